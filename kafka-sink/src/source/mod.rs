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
use rdkafka::message::{Message, Timestamp};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sluice_engine::{
    GroupOffsets, Offset, Partitions, Rejected, Result, SluiceError, Source, SourceFactory,
    TaskAssigner, TaskId,
};

mod config;
mod debezium;
mod decode;
mod purge;

use crate::client::Role;
use crate::group::KafkaTaskGroup;
use crate::position::Ended;
pub(crate) use config::factory;
use config::{OnError, SourceConfig, SourceFormat, StartupMode};
pub use decode::decode_json;
use decode::Record;
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
    /// A source of its own consumer, reading every partition or `task`'s.
    fn open(&self, task: Option<TaskId>) -> Result<Arc<dyn Source>> {
        let c = &self.0;
        let mut config = c.client.config(Role::Consumer);
        config
            // Never used for offsets: Sluice plans them. librdkafka wants one.
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
        let consumer: BaseConsumer = c
            .client
            .create(&config, &format!("kafka source '{}'", c.stream))?;
        Ok(Arc::new(KafkaSource(Arc::new(SourceInner {
            config: c.clone(),
            task,
            consumer: Mutex::new(consumer),
            initial: Mutex::new(BTreeMap::new()),
            cap: Mutex::new(None),
            record_bytes: Mutex::new(None),
            lag: Mutex::new(BTreeMap::new()),
            rejected: Mutex::default(),
            purger: Purger::new(c),
        }))))
    }
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
    consumer: Mutex<BaseConsumer>,
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

    /// The partitions this source reads (its task's, or all), from the
    /// topic's metadata alone.
    fn partitions(&self) -> Result<Vec<i32>> {
        self.check_connection()?;
        let consumer = self.consumer.lock().unwrap_or_else(|p| p.into_inner());
        let timeout = self.config.client.timeout();
        let metadata = consumer
            .fetch_metadata(Some(&self.config.topic), timeout)
            .map_err(|e| self.unreachable("fetching metadata", e))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.config.topic)
            .ok_or_else(|| {
                self.unreachable("fetching metadata", "topic missing from the answer")
            })?;
        if let Some(e) = topic.error() {
            return Err(SluiceError::External {
                what: format!(
                    "kafka source '{}', topic '{}'",
                    self.config.stream, self.config.topic
                ),
                message: format!("{e:?}"),
                hint: Some("create the topic, or fix 'topic'".into()),
            });
        }
        if let Some(task) = self.task {
            let count = topic.partitions().len();
            if count != task.count as usize {
                return Err(SluiceError::External {
                    what: format!(
                        "kafka source '{}', topic '{}'",
                        self.config.stream, self.config.topic
                    ),
                    message: format!(
                        "the topic now has {count} partitions, but the query was divided into \
                         {} tasks, one per partition: records of the new partitions would be \
                         read by no task, or keys would move between tasks",
                        task.count
                    ),
                    hint: Some(
                        "restart the query: each start divides it by the partitions of the \
                         moment. A stateful one then starts as a new query (a new \
                         'pipeline.name' and checkpoint location), since its keys moved between \
                         partitions"
                            .into(),
                    ),
                });
            }
        }
        Ok(topic
            .partitions()
            .iter()
            .map(|p| p.id())
            .filter(|&p| self.task.is_none_or(|t| t.reads(p)))
            .collect())
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

    fn plan(&self, start: Option<PlannedRanges>) -> Result<Option<PlannedRanges>> {
        let marks = self.watermarks()?;
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let positions: BTreeMap<i32, i64> = start
            .map(|s| s.ranges.into_iter().map(|(p, (_, to))| (p, to)).collect())
            .unwrap_or_default();
        let mut initial = self.initial.lock().unwrap_or_else(|p| p.into_inner());
        if positions.is_empty() && initial.is_empty() {
            // Fixed at first sight, so 'latest' is resolved once per run.
            *initial = self.startup_positions(&marks)?;
        }
        // The epoch's cap in records: the smaller of the record cap and the
        // byte cap at the average record size read so far, shared evenly.
        let per_record = *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let by_bytes = per_record.map_or(u64::MAX, |b| (self.config.max_bytes as f64 / b) as u64);
        let with_data = marks.len().max(1) as u64;
        let share = Some((self.config.max_records.min(by_bytes) / with_data).max(1) as i64);
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
        Ok(any.then_some(PlannedRanges { ranges }))
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
        loop {
            match self.read_ranges(&wanted)? {
                Ok(messages) => return self.decode_partitions(messages),
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
    fn read_ranges(
        &self,
        wanted: &[(i32, i64, i64)],
    ) -> Result<std::result::Result<BTreeMap<i32, Vec<Record>>, OutOfRange>> {
        let consumer = self.consumer.lock().unwrap_or_else(|p| p.into_inner());
        let mut messages: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        let mut tombstones = 0;
        let ended = crate::position::read_ranges(
            &consumer,
            &self.config.topic,
            wanted,
            self.config.client.timeout(),
            &|what, e| self.unreachable(what, e),
            |m| {
                // A tombstone (no value; for JSON and Avro also an empty
                // one) deletes a key in a compacted topic: on an append
                // stream it is no row, and is skipped and counted.
                let tombstone = match m.payload() {
                    None => true,
                    Some(v) => v.is_empty() && self.config.format != SourceFormat::Raw,
                };
                // On an upsert stream it deletes its key.
                if tombstone && !self.config.upsert {
                    tombstones += 1;
                    return Ok(());
                }
                messages.entry(m.partition()).or_default().push(Record {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    tombstone,
                    offset: m.offset(),
                    timestamp_ms: match m.timestamp() {
                        Timestamp::NotAvailable => None,
                        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
                    },
                });
                Ok(())
            },
        )?;
        let (count, bytes) = messages
            .values()
            .flatten()
            .fold((0usize, 0usize), |(n, b), r| {
                (
                    n + 1,
                    b + r.value.len() + r.key.as_ref().map_or(0, Vec::len),
                )
            });
        if count > 0 {
            *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((bytes as f64 / count as f64).max(1.0));
        }
        Ok(match ended {
            Ended::Reached => {
                self.rejected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .skipped += tombstones;
                Ok(messages)
            }
            Ended::OutOfRange => Err(OutOfRange),
        })
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let start = start.map(parse).transpose()?;
        if let (Some(purger), Some(committed)) = (&self.0.purger, &start) {
            let positions = committed.ranges.iter().map(|(&p, &(_, to))| (p, to));
            purger.committed(&positions.collect())?;
        }
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
            let consumer = inner.consumer.lock().unwrap_or_else(|p| p.into_inner());
            Ok(consumer
                .client()
                .fetch_cluster_id(inner.config.client.timeout()))
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka cluster task: {e}")))?
    }
}
