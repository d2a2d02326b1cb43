//! The Kafka source: planned, replayable offset ranges read `read_committed`.
//!
//! Sluice assigns partitions itself (no consumer-group rebalancing). Each
//! epoch plans, per partition, a range `[from, to)` with `to` at most the
//! partition's last stable offset (and at most its share of
//! `max-records-per-epoch`); the plan is the offset JSON
//! `{"ranges": {"<partition>": [from, to]}}`, so replaying an epoch reads
//! exactly the same records. The reader stops when its position reaches
//! `to`, not after a count of records: transaction markers and aborted
//! records take offsets without yielding rows.
//!
//! In the steady state an epoch asks the broker nothing: the partitions
//! stay assigned between epochs and librdkafka fetches ahead (see
//! [`fetch`]), so a plan takes what has arrived (every record a
//! `read_committed` consumer receives is below the last stable offset) and
//! the read hands it over; the topic's partitions are the last ones the
//! broker named, refreshed in the background (see [`metadata`]). The first plan, a plan after an error,
//! and a replay ask the broker for each partition's offsets, as does an
//! `available-now` query once, at its start, for where it stops.
//!
//! Rows are decoded column-at-a-time (arrow-json's decoder over all of an
//! epoch's messages); only when that fails is each message decoded alone,
//! to name the bad one (topic, partition, offset) or, with
//! `format.on-error = 'skip'`, to drop it. Virtual columns `_key`, `_topic`,
//! `_partition`, `_offset`, `_timestamp` follow the declared ones.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sluice_engine::{
    GroupOffsets, Offset, Partitions, Rejected, Result, SluiceError, Source, SourceFactory,
    TaskAssigner, TaskId,
};

mod config;
mod debezium;
mod decode;
mod fetch;
mod metadata;
mod purge;

use crate::client::{Detached, Role};
use crate::group::KafkaTaskGroup;
pub(crate) use config::factory;
use config::{OnError, SourceConfig, StartupMode};
pub use decode::decode_json;
use fetch::{Fetched, LaneError, Lanes};
use metadata::KnownPartitions;
use purge::Purger;

#[derive(Debug)]
pub(crate) struct KafkaSourceFactory(SourceConfig);

/// A read found a range starting where records are gone.
struct OutOfRange;

impl SourceFactory for KafkaSourceFactory {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.0.schema)
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        self.open(None)
    }

    fn create_task(&self, task: TaskId) -> Result<Arc<dyn Source>> {
        self.open(Some(task))
    }

    fn describe(&self) -> String {
        format!("kafka(topic={}, read_committed)", self.0.topic)
    }

    fn identity(&self) -> Option<String> {
        Some(format!("kafka topic {}", self.0.topic))
    }
}

impl KafkaSourceFactory {
    /// A source of its own consumers, reading every partition or `task`'s.
    fn open(&self, task: Option<TaskId>) -> Result<Arc<dyn Source>> {
        let c = &self.0;
        let consumer = new_consumer(c)?;
        Ok(Arc::new(KafkaSource(Arc::new(SourceInner {
            config: c.clone(),
            task,
            consumer: Mutex::new(Detached::new(consumer)),
            lanes: Mutex::new(None),
            partitions: Mutex::default(),
            initial: Mutex::new(BTreeMap::new()),
            cap: Mutex::new(None),
            record_bytes: Mutex::new(None),
            lag: Mutex::new(BTreeMap::new()),
            rejected: Mutex::default(),
            purger: Purger::new(c),
        }))))
    }
}

/// A `read_committed` consumer of the stream's connection that never
/// commits offsets: Sluice plans them.
fn new_consumer(c: &SourceConfig) -> Result<BaseConsumer> {
    let mut config = c.client.config(Role::Consumer);
    config
        // Never used for offsets. librdkafka wants one.
        .set(
            "group.id",
            format!("sluice-source-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        // A range that starts where records are gone is an error to
        // report, never a jump to the log's end (librdkafka's default).
        .set("auto.offset.reset", "error");
    // Defaults a user's `kafka.*` setting overrides:
    // - `fetch.wait.max.ms`: the broker held a read_committed fetch for as
    //   long as this allows (librdkafka's 500 ms) while new records waited:
    //   at 10 K records/s, p99 541 ms end to end, against 144 ms at 5 ms.
    // - `fetch.queue.backoff.ms`: once librdkafka holds
    //   `queued.min.messages` of a partition it stops fetching it for this
    //   long (1 s by default), even after an epoch took them: Nexmark q0's
    //   reads took 1.3-1.7 s per 250 K records, mostly waiting.
    for (key, value) in [("fetch.wait.max.ms", "10"), ("fetch.queue.backoff.ms", "5")] {
        if c.client.get(key).is_none() {
            config.set(key, value);
        }
    }
    c.client
        .create(&config, &format!("kafka source '{}'", c.stream))
}

/// `{"ranges": {"<partition>": [from, to]}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PlannedRanges {
    ranges: BTreeMap<i32, (i64, i64)>,
}

fn parse(offset: &Offset) -> Result<PlannedRanges> {
    serde_json::from_value(offset.clone())
        .map_err(|e| SluiceError::Internal(format!("kafka source offset {offset}: {e}")))
}

/// Each partition of `marks` (low watermark, last stable offset) at the
/// offset Kafka `found` for it, moved into its range; `missing(partition,
/// low, high)` where Kafka has none.
fn found_positions(
    found: &TopicPartitionList,
    topic: &str,
    marks: &BTreeMap<i32, (i64, i64)>,
    missing: impl Fn(i32, i64, i64) -> i64,
) -> BTreeMap<i32, i64> {
    marks
        .iter()
        .map(|(&p, &(low, high))| {
            let pos = match found.find_partition(topic, p).map(|e| e.offset()) {
                Some(KafkaOffset::Offset(o)) => o.clamp(low, high),
                _ => missing(p, low, high),
            };
            (p, pos)
        })
        .collect()
}

#[derive(Debug)]
struct KafkaSource(Arc<SourceInner>);

struct SourceInner {
    config: SourceConfig,
    /// The task whose partition this source reads; `None`: all of them.
    task: Option<TaskId>,
    /// For metadata and offset lookups.
    consumer: Mutex<Detached<BaseConsumer>>,
    /// The partitions being read, on a consumer of their own; none before
    /// the first plan and after an error.
    lanes: Mutex<Option<Lanes>>,
    /// The partitions this source reads, as the broker last said.
    partitions: Mutex<KnownPartitions>,
    /// Where partitions without a position start, fixed on first sight so
    /// that `latest` and `timestamp` are resolved once per run.
    initial: Mutex<BTreeMap<i32, i64>>,
    /// Per-partition end offsets when prepared for available-now.
    cap: Mutex<Option<BTreeMap<i32, i64>>>,
    /// The average size of a record (key and value) in the last read, for
    /// `max-bytes-per-epoch`; none before the first.
    record_bytes: Mutex<Option<f64>>,
    /// Per partition, the last stable offset minus the last planned end.
    lag: Mutex<BTreeMap<String, i64>>,
    /// What the last read could not decode and set aside.
    rejected: Mutex<Rejected>,
    /// With 'purge-committed', what deletes the records it committed past.
    purger: Option<Purger>,
}

impl Drop for SourceInner {
    fn drop(&mut self) {
        // The readers leave on a thread of their own, as the consumer does.
        let lanes = self.lanes.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(lanes) = lanes.take() {
            drop(Detached::new(lanes));
        }
    }
}

impl std::fmt::Debug for SourceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topic", &self.config.topic)
            .finish_non_exhaustive()
    }
}

impl SourceInner {
    fn unreachable(&self, what: &str, e: impl std::fmt::Display) -> SluiceError {
        SluiceError::Unreachable {
            what: format!(
                "kafka source '{}', brokers '{}'",
                self.config.stream,
                self.config.client.bootstrap()
            ),
            message: format!("{what}: {e}"),
            hint: Some(format!(
                "check that Kafka runs there (for a local one: scripts/kafka start) and that \
                 'bootstrap.servers' is right; the wait is set by 'connect.timeout' (now {:?})",
                self.config.client.timeout()
            )),
        }
    }

    /// Records `[from, to)` of `partition` are gone before the query read
    /// them (`why`): an error naming them, or with
    /// `'fail-on-data-loss' = 'false'` a warning, and they count as lost.
    fn data_loss(&self, partition: i32, from: i64, to: i64, why: &str) -> Result<()> {
        let (topic, stream) = (&self.config.topic, &self.config.stream);
        let what = format!("topic '{topic}' partition {partition}, offsets {from}..{to}");
        if self.config.fail_on_data_loss {
            return Err(SluiceError::External {
                what: format!("kafka source '{stream}'"),
                message: format!("data loss: {what} {why}"),
                hint: Some(
                    "nothing of this epoch was committed. Keep records longer than the query \
                     may stay behind (retention.ms), or accept the loss: with \
                     'fail-on-data-loss' = 'false' the query skips what is gone and counts it \
                     in progress (lost_records) and metrics (sluice_lost_records_total)"
                        .into(),
                ),
            });
        }
        tracing::warn!(stream = %stream, "data loss: {what} {why}; skipped ('fail-on-data-loss' = 'false')");
        self.rejected.lock().unwrap_or_else(|p| p.into_inner()).lost += (to - from).max(0) as u64;
        Ok(())
    }

    /// Each partition's `(low watermark, last stable offset)`.
    /// Fails fast when the brokers refuse the stream's login or TLS
    /// (checked once per process and connection settings).
    fn check_connection(&self) -> Result<()> {
        self.config
            .client
            .check_connection(&format!("kafka source '{}'", self.config.stream))
    }

    fn watermarks(&self) -> Result<BTreeMap<i32, (i64, i64)>> {
        let partitions = self.partitions()?;
        let consumer = self.consumer.lock().unwrap_or_else(|p| p.into_inner());
        let timeout = self.config.client.timeout();
        let mut out = BTreeMap::new();
        for p in partitions {
            let (low, high) = consumer
                .fetch_watermarks(&self.config.topic, p, timeout)
                .map_err(|e| self.unreachable("fetching offsets", e))?;
            out.insert(p, (low, high));
        }
        Ok(out)
    }

    /// Where each partition of `marks` (low watermark, last stable offset)
    /// starts under the startup mode, within the partition's range.
    fn startup_positions(&self, marks: &BTreeMap<i32, (i64, i64)>) -> Result<BTreeMap<i32, i64>> {
        let topic = &self.config.topic;
        Ok(match &self.config.startup {
            StartupMode::Earliest => marks.iter().map(|(p, (low, _))| (*p, *low)).collect(),
            StartupMode::Latest => marks.iter().map(|(p, (_, high))| (*p, *high)).collect(),
            StartupMode::Offsets(given) => marks
                .iter()
                .map(|(p, (low, high))| {
                    (*p, given.get(p).map_or(*low, |o| (*o).clamp(*low, *high)))
                })
                .collect(),
            StartupMode::GroupOffsets(group) => {
                let mut config = self.config.client.config(Role::Consumer);
                config
                    .set("group.id", group)
                    .set("enable.auto.commit", "false");
                let consumer: BaseConsumer = self
                    .config
                    .client
                    .create(&config, &format!("consumer group '{group}'"))?;
                let mut query = TopicPartitionList::new();
                for p in marks.keys() {
                    query.add_partition(topic, *p);
                }
                let committed = consumer
                    .committed_offsets(query, self.config.client.timeout())
                    .map_err(|e| {
                        self.unreachable(&format!("reading the offsets of group '{group}'"), e)
                    })?;
                // Never committed by the group: from the beginning, so
                // nothing is skipped.
                found_positions(&committed, topic, marks, |p, low, _| {
                    tracing::info!(
                        topic = %topic, partition = p, group = %group,
                        "the group has no offset for this partition; reading it from the \
                         beginning"
                    );
                    low
                })
            }
            StartupMode::Timestamp(ms) => {
                let mut query = TopicPartitionList::new();
                for p in marks.keys() {
                    query
                        .add_partition_offset(topic, *p, KafkaOffset::Offset(*ms))
                        .map_err(|e| self.unreachable("looking up offsets by time", e))?;
                }
                let found = self
                    .consumer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .offsets_for_times(query, self.config.client.timeout())
                    .map_err(|e| self.unreachable("looking up offsets by time", e))?;
                // No record at or after the time: start at the end.
                found_positions(&found, topic, marks, |_, _, high| high)
            }
        })
    }

    /// The epoch's cap in records per partition: the smaller of the record
    /// cap and the byte cap at the average record size read so far, shared
    /// evenly by `partitions`.
    fn share(&self, partitions: usize) -> i64 {
        let per_record = *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let by_bytes = per_record.map_or(u64::MAX, |b| (self.config.max_bytes as f64 / b) as u64);
        let with_data = partitions.max(1) as u64;
        (self.config.max_records.min(by_bytes) / with_data).max(1) as i64
    }

    fn plan(self: &Arc<Self>, start: Option<PlannedRanges>) -> Result<Option<PlannedRanges>> {
        let positions: BTreeMap<i32, i64> = start
            .map(|s| s.ranges.into_iter().map(|(p, (_, to))| (p, to)).collect())
            .unwrap_or_default();
        if let Some(plan) = self.plan_fetched(&positions)? {
            return Ok(plan);
        }
        let marks = self.watermarks()?;
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut initial = self.initial.lock().unwrap_or_else(|p| p.into_inner());
        if positions.is_empty() && initial.is_empty() {
            // Fixed at first sight, so 'latest' is resolved once per run.
            *initial = self.startup_positions(&marks)?;
        }
        let share = Some(self.share(marks.len()));
        let mut ranges = BTreeMap::new();
        let mut lag = BTreeMap::new();
        let mut any = false;
        for (&p, &pos) in &positions {
            if !marks.contains_key(&p) {
                self.data_loss(
                    p,
                    pos,
                    pos,
                    "cannot be read: the partition is gone (the topic was deleted and \
                     recreated with fewer partitions)",
                )?;
            }
        }
        for (&p, &(low, high)) in &marks {
            let from = match positions.get(&p) {
                Some(&pos) if pos < low => {
                    self.data_loss(
                        p,
                        pos,
                        low,
                        "were deleted (retention or delete_records) before the query read them",
                    )?;
                    low
                }
                Some(&pos) if pos > high => {
                    // The log ends before where the query had read to.
                    self.data_loss(
                        p,
                        high,
                        pos,
                        &format!(
                            "are gone: the query had read up to {pos} but the partition now \
                             ends at {high} (the topic was deleted and recreated, or its log \
                             truncated); going on would skip whatever the new log holds below \
                             {pos}"
                        ),
                    )?;
                    // Skipped: start over at the new log's beginning.
                    low
                }
                Some(&pos) => pos,
                // A partition added after the start is read from its
                // beginning.
                None => *initial.entry(p).or_insert(low),
            };
            let mut to = high.max(from);
            if let Some(share) = share {
                to = to.min(from + share);
            }
            if let Some(c) = cap.as_ref().and_then(|c| c.get(&p)) {
                to = to.min(*c).max(from);
            }
            any |= to > from;
            ranges.insert(p, (from, to));
            lag.insert(p.to_string(), (high - to).max(0));
        }
        *self.lag.lock().unwrap_or_else(|p| p.into_inner()) = lag;
        drop(initial);
        // Fetching starts now, for this epoch and the next ones.
        let starts = ranges.iter().map(|(&p, &(from, _))| (p, from)).collect();
        self.lanes_at(&starts)?;
        Ok(any.then_some(PlannedRanges { ranges }))
    }

    /// The plan without a word to the broker, when the lanes stand where
    /// the epoch starts: up to each partition's share of what has arrived
    /// (or, for `available-now`, of what is below where it stops). `None`
    /// when the broker must be asked: nothing was planned yet, the
    /// partitions changed, the lanes are elsewhere (a replay) or failed.
    fn plan_fetched(
        self: &Arc<Self>,
        positions: &BTreeMap<i32, i64>,
    ) -> Result<Option<Option<PlannedRanges>>> {
        let partitions = self.known_partitions()?;
        let starts: Option<BTreeMap<i32, i64>> = {
            let initial = self.initial.lock().unwrap_or_else(|p| p.into_inner());
            if initial.is_empty() && positions.is_empty() {
                return Ok(None);
            }
            partitions
                .iter()
                .map(|&p| Some((p, *positions.get(&p).or_else(|| initial.get(&p))?)))
                .collect()
        };
        // A partition read before but gone from the metadata is data loss,
        // which the broker's offsets tell.
        let Some(starts) = starts.filter(|s| positions.keys().all(|p| s.contains_key(p))) else {
            return Ok(None);
        };
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = lanes
            .as_mut()
            .filter(|l| l.at(&starts) && l.len() == starts.len())
        else {
            return Ok(None);
        };
        let share = self.share(starts.len());
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ends = match &cap {
            // Everything below the cap is there to be read.
            Some(cap) => starts
                .iter()
                .map(|(&p, &from)| {
                    (
                        p,
                        cap.get(&p).map_or(from, |&c| c.min(from + share).max(from)),
                    )
                })
                .collect(),
            None => match held.drain(share as usize) {
                Ok(ends) => ends,
                // What went wrong is found out by asking the broker.
                Err(_) => {
                    *lanes = None;
                    return Ok(None);
                }
            },
        };
        let ranges: BTreeMap<i32, (i64, i64)> = starts
            .iter()
            .map(|(&p, &from)| (p, (from, ends.get(&p).copied().unwrap_or(from))))
            .collect();
        let ends = ranges.iter().map(|(&p, &(_, to))| (p, to)).collect();
        *self.lag.lock().unwrap_or_else(|p| p.into_inner()) = held
            .lag(&ends)
            .into_iter()
            .map(|(p, lag)| (p.to_string(), lag))
            .collect();
        let any = ranges.values().any(|(from, to)| to > from);
        Ok(Some(any.then_some(PlannedRanges { ranges })))
    }

    /// Makes the lanes stand at `starts`: kept when they do, else opened
    /// there on a new consumer.
    fn lanes_at(&self, starts: &BTreeMap<i32, i64>) -> Result<()> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if lanes.as_ref().is_some_and(|l| l.at(starts)) {
            return Ok(());
        }
        // The old consumer goes first: two would fetch the same partitions.
        *lanes = None;
        let consumer = new_consumer(&self.config)?;
        *lanes = Some(
            Lanes::open(consumer, &self.config.topic, starts)
                .map_err(|e| self.unreachable("assigning partitions", e))?,
        );
        Ok(())
    }

    /// Reads every range of `plan`; one partition of rows per Kafka
    /// partition. A range whose start is gone by now (deleted since it was
    /// planned, or before a replay) is data loss, as at planning.
    fn read(&self, plan: &PlannedRanges) -> Result<Partitions> {
        let mut wanted: Vec<(i32, i64, i64)> = plan
            .ranges
            .iter()
            .filter(|(_, (from, to))| to > from)
            .map(|(p, (from, to))| (*p, *from, *to))
            .collect();
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
    ) -> Result<std::result::Result<Vec<(i32, Fetched)>, OutOfRange>> {
        self.lanes_at(starts)?;
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = lanes.as_mut() else {
            return Err(SluiceError::Internal("kafka source: no lanes".into()));
        };
        let stall = self.config.client.timeout();
        let mut fetched = Vec::with_capacity(wanted.len());
        for &(p, _, to) in wanted {
            match held.take(p, to, stall) {
                Ok(records) => fetched.push((p, records)),
                Err(e) => {
                    *lanes = None;
                    return match e {
                        LaneError::OutOfRange => Ok(Err(OutOfRange)),
                        LaneError::Stalled(last) => {
                            let why = last.map_or(String::new(), |e| format!(" (last error: {e})"));
                            Err(self
                                .unreachable("reading", format!("no progress for {stall:?}{why}")))
                        }
                    };
                }
            }
        }
        let (count, bytes) = fetched.iter().fold((0, 0), |(n, b), (_, f)| {
            (n + f.len(), b + f.payload_bytes())
        });
        if count > 0 {
            *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((bytes as f64 / count as f64).max(1.0));
        }
        Ok(Ok(fetched))
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let start = start.map(parse).transpose()?;
        let inner = Arc::clone(&self.0);
        let plan = tokio::task::spawn_blocking(move || inner.plan(start))
            .await
            .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))??;
        plan.map(|p| serde_json::to_value(p).map_err(|e| SluiceError::Internal(e.to_string())))
            .transpose()
    }

    async fn read(&self, _start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let plan = parse(end)?;
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || inner.read(&plan))
            .await
            .map_err(|e| SluiceError::Internal(format!("kafka read task: {e}")))?
    }

    /// Kafka's `latest`, `timestamp` and `offsets` modes, resolved now:
    /// a range `[pos, pos)` per partition, whose end is where it starts.
    async fn initial_position(&self) -> Result<Option<Offset>> {
        if self.0.config.startup == StartupMode::Earliest {
            return Ok(None);
        }
        let inner = Arc::clone(&self.0);
        let starts = tokio::task::spawn_blocking(move || {
            let marks = inner.watermarks()?;
            inner.startup_positions(&marks)
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))??;
        let ranges = starts.into_iter().map(|(p, pos)| (p, (pos, pos))).collect();
        serde_json::to_value(PlannedRanges { ranges })
            .map(Some)
            .map_err(|e| SluiceError::Internal(e.to_string()))
    }

    async fn since_start(&self, end: &Offset) -> Result<Option<Offset>> {
        // With 'latest' the query began wherever the topic ended then.
        if self.0.config.startup == StartupMode::Latest {
            return Ok(None);
        }
        let end = parse(end)?;
        let inner = Arc::clone(&self.0);
        let starts = tokio::task::spawn_blocking(move || {
            let marks = inner.watermarks()?;
            inner.startup_positions(&marks)
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))??;
        let ranges = end
            .ranges
            .into_iter()
            .map(|(p, (_, to))| (p, (starts.get(&p).copied().unwrap_or(0).min(to), to)))
            .collect();
        serde_json::to_value(PlannedRanges { ranges })
            .map(Some)
            .map_err(|e| SluiceError::Internal(e.to_string()))
    }

    fn lag(&self) -> BTreeMap<String, i64> {
        self.0.lag.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn task_group(
        &self,
        query_id: &str,
        session_timeout: std::time::Duration,
    ) -> Result<Option<Arc<dyn TaskAssigner>>> {
        let c = &self.0.config;
        let group = KafkaTaskGroup::join(&c.client, &c.topic, query_id, session_timeout)?;
        Ok(Some(Arc::new(group)))
    }

    async fn partition_count(&self) -> Result<Option<u32>> {
        let inner = Arc::clone(&self.0);
        let partitions = tokio::task::spawn_blocking(move || inner.partitions())
            .await
            .map_err(|e| SluiceError::Internal(format!("partition count task: {e}")))??;
        Ok(Some(partitions.len() as u32))
    }

    /// With `'purge-committed'`, deletes what lies below `end`.
    fn committed(&self, end: &Offset) -> Result<()> {
        let Some(purger) = &self.0.purger else {
            return Ok(());
        };
        let positions = parse(end)?.ranges.into_iter().map(|(p, (_, to))| (p, to));
        purger.committed(&positions.collect())
    }

    fn take_rejected(&self) -> Rejected {
        std::mem::take(&mut *self.0.rejected.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn group_offsets(&self, end: &Offset) -> Option<GroupOffsets> {
        let group = self.0.config.group.clone()?;
        let end = parse(end).ok()?;
        Some(GroupOffsets {
            group,
            topic: self.0.config.topic.clone(),
            offsets: end.ranges.into_iter().map(|(p, (_, to))| (p, to)).collect(),
        })
    }

    fn commits_through_sink(&self) -> Option<String> {
        if matches!(self.0.config.on_error, OnError::DeadLetter(_)) {
            return Some("'format.on-error' = 'dead-letter'".into());
        }
        self.0
            .config
            .group
            .as_ref()
            .map(|g| format!("'group.id' = '{g}'"))
    }

    async fn prepare_available_now(&self) -> Result<()> {
        let inner = Arc::clone(&self.0);
        let marks = tokio::task::spawn_blocking(move || inner.watermarks())
            .await
            .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))??;
        *self.0.cap.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(marks.into_iter().map(|(p, (_, high))| (p, high)).collect());
        Ok(())
    }

    /// The cluster id the brokers report (KIP-78); none from a broker that
    /// does not answer within `connect.timeout` (the start then fails on
    /// what it reads).
    async fn cluster(&self) -> Result<Option<String>> {
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            inner.check_connection()?;
            // librdkafka answers the cluster id from the client's last
            // metadata; a client without any yet waits for a change of its
            // topic cache, and every start waited 1 s there. The topic's
            // metadata (which the first plan needs anyway) comes in one
            // round trip. A topic that is missing now is the plan's to
            // report (and wait for), as before.
            if let Err(e) = inner.partitions() {
                tracing::debug!(error = %e, "no metadata of the topic yet");
            }
            let consumer = inner.consumer.lock().unwrap_or_else(|p| p.into_inner());
            Ok(consumer
                .client()
                .fetch_cluster_id(inner.config.client.timeout()))
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka cluster task: {e}")))?
    }
}
