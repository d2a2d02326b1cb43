//! Reading a planned epoch: its ranges taken from the lanes (the
//! partitions' consumer, fetching ahead) and decoded; a range whose start
//! is gone by the time it is read is data loss, as at planning.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use sluice_engine::{LazyPartition, Partitions, Result, SluiceError};

use super::fetch::{Fetched, LaneError, Taken};
use super::{PlannedRanges, SourceInner};

/// A read found a range starting where records are gone.
struct OutOfRange;

/// Where a lazy read's thread hands a partition's chunks.
type Chunks = tokio::sync::mpsc::UnboundedSender<Result<Fetched>>;

impl SourceInner {
    /// The rows of `plan`'s ranges as streams (under `'epoch.pipeline' =
    /// 'true'`: see `pipelines_by_default`),
    /// one per Kafka partition, when the lanes stand at its starts (the steady state; `None`
    /// otherwise, and for an upsert stream, whose partitions are decoded
    /// whole). A thread takes the records from the lanes
    /// as they arrive and hands them over chunk by chunk; each stream's
    /// chunks are decoded off the async threads as they arrive.
    /// A range found gone meanwhile fails the epoch as an outage, so that
    /// it is read again whole, where data loss is told apart.
    pub(super) fn read_lazily(
        self: &Arc<Self>,
        plan: &PlannedRanges,
    ) -> Result<Option<Vec<LazyPartition>>> {
        let starts: BTreeMap<i32, i64> = plan
            .ranges
            .iter()
            .map(|(&p, &(from, _))| (p, from))
            .collect();
        let ends: BTreeMap<i32, i64> = plan
            .ranges
            .iter()
            .filter(|(_, (from, to))| to > from)
            .map(|(&p, &(_, to))| (p, to))
            .collect();
        let positioned = {
            let lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
            lanes.as_ref().is_some_and(|l| l.at(&starts))
        };
        if self.config.upsert || ends.is_empty() || !positioned {
            return Ok(None);
        }
        let mut senders = BTreeMap::new();
        let mut streams = Vec::with_capacity(ends.len());
        for &p in ends.keys() {
            // Unbounded: a plan may pull one partition to its end before
            // the next, and the reader must not wait on it meanwhile. What
            // it holds is at most the epoch, as a whole read holds.
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            senders.insert(p, tx);
            streams.push(self.decoding(p, rx));
        }
        let inner = Arc::clone(self);
        std::thread::Builder::new()
            .name("sluice-kafka-read".into())
            .spawn(move || inner.hand_over(&starts, &ends, senders))
            .map_err(|e| SluiceError::Internal(format!("kafka reader thread: {e}")))?;
        Ok(Some(streams))
    }

    /// `read_lazily`'s thread: streams the records below `ends` from the
    /// lanes standing at `starts` into `senders`, or an error into each.
    fn hand_over(
        &self,
        starts: &BTreeMap<i32, i64>,
        ends: &BTreeMap<i32, i64>,
        mut senders: BTreeMap<i32, Chunks>,
    ) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let (mut count, mut bytes) = (0, 0);
        let streamed = match lanes.as_mut() {
            Some(held) if held.at(starts) => {
                held.stream(ends, self.config.client.timeout(), |p, chunk| {
                    count += chunk.len();
                    bytes += chunk.payload_bytes();
                    // A plan may stop pulling one partition (a limit) and
                    // go on with the others.
                    if senders
                        .get(&p)
                        .is_some_and(|tx| tx.send(Ok(chunk)).is_err())
                    {
                        senders.remove(&p);
                    }
                    !senders.is_empty()
                })
            }
            _ => Err(LaneError::Stalled(Some(
                "the partitions' consumer moved after the epoch was planned".into(),
            ))),
        };
        let failure = match streamed {
            Ok(true) => {
                self.note_record_size(count, bytes);
                return;
            }
            // Nobody reads on: the epoch failed or was dropped.
            Ok(false) => None,
            Err(e) => Some(e),
        };
        *lanes = None;
        drop(lanes);
        let Some(failure) = failure else { return };
        for tx in senders.values() {
            let error = match &failure {
                LaneError::OutOfRange => self.unreachable(
                    "reading",
                    "records of the epoch's range were deleted while it was read; the epoch is \
                     read again",
                ),
                LaneError::Stalled(last) => self.stalled(last.clone()),
            };
            let _ = tx.send(Err(error));
        }
    }

    /// Partition `p`'s rows from `chunks`: each chunk decoded on a blocking
    /// thread as soon as it arrives, a few at a time, in order, whether or
    /// not the plan pulls yet, so that an epoch read ahead is decoded while
    /// the one before it commits.
    fn decoding(
        self: &Arc<Self>,
        p: i32,
        chunks: tokio::sync::mpsc::UnboundedReceiver<Result<Fetched>>,
    ) -> LazyPartition {
        let inner = Arc::clone(self);
        let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut decoded =
            futures::stream::unfold(
                chunks,
                |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
            )
            .map(move |chunk| {
                let inner = Arc::clone(&inner);
                async move {
                    let chunk = chunk?;
                    tokio::task::spawn_blocking(move || {
                        inner.decode_chunks(p, std::slice::from_ref(&chunk))
                    })
                    .await
                    .map_err(|e| SluiceError::Internal(format!("kafka decoder task: {e}")))?
                }
            })
            .buffered(parallel)
            .boxed();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Ends when the chunks do, or when the plan drops the partition.
        tokio::spawn(async move {
            while let Some(batch) = decoded.next().await {
                if tx.send(batch).is_err() {
                    break;
                }
            }
        });
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
            .boxed()
    }

    /// Reads every range of `plan`; one partition of rows per Kafka
    /// partition. A range whose start is gone by now (deleted since it was
    /// planned, or before a replay) is data loss, as at planning.
    pub(super) fn read(&self, plan: &PlannedRanges) -> Result<Partitions> {
        let mut wanted: Vec<(i32, i64, i64)> = plan.to_read().collect();
        let mut starts: BTreeMap<i32, i64> = plan
            .ranges
            .iter()
            .map(|(&p, &(from, _))| (p, from))
            .collect();
        loop {
            starts.extend(wanted.iter().map(|&(p, from, _)| (p, from)));
            match self.read_ranges(&starts, &wanted)? {
                Ok(fetched) => return self.decode_partitions(fetched),
                Err(OutOfRange) => wanted = self.what_is_left(&wanted)?,
            }
        }
    }

    /// What of `wanted` can still be read, after one of them started where
    /// records are gone: each range starting below its partition's first
    /// offset is data loss (see [`data_loss`](Self::data_loss)) and, when
    /// that is accepted, starts at the first offset left.
    fn what_is_left(&self, wanted: &[(i32, i64, i64)]) -> Result<Vec<(i32, i64, i64)>> {
        let marks = self.watermarks()?;
        let mut left = Vec::with_capacity(wanted.len());
        for &(p, from, to) in wanted {
            let (low, high) = marks.get(&p).copied().unwrap_or((to, to));
            let why = "were deleted (retention or delete_records) before the query read them";
            let start = if from < low {
                self.data_loss(p, from, low.min(to), why)?;
                low.min(to)
            } else if high < from {
                self.data_loss(p, from, to, "are gone: the topic was deleted and recreated")?;
                to
            } else {
                from
            };
            left.push((p, start, to));
        }
        if left == wanted {
            return Err(SluiceError::External {
                what: format!("kafka source '{}'", self.config.stream),
                message: format!(
                    "topic '{}': reading {wanted:?} found an offset out of range, but every \
                     range is within its partition now",
                    self.config.topic
                ),
                hint: Some("restart the query; it re-reads the epoch".into()),
            });
        }
        Ok(left)
    }

    /// The records of `wanted`, by partition, or `Err(OutOfRange)` when a
    /// range starts where records are gone.
    /// The lanes stand at `starts` (every partition of the plan) for it.
    fn read_ranges(
        &self,
        starts: &BTreeMap<i32, i64>,
        wanted: &[(i32, i64, i64)],
    ) -> Result<std::result::Result<Taken, OutOfRange>> {
        self.lanes_at(starts)?;
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = lanes.as_mut() else {
            return Err(SluiceError::Internal("kafka source: no lanes".into()));
        };
        let stall = self.config.client.timeout();
        let ends: BTreeMap<i32, i64> = wanted.iter().map(|&(p, _, to)| (p, to)).collect();
        let mut fetched: Taken = wanted.iter().map(|&(p, ..)| (p, Vec::new())).collect();
        let streamed = held.stream(&ends, stall, |p, chunk| {
            if let Some((_, chunks)) = fetched.iter_mut().find(|(q, _)| *q == p) {
                chunks.push(chunk);
            }
            true
        });
        if let Err(e) = streamed {
            *lanes = None;
            return match e {
                LaneError::OutOfRange => Ok(Err(OutOfRange)),
                LaneError::Stalled(last) => Err(self.stalled(last)),
            };
        }
        let (count, bytes) = fetched
            .iter()
            .flat_map(|(_, chunks)| chunks)
            .fold((0, 0), |(n, b), f| (n + f.len(), b + f.payload_bytes()));
        self.note_record_size(count, bytes);
        Ok(Ok(fetched))
    }

    /// The error of a read that saw no progress for `stall`.
    fn stalled(&self, last: Option<String>) -> SluiceError {
        let stall = self.config.client.timeout();
        let why = last.map_or(String::new(), |e| format!(" (last error: {e})"));
        self.unreachable("reading", format!("no progress for {stall:?}{why}"))
    }

    /// Remembers the mean size of the records of a read, `count` of
    /// them in `bytes` (for the byte cap of the next plans).
    fn note_record_size(&self, count: usize, bytes: usize) {
        if count > 0 {
            *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((bytes as f64 / count as f64).max(1.0));
        }
    }
}
