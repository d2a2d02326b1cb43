//! Which OVER aggregations run on a stream: aggregate functions over
//! frames that end at the current row and reach a bounded way back, in
//! partitions ordered by a watermarked event-time column (see
//! `operator::over`).

use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    Expr, Window, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
};

use crate::window::time_offset;

/// How far back an OVER window's frames reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Reach {
    /// The most rows of a `ROWS n PRECEDING` frame.
    pub rows: Option<u64>,
    /// The widest `RANGE INTERVAL ... PRECEDING` frame, in ns.
    pub range_ns: Option<i64>,
}

/// What an OVER window `w` needs kept, or why it cannot run on a stream.
pub(super) fn over_reach(w: &Window, watermarked: &[String]) -> Result<Reach, String> {
    let mut reach = Reach::default();
    type Shape = (Vec<Expr>, Vec<datafusion::logical_expr::SortExpr>);
    let mut shape: Option<Shape> = None;
    for e in &w.window_expr {
        let Expr::WindowFunction(f) = e.clone().unalias_nested().data else {
            return Err("uses a window expression Sluice cannot run".into());
        };
        let WindowFunction { fun, params } = f.as_ref();
        if let WindowFunctionDefinition::WindowUDF(udf) = fun {
            return Err(format!(
                "uses {}() OVER (...), which Sluice does not run on a stream; a Top-N bounds \
                 ROW_NUMBER(), RANK() or DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) \
                 with WHERE rn <= N, and \
                 aggregate functions run OVER (PARTITION BY ... ORDER BY ts ROWS BETWEEN n \
                 PRECEDING AND CURRENT ROW)",
                udf.name()
            ));
        }
        let same = (params.partition_by.clone(), params.order_by.clone());
        match &shape {
            None => shape = Some(same),
            Some(s) if *s != same => {
                return Err(
                    "computes OVER windows of different PARTITION BY or ORDER BY in one \
                            query; give them all the same"
                        .into(),
                )
            }
            Some(_) => {}
        }
        let frame = &params.window_frame;
        let back = match (&frame.start_bound, &frame.end_bound) {
            (WindowFrameBound::Preceding(v), WindowFrameBound::CurrentRow) if !v.is_null() => v,
            _ => {
                return Err(
                    "uses an OVER frame that does not run from a bounded distance back \
                            to the current row; over a stream write ROWS BETWEEN n PRECEDING \
                            AND CURRENT ROW or RANGE BETWEEN INTERVAL '...' PRECEDING AND \
                            CURRENT ROW (a frame from UNBOUNDED PRECEDING, the default with \
                            ORDER BY, would keep every row for ever)"
                        .into(),
                )
            }
        };
        match frame.units {
            WindowFrameUnits::Rows => {
                let n = match back {
                    ScalarValue::UInt64(Some(n)) => *n,
                    other => other
                        .to_string()
                        .parse::<u64>()
                        .map_err(|_| format!("uses ROWS {other} PRECEDING, not a row count"))?,
                };
                reach.rows = Some(reach.rows.map_or(n, |r| r.max(n)));
            }
            WindowFrameUnits::Range => {
                let ns = interval_ns(back).ok_or_else(|| {
                    format!(
                        "uses RANGE {back} PRECEDING; over event time the range is an interval \
                         of days, hours, minutes or seconds (INTERVAL '10' SECOND)"
                    )
                })?;
                reach.range_ns = Some(reach.range_ns.map_or(ns, |r| r.max(ns)));
            }
            WindowFrameUnits::Groups => {
                return Err("uses a GROUPS frame; over a stream use ROWS or RANGE".into())
            }
        }
    }
    let Some((partition_by, order_by)) = shape else {
        return Err("has an empty OVER window".into());
    };
    if let Some(e) = partition_by.iter().find(|e| !matches!(e, Expr::Column(_))) {
        return Err(format!(
            "partitions an OVER window by {e}, not a column; compute it in a subquery and \
             partition by its name"
        ));
    }
    // An event-time column, or a window's bound (an aggregation above a
    // window emits its groups in the bound's order, see `closing`).
    let is_time = |c: &datafusion::common::Column| {
        watermarked.contains(&c.name)
            || w.input
                .schema()
                .qualified_field_from_column(c)
                .is_ok_and(|(_, f)| time_offset(f, watermarked).is_some())
    };
    match order_by.as_slice() {
        [o] if o.asc && matches!(&o.expr, Expr::Column(c) if is_time(c)) => {}
        _ => {
            return Err(
                "orders an OVER window by something other than one watermarked \
                        event-time column, ascending: a row's value is final only once the \
                        watermark passes it (ORDER BY ts, with WATERMARK FOR ts declared)"
                    .into(),
            )
        }
    }
    Ok(reach)
}

/// A day in ns.
const DAY_NS: i64 = 86_400_000_000_000;

/// An interval literal's length in ns: `None` for months (not a fixed
/// length), for a length that does not fit, and for a negative one. SQL
/// gives it as text ('5 SECOND') until types are coerced.
fn interval_ns(v: &ScalarValue) -> Option<i64> {
    interval_length(v).filter(|ns| *ns >= 0)
}

fn interval_length(v: &ScalarValue) -> Option<i64> {
    use datafusion::arrow::datatypes::{DataType, IntervalUnit};
    match v {
        ScalarValue::Utf8(Some(_))
        | ScalarValue::LargeUtf8(Some(_))
        | ScalarValue::Utf8View(Some(_)) => {
            let interval = v
                .cast_to(&DataType::Interval(IntervalUnit::MonthDayNano))
                .ok()?;
            interval_ns(&interval)
        }
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => (i.days as i64)
            .checked_mul(DAY_NS)?
            .checked_add(i.nanoseconds),
        ScalarValue::IntervalDayTime(Some(i)) => (i.days as i64)
            .checked_mul(DAY_NS)?
            .checked_add((i.milliseconds as i64).checked_mul(1_000_000)?),
        ScalarValue::DurationSecond(Some(s)) => s.checked_mul(1_000_000_000),
        ScalarValue::DurationMillisecond(Some(s)) => s.checked_mul(1_000_000),
        ScalarValue::DurationMicrosecond(Some(s)) => s.checked_mul(1_000),
        ScalarValue::DurationNanosecond(Some(s)) => Some(*s),
        _ => None,
    }
}
