//! The Kafka source: planned, replayable offset ranges read `read_committed`.
//!
//! Sluice assigns partitions itself (no consumer-group rebalancing). Each
//! epoch plans, per partition, a range `[from, to)` with `to` at most the
//! partition's last stable offset (and at most its share of
//! `max-records-per-epoch`); the plan is the offset JSON
//! `{"ranges": {"<partition>": [from, to]}}`, so replaying an epoch reads
//! exactly the same records ([`plan`]). The reader stops when its position
//! reaches `to`, not after a count of records: transaction markers and
//! aborted records take offsets without yielding rows ([`read`]).
//!
//! In the steady state an epoch asks the broker nothing: the partitions
//! stay assigned between epochs and librdkafka fetches ahead (see
//! [`fetch`]), so a plan takes what has arrived (every record a
//! `read_committed` consumer receives is below the last stable offset) and
//! the read hands it over; the topic's partitions are the last ones the
//! broker named, refreshed in the background (see [`metadata`]). The first
//! plan, a plan after an error, and a replay ask the broker for each
//! partition's offsets, as does an `available-now` query once, at its
//! start, for where it stops.
//!
//! Rows are decoded column-at-a-time (arrow-json's decoder over all of an
//! epoch's messages); only when that fails is each message decoded alone,
//! to name the bad one (topic, partition, offset) or, with
//! `format.on-error = 'skip'`, to drop it. Virtual columns `_key`, `_topic`,
//! `_partition`, `_offset`, `_timestamp` follow the declared ones.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use sluice_engine::{
    GroupOffsets, LazyPartition, Offset, Partitions, Rejected, Result, SluiceError, Source,
    SourceFactory, TaskAssigner, TaskId,
};

mod columns;
mod config;
mod debezium;
mod decode;
mod fetch;
#[cfg(test)]
mod fuzz;
mod group_offsets;
mod metadata;
mod plan;
mod purge;
mod read;

use crate::client::{Detached, Role};
use crate::group::KafkaTaskGroup;
pub(crate) use config::factory;
use config::{OnError, SourceConfig, StartupMode};
use fetch::Lanes;
use group_offsets::GroupCommitter;
use metadata::KnownPartitions;
use purge::Purger;

#[derive(Debug)]
pub(crate) struct KafkaSourceFactory(SourceConfig);

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
        Ok(Arc::new(KafkaSource(Arc::new(SourceInner::new(
            self.0.clone(),
            task,
        )?))))
    }
}

/// A `read_committed` consumer of the stream's connection that never
/// commits offsets: Sluice plans them.
fn new_consumer(c: &SourceConfig) -> Result<BaseConsumer> {
    c.client
        .create(&consumer_config(c), &format!("kafka source '{}'", c.stream))
}

/// The configuration of a source's consumers (see [`new_consumer`]).
fn consumer_config(c: &SourceConfig) -> ClientConfig {
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
    config
}

/// `{"ranges": {"<partition>": [from, to]}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PlannedRanges {
    ranges: BTreeMap<i32, (i64, i64)>,
}

impl PlannedRanges {
    /// The ranges with records to read, `(partition, from, to)`, in
    /// partition order: the order a read returns its partitions in.
    fn to_read(&self) -> impl Iterator<Item = (i32, i64, i64)> + '_ {
        self.ranges
            .iter()
            .filter(|(_, (from, to))| to > from)
            .map(|(p, (from, to))| (*p, *from, *to))
    }

    fn to_offset(&self) -> Result<Offset> {
        serde_json::to_value(self).map_err(|e| SluiceError::Internal(e.to_string()))
    }
}

/// One offset reading everything `ends` read: the ranges of each
/// partition any of them names (the ends of a divided query's tasks, each
/// reading its own partitions), a partition named twice read as far as
/// the furthest. A null end (a source that has read nothing) names none.
pub(crate) fn union(ends: &[&Offset]) -> Result<Offset> {
    let mut all = PlannedRanges::default();
    for end in ends.iter().filter(|e| !e.is_null()) {
        for (p, (from, to)) in parse(end)?.ranges {
            let range = all.ranges.entry(p).or_insert((from, to));
            *range = (range.0.min(from), range.1.max(to));
        }
    }
    all.to_offset()
}

/// Where `end` ends in each partition it names (none when it is null).
pub(crate) fn ends(end: &Offset) -> Result<BTreeMap<i32, i64>> {
    if end.is_null() {
        return Ok(BTreeMap::new());
    }
    Ok(parse(end)?
        .ranges
        .into_iter()
        .map(|(p, (_, to))| (p, to))
        .collect())
}

fn parse(offset: &Offset) -> Result<PlannedRanges> {
    serde_json::from_value(offset.clone())
        .map_err(|e| SluiceError::Internal(format!("kafka source offset {offset}: {e}")))
}

#[derive(Debug)]
struct KafkaSource(Arc<SourceInner>);

struct SourceInner {
    config: SourceConfig,
    /// The task whose partition this source reads; `None`: all of them.
    task: Option<TaskId>,
    /// For metadata and offset lookups; made on first use, so that
    /// planning a query (EXPLAIN) opens no connection.
    consumer: OnceLock<Mutex<Detached<BaseConsumer>>>,
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
    /// Whether the query reads `_key`: a key that is not UTF-8 text is
    /// then a bad record (`_key` is a VARCHAR, and two such keys given as
    /// text with replacement characters could become one).
    key_read: AtomicBool,
    /// With 'purge-committed', what deletes the records it committed past.
    purger: Option<Purger>,
    /// With 'group.id', what commits the group's offsets when the sink
    /// cannot take them with the epoch.
    group: Option<GroupCommitter>,
}

impl SourceInner {
    fn new(config: SourceConfig, task: Option<TaskId>) -> Result<Self> {
        // What librdkafka refuses of the settings is said now, at
        // planning, though the consumer connects only when first used.
        consumer_config(&config)
            .create_native_config()
            .map_err(|e| {
                config
                    .client
                    .creation_error(&format!("kafka source '{}'", config.stream), &e)
            })?;
        Ok(Self {
            task,
            consumer: OnceLock::new(),
            lanes: Mutex::new(None),
            partitions: Mutex::default(),
            initial: Mutex::new(BTreeMap::new()),
            cap: Mutex::new(None),
            record_bytes: Mutex::new(None),
            lag: Mutex::new(BTreeMap::new()),
            rejected: Mutex::default(),
            key_read: AtomicBool::new(false),
            purger: Purger::new(&config),
            group: GroupCommitter::new(&config),
            config,
        })
    }
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
    /// The consumer for metadata and offset lookups, made now if this is
    /// its first use.
    fn consumer(&self) -> Result<std::sync::MutexGuard<'_, Detached<BaseConsumer>>> {
        let consumer = match self.consumer.get() {
            Some(c) => c,
            None => {
                let made = Detached::new(new_consumer(&self.config)?);
                self.consumer.get_or_init(|| Mutex::new(made))
            }
        };
        Ok(consumer.lock().unwrap_or_else(|p| p.into_inner()))
    }

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
        let consumer = self.consumer()?;
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
}

impl SourceInner {
    /// Where an available-now query stops: each partition's last stable
    /// offset, once the transactions committed before the query started
    /// have their markers written (see `settle_stable_offsets`: without
    /// the wait, records a producer committed just before the start were
    /// left out; up to 5 s).
    fn available_now_ends(&self) -> Result<BTreeMap<i32, i64>> {
        let marks = self.watermarks()?;
        let mut stable: Vec<(i32, i64)> = marks.iter().map(|(p, (_, s))| (*p, *s)).collect();
        let mut config = self.config.client.config(Role::Consumer);
        config
            .set(
                "group.id",
                format!("sluice-source-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_uncommitted");
        let uncommitted: BaseConsumer = self.config.client.create(&config, "consumer")?;
        let consumer = self.consumer()?;
        let timeout = self.config.client.timeout();
        crate::position::settle_stable_offsets(
            &consumer,
            &uncommitted,
            &self.config.topic,
            &mut stable,
            Duration::from_secs(5).min(timeout),
            timeout,
        )
        .map_err(|e| self.unreachable("fetching offsets", e))?;
        Ok(stable.into_iter().collect())
    }
}

impl KafkaSource {
    /// Where the startup mode begins each partition, asked of the broker off
    /// the async runtime.
    async fn startup_positions(&self) -> Result<BTreeMap<i32, i64>> {
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            let marks = inner.watermarks()?;
            inner.startup_positions(&marks)
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))?
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
    fn read_lazily(
        &self,
        _start: Option<&Offset>,
        end: &Offset,
    ) -> Result<Option<Vec<LazyPartition>>> {
        self.0.read_lazily(&parse(end)?)
    }

    /// Kafka's partition numbers: the watermark advances per partition.
    fn partition_ids(&self, _start: Option<&Offset>, end: &Offset) -> Result<Option<Vec<u32>>> {
        let plan = parse(end)?;
        Ok(Some(
            plan.to_read().map(|(p, ..)| p.unsigned_abs()).collect(),
        ))
    }

    /// Side by side, lazy reads lost to whole epochs in the suite on JSON
    /// records (benches/README.md, *pipelined epochs tried as the
    /// default*): only `'epoch.pipeline' = 'true'` asks for them.
    fn pipelines_by_default(&self) -> bool {
        false
    }

    async fn initial_position(&self) -> Result<Option<Offset>> {
        if self.0.config.startup == StartupMode::Earliest {
            return Ok(None);
        }
        let starts = self.startup_positions().await?;
        let ranges = starts.into_iter().map(|(p, pos)| (p, (pos, pos))).collect();
        PlannedRanges { ranges }.to_offset().map(Some)
    }

    async fn since_start(&self, end: &Offset) -> Result<Option<Offset>> {
        // With 'latest' the query began wherever the topic ended then.
        if self.0.config.startup == StartupMode::Latest {
            return Ok(None);
        }
        let end = parse(end)?;
        let starts = self.startup_positions().await?;
        let ranges = end
            .ranges
            .into_iter()
            .map(|(p, (_, to))| (p, (starts.get(&p).copied().unwrap_or(0).min(to), to)))
            .collect();
        PlannedRanges { ranges }.to_offset().map(Some)
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
        if self.0.purger.is_none() && self.0.group.is_none() {
            return Ok(());
        }
        let positions: BTreeMap<i32, i64> = parse(end)?
            .ranges
            .into_iter()
            .map(|(p, (_, to))| (p, to))
            .collect();
        if let Some(purger) = &self.0.purger {
            purger.committed(&positions)?;
        }
        match &self.0.group {
            Some(group) => group.committed(&positions),
            None => Ok(()),
        }
    }

    fn record_offsets_apart(&self) {
        if let Some(group) = &self.0.group {
            group.commit_apart();
        }
    }

    fn columns_read(&self, names: &BTreeSet<String>) {
        self.0
            .key_read
            .store(names.contains("_key"), Ordering::Relaxed);
    }

    fn take_rejected(&self) -> Rejected {
        std::mem::take(&mut *self.0.rejected.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn group_offsets(&self, end: &Offset) -> Option<GroupOffsets> {
        if self.0.group.as_ref().is_some_and(GroupCommitter::is_apart) {
            return None;
        }
        let group = self.0.config.group.clone()?;
        let end = parse(end).ok()?;
        Some(GroupOffsets {
            group,
            topic: self.0.config.topic.clone(),
            offsets: end.ranges.into_iter().map(|(p, (_, to))| (p, to)).collect(),
        })
    }

    fn commits_through_sink(&self) -> Option<String> {
        matches!(self.0.config.on_error, OnError::DeadLetter(_))
            .then(|| "'format.on-error' = 'dead-letter'".into())
    }

    async fn prepare_available_now(&self) -> Result<()> {
        let inner = Arc::clone(&self.0);
        let ends = tokio::task::spawn_blocking(move || inner.available_now_ends())
            .await
            .map_err(|e| SluiceError::Internal(format!("kafka plan task: {e}")))??;
        *self.0.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(ends);
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
            let consumer = inner.consumer()?;
            Ok(consumer
                .client()
                .fetch_cluster_id(inner.config.client.timeout()))
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka cluster task: {e}")))?
    }
}
