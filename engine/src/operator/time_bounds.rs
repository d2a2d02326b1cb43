//! The time condition of an interval join (`b.ts BETWEEN a.ts AND a.ts +
//! INTERVAL '1' HOUR`, or `b.ts BETWEEN a.ts AND a.expires`): found in the
//! join's condition ([`time_bounds`]), it tells which rows of each side no
//! row still to come can meet ([`TimeBounds`]), which the join forgets, and
//! which columns of its output the watermark closes
//! ([`TimeBounds::closing_columns`]).

use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator as BinaryOp};

use crate::window::time_offset;

/// One half of an interval join's time condition: `left.x - right.y ≥ ns`
/// (a lower bound) or `≤ ns` (an upper bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    pub left: Column,
    pub right: Column,
    pub ns: i64,
    /// [`time_offset`] of the side's time column: the right one in a lower
    /// bound, the left one in an upper bound.
    pub to_end_ns: i64,
}

/// The time condition of an interval join, which may bound each side by
/// another pair of columns (`b.ts BETWEEN a.ts AND a.expires`, Nexmark q4).
/// Each half rules out one side's rows: every row still to come on a side
/// has `ts + to_end_ns ≥` the watermark W for its time columns (event times
/// or window bounds, see [`time_offset`]), so
/// - the lower bound, `left.x - right.y ≥ lo` with `right.y` a time column,
///   says a left row with `x < W + lo - to_end` meets no right row to come;
/// - the upper bound, `left.x - right.y ≤ hi` with `left.x` a time column,
///   says a right row with `y < W - hi - to_end` meets no left row to come.
///
/// The other column of each half (`a.expires`) needs no watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimeBounds {
    pub lower: Bound,
    pub upper: Bound,
}

impl TimeBounds {
    /// Left rows with `lower.left` below this can meet no right row still
    /// to come.
    pub(super) fn left_expiry(&self, watermark: i64) -> i64 {
        watermark
            .saturating_add(self.lower.ns)
            .saturating_sub(self.lower.to_end_ns)
    }

    /// Right rows with `upper.right` below this can meet no left row still
    /// to come.
    pub(super) fn right_expiry(&self, watermark: i64) -> i64 {
        watermark
            .saturating_sub(self.upper.ns)
            .saturating_sub(self.upper.to_end_ns)
    }

    /// The columns that need a watermark: those whose future values the
    /// watermark bounds from below, one per side.
    pub(crate) fn time_columns(&self) -> [&Column; 2] {
        [&self.upper.left, &self.lower.right]
    }

    /// The columns compared with the expiries, one per side.
    pub(crate) fn expiry_columns(&self) -> [&Column; 2] {
        [&self.lower.left, &self.upper.right]
    }

    /// The columns that close the joined rows carrying them, each with
    /// `to_end`: no joined row still to come carries a value `c` with `c +
    /// to_end <= W` (the watermark). So an aggregation grouped by one
    /// (Nexmark q6's `A.expires` under `B.ts BETWEEN A.ts AND A.expires`)
    /// has final groups, as a window does.
    ///
    /// A pair still to come has a new right row, whose time column `y` is
    /// at least `W - lower.to_end`, or a new left row, whose `x` (the
    /// upper bound's left column) is at least `W - upper.to_end`. Where
    /// the two halves bound the same right column, a new left row meets
    /// only right rows with `y >= x - hi`: every pair to come has `y >= W -
    /// dy`. Then the lower bound's left column `x'` (`x' - y >= lo`) is at
    /// least `W - dy + lo`. The same from the other side gives `dx` and
    /// the upper bound's right column.
    pub(crate) fn closing_columns(&self) -> Vec<(&Column, i64)> {
        let (lower, upper) = (&self.lower, &self.upper);
        let mut behind: Vec<(&Column, i64)> = Vec::new();
        if lower.right == upper.right {
            let dy = lower
                .to_end_ns
                .max(upper.to_end_ns.saturating_add(upper.ns));
            behind.push((&lower.right, dy));
            behind.push((&lower.left, dy.saturating_sub(lower.ns)));
        }
        if lower.left == upper.left {
            let dx = upper
                .to_end_ns
                .max(lower.to_end_ns.saturating_sub(lower.ns));
            behind.push((&upper.left, dx));
            behind.push((&upper.right, dx.saturating_add(upper.ns)));
        }
        // A column closed both ways closes at the earlier.
        let mut closing: Vec<(&Column, i64)> = Vec::new();
        for (c, d) in behind {
            let to_end = d.saturating_add(1);
            match closing.iter_mut().find(|(k, _)| *k == c) {
                Some(found) => found.1 = found.1.min(to_end),
                None => closing.push((c, to_end)),
            }
        }
        closing
    }
}

/// Finds the time condition of an interval join: conjuncts of its filter
/// like `l.ts >= r.ts`, `l.ts <= r.ts + INTERVAL '1' HOUR` or `r.ts BETWEEN
/// l.ts AND l.expires`, and equalities among its keys of two time columns
/// (`l.window_start = r.window_start`: a window join), that bound `l.x -
/// r.y` from below and from above, each on some pair of columns.
/// Comparisons use any columns (the planner then asks for watermarks);
/// equalities only time columns, as other keys are no bound.
pub(crate) fn time_bounds(
    filter: Option<&Expr>,
    keys: &[(Expr, Expr)],
    left: &DFSchema,
    right: &DFSchema,
    watermarked: &[String],
) -> Option<TimeBounds> {
    let mut conjuncts = Vec::new();
    if let Some(f) = filter {
        split_conjuncts(f, &mut conjuncts);
    }
    for (l, r) in keys {
        let is_time = |e: &Expr, schema: &DFSchema| {
            term(e).is_some_and(|(c, _)| column_offset(schema, &c, watermarked).is_some())
        };
        if is_time(l, left) && is_time(r, right) {
            conjuncts.push((l.clone(), BinaryOp::GtEq, r.clone()));
            conjuncts.push((l.clone(), BinaryOp::LtEq, r.clone()));
        }
    }
    // Per pair of columns, the tightest bounds on `left.ts - right.ts`.
    type Bounds = ((Column, Column), Option<i64>, Option<i64>);
    let mut pairs: Vec<Bounds> = Vec::new();
    for (l, op, r) in conjuncts {
        let (Some((cl, al)), Some((cr, ar))) = (term(&l), term(&r)) else {
            continue;
        };
        // Normalise to `left.ts - right.ts <op> c`.
        let (lt_col, rt_col, op, c) = if left.has_column(&cl) && right.has_column(&cr) {
            (cl, cr, op, ar - al)
        } else if right.has_column(&cl) && left.has_column(&cr) {
            (cr, cl, flip(op), al - ar)
        } else {
            continue;
        };
        let at = match pairs
            .iter()
            .position(|(p, _, _)| p.0 == lt_col && p.1 == rt_col)
        {
            Some(i) => i,
            None => {
                pairs.push(((lt_col, rt_col), None, None));
                pairs.len() - 1
            }
        };
        let (_, lo, hi) = &mut pairs[at];
        match op {
            BinaryOp::GtEq | BinaryOp::Gt => *lo = Some(lo.map_or(c, |x| x.max(c))),
            BinaryOp::LtEq | BinaryOp::Lt => *hi = Some(hi.map_or(c, |x| x.min(c))),
            _ => {}
        }
    }
    // Of the pairs that give each half, the one whose column the watermark
    // bounds, then one of time columns only, then one bounded both ways:
    // `c.num >= m.maxn` next to a window equality is a filter, not the bound.
    let is_time = |schema: &DFSchema, c: &Column| column_offset(schema, c, watermarked).is_some();
    let pick = |lower: bool| {
        let mut best: Option<(Bound, (bool, bool, bool))> = None;
        for ((l, r), lo, hi) in &pairs {
            let Some(ns) = (if lower { *lo } else { *hi }) else {
                continue;
            };
            let (time, other) = if lower {
                (is_time(right, r), is_time(left, l))
            } else {
                (is_time(left, l), is_time(right, r))
            };
            let rank = (time, other, lo.is_some() && hi.is_some());
            if best.as_ref().is_none_or(|(_, b)| rank > *b) {
                let to_end_ns = if lower {
                    column_offset(right, r, watermarked)
                } else {
                    column_offset(left, l, watermarked)
                };
                let bound = Bound {
                    left: l.clone(),
                    right: r.clone(),
                    ns,
                    to_end_ns: to_end_ns.unwrap_or(0),
                };
                best = Some((bound, rank));
            }
        }
        best.map(|(b, _)| b)
    };
    Some(TimeBounds {
        lower: pick(true)?,
        upper: pick(false)?,
    })
}

/// Whether `c` is a time column of `schema`: watermarked, or a window
/// bound over a watermarked column.
pub(crate) fn is_time_column(schema: &DFSchema, c: &Column, watermarked: &[String]) -> bool {
    column_offset(schema, c, watermarked).is_some()
}

/// [`time_offset`] of column `c` of `schema`.
fn column_offset(schema: &DFSchema, c: &Column, watermarked: &[String]) -> Option<i64> {
    let (_, field) = schema.qualified_field_from_column(c).ok()?;
    time_offset(field, watermarked)
}

fn split_conjuncts(e: &Expr, out: &mut Vec<(Expr, BinaryOp, Expr)>) {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            BinaryOp::And => {
                split_conjuncts(left, out);
                split_conjuncts(right, out);
            }
            BinaryOp::Gt | BinaryOp::GtEq | BinaryOp::Lt | BinaryOp::LtEq => {
                out.push(((**left).clone(), *op, (**right).clone()))
            }
            _ => {}
        },
        Expr::Between(b) if !b.negated => {
            out.push(((*b.expr).clone(), BinaryOp::GtEq, (*b.low).clone()));
            out.push(((*b.expr).clone(), BinaryOp::LtEq, (*b.high).clone()));
        }
        _ => {}
    }
}

fn flip(op: BinaryOp) -> BinaryOp {
    match op {
        BinaryOp::Gt => BinaryOp::Lt,
        BinaryOp::GtEq => BinaryOp::LtEq,
        BinaryOp::Lt => BinaryOp::Gt,
        BinaryOp::LtEq => BinaryOp::GtEq,
        other => other,
    }
}

/// `col`, `col + interval` or `col - interval` as (column, offset ns).
fn term(e: &Expr) -> Option<(Column, i64)> {
    match e {
        Expr::Column(c) => Some((c.clone(), 0)),
        Expr::Cast(c) => term(&c.expr),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (c, base) = term(left)?;
            let d = interval_ns(right)?;
            match op {
                BinaryOp::Plus => Some((c, base + d)),
                BinaryOp::Minus => Some((c, base - d)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn interval_ns(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) if v.months == 0 => {
            Some(v.days as i64 * 86_400_000_000_000 + v.nanoseconds)
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(v)), _) => {
            Some(v.days as i64 * 86_400_000_000_000 + v.milliseconds as i64 * 1_000_000)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(left: &str, right: &str, ns: i64) -> Bound {
        Bound {
            left: Column::from_qualified_name(left),
            right: Column::from_qualified_name(right),
            ns,
            to_end_ns: 0,
        }
    }

    fn closing(bounds: &TimeBounds) -> Vec<(String, i64)> {
        bounds
            .closing_columns()
            .into_iter()
            .map(|(c, ns)| (c.flat_name(), ns))
            .collect()
    }

    #[test]
    fn an_expiry_closes_its_pairs_once_the_watermark_passes_it() {
        // b.ts BETWEEN a.ts AND a.expires (Nexmark q4 and q6).
        let bounds = TimeBounds {
            lower: bound("a.expires", "b.ts", 0),
            upper: bound("a.ts", "b.ts", 0),
        };
        assert_eq!(
            closing(&bounds),
            [("b.ts".to_string(), 1), ("a.expires".to_string(), 1)]
        );
    }

    #[test]
    fn a_left_time_column_closes_only_after_the_bound_lets_a_right_row_reach_it() {
        // b.ts BETWEEN a.ts AND a.ts + 10 s: a kept `a` row meets bids up to
        // 10 s after it, so a pair to come has `a.ts` up to 10 s behind the
        // watermark; a bid's time is never behind it.
        const TEN_S: i64 = 10_000_000_000;
        let bounds = TimeBounds {
            lower: bound("a.ts", "b.ts", -TEN_S),
            upper: bound("a.ts", "b.ts", 0),
        };
        assert_eq!(
            closing(&bounds),
            [("b.ts".to_string(), 1), ("a.ts".to_string(), TEN_S + 1)]
        );
    }
}
