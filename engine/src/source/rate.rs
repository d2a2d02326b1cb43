//! The `rate` source: Spark's rate source, for demos, tests and benchmarks.
//!
//! Emits rows `(timestamp TIMESTAMP, value BIGINT)` at `rows_per_second`,
//! with `value` counting up from 0 and rows dealt round-robin over
//! `num_partitions` partitions as Spark does (partition `i` gets
//! `start + i, start + i + n, ...`).
//!
//! The offset is `{"end", "anchor_value", "anchor_ms"}`: rows below `end`
//! exist, and row `v`'s timestamp is `anchor_ms + (v - anchor_value) / rate`.
//! The anchor is set when a query (re)starts, so a restart after downtime
//! continues the count without a burst of backlog, and since every value the
//! rows depend on is in the offset, a replayed epoch yields the same rows.
//!
//! With `rows_per_batch` (Spark's `rate-micro-batch` source) every epoch
//! gets that many rows however long the last one took, for benchmarks that
//! compare engines epoch for epoch; timestamps still follow
//! `rows_per_second`.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{Int64Array, TimestampNanosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::{LazyPartition, Offset, Partitions, Source, SourceFactory};
use crate::error::{Result, SluiceError};

/// Rows per record batch: large enough for vectorised kernels to shine,
/// small enough to stay in cache-friendly chunks.
const BATCH_ROWS: usize = 64 * 1024;

/// The rate source's fixed schema.
fn rate_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            false,
        ),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// Creates the rate sources of a stream: `rows_per_second` over
/// `num_partitions` partitions, or `rows_per_batch` rows per epoch.
#[derive(Debug)]
pub(crate) struct RateFactory {
    rows_per_second: u64,
    num_partitions: usize,
    rows_per_batch: Option<u64>,
}

impl RateFactory {
    /// A factory of rate sources; every number at least 1, and the
    /// declared columns, if any, the fixed ones.
    pub(crate) fn new(
        rows_per_second: u64,
        num_partitions: usize,
        rows_per_batch: Option<u64>,
        declared: Option<&SchemaRef>,
    ) -> Result<Self> {
        if rows_per_second == 0 || num_partitions == 0 || rows_per_batch == Some(0) {
            return Err(SluiceError::config(
                "rate source: 'rows_per_second', 'num_partitions' and 'rows_per_batch' must be \
                 at least 1",
            ));
        }
        if declared.is_some_and(|d| d.fields() != rate_schema().fields()) {
            return Err(SluiceError::config(
                "the rate source has the fixed columns (timestamp TIMESTAMP, value BIGINT); \
                 leave the column list out",
            ));
        }
        Ok(Self {
            rows_per_second,
            num_partitions,
            rows_per_batch,
        })
    }
}

impl SourceFactory for RateFactory {
    fn schema(&self) -> SchemaRef {
        rate_schema()
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        let mut source = RateSource::new(self.rows_per_second, self.num_partitions);
        source.rows_per_batch = self.rows_per_batch;
        Ok(Arc::new(source))
    }

    fn describe(&self) -> String {
        let batch = self
            .rows_per_batch
            .map(|n| format!(", {n} rows per epoch"))
            .unwrap_or_default();
        format!(
            "rate({} rows/s, {} partitions{batch})",
            self.rows_per_second, self.num_partitions
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct RateOffset {
    end: i64,
    anchor_value: i64,
    anchor_ms: i64,
}

/// One query's rate source.
#[derive(Debug)]
pub(crate) struct RateSource {
    rows_per_second: u64,
    num_partitions: usize,
    schema: SchemaRef,
    /// `(anchor_value, anchor_ms)`, set on the first plan of this run.
    anchor: Mutex<Option<(i64, i64)>>,
    /// Upper bound on `end` once prepared for available-now.
    cap: Mutex<Option<i64>>,
    /// Rows per epoch, whatever the time (`rows_per_batch`).
    rows_per_batch: Option<u64>,
}

impl RateSource {
    /// A rate source emitting `rows_per_second` over `num_partitions`.
    pub(crate) fn new(rows_per_second: u64, num_partitions: usize) -> Self {
        Self {
            rows_per_second,
            num_partitions: num_partitions.max(1),
            schema: rate_schema(),
            anchor: Mutex::new(None),
            cap: Mutex::new(None),
            rows_per_batch: None,
        }
    }

    /// The rows of `[start, end)`: a generator per partition.
    fn partitions(&self, start: Option<&Offset>, end: &Offset) -> Result<Vec<PartitionRows>> {
        let start = start.map(parse).transpose()?.map_or(0, |o| o.end);
        let end = parse(end)?;
        let (rps, n) = (self.rows_per_second, self.num_partitions);
        Ok((0..n)
            .map(|p| PartitionRows::new(&self.schema, rps, n, p, start, end))
            .collect())
    }

    fn available_at(&self, start_end: i64, now_ms: i64) -> (i64, i64, i64) {
        let mut anchor = self.anchor.lock().unwrap_or_else(|p| p.into_inner());
        let (anchor_value, anchor_ms) = *anchor.get_or_insert((start_end, now_ms));
        let elapsed_ms = (now_ms - anchor_ms).max(0) as i128;
        let produced = elapsed_ms * self.rows_per_second as i128 / 1000;
        let end = anchor_value.saturating_add(produced.min(i64::MAX as i128) as i64);
        (end, anchor_value, anchor_ms)
    }
}

/// Generates partition `p`'s rows of `[start, offset.end)`, one batch at a
/// time, with timestamps from the offset's anchor: pure arithmetic on the
/// offsets, hence replayable.
struct PartitionRows {
    schema: SchemaRef,
    rps: i64,
    n: i64,
    /// The value of the next batch's first row.
    first: i64,
    offset: RateOffset,
}

impl PartitionRows {
    fn new(
        schema: &SchemaRef,
        rows_per_second: u64,
        num_partitions: usize,
        p: usize,
        start: i64,
        offset: RateOffset,
    ) -> Self {
        Self {
            schema: Arc::clone(schema),
            rps: rows_per_second as i64,
            n: num_partitions as i64,
            first: start + p as i64,
            offset,
        }
    }

    fn batch(&self, count: i64) -> Result<RecordBatch> {
        const NANOS: i64 = 1_000_000_000;
        let (rps, n, first, offset) = (self.rps, self.n, self.first, self.offset);
        // Row `v` is due at anchor + (v - anchor_value) / rps seconds.
        // Computed exactly for the batch's first row, then by adding the step
        // (whole nanoseconds plus a carried remainder): no division per row.
        let (step_ns, step_rem) = ((n * NANOS) / rps, (n * NANOS) % rps);
        let values = Int64Array::from_iter_values((0..count).map(|i| first + i * n));
        let d = first - offset.anchor_value;
        let mut ts = offset.anchor_ms * 1_000_000 + (d / rps) * NANOS + (d % rps) * NANOS / rps;
        let mut rem = (d % rps) * NANOS % rps;
        let times = if step_rem == 0 && rem == 0 {
            // The step is whole nanoseconds (e.g. 4M rows/s over 2
            // partitions: 500 ns): no carry, and the loop vectorises.
            let first_ts = ts;
            TimestampNanosecondArray::from_iter_values((0..count).map(|i| first_ts + i * step_ns))
        } else {
            TimestampNanosecondArray::from_iter_values((0..count).map(|_| {
                let now = ts;
                ts += step_ns;
                rem += step_rem;
                if rem >= rps {
                    rem -= rps;
                    ts += 1;
                }
                now
            }))
        };
        Ok(RecordBatch::try_new(
            Arc::clone(&self.schema),
            vec![Arc::new(times), Arc::new(values)],
        )?)
    }
}

impl Iterator for PartitionRows {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.first >= self.offset.end {
            return None;
        }
        let n = self.n;
        let count = ((self.offset.end - self.first + n - 1) / n).min(BATCH_ROWS as i64);
        let batch = self.batch(count);
        self.first += count * n;
        Some(batch)
    }
}

fn parse(offset: &Offset) -> Result<RateOffset> {
    serde_json::from_value(offset.clone())
        .map_err(|e| SluiceError::Internal(format!("rate offset {offset}: {e}")))
}

fn to_json(offset: RateOffset) -> Result<Offset> {
    serde_json::to_value(offset).map_err(|e| SluiceError::Internal(e.to_string()))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[async_trait]
impl Source for RateSource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let start_end = start.map(parse).transpose()?.map_or(0, |o| o.end);
        let (mut end, anchor_value, anchor_ms) = self.available_at(start_end, now_ms());
        if let Some(n) = self.rows_per_batch {
            end = start_end.saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Some(cap) = *self.cap.lock().unwrap_or_else(|p| p.into_inner()) {
            end = end.min(cap);
        }
        if end <= start_end {
            return Ok(None);
        }
        to_json(RateOffset {
            end,
            anchor_value,
            anchor_ms,
        })
        .map(Some)
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let partitions = self.partitions(start, end)?;
        // Generation is CPU work: one blocking task per partition, in
        // parallel, off the async reactor.
        let tasks: Vec<_> = partitions
            .into_iter()
            .map(|p| tokio::task::spawn_blocking(move || p.collect::<Result<Vec<_>>>()))
            .collect();
        let mut partitions = Vec::with_capacity(tasks.len());
        for task in tasks {
            partitions.push(
                task.await
                    .map_err(|e| SluiceError::Internal(format!("rate generator task: {e}")))??,
            );
        }
        Ok(partitions)
    }

    fn read_lazily(
        &self,
        start: Option<&Offset>,
        end: &Offset,
    ) -> Result<Option<Vec<LazyPartition>>> {
        let partitions = self.partitions(start, end)?;
        Ok(Some(
            partitions
                .into_iter()
                .map(|p| futures::stream::iter(p).boxed())
                .collect(),
        ))
    }

    async fn prepare_available_now(&self) -> Result<()> {
        // Rows that exist "now": everything up to the current time since the
        // anchor; a query that has not planned yet has none.
        let anchor = *self.anchor.lock().unwrap_or_else(|p| p.into_inner());
        let cap = match anchor {
            Some((value, ms)) => {
                value
                    + ((now_ms() - ms).max(0) as i128 * self.rows_per_second as i128 / 1000) as i64
            }
            None => 0,
        };
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(cap);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    fn values(parts: &Partitions) -> Vec<Vec<i64>> {
        parts
            .iter()
            .map(|p| {
                p.iter()
                    .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn rows_are_dealt_round_robin_with_spark_timestamps() {
        let off = RateOffset {
            end: 10,
            anchor_value: 0,
            anchor_ms: 1_000,
        };
        let parts: Partitions = (0..2)
            .map(|p| {
                PartitionRows::new(&rate_schema(), 4, 2, p, 3, off)
                    .collect::<Result<Vec<_>>>()
                    .unwrap()
            })
            .collect();
        assert_eq!(values(&parts), vec![vec![3, 5, 7, 9], vec![4, 6, 8]]);
        let ts = parts[0][0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>();
        // value 3 at 4 rows/s: 750 ms after the anchor.
        assert_eq!(ts.value(0), 1_750_000_000);
    }

    #[test]
    fn timestamps_match_the_exact_formula_for_every_row() {
        let off = RateOffset {
            end: 200_000,
            anchor_value: 7,
            anchor_ms: 123,
        };
        for (rps, parts) in [(7_000i64, 3usize), (4_000_000, 2)] {
            for p in 0..parts {
                let batches = PartitionRows::new(&rate_schema(), rps as u64, parts, p, 11, off)
                    .collect::<Result<Vec<_>>>()
                    .unwrap();
                for b in batches {
                    let values = b.column(1).as_primitive::<Int64Type>();
                    let ts = b
                        .column(0)
                        .as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>();
                    for (v, t) in values.values().iter().zip(ts.values()) {
                        let d = v - off.anchor_value;
                        let exact = off.anchor_ms * 1_000_000 + d * 1_000_000_000 / rps;
                        assert_eq!(*t, exact, "value {v} at {rps} rows/s");
                    }
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn replaying_a_range_yields_identical_rows() {
        let src = RateSource::new(1000, 3);
        let start = to_json(RateOffset {
            end: 100,
            anchor_value: 100,
            anchor_ms: 5,
        })
        .unwrap();
        let end = to_json(RateOffset {
            end: 250_000,
            anchor_value: 100,
            anchor_ms: 5,
        })
        .unwrap();
        let a = src.read(Some(&start), &end).await.unwrap();
        // A different instance, as after a restart.
        let b = RateSource::new(1000, 3)
            .read(Some(&start), &end)
            .await
            .unwrap();
        assert_eq!(a, b);
        let total: usize = a.iter().flatten().map(|b| b.num_rows()).sum();
        assert_eq!(total, 249_900);
        // Generated as a plan pulls it: the same rows.
        let mut c: Partitions = Vec::new();
        for p in src.read_lazily(Some(&start), &end).unwrap().unwrap() {
            c.push(
                p.collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect::<Result<_>>()
                    .unwrap(),
            );
        }
        assert_eq!(a, c);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_per_batch_gives_every_epoch_that_many_rows_whatever_the_time() {
        let mut src = RateSource::new(1, 2);
        src.rows_per_batch = Some(1_000);
        let mut start = None;
        for epoch in 1..=3i64 {
            let end = src.latest_offset(start.as_ref()).await.unwrap().unwrap();
            assert_eq!(parse(&end).unwrap().end, epoch * 1_000);
            let rows: usize = src
                .read(start.as_ref(), &end)
                .await
                .unwrap()
                .iter()
                .flatten()
                .map(|b| b.num_rows())
                .sum();
            assert_eq!(rows, 1_000, "epoch {epoch}");
            start = Some(end);
        }
    }
}
