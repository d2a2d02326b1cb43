//! What a query reports after every epoch, and who hears it.
//!
//! [`QueryProgress`] follows Spark's `StreamingQueryProgress`: per epoch, the
//! input rows, rates, the duration of each phase, state size, watermark and
//! late rows. The epoch loop sends it to every [`StreamingQueryListener`]
//! registered on the session and emits it as a `tracing` event (target
//! `sluice::progress`); `sluice run --progress-log` appends
//! [`QueryProgress::log_line`] as JSON lines.

use serde::Serialize;

/// Time spent in each phase of one epoch, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseDurations {
    /// Asking sources for offsets and writing `offsets/N`.
    pub plan: f64,
    /// Reading and decoding the input.
    pub read: f64,
    /// Running the query over the epoch's batches.
    pub compute: f64,
    /// Updating and staging operator state.
    pub state: f64,
    /// Writing to the sink and recording the commit.
    pub commit: f64,
    /// The whole epoch: from its planning to its commit, or, for an epoch
    /// planned and read while the one before it committed (a query that is
    /// behind reads ahead), from that commit to its own. Totals add up to
    /// the query's wall time; an epoch read ahead has `plan` and `read`
    /// phases that overlapped the previous `commit`, so its phases can add
    /// up to more than its total.
    pub total: f64,
}

/// One source's part of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceProgress {
    /// `stream ← connector(...)`.
    pub description: String,
    /// Where the epoch started (`None`: the beginning).
    pub start_offset: Option<serde_json::Value>,
    /// Where it ended (exclusive).
    pub end_offset: serde_json::Value,
    /// Rows read.
    pub num_input_rows: u64,
    /// Malformed records dropped (`'format.on-error' = 'skip'`).
    pub skipped_records: u64,
    /// Malformed records written to the dead-letter topic.
    pub dead_lettered_records: u64,
    /// Records lost before they were read and skipped
    /// (`'fail-on-data-loss' = 'false'`).
    pub lost_records: u64,
    /// Records available beyond `end_offset` when the epoch was planned,
    /// per partition (see [`crate::Source::lag`]); empty if unknown.
    pub lag: std::collections::BTreeMap<String, i64>,
}

/// Progress of one committed epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryProgress {
    /// The task whose epoch this is, for a query divided into tasks
    /// (`'tasks' = 'per-partition'`: the partition it reads); each task
    /// numbers its epochs from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<u32>,
    /// Query id, stable across restarts.
    pub id: String,
    /// Id of this run of the query.
    pub run_id: String,
    /// The query's name.
    pub name: String,
    /// The epoch number.
    pub epoch: u64,
    /// When the epoch was planned (RFC 3339).
    pub timestamp: String,
    /// Rows read by all sources.
    pub num_input_rows: u64,
    /// Rows written to the sink.
    pub num_output_rows: u64,
    /// Input rows per second of wall time since the previous epoch started.
    pub input_rows_per_second: f64,
    /// Input rows per second of this epoch's execution (`num_input_rows`
    /// over `duration_ms.total`).
    pub processed_rows_per_second: f64,
    /// Time per phase.
    pub duration_ms: PhaseDurations,
    /// Rows held in operator state.
    pub state_rows: u64,
    /// Bytes operator state holds in memory.
    pub state_bytes: u64,
    /// Bytes operator state holds on local disk, past
    /// `state.memory.limit`.
    pub state_disk_bytes: u64,
    /// The query's event-time watermark (RFC 3339), if it has one.
    pub watermark: Option<String>,
    /// Input rows dropped for arriving behind the watermark.
    pub late_rows: u64,
    /// Times this run recovered in-process after an external system (a
    /// broker) failed an epoch, so far.
    pub recoveries: u64,
    /// Per source.
    pub sources: Vec<SourceProgress>,
    /// The sink's description.
    pub sink: String,
}

impl QueryProgress {
    /// The JSON object `sluice run --progress-log` appends per epoch, and
    /// the status page's API serves: `{"query", "epoch", "timestamp",
    /// "input_rows", "output_rows", "input_rows_per_second",
    /// "processed_rows_per_second", "duration_ms": {"total", "plan",
    /// "read", "compute", "state", "commit"}, "state_rows", "state_bytes",
    /// "watermark", "late_rows", "skipped_records",
    /// "dead_lettered_records", "lost_records", "lag_records"}`, and
    /// `"task"` for a task's epoch. `lag_records` sums the sources' lag
    /// over their partitions (`null` when no source knows its lag).
    pub fn log_line(&self) -> serde_json::Value {
        let mut line = serde_json::json!({
            "query": self.name,
            "epoch": self.epoch,
            "timestamp": self.timestamp,
            "input_rows": self.num_input_rows,
            "output_rows": self.num_output_rows,
            "input_rows_per_second": self.input_rows_per_second,
            "processed_rows_per_second": self.processed_rows_per_second,
            "duration_ms": {
                "total": self.duration_ms.total,
                "plan": self.duration_ms.plan,
                "read": self.duration_ms.read,
                "compute": self.duration_ms.compute,
                "state": self.duration_ms.state,
                "commit": self.duration_ms.commit,
            },
            "state_rows": self.state_rows,
            "state_bytes": self.state_bytes,
            "state_disk_bytes": self.state_disk_bytes,
            "watermark": self.watermark,
            "late_rows": self.late_rows,
            "skipped_records": self.sources.iter().map(|s| s.skipped_records).sum::<u64>(),
            "dead_lettered_records": self.sources.iter().map(|s| s.dead_lettered_records).sum::<u64>(),
            "lost_records": self.sources.iter().map(|s| s.lost_records).sum::<u64>(),
            "lag_records": lag_records(self.sources.iter().map(|s| &s.lag)),
        });
        if let (Some(task), Some(fields)) = (self.task, line.as_object_mut()) {
            fields.insert("task".into(), task.into());
        }
        line
    }
}

/// Records behind over every partition of `lags` (each a source's lag
/// per partition, as [`SourceProgress::lag`]); `None` when no source knows
/// its lag.
///
/// ```
/// use std::collections::BTreeMap;
/// let a = BTreeMap::from([("0".to_string(), 3), ("1".to_string(), 4)]);
/// let unknown = BTreeMap::new();
/// assert_eq!(sluice_engine::lag_records([&a, &unknown]), Some(7));
/// assert_eq!(sluice_engine::lag_records([&unknown]), None);
/// ```
pub fn lag_records<'a>(
    lags: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, i64>>,
) -> Option<i64> {
    lags.into_iter()
        .flat_map(|lag| lag.values().copied())
        .fold(None, |total, records| Some(total.unwrap_or(0) + records))
}

/// A query started running.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryStartedEvent {
    /// Query id.
    pub id: String,
    /// Run id.
    pub run_id: String,
    /// Query name.
    pub name: String,
}

/// A query stopped: by request, after available-now, or with an error.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryTerminatedEvent {
    /// Query id.
    pub id: String,
    /// Run id.
    pub run_id: String,
    /// Query name.
    pub name: String,
    /// The error that stopped it, if any.
    pub error: Option<String>,
}

/// Hears about every query of a session. Every method defaults to doing
/// nothing. Methods run on the query's task: they MUST return quickly.
pub trait StreamingQueryListener: Send + Sync {
    /// A query started.
    fn on_query_started(&self, event: &QueryStartedEvent) {
        let _ = event;
    }
    /// A query committed an epoch.
    fn on_query_progress(&self, progress: &QueryProgress) {
        let _ = progress;
    }
    /// A query stopped.
    fn on_query_terminated(&self, event: &QueryTerminatedEvent) {
        let _ = event;
    }
}

/// `d` in milliseconds, to the microsecond: how progress reports phases.
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
