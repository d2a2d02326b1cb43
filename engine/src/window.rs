//! Event-time windows: TUMBLE, HOP, CUMULATE and SESSION, from assignment
//! to closing.
//!
//! Everything about windows is here: the table functions that assign rows
//! to windows ([`Window`]), which group key closes a group and when
//! ([`WindowKey::closed`], [`event_time_key`]), what the planner refuses
//! about sessions ([`session_problem`]), and how touching sessions merge
//! ([`merge_sessions`]). The aggregation operator asks these; the state
//! store knows nothing of windows.
//!
//! A window table function adds `window_start` and `window_end` columns to
//! a stream's rows (HOP and CUMULATE repeat a row once per window holding
//! it), so a windowed aggregation is an ordinary `GROUP BY window_start,
//! window_end, ...` for DataFusion and for the incremental aggregate.
//! Windows are aligned to the Unix epoch, as in Flink and Spark: `[k·size,
//! (k+1)·size)` for TUMBLE, starts at multiples of the slide for HOP, and
//! for CUMULATE windows `[k·size, k·size + j·step)` that grow by a step
//! until they are `size` long.
//!
//! The two columns carry Arrow field metadata saying they are window
//! bounds and how far the bound is from the window's end. The metadata
//! survives DataFusion's planning into the aggregate's group keys, which
//! is how the aggregate learns, without tracing expressions, which key
//! closes a group when the watermark passes it (see `aggregate`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray, RecordBatch, Scalar,
    TimestampNanosecondArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::kernels::cmp::lt_eq;
use datafusion::arrow::compute::prep_null_mask_filter;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, TimeUnit};
use datafusion::common::metadata::FieldMetadata;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use datafusion::logical_expr::Aggregate;
use foldhash::{HashMap, HashMapExt};

use crate::error::{Result, SluiceError};
use crate::output_mode::OutputMode;
use crate::state::row_converter;
use crate::watermark::nanos;

/// Field metadata key marking a window bound: `start` or `end`.
const BOUND: &str = "sluice.window.bound";
/// Field metadata key: nanoseconds from this bound to the window's end.
const TO_END_NS: &str = "sluice.window.to_end_ns";
/// Field metadata key: the event-time column the window is over.
const TIME_COLUMN: &str = "sluice.window.time_column";
/// Field metadata key on session bounds: the PARTITION BY columns.
const SESSION_BY: &str = "sluice.window.session_by";

/// An event-time window assignment.
///
/// ```
/// use std::time::Duration;
/// use sluice_engine::Window;
/// let w = Window::hop("ts", Duration::from_secs(2), Duration::from_secs(10));
/// assert_eq!(w.to_string(), "HOP(ts, slide 2s, size 10s)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// Fixed, non-overlapping windows of `size`.
    Tumble {
        /// The event-time column.
        column: String,
        /// The window length.
        size: Duration,
    },
    /// Windows of `size` starting every `slide`; a row is in each window
    /// that holds its time.
    Hop {
        /// The event-time column.
        column: String,
        /// How often a window starts.
        slide: Duration,
        /// The window length.
        size: Duration,
    },
    /// Windows that share a start every `size` and end every `step` after
    /// it (Flink's CUMULATE): `[s, s + step)`, `[s, s + 2·step)`, ... up to
    /// `[s, s + size)`; a row is in each of them that holds its time.
    Cumulate {
        /// The event-time column.
        column: String,
        /// How much each window is longer than the one before.
        step: Duration,
        /// The longest window's length, a multiple of `step`.
        size: Duration,
    },
    /// Per value of the `partition_by` columns, rows closer than `gap` to
    /// each other form one session `[first ts, last ts + gap)`.
    Session {
        /// The event-time column.
        column: String,
        /// The columns sessions are formed per (the other GROUP BY keys).
        partition_by: Vec<String>,
        /// The inactivity that ends a session.
        gap: Duration,
    },
}

impl Window {
    /// `TUMBLE(TABLE s, DESCRIPTOR(column), size)`.
    pub fn tumble(column: impl Into<String>, size: Duration) -> Self {
        Self::Tumble {
            column: column.into(),
            size,
        }
    }

    /// `HOP(TABLE s, DESCRIPTOR(column), slide, size)`.
    pub fn hop(column: impl Into<String>, slide: Duration, size: Duration) -> Self {
        Self::Hop {
            column: column.into(),
            slide,
            size,
        }
    }

    /// `CUMULATE(TABLE s, DESCRIPTOR(column), step, size)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_engine::Window;
    /// // per day, a count at every hour so far
    /// let w = Window::cumulate("ts", Duration::from_secs(3600), Duration::from_secs(86400));
    /// assert_eq!(w.to_string(), "CUMULATE(ts, step 3600s, size 86400s)");
    /// ```
    pub fn cumulate(column: impl Into<String>, step: Duration, size: Duration) -> Self {
        Self::Cumulate {
            column: column.into(),
            step,
            size,
        }
    }

    /// `SESSION(TABLE s PARTITION BY keys, DESCRIPTOR(column), gap)`.
    pub fn session(column: impl Into<String>, partition_by: &[&str], gap: Duration) -> Self {
        Self::Session {
            column: column.into(),
            partition_by: partition_by.iter().map(|c| c.to_string()).collect(),
            gap,
        }
    }

    /// The event-time column.
    pub fn column(&self) -> &str {
        match self {
            Self::Tumble { column, .. }
            | Self::Hop { column, .. }
            | Self::Cumulate { column, .. }
            | Self::Session { column, .. } => column,
        }
    }

    /// TUMBLE and HOP: the window length; CUMULATE: the longest window's;
    /// SESSION: the gap, the length of a one-row session.
    fn size(&self) -> Duration {
        match self {
            Self::Tumble { size, .. } | Self::Hop { size, .. } | Self::Cumulate { size, .. } => {
                *size
            }
            Self::Session { gap, .. } => *gap,
        }
    }

    /// Adds `window_start` and `window_end` to `df`'s columns.
    pub(crate) fn apply(&self, df: DataFrame) -> Result<DataFrame> {
        let time = self.column().to_string();
        let schema = df.schema().clone();
        let (qualifier, field) = find(&schema, &time)?;
        let DataType::Timestamp(unit, _) = field.data_type() else {
            return Err(SluiceError::plan(format!(
                "{self}: column '{time}' is {}, but a window needs a TIMESTAMP column",
                field.data_type()
            )));
        };
        let size_ns = positive_nanos(self, "size", self.size())?;
        let time_col = Expr::Column(Column::new(qualifier.cloned(), &time));
        let per_unit = nanos_per(*unit);
        let whole_units = |ns: i64| -> Result<i64> {
            if ns % per_unit != 0 {
                return Err(SluiceError::plan(format!(
                    "{self}: column '{time}' has {unit:?} precision, finer than the window's \
                     durations; use whole {unit:?}s"
                )));
            }
            Ok(ns / per_unit)
        };
        // Each window's start, and its end where windows of one start end
        // at different times (CUMULATE).
        let (df, start, end) = match self {
            // Each row starts as its own session `[ts, ts + gap)`; the
            // aggregate merges sessions that touch (see `aggregate`).
            Self::Session { .. } => (df, time_col, None),
            Self::Tumble { .. } => {
                let start = datafusion::functions::datetime::date_bin()
                    .call(vec![interval(size_ns), time_col]);
                (df, start, None)
            }
            Self::Hop { slide, .. } => {
                let slide_ns = positive_nanos(self, "slide", *slide)?;
                if slide_ns > size_ns {
                    return Err(SluiceError::plan(format!(
                        "{self}: the slide is longer than the window, so some rows would be in \
                         no window; use a slide up to the size (equal is TUMBLE)"
                    )));
                }
                let bounds = WindowBounds::HopStarts {
                    slide: whole_units(slide_ns)?,
                    size: whole_units(size_ns)?,
                };
                let (df, starts) = bounds.unnest(df, time_col)?;
                (df, starts, None)
            }
            Self::Cumulate { step, .. } => {
                let step_ns = positive_nanos(self, "step", *step)?;
                if size_ns % step_ns != 0 {
                    return Err(SluiceError::plan(format!(
                        "{self}: the size is not a multiple of the step, so the last window \
                         would not end at the size; use a size that is a whole number of steps"
                    )));
                }
                let start = datafusion::functions::datetime::date_bin()
                    .call(vec![interval(size_ns), time_col.clone()]);
                let bounds = WindowBounds::CumulateEnds {
                    step: whole_units(step_ns)?,
                    size: whole_units(size_ns)?,
                };
                let (df, ends) = bounds.unnest(df, time_col)?;
                (df, start, Some(ends))
            }
        };
        let session = match self {
            Self::Session { partition_by, .. } => Some(partition_by.join(",")),
            _ => None,
        };
        let bound = |which: &str, to_end_ns: i64| {
            let mut md = BTreeMap::from([
                (BOUND.to_string(), which.to_string()),
                (TO_END_NS.to_string(), to_end_ns.to_string()),
                (TIME_COLUMN.to_string(), time.clone()),
            ]);
            if let Some(keys) = &session {
                md.insert(SESSION_BY.to_string(), keys.clone());
            }
            FieldMetadata::new(md)
        };
        let mut exprs: Vec<Expr> = df
            .schema()
            .columns()
            .into_iter()
            .filter(|c| !c.name.starts_with("__sluice_"))
            .filter(|c| c.name != "window_start" && c.name != "window_end")
            .map(Expr::Column)
            .collect();
        exprs.push(
            start
                .clone()
                .alias_with_metadata("window_start", Some(bound("start", size_ns))),
        );
        let end = end.unwrap_or_else(|| start + interval(size_ns));
        exprs.push(end.alias_with_metadata("window_end", Some(bound("end", 0))));
        Ok(df.select(exprs)?)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tumble { column, size } => write!(f, "TUMBLE({column}, size {size:?})"),
            Self::Hop {
                column,
                slide,
                size,
            } => write!(f, "HOP({column}, slide {slide:?}, size {size:?})"),
            Self::Cumulate { column, step, size } => {
                write!(f, "CUMULATE({column}, step {step:?}, size {size:?})")
            }
            Self::Session {
                column,
                partition_by,
                gap,
            } => write!(
                f,
                "SESSION({column} PARTITION BY {}, gap {gap:?})",
                partition_by.join(", ")
            ),
        }
    }
}

/// What is wrong with a GROUP BY over SESSION windows, if anything.
pub(crate) fn session_problem(
    agg: &Aggregate,
    window: Option<&WindowKey>,
    mode: Option<OutputMode>,
) -> Option<String> {
    let keys = &agg.schema.fields()[..agg.group_expr.len()];
    if !keys.iter().any(|f| is_session_bound(f)) {
        return None;
    }
    let Some(key) = window.and_then(|w| w.session.as_ref()) else {
        return Some(
            "a GROUP BY over SESSION windows needs both window_start and window_end among its \
             keys: a session is known by both bounds"
                .into(),
        );
    };
    if mode == Some(OutputMode::Complete) {
        return Some(
            "SESSION windows run in append mode (each session once, when the watermark passes \
             its end) or update mode (sessions as they grow, a merged session's old row taken \
             back), not complete mode, which would keep every session forever"
                .into(),
        );
    }
    let others: BTreeSet<String> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != key.start && *i != key.end)
        .map(|(_, f)| f.name().clone())
        .collect();
    let partition: BTreeSet<String> = key.partition_by.iter().cloned().collect();
    (others != partition).then(|| {
        format!(
            "sessions are formed per PARTITION BY key, so the GROUP BY columns besides \
             window_start and window_end must be exactly those: PARTITION BY [{}], but they \
             are [{}]",
            key.partition_by.join(", "),
            others.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

/// The group key that carries event time, if any: a window bound (see
/// `window`), else a watermarked column itself, whose groups are final once
/// the watermark has passed the key (rows older than it are late).
pub(crate) fn event_time_key(agg: &Aggregate, watermarked: &[String]) -> Option<WindowKey> {
    let keys = &agg.schema.fields()[..agg.group_expr.len()];
    window_key(keys.iter().map(|f| f.as_ref())).or_else(|| {
        agg.group_expr
            .iter()
            .enumerate()
            .find_map(|(column, e)| match e {
                Expr::Column(c) if watermarked.contains(&c.name) => Some(WindowKey {
                    column,
                    to_end_ns: 1,
                    session: None,
                    time_column: c.name.clone(),
                }),
                _ => None,
            })
    })
}

/// A group key that is a window bound: the key's rows are final once the
/// watermark reaches `key + to_end_ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowKey {
    /// Index among the group keys.
    pub column: usize,
    /// Nanoseconds from the key's value to the window's end.
    pub to_end_ns: i64,
    /// The event-time column the window is over.
    pub time_column: String,
    /// For SESSION windows: the group-key indexes of `window_start` and
    /// `window_end`, and the PARTITION BY columns.
    pub session: Option<SessionKey>,
}

impl WindowKey {
    /// Which of `bounds` (this key's column) are closed windows once the
    /// watermark is `watermark`: the running aggregate emits and evicts
    /// them, and `sluice verify` expects exactly them. A null bound (no
    /// event time) never closes.
    pub(crate) fn closed(&self, bounds: &ArrayRef, watermark: i64) -> Result<BooleanArray> {
        let bound = nanos(bounds)?;
        let last = self.last_closed(watermark);
        let closed = lt_eq(&bound, &Scalar::new(Int64Array::from(vec![last])))?;
        Ok(if closed.null_count() > 0 {
            prep_null_mask_filter(&closed)
        } else {
            closed
        })
    }

    /// Whether a window whose bound (this key's value) is `bound_ns` is
    /// closed once the watermark is `watermark`, as [`closed`](Self::closed)
    /// says of a column.
    pub(crate) fn closed_at(&self, bound_ns: i64, watermark: i64) -> bool {
        bound_ns <= self.last_closed(watermark)
    }

    /// The greatest bound of a closed window.
    fn last_closed(&self, watermark: i64) -> i64 {
        watermark.saturating_sub(self.to_end_ns)
    }
}

/// Where a session's bounds are among the group keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionKey {
    pub start: usize,
    pub end: usize,
    pub partition_by: Vec<String>,
}

/// The window bound among `fields` (group-key fields), preferring
/// `window_end` when both are keys.
pub(crate) fn window_key<'a>(fields: impl IntoIterator<Item = &'a Field>) -> Option<WindowKey> {
    let mut found: Option<WindowKey> = None;
    let (mut start, mut end, mut session_by) = (None, None, None);
    for (column, field) in fields.into_iter().enumerate() {
        let md = field.metadata();
        let (Some(bound), Some(to_end)) = (md.get(BOUND), md.get(TO_END_NS)) else {
            continue;
        };
        let Ok(to_end_ns) = to_end.parse() else {
            continue;
        };
        if let Some(by) = md.get(SESSION_BY) {
            session_by = Some(by.clone());
            match bound.as_str() {
                "start" => start = Some(column),
                _ => end = Some(column),
            }
        }
        let key = WindowKey {
            column,
            to_end_ns,
            time_column: md.get(TIME_COLUMN).cloned().unwrap_or_default(),
            session: None,
        };
        if bound == "end" || found.is_none() {
            found = Some(key);
        }
    }
    let mut key = found?;
    if let Some(by) = session_by {
        key.session = Some(SessionKey {
            start: start?,
            end: end?,
            partition_by: by
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        });
        // A row at exactly the end would still join the session, so a
        // session is final only once the watermark is past its end.
        key.column = end?;
        key.to_end_ns = 1;
    }
    Some(key)
}

/// For a column that event time bounds from below for every row still to
/// come: how far its values may lie behind the row's event time. A
/// watermarked column: 0 (rows behind the watermark are late). A TUMBLE or
/// HOP bound over one: the distance to the window's end (a row's window
/// ends after its event time). Anything else, SESSION bounds included: None.
pub(crate) fn time_offset(field: &Field, watermarked: &[String]) -> Option<i64> {
    if watermarked.contains(field.name()) {
        return Some(0);
    }
    let md = field.metadata();
    if md.contains_key(SESSION_BY) || !watermarked.contains(md.get(TIME_COLUMN)?) {
        return None;
    }
    md.get(BOUND)?;
    md.get(TO_END_NS)?.parse().ok()
}

/// Whether `field` is a SESSION window bound.
pub(crate) fn is_session_bound(field: &Field) -> bool {
    field.metadata().contains_key(SESSION_BY)
}

/// The first column of `fields` that is a window's end, with the
/// event-time column its window is over: what orders a windowed
/// operator's output in event time.
pub(crate) fn window_end<'a>(
    fields: impl IntoIterator<Item = &'a Field>,
) -> Option<(usize, String)> {
    fields.into_iter().enumerate().find_map(|(i, f)| {
        let md = f.metadata();
        (md.get(BOUND).map(String::as_str) == Some("end"))
            .then(|| md.get(TIME_COLUMN).map(|t| (i, t.clone())))
            .flatten()
    })
}

/// `schema` with its window bounds over event-time column `from` said to
/// be over `to`: the same column under another name, as a repartition
/// channel carries it.
pub(crate) fn rename_time_column(
    schema: &datafusion::arrow::datatypes::Schema,
    from: &str,
    to: &str,
) -> datafusion::arrow::datatypes::SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut md = f.metadata().clone();
            match md.get_mut(TIME_COLUMN) {
                Some(column) if column == from => {
                    *column = to.to_string();
                    f.as_ref().clone().with_metadata(md)
                }
                _ => f.as_ref().clone(),
            }
        })
        .collect();
    Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

fn find<'a>(
    schema: &'a DFSchema,
    name: &str,
) -> Result<(Option<&'a datafusion::common::TableReference>, &'a Field)> {
    let mut hits = schema.iter().filter(|(_, f)| f.name() == name);
    match (hits.next(), hits.next()) {
        (Some((q, f)), None) => Ok((q, f.as_ref())),
        (None, _) => {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            let hint = crate::options::closest(name, names.iter().copied())
                .map(|c| format!(" (did you mean '{c}'?)"))
                .unwrap_or_default();
            Err(SluiceError::plan(format!(
                "DESCRIPTOR({name}): no column '{name}'{hint}; the columns are {}",
                names.join(", ")
            )))
        }
        (Some(_), Some(_)) => Err(SluiceError::plan(format!(
            "DESCRIPTOR({name}): more than one column is named '{name}'"
        ))),
    }
}

/// Gives the rows of touching sessions of one partition the bounds of
/// their union: sorted by start, a session that starts at or before the
/// running end extends it (as Flink merges session windows).
pub(crate) fn merge_sessions(
    batch: &RecordBatch,
    key: &SessionKey,
    group_columns: usize,
) -> Result<RecordBatch> {
    let starts = nanos(batch.column(key.start))?;
    let ends = nanos(batch.column(key.end))?;
    let (starts, ends) = (
        starts.as_primitive::<Int64Type>(),
        ends.as_primitive::<Int64Type>(),
    );
    let partition: Vec<usize> = (0..group_columns)
        .filter(|&c| c != key.start && c != key.end)
        .collect();
    let schema = batch.schema();
    let converter = row_converter(partition.iter().map(|&c| schema.field(c).data_type()))?;
    let rows = converter.convert_columns(
        &partition
            .iter()
            .map(|&c| Arc::clone(batch.column(c)))
            .collect::<Vec<_>>(),
    )?;
    let mut groups: HashMap<&[u8], Vec<usize>> = HashMap::new();
    for i in 0..batch.num_rows() {
        let k = if partition.is_empty() {
            &[]
        } else {
            rows.row(i).data()
        };
        groups.entry(k).or_default().push(i);
    }
    let mut new_start = starts.values().to_vec();
    let mut new_end = ends.values().to_vec();
    for members in groups.values_mut() {
        members.sort_by_key(|&i| (starts.value(i), ends.value(i)));
        let mut run: Vec<usize> = Vec::new();
        let (mut lo, mut hi) = (0i64, i64::MIN);
        for &i in members.iter() {
            if !run.is_empty() && starts.value(i) > hi {
                for &j in &run {
                    (new_start[j], new_end[j]) = (lo, hi);
                }
                run.clear();
            }
            if run.is_empty() {
                (lo, hi) = (starts.value(i), ends.value(i));
            }
            hi = hi.max(ends.value(i));
            run.push(i);
        }
        for &j in &run {
            (new_start[j], new_end[j]) = (lo, hi);
        }
    }
    let as_type = |values: Vec<i64>, like: &ArrayRef| -> Result<ArrayRef> {
        let DataType::Timestamp(_, tz) = like.data_type() else {
            return Err(SluiceError::Internal(
                "a session bound is not a timestamp".into(),
            ));
        };
        let ns = TimestampNanosecondArray::from(values).with_timezone_opt(tz.clone());
        Ok(cast(&ns, like.data_type())?)
    };
    let mut columns = batch.columns().to_vec();
    columns[key.start] = as_type(new_start, batch.column(key.start))?;
    columns[key.end] = as_type(new_end, batch.column(key.end))?;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

fn positive_nanos(window: &Window, what: &str, d: Duration) -> Result<i64> {
    match i64::try_from(d.as_nanos()) {
        Ok(ns) if ns > 0 => Ok(ns),
        _ => Err(SluiceError::plan(format!(
            "{window}: the {what} must be positive (and under 292 years), got {d:?}"
        ))),
    }
}

fn interval(ns: i64) -> Expr {
    Expr::Literal(
        ScalarValue::IntervalMonthDayNano(Some(
            datafusion::arrow::datatypes::IntervalMonthDayNano::new(0, 0, ns),
        )),
        None,
    )
}

fn nanos_per(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1_000_000_000,
        TimeUnit::Millisecond => 1_000_000,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1,
    }
}

/// The window bounds of each event time that HOP and CUMULATE repeat a row
/// over, in the time column's own unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum WindowBounds {
    /// The starts of the HOP windows holding `t`, newest first.
    HopStarts { slide: i64, size: i64 },
    /// The ends of the CUMULATE windows holding `t`, shortest first.
    CumulateEnds { step: i64, size: i64 },
}

impl WindowBounds {
    /// Pushes the bounds of the windows holding `t` onto `out`.
    fn of(self, t: i64, out: &mut Vec<i64>) {
        match self {
            Self::HopStarts { slide, size } => {
                let mut start = t - t.rem_euclid(slide);
                while start > t - size {
                    out.push(start);
                    start -= slide;
                }
            }
            Self::CumulateEnds { step, size } => {
                let start = t - t.rem_euclid(size);
                let mut end = t - t.rem_euclid(step) + step;
                while end <= start + size {
                    out.push(end);
                    end += step;
                }
            }
        }
    }

    /// How many windows hold a row.
    fn per_row(self) -> usize {
        match self {
            Self::HopStarts { slide, size } => (size / slide) as usize,
            Self::CumulateEnds { step, size } => (size / step) as usize,
        }
    }

    /// `df` with one row per window holding `time`, and the column holding
    /// the window's bound.
    fn unnest(self, df: DataFrame, time: Expr) -> Result<(DataFrame, Expr)> {
        const BOUNDS: &str = "__sluice_window_bounds";
        let udf = ScalarUDF::from(WindowBoundsUdf {
            bounds: self,
            signature: Signature::any(1, Volatility::Immutable),
        });
        let df = df
            .with_column(BOUNDS, udf.call(vec![time]))?
            .unnest_columns(&[BOUNDS])?;
        Ok((df, Expr::Column(Column::from_name(BOUNDS))))
    }
}

/// [`WindowBounds`] as a function: a list of bounds per row.
#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowBoundsUdf {
    bounds: WindowBounds,
    signature: Signature,
}

impl ScalarUDFImpl for WindowBoundsUdf {
    fn name(&self) -> &str {
        match self.bounds {
            WindowBounds::HopStarts { .. } => "hop_window_starts",
            WindowBounds::CumulateEnds { .. } => "cumulate_window_ends",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        let item = args.first().cloned().unwrap_or(DataType::Null);
        Ok(DataType::List(Arc::new(Field::new_list_field(item, true))))
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let [time] = args.args.as_slice() else {
            return Err(datafusion::error::DataFusionError::Internal(format!(
                "{} takes one argument",
                self.name()
            )));
        };
        let time = time.to_array(args.number_rows)?;
        let item_type = time.data_type().clone();
        let values = cast(&time, &DataType::Int64)?;
        let values = values.as_primitive::<Int64Type>();
        let mut bounds = Vec::with_capacity(values.len() * self.bounds.per_row());
        let mut offsets = Vec::with_capacity(values.len() + 1);
        offsets.push(0i32);
        for (i, t) in values.values().iter().enumerate() {
            if values.is_valid(i) {
                self.bounds.of(*t, &mut bounds);
            }
            let end = i32::try_from(bounds.len()).map_err(|_| {
                datafusion::error::DataFusionError::Execution(
                    "too many windows in one batch".into(),
                )
            })?;
            offsets.push(end);
        }
        let bounds = cast(&Int64Array::from(bounds), &item_type)?;
        let list = ListArray::try_new(
            Arc::new(Field::new_list_field(item_type, true)),
            OffsetBuffer::new(offsets.into()),
            bounds,
            time.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}
