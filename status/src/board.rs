//! The queries a process runs, as the status page and its API show them:
//! a summary of each (`/api/queries`), one query whole
//! (`/api/queries/<id>`), and its recent epochs
//! (`/api/queries/<id>/progress`, the progress log's objects).
//!
//! Everything is read from the queries' own handles when asked
//! ([`StreamingQuery::task_reports`], [`StreamingQuery::recent_progress`]):
//! the board keeps nothing of its own but each query's statement and plan,
//! so a page nobody opens costs nothing, and what it shows is what the
//! epoch loops last reported.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::{json, Value};
use sluice_engine::{QueryProgress, StreamingQuery, TaskPhase, TaskReport};

/// The queries of this process that the status page shows.
///
/// ```no_run
/// # async fn demo(query: sluice_engine::StreamingQuery) {
/// let board = std::sync::Arc::new(sluice_status::StatusBoard::default());
/// board.watch(&query, "INSERT INTO out SELECT * FROM bids", "Projection: ...");
/// let summaries = board.summaries();
/// assert_eq!(summaries[0]["id"], query.id());
/// # }
/// ```
#[derive(Debug)]
pub struct StatusBoard {
    queries: Mutex<Vec<Watched>>,
    process: Process,
}

impl Default for StatusBoard {
    fn default() -> Self {
        Self {
            queries: Mutex::default(),
            process: Process {
                host: sluice_engine::host_name(),
                pid: std::process::id(),
            },
        }
    }
}

#[derive(Debug)]
struct Watched {
    query: StreamingQuery,
    statement: String,
    plan: String,
}

/// This process, as a task's owner: the host and the process id.
#[derive(Debug, Clone, Serialize)]
struct Process {
    host: String,
    pid: u32,
}

impl StatusBoard {
    /// Shows `query` on the page, with the statement it runs and its plan
    /// (EXPLAIN's text). A query watched again (restarted in the same
    /// process under the same id) replaces the one before.
    pub fn watch(&self, query: &StreamingQuery, statement: &str, plan: &str) {
        let mut queries = self.lock();
        queries.retain(|w| w.query.id() != query.id());
        queries.push(Watched {
            query: query.clone(),
            statement: statement.to_string(),
            plan: plan.to_string(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Watched>> {
        self.queries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `/api/queries`: one summary per query, in the order watched.
    pub fn summaries(&self) -> Value {
        let now = now_ms();
        Value::Array(
            self.lock()
                .iter()
                .map(|w| summary(w, &w.query.task_reports(), &self.process, now))
                .collect(),
        )
    }

    /// `/api/queries/<id>`: the summary with the statement, the plan, the
    /// sources' lag per partition, and each task.
    pub fn detail(&self, id: &str) -> Option<Value> {
        let now = now_ms();
        let queries = self.lock();
        let w = queries.iter().find(|w| w.query.id() == id)?;
        let reports = w.query.task_reports();
        let mut out = summary(w, &reports, &self.process, now);
        let fields = out.as_object_mut()?;
        fields.insert("statement".into(), w.statement.clone().into());
        fields.insert("plan".into(), w.plan.clone().into());
        fields.insert("sources".into(), sources(&reports));
        fields.insert(
            "tasks".into(),
            reports
                .iter()
                .map(|t| task(t, &self.process, now))
                .collect(),
        );
        Some(out)
    }

    /// `/api/queries/<id>/progress`: the query's recent epochs (up to a
    /// few hundred per task), oldest first, as the progress log writes them.
    pub fn progress(&self, id: &str) -> Option<Value> {
        let queries = self.lock();
        let w = queries.iter().find(|w| w.query.id() == id)?;
        Some(
            w.query
                .recent_progress()
                .iter()
                .map(QueryProgress::log_line)
                .collect(),
        )
    }
}

/// What the page's list shows of a query, from its tasks' `reports`: who
/// it is, its state, its last commit, watermark, rates and lag.
fn summary(w: &Watched, reports: &[TaskReport], process: &Process, now: i64) -> Value {
    let q = &w.query;
    let here: Vec<&TaskReport> = reports.iter().filter(|t| t.here).collect();
    let last: Vec<&QueryProgress> = here.iter().filter_map(|t| t.last.as_ref()).collect();
    let (state, error) = state(q, reports);
    let watermark = last
        .iter()
        .map(|p| p.watermark.as_deref().and_then(millis))
        .collect::<Option<Vec<i64>>>()
        .and_then(|w| w.into_iter().min());
    let last_commit = q.last_progress().map(|p| {
        json!({
            "epoch": p.epoch,
            "task": p.task,
            "timestamp": p.timestamp,
            "sink": p.sink,
            "output_rows": p.num_output_rows,
        })
    });
    json!({
        "id": q.id(),
        "name": q.name(),
        "run_id": q.run_id(),
        "process": process,
        "state": state,
        "error": error,
        "message": q.status().message,
        "epoch": last.iter().map(|p| p.epoch).max(),
        "last_commit": last_commit,
        "tasks_total": reports.len(),
        "tasks_here": here.len(),
        "input_rows_per_second": last.iter().map(|p| p.input_rows_per_second).sum::<f64>(),
        "processed_rows_per_second": last.iter().map(|p| p.processed_rows_per_second).sum::<f64>(),
        "lag_records": lag(here.iter().copied()),
        "watermark": watermark.and_then(rfc3339),
        "watermark_delay_ms": watermark.map(|w| now - w),
        "late_rows": here.iter().map(|t| t.late_rows).sum::<u64>(),
        "epochs": here.iter().map(|t| t.epochs).sum::<u64>(),
        "input_rows": here.iter().map(|t| t.input_rows).sum::<u64>(),
        "state_rows": last.iter().map(|p| p.state_rows).sum::<u64>(),
        "state_bytes": last.iter().map(|p| p.state_bytes).sum::<u64>(),
    })
}

/// The query's state: stopped once its handle says so (with the error that
/// stopped it), else the worst of its tasks here: retrying (with the
/// failure), recovering, running.
fn state(q: &StreamingQuery, reports: &[TaskReport]) -> (&'static str, Option<String>) {
    if !q.is_active() {
        return ("stopped", q.exception());
    }
    let here = || reports.iter().filter(|t| t.here);
    if let Some(error) = here().find_map(|t| match &t.phase {
        TaskPhase::Retrying { error } => Some(error.clone()),
        _ => None,
    }) {
        return ("retrying", Some(error));
    }
    if here().any(|t| t.phase == TaskPhase::Recovering) {
        return ("recovering", None);
    }
    if here().next().is_none() {
        // A process of a task group that owns no task now.
        return ("idle", None);
    }
    ("running", None)
}

/// One task: where it runs, its phase, its last epoch and lag.
fn task(t: &TaskReport, process: &Process, now: i64) -> Value {
    let last = t.last.as_ref();
    let watermark = last.and_then(|p| p.watermark.as_deref()).and_then(millis);
    let mut out = json!({
        "task": t.task,
        "owner": if t.here { "this process" } else { "another process" },
        "owned_by": t.owner,
        "process": t.here.then_some(process),
        "message": t.status.message,
        "epoch": last.map(|p| p.epoch),
        "timestamp": last.map(|p| &p.timestamp),
        "lag_records": lag([t]),
        "input_rows_per_second": last.map(|p| p.input_rows_per_second),
        "watermark": last.and_then(|p| p.watermark.clone()),
        "watermark_delay_ms": watermark.map(|w| now - w),
        "epochs": t.epochs,
        "late_rows": t.late_rows,
    });
    if let (Some(fields), Ok(Value::Object(phase))) =
        (out.as_object_mut(), serde_json::to_value(&t.phase))
    {
        fields.extend(phase);
    }
    out
}

/// Each source's rows read in the last epoch and lag per partition at the
/// last look, over every task here (a divided query's tasks each report
/// their own partitions).
fn sources(reports: &[TaskReport]) -> Value {
    let mut by_source: BTreeMap<&str, (u64, BTreeMap<&str, i64>)> = BTreeMap::new();
    for t in reports.iter().filter(|t| t.here) {
        for (description, lags) in &t.lag {
            let (_, lag) = by_source.entry(description).or_default();
            for (partition, records) in lags {
                lag.insert(partition, *records);
            }
        }
        for s in t.last.iter().flat_map(|p| &p.sources) {
            by_source.entry(&s.description).or_default().0 += s.num_input_rows;
        }
    }
    by_source
        .into_iter()
        .map(|(description, (rows, lag))| {
            json!({
                "description": description,
                "input_rows": rows,
                "lag_records": lag.values().sum::<i64>(),
                "lag": lag,
            })
        })
        .collect()
}

/// Records behind over every source partition of `tasks`, as of their
/// last look at their sources; `None` when no source knows its lag.
fn lag<'a>(tasks: impl IntoIterator<Item = &'a TaskReport>) -> Option<i64> {
    sluice_engine::lag_records(
        tasks
            .into_iter()
            .flat_map(|t| t.lag.iter().map(|(_, lag)| lag)),
    )
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A progress record's time as milliseconds since the Unix epoch, parsed
/// as the metrics parse it.
fn millis(time: &str) -> Option<i64> {
    sluice_engine::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(time)
        .ok()
        .map(|ns| ns / 1_000_000)
}

fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}
