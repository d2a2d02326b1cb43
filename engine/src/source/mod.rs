//! Sources: where each epoch's rows come from.
//!
//! A source is replayable by offsets. Each epoch the engine asks every source
//! for its latest offset ([`Source::latest_offset`]), writes the ranges to the
//! checkpoint's `offsets/N`, then reads exactly those ranges
//! ([`Source::read`]). After a crash the same ranges are read again, so a
//! source MUST return the same rows for the same range.
//!
//! Offsets are the source's own JSON values; the engine only stores and
//! compares them.

use std::fmt::Debug;
use std::sync::Arc;

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::task::{TaskAssigner, TaskId};

mod files;
mod memory;
mod rate;

pub(crate) use files::{FilesFactory, Format as FilesFormat};
pub use memory::{MemorySourceFactory, MemoryStream};
pub(crate) use rate::RateFactory;

/// A source's position, as the source's own JSON.
pub type Offset = serde_json::Value;

/// One epoch's input from one source: record batches per partition.
pub type Partitions = Vec<Vec<RecordBatch>>;

/// One partition of an epoch's input, produced batch by batch as the
/// epoch's plan pulls it (see [`Source::read_lazily`]).
pub type LazyPartition = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// A record a source could not decode, to be written to a dead-letter
/// topic in the same transaction as the epoch's output
/// (`'format.on-error' = 'dead-letter'`), so that every input record ends
/// up either in the computation or there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeadLetter {
    /// The dead-letter topic.
    pub topic: String,
    /// The original record's key.
    pub key: Option<Vec<u8>>,
    /// The original record's bytes.
    pub value: Vec<u8>,
    /// The problem and the record's origin, as headers.
    pub headers: Vec<(String, String)>,
}

/// A consumer group's offsets on one topic: per partition, the next
/// offset to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOffsets {
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// Partition → next offset.
    pub offsets: BTreeMap<i32, i64>,
}

/// What an epoch's sources hand over to the sink, to be written with the
/// epoch's output (inside its transaction, for the exactly-once Kafka
/// sink): records for dead-letter topics, and consumer-group offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    /// Records the sources could not decode, for their dead-letter topics.
    pub dead_letters: Vec<DeadLetter>,
    /// Consumer-group offsets the sources ask to record with the epoch.
    pub group_offsets: Vec<GroupOffsets>,
}

impl Handover {
    /// Whether there is nothing to hand over.
    pub fn is_empty(&self) -> bool {
        self.dead_letters.is_empty() && self.group_offsets.is_empty()
    }
}

/// The records a source's last [`Source::read`] could not decode and did
/// not fail on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejected {
    /// Records dropped (`'format.on-error' = 'skip'`).
    pub skipped: u64,
    /// Records lost before they were read (deleted by retention or
    /// `delete_records`, or a topic recreated), and skipped because
    /// `'fail-on-data-loss' = 'false'`; with the default, the query stops
    /// instead.
    pub lost: u64,
    /// Records to write to a dead-letter topic.
    pub dead_letters: Vec<DeadLetter>,
}

/// A running query's connection to one input stream.
#[async_trait]
pub trait Source: Send + Sync + Debug {
    /// The end (exclusive) of the next epoch's range starting at `start`
    /// (`None`: the source's initial position), or `None` when there is no
    /// new data. A source that caps records per epoch applies the cap here.
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>>;

    /// Reads `[start, end)`. MUST return the same rows for the same range,
    /// whenever it is called: replaying an epoch depends on it.
    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions>;

    /// The same rows as [`Source::read`], one stream per partition,
    /// produced as the epoch's plan pulls them instead of all before it
    /// runs: each batch is computed on while it is still in cache, the
    /// epoch's input is never whole in memory, and with a sink that
    /// [sends ahead](crate::Sink::sends_ahead) its output is written while
    /// the rest is still being read. The engine uses it for inputs without
    /// a watermark (which must see every row before the plan runs) that one
    /// scan reads, counts the rows as they pass, and takes
    /// [`Source::take_rejected`] once the plan has run. `None` (the
    /// default): not supported now, the engine calls [`Source::read`].
    fn read_lazily(
        &self,
        start: Option<&Offset>,
        end: &Offset,
    ) -> Result<Option<Vec<LazyPartition>>> {
        let _ = (start, end);
        Ok(None)
    }

    /// Whether the engine reads this source lazily (where it can) under
    /// `'epoch.pipeline' = 'auto'`, the default; `'true'` reads every
    /// source lazily that can be, `'false'` none. Default `true`: a source
    /// whose lazy read costs nothing over a whole one.
    fn pipelines_by_default(&self) -> bool {
        true
    }

    /// The names of the columns the query reads from this source, told once,
    /// before the first read. Conservative: every column name the query
    /// mentions anywhere, and every column it writes out unnamed (a bare
    /// `SELECT *`). A source can then fill a column it cannot always give
    /// exactly only where no one reads it, and refuse a record whose
    /// value that column cannot hold where someone does (Kafka's `_key`,
    /// a VARCHAR, for a key that is not UTF-8). The default ignores it.
    fn columns_read(&self, names: &BTreeSet<String>) {
        let _ = names;
    }

    /// Where this source starts, resolved now, when it depends on the
    /// moment (Kafka's `latest`, `timestamp`): the engine records it in the
    /// checkpoint before the first epoch and passes it as the start of the
    /// first range, in this run and any restart, so nothing that arrives
    /// between two runs is skipped. `None` (the default): the start does
    /// not depend on when it is asked, and the first range starts at `None`.
    async fn initial_position(&self) -> Result<Option<Offset>> {
        Ok(None)
    }

    /// Called once when the query runs with the available-now trigger: from
    /// then on, [`Source::latest_offset`] MUST NOT go past what is available
    /// now, so the query ends. The default does nothing, which is right for
    /// sources that never grow while a query runs.
    async fn prepare_available_now(&self) -> Result<()> {
        Ok(())
    }

    /// The cluster the source reads (a Kafka cluster's id), recorded with
    /// each commit: the same topic name on another cluster is another
    /// input, whose offsets mean nothing to this checkpoint. `None` (the
    /// default): no such thing, or not known.
    async fn cluster(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// One range from where this source began up to `end` (the end of an
    /// epoch's range), such that [`Source::read`] returns everything a
    /// query read until then: how `sluice verify` reads a query's whole
    /// input at once. `None` (the default) when the source cannot tell
    /// where the query began.
    async fn since_start(&self, end: &Offset) -> Result<Option<Offset>> {
        let _ = end;
        Ok(None)
    }

    /// What the last [`Source::read`] (or the streams of the last
    /// [`Source::read_lazily`], once they ended) could not decode and set
    /// aside; taking it clears it. The default: nothing.
    fn take_rejected(&self) -> Rejected {
        Rejected::default()
    }

    /// Offsets to record for a consumer group with the epoch ending at
    /// `end` (Kafka `'group.id'`), so that the broker's own tools show the
    /// query's lag. Informational: recovery never reads them. Default
    /// `None`.
    fn group_offsets(&self, end: &Offset) -> Option<GroupOffsets> {
        let _ = end;
        None
    }

    /// The epoch whose range of this source ends at `end` is committed: the
    /// query never reads below `end` again, and a source may release what
    /// lies there (Kafka's `'purge-committed'`). Called after `commits/N`
    /// is written, in epoch order, and only then: the next epoch may be
    /// planned and read while this one commits, so a range's start does
    /// not say its predecessor is committed. The default does nothing.
    fn committed(&self, end: &Offset) -> Result<()> {
        let _ = end;
        Ok(())
    }

    /// The option asking this source to hand the sink something to commit
    /// with each epoch's output (dead letters, group offsets), which only a
    /// sink that [`accepts_source_commits`](crate::Sink::accepts_source_commits)
    /// can take; `None` (the default) when it hands nothing.
    fn commits_through_sink(&self) -> Option<String> {
        None
    }

    /// The query's sink cannot record [`group_offsets`](Self::group_offsets)
    /// with its epochs (it does not
    /// [`accept_source_commits`](crate::Sink::accepts_source_commits)): the
    /// source records them itself once each epoch is
    /// [`committed`](Self::committed), if it can, as Flink's Kafka source
    /// commits its offsets when a checkpoint completes. The default does
    /// nothing.
    fn record_offsets_apart(&self) {}

    /// Records available beyond the end of the last planned range, per
    /// partition, as the last [`Source::latest_offset`] saw them (the
    /// backlog; Kafka: last stable offset minus the planned end). Empty when
    /// the source cannot tell.
    fn lag(&self) -> BTreeMap<String, i64> {
        BTreeMap::new()
    }

    /// The ids of the partitions [`Source::read`] returns for `[start,
    /// end)`, in its order, when they name the same partitions from epoch
    /// to epoch (Kafka's partition numbers). An event-time watermark then
    /// advances per partition and the input's is the least of them, as in
    /// Flink (see the `watermark` module): rows of a partition that an
    /// epoch read less far into than another are not late for it. `None`
    /// (the default): the input's rows are one sequence.
    fn partition_ids(&self, start: Option<&Offset>, end: &Offset) -> Result<Option<Vec<u32>>> {
        let _ = (start, end);
        Ok(None)
    }

    /// How many partitions the input has now, when it can be divided into
    /// one task per partition (see [`SourceFactory::create_task`]); `None`
    /// (the default) when it cannot.
    async fn partition_count(&self) -> Result<Option<u32>> {
        Ok(None)
    }

    /// Joins the group of the processes running query `query_id` divided
    /// into tasks, a member declared dead after `session_timeout` without
    /// a sign of life (see [`TaskAssigner`]); `None` (the default): the
    /// source has no such group, and one process runs every task.
    fn task_group(
        &self,
        query_id: &str,
        session_timeout: std::time::Duration,
    ) -> Result<Option<Arc<dyn TaskAssigner>>> {
        let _ = (query_id, session_timeout);
        Ok(None)
    }
}

/// What a declared stream reads from: creates one [`Source`] per running
/// query, so that two queries over the same stream never share positions.
pub trait SourceFactory: Send + Sync + Debug {
    /// The rows' schema.
    fn schema(&self) -> SchemaRef;

    /// A new source for one query.
    fn create(&self) -> Result<Arc<dyn Source>>;

    /// A new source for one task of a query divided by partition (see
    /// [`TaskId`]): it reads partition `task.index` only, and fails when the
    /// input no longer has `task.count` partitions. The default refuses:
    /// the source cannot be divided (its [`Source::partition_count`] is
    /// `None`).
    fn create_task(&self, task: TaskId) -> Result<Arc<dyn Source>> {
        Err(crate::error::SluiceError::config(format!(
            "{} cannot be divided into tasks ({task})",
            self.describe()
        )))
    }

    /// A one-line description for progress and `EXPLAIN`, e.g. `rate(5 rows/s)`.
    fn describe(&self) -> String;

    /// What the source reads, in a form that changes only when it reads
    /// something else (a Kafka topic, a directory), for the fingerprint
    /// that keeps a changed query from restoring another's offsets. `None`
    /// (the default): nothing such (a generator whose rate may change).
    fn identity(&self) -> Option<String> {
        None
    }
}
