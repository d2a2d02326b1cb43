//! Event time: watermarks and late rows.
//!
//! A stream may declare `WATERMARK FOR ts AS ts - INTERVAL '5' SECOND`
//! (API: [`StreamFrame::with_watermark`](crate::StreamFrame::with_watermark)):
//! its rows are expected to arrive at most 5 seconds out of order. The rules,
//! chosen to match Spark's and close windows one epoch sooner than Spark does:
//!
//! - An input's watermark is the largest event time it has read, minus the
//!   delay; it never goes back. An input that has read no rows yet has none
//!   and does not hold the query back (Spark's behaviour).
//! - An input whose source names its partitions (Kafka's, see
//!   [`Source::partition_ids`](crate::Source::partition_ids)) keeps that
//!   largest event time per partition, and its watermark is the least over
//!   the partitions that have read a row, as Flink's Kafka source does: a
//!   partition that an epoch read less far into than another does not see
//!   its rows dropped as late for it. A partition that stops receiving
//!   rows holds the watermark where it is.
//! - The query's watermark is the minimum over its inputs' watermarks.
//! - Epoch N runs with the watermark left by epoch N-1: its rows older than
//!   that are *late*. Stateful event-time operators drop them before they
//!   touch state, and progress counts them (`late_rows`).
//! - After epoch N's rows are read the watermark advances, and windows that
//!   end at or before it are emitted and evicted in epoch N itself; no extra
//!   empty epoch is needed to close them.
//! - Each input's watermark is stored with the epoch's commit (and the Kafka
//!   progress record), so a replayed epoch sees exactly the watermark it saw
//!   the first time and drops exactly the same rows.
//! - `CURRENT_WATERMARK(ts)` ([`current`]) is the watermark epoch N's rows
//!   are judged by, so `ts < CURRENT_WATERMARK(ts)` holds for exactly the
//!   rows a stateful operator would drop as late.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray, BooleanArray, Int64Array, Scalar};
use datafusion::arrow::compute::kernels::cmp::{gt_eq, lt};
use datafusion::arrow::compute::{cast, filter_record_batch, max, not};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use crate::checkpoint::PartitionWatermarks;
use crate::error::{Result, SluiceError};
use crate::source::Partitions;

pub(crate) mod aligned;
pub(crate) mod current;
pub(crate) mod processing_time;
pub(crate) use aligned::Aligned;
pub use current::CurrentWatermark;
pub use processing_time::Proctime;

/// A stream's declared event-time column and how late its rows may be.
///
/// ```
/// use std::time::Duration;
/// use sluice_engine::WatermarkSpec;
/// let spec = WatermarkSpec::new("ts", Duration::from_secs(5));
/// assert_eq!(spec.to_string(), "WATERMARK FOR ts AS ts - 5s");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatermarkSpec {
    /// The event-time column (a TIMESTAMP).
    pub column: String,
    /// How far behind the latest event time the watermark trails.
    pub delay: Duration,
    /// On a repartition channel read back: the watermark is not the rows'
    /// progress but what the upstream tasks say (see [`aligned`]).
    pub(crate) aligned: Option<Aligned>,
}

impl WatermarkSpec {
    /// A watermark on `column` trailing the latest event time by `delay`.
    pub fn new(column: impl Into<String>, delay: Duration) -> Self {
        Self {
            column: column.into(),
            delay,
            aligned: None,
        }
    }

    /// This spec, its watermark taken from the upstream tasks' watermark
    /// rows instead of the rows' times.
    pub(crate) fn aligned(self, aligned: Aligned) -> Self {
        Self {
            aligned: Some(aligned),
            ..self
        }
    }

    /// Checks that the column exists in `schema` and holds timestamps.
    pub(crate) fn check(&self, stream: &str, schema: &SchemaRef) -> Result<usize> {
        let (index, field) = schema.column_with_name(&self.column).ok_or_else(|| {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            let hint = crate::options::closest(&self.column, names.iter().copied())
                .map(|c| format!(" (did you mean '{c}'?)"))
                .unwrap_or_default();
            SluiceError::plan(format!(
                "WATERMARK FOR {}: stream '{stream}' has no column '{}'{hint}; its columns are {}",
                self.column,
                self.column,
                names.join(", ")
            ))
        })?;
        if !matches!(field.data_type(), DataType::Timestamp(..)) {
            return Err(SluiceError::plan(format!(
                "WATERMARK FOR {}: the column is {}, but event time must be a TIMESTAMP; convert \
                 it first (for example with to_timestamp_millis) in a stream of its own",
                self.column,
                field.data_type()
            )));
        }
        Ok(index)
    }
}

impl std::fmt::Display for WatermarkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WATERMARK FOR {} AS {} - {:?}",
            self.column, self.column, self.delay
        )
    }
}

/// One input's event-time column and watermark.
#[derive(Debug)]
struct Tracked {
    key: String,
    column: usize,
    delay_ns: i64,
    current: Option<i64>,
    /// Per partition of a source that names them, its own watermark; on a
    /// channel read back, per upstream task.
    partitions: BTreeMap<u32, i64>,
    /// On a channel read back, its upstream tasks (see [`aligned`]).
    upstream: Option<aligned::Upstream>,
    /// Whether the input's watermark judges rows and moves the query's:
    /// not on processing time, where a channel's watermark rows are only
    /// taken out.
    judges: bool,
}

/// The watermarks of one query's inputs (nanoseconds since the Unix epoch).
#[derive(Debug, Default)]
pub(crate) struct WatermarkTracker {
    /// Per input, in plan order; `None` for an input without a watermark.
    inputs: Vec<Option<Tracked>>,
    clock: Clock,
}

/// Which time a query's watermark follows.
#[derive(Debug, Default)]
enum Clock {
    /// The event time its inputs declare.
    #[default]
    Event,
    /// The planned time of its latest epoch (see `processing_time`).
    Processing { now: Option<i64> },
}

impl WatermarkTracker {
    /// Tracks the inputs, each `(checkpoint key, schema, declared
    /// watermark)`; on `processing_time`, the epochs' planned times instead
    /// (the inputs' declared watermarks then judge no row late).
    pub(crate) fn new<'a>(
        inputs: impl IntoIterator<Item = (&'a str, &'a str, SchemaRef, Option<&'a WatermarkSpec>)>,
        processing_time: bool,
    ) -> Result<Self> {
        let mut tracked = Vec::new();
        for (key, stream, schema, spec) in inputs {
            let spec = spec.filter(|s| !processing_time || s.aligned.is_some());
            tracked.push(match spec {
                None => None,
                Some(spec) => Some(Tracked {
                    key: key.to_string(),
                    column: spec.check(stream, &schema)?,
                    delay_ns: i64::try_from(spec.delay.as_nanos()).unwrap_or(i64::MAX),
                    current: None,
                    partitions: BTreeMap::new(),
                    upstream: spec
                        .aligned
                        .map(|a| aligned::Upstream::new(&schema, a))
                        .transpose()?,
                    judges: !processing_time,
                }),
            });
        }
        let clock = match processing_time {
            true => Clock::Processing { now: None },
            false => Clock::Event,
        };
        Ok(Self {
            inputs: tracked,
            clock,
        })
    }

    /// Whether input `index` has a watermark.
    pub(crate) fn tracks(&self, index: usize) -> bool {
        matches!(self.inputs.get(index), Some(Some(t)) if t.judges)
    }

    /// The query's watermark: the minimum over inputs that have one, or on
    /// processing time the latest epoch's planned time. A repartition
    /// channel without one yet (an upstream task has not sent its own)
    /// holds it back: the other side of a divided join, or a chain's link
    /// whose upstream is still starting, must not expire what that channel
    /// will bring.
    pub(crate) fn current(&self) -> Option<i64> {
        match self.clock {
            Clock::Event => {
                let tracked = self.inputs.iter().flatten();
                if tracked
                    .clone()
                    .any(|t| t.upstream.is_some() && t.current.is_none())
                {
                    return None;
                }
                tracked.filter_map(|t| t.current).min()
            }
            Clock::Processing { now } => now,
        }
    }

    /// On input `index`, a repartition channel read back at `now_ms` (the
    /// epoch's planned time): takes its upstream tasks' watermark rows out
    /// of `partitions`, and moves its watermark to what they say (see
    /// [`aligned`]). Any other input's rows are returned as they are.
    pub(crate) fn take_upstream_watermarks(
        &mut self,
        index: usize,
        partitions: Partitions,
        now_ms: i64,
    ) -> Result<Partitions> {
        let Some(Some(t)) = self.inputs.get_mut(index) else {
            return Ok(partitions);
        };
        let Some(upstream) = &mut t.upstream else {
            return Ok(partitions);
        };
        let kept = upstream.take(partitions, &mut t.partitions, now_ms)?;
        if t.judges {
            t.current = t.current.max(upstream.watermark(&t.partitions, now_ms));
        }
        Ok(kept)
    }

    /// On processing time, moves the watermark to the planned time of the
    /// epoch being admitted (ms since the Unix epoch); never back, should
    /// the wall clock be set back.
    pub(crate) fn observe_clock(&mut self, planned_at_ms: i64) {
        if let Clock::Processing { now } = &mut self.clock {
            let ns = planned_at_ms.saturating_mul(1_000_000);
            *now = Some(now.map_or(ns, |n| n.max(ns)));
        }
    }

    /// Removes input `index`'s rows older than `watermark` (the query's,
    /// before this epoch); returns the rows kept, how many were dropped,
    /// and, with `keep_late`, the dropped rows themselves. Rows without an event
    /// time cannot be placed and count as late too.
    pub(crate) fn drop_late(
        &self,
        index: usize,
        partitions: Partitions,
        watermark: Option<i64>,
        keep_late: bool,
    ) -> Result<(Partitions, u64, Vec<RecordBatch>)> {
        let (Some(Some(t)), Some(watermark)) = (self.inputs.get(index), watermark) else {
            return Ok((partitions, 0, Vec::new()));
        };
        if !t.judges {
            return Ok((partitions, 0, Vec::new()));
        }
        let mut dropped = 0;
        let mut late = Vec::new();
        let mut kept = Vec::with_capacity(partitions.len());
        for partition in partitions {
            let mut out = Vec::with_capacity(partition.len());
            for batch in partition {
                let times = nanos(batch.column(t.column))?;
                let keep = gt_eq(&times, &Scalar::new(Int64Array::from(vec![watermark])))?;
                let keep = match keep.nulls() {
                    // Null comparisons (null event time) do not keep the row.
                    Some(_) => BooleanArray::from_iter(keep.iter().map(|v| Some(v == Some(true)))),
                    None => keep,
                };
                let n = keep.true_count();
                dropped += (batch.num_rows() - n) as u64;
                if keep_late && n < batch.num_rows() {
                    late.push(filter_record_batch(&batch, &not(&keep)?)?);
                }
                out.push(if n == batch.num_rows() {
                    batch
                } else {
                    filter_record_batch(&batch, &keep)?
                });
            }
            kept.push(out);
        }
        Ok((kept, dropped, late))
    }

    /// Advances input `index`'s watermark past the rows it read; with
    /// `ids` (the source's name for each of `partitions`), per partition.
    pub(crate) fn observe(
        &mut self,
        index: usize,
        partitions: &Partitions,
        ids: Option<&[u32]>,
    ) -> Result<()> {
        let Some(Some(t)) = self.inputs.get_mut(index) else {
            return Ok(());
        };
        // A channel's watermark is its upstream tasks', not its rows'.
        if t.upstream.is_some() || !t.judges {
            return Ok(());
        }
        let latest = |batches: &[RecordBatch]| -> Result<Option<i64>> {
            let mut latest = None;
            for batch in batches {
                let times = nanos(batch.column(t.column))?;
                latest = latest.max(max(times.as_primitive::<Int64Type>()));
            }
            Ok(latest.map(|l| l.saturating_sub(t.delay_ns)))
        };
        let candidate = match ids {
            None => {
                let mut candidate = None;
                for partition in partitions {
                    candidate = candidate.max(latest(partition)?);
                }
                candidate
            }
            Some(ids) => {
                if ids.len() != partitions.len() {
                    return Err(SluiceError::Internal(format!(
                        "input '{}': the source named {} partitions but read {}",
                        t.key,
                        ids.len(),
                        partitions.len()
                    )));
                }
                for (id, partition) in ids.iter().zip(partitions) {
                    if let Some(l) = latest(partition)? {
                        let entry = t.partitions.entry(*id).or_insert(l);
                        *entry = (*entry).max(l);
                    }
                }
                t.partitions.values().copied().min()
            }
        };
        t.current = t.current.max(candidate);
        Ok(())
    }

    /// Each input's watermark, or the processing time, for the commit
    /// record.
    pub(crate) fn to_record(&self) -> BTreeMap<String, i64> {
        let mut record: BTreeMap<String, i64> = self
            .inputs
            .iter()
            .flatten()
            .filter_map(|t| Some((t.key.clone(), t.current?)))
            .collect();
        if let Clock::Processing { now: Some(now) } = self.clock {
            record.insert(processing_time::RECORD_KEY.to_string(), now);
        }
        record
    }

    /// Each partition's watermark of the inputs whose sources name them,
    /// for the commit record.
    pub(crate) fn partitions_to_record(&self) -> PartitionWatermarks {
        self.inputs
            .iter()
            .flatten()
            .filter(|t| !t.partitions.is_empty())
            .map(|t| {
                (
                    t.key.clone(),
                    t.partitions.iter().map(|(p, w)| (*p, *w)).collect(),
                )
            })
            .collect()
    }

    /// Resumes from a commit record's watermarks. A record written before
    /// watermarks were kept per partition has none: the input's watermark
    /// then stands until its partitions pass it.
    pub(crate) fn restore(
        &mut self,
        record: &BTreeMap<String, i64>,
        partitions: &PartitionWatermarks,
    ) {
        for t in self.inputs.iter_mut().flatten() {
            t.current = record.get(&t.key).copied();
            t.partitions = partitions
                .get(&t.key)
                .map(|p| p.iter().copied().collect())
                .unwrap_or_default();
        }
        if let Clock::Processing { now } = &mut self.clock {
            *now = record.get(processing_time::RECORD_KEY).copied();
        }
    }
}

/// A timestamp column as Int64 nanoseconds since the Unix epoch.
pub(crate) fn nanos(column: &Arc<dyn Array>) -> Result<Arc<dyn Array>> {
    let as_ns = cast(column, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
    Ok(cast(&as_ns, &DataType::Int64)?)
}

/// Splits `batch` into the rows whose time column is before `limit` (ns)
/// and the rest.
pub(crate) fn split_before(
    batch: &RecordBatch,
    column: usize,
    limit: i64,
) -> Result<(RecordBatch, RecordBatch)> {
    let times = nanos(batch.column(column))?;
    let before = lt(&times, &Scalar::new(Int64Array::from(vec![limit])))?;
    let before = if before.null_count() > 0 {
        datafusion::arrow::compute::prep_null_mask_filter(&before)
    } else {
        before
    };
    Ok((
        filter_record_batch(batch, &before)?,
        filter_record_batch(batch, &not(&before)?)?,
    ))
}

/// Nanoseconds since the Unix epoch as RFC 3339, for progress reports.
pub(crate) fn format_nanos(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMillisecondArray;
    use datafusion::arrow::datatypes::{Field, Schema};

    fn tracker() -> WatermarkTracker {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        )]));
        let spec = WatermarkSpec::new("ts", Duration::from_millis(10));
        WatermarkTracker::new([("bids", "bids", schema, Some(&spec))], false).unwrap()
    }

    /// One partition of rows at the given times (ms).
    fn rows(times: &[i64]) -> Vec<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        )]));
        let times = TimestampMillisecondArray::from(times.to_vec());
        vec![RecordBatch::try_new(schema, vec![Arc::new(times)]).unwrap()]
    }

    const MS: i64 = 1_000_000;

    #[test]
    fn a_partition_behind_the_others_holds_the_watermark_and_loses_no_row() {
        let mut w = tracker();
        // Epoch 1 read partition 0 up to 1000 ms, partition 1 up to 200 ms.
        let epoch1 = vec![rows(&[100, 1000]), rows(&[150, 200])];
        w.observe(0, &epoch1, Some(&[0, 1])).unwrap();
        assert_eq!(w.current(), Some(190 * MS));
        // Partition 1's next rows (300 ms) are not late, though partition 0
        // is far ahead: an input-wide maximum would have dropped them.
        let epoch2 = vec![rows(&[300])];
        let (kept, dropped, _) = w.drop_late(0, epoch2.clone(), w.current(), false).unwrap();
        assert_eq!((dropped, kept[0][0].num_rows()), (0, 1));
        w.observe(0, &epoch2, Some(&[1])).unwrap();
        assert_eq!(w.current(), Some(290 * MS));
        // Rows older than partition 1's own progress are late.
        let (_, dropped, _) = w
            .drop_late(0, vec![rows(&[250])], w.current(), false)
            .unwrap();
        assert_eq!(dropped, 1);

        // The commit record carries each partition's watermark, and a
        // restored tracker goes on from them.
        let mut restored = tracker();
        restored.restore(&w.to_record(), &w.partitions_to_record());
        assert_eq!(restored.current(), Some(290 * MS));
        restored
            .observe(0, &vec![rows(&[2000])], Some(&[1]))
            .unwrap();
        assert_eq!(restored.current(), Some(990 * MS));
    }

    #[test]
    fn a_partition_seen_late_never_moves_the_watermark_back() {
        let mut w = tracker();
        w.observe(0, &vec![rows(&[1000])], Some(&[0])).unwrap();
        assert_eq!(w.current(), Some(990 * MS));
        w.observe(0, &vec![rows(&[500])], Some(&[1])).unwrap();
        assert_eq!(w.current(), Some(990 * MS));
        // Without ids the input's rows are one sequence, as before.
        let mut whole = tracker();
        whole
            .observe(0, &vec![rows(&[1000]), rows(&[200])], None)
            .unwrap();
        assert_eq!(whole.current(), Some(990 * MS));
    }

    #[test]
    fn ids_that_do_not_match_the_partitions_are_an_error_not_a_guess() {
        let mut w = tracker();
        let err = w.observe(0, &vec![rows(&[1])], Some(&[0, 1])).unwrap_err();
        assert!(
            err.to_string().contains("named 2 partitions but read 1"),
            "{err}"
        );
    }
}
