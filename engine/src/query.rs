//! [`StreamingQuery`]: the handle to a running query.
//!
//! The epoch loop (see `epoch`; one per task of a query divided into tasks)
//! runs on its own tokio task and reports through the shared state here; the handle reads it, waits on it, and asks the loop to
//! stop. Stopping is graceful: the loop finishes the epoch it is in (its
//! output and commit) and stops before planning the next.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Result, SluiceError};
use crate::progress::QueryProgress;
use crate::task::TaskId;

/// How many progress reports [`StreamingQuery::recent_progress`] keeps per
/// task: a few minutes of epochs at the default trigger, what the status
/// page draws.
const RECENT_PROGRESS: usize = 300;

/// What a query is doing right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueryStatus {
    /// A human-readable description, e.g. "Waiting for data to arrive".
    pub message: String,
    /// Whether the last look at the sources found new data.
    pub is_data_available: bool,
    /// Whether an epoch is being processed.
    pub is_trigger_active: bool,
}

/// Where a task is in its life, for the status page and scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum TaskPhase {
    /// Starting: restoring its state from the checkpoint, opening its
    /// sources and sink; no epoch committed yet in this run.
    Recovering,
    /// Committing epochs, or waiting for the next trigger or for data.
    Running,
    /// An epoch or the start failed on an outage (a broker, the checkpoint
    /// store); it is retried after a backoff, until the outage limit.
    Retrying {
        /// The failure retried.
        error: String,
    },
    /// Another process of the task group runs it.
    Elsewhere,
    /// The query stopped (see [`StreamingQuery::exception`]).
    Stopped,
}

/// One task of a query as it is now (a query that is not divided into
/// tasks has one, `task: None`).
///
/// ```no_run
/// # fn show(query: &sluice_engine::StreamingQuery) {
/// for t in query.task_reports() {
///     println!("{:?} here: {} {:?} epoch {:?}", t.task, t.here, t.phase,
///         t.last.as_ref().map(|p| p.epoch));
/// }
/// # }
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct TaskReport {
    /// The task's index (its partition), if the query is divided.
    pub task: Option<u32>,
    /// Whether this process runs it.
    pub here: bool,
    /// Which process runs it, when another process of the task group does
    /// and the group has said (`sluice-<pid>@<host> at /<address>`).
    pub owner: Option<String>,
    /// Where it is in its life.
    #[serde(flatten)]
    pub phase: TaskPhase,
    /// What it is doing, as [`StreamingQuery::status`] says it.
    pub status: QueryStatus,
    /// The progress of its last epoch committed in this process, if any.
    pub last: Option<QueryProgress>,
    /// Each source's records behind per partition (its
    /// [`lag`](crate::SourceProgress::lag)) as of the task's last look at
    /// its sources, whether that look found data (its last epoch's) or not:
    /// a task with nothing to read still shows how far behind it is.
    pub lag: Vec<(String, BTreeMap<String, i64>)>,
    /// Epochs it committed in this run of the process.
    pub epochs: u64,
    /// Rows its sources read in those epochs.
    pub input_rows: u64,
    /// Rows it dropped in those epochs for arriving behind the watermark.
    pub late_rows: u64,
}

/// What one task of a query is doing (a query that is not divided into
/// tasks is one).
#[derive(Debug)]
struct TaskState {
    task: Option<TaskId>,
    /// Asks this task alone to stop (it left this process).
    stop: watch::Sender<bool>,
    /// Whether the task runs in this process.
    here: bool,
    phase: TaskPhase,
    status: QueryStatus,
    recent: VecDeque<QueryProgress>,
    /// Per source, its lag per partition at the last look.
    lag: Vec<(String, BTreeMap<String, i64>)>,
    /// Epochs, input rows and late rows committed in this run.
    totals: (u64, u64, u64),
    /// Times the task looked at its sources and found nothing new.
    no_data_rounds: u64,
    /// When it last found nothing new, and how many epochs with data the
    /// query's tasks had committed then (see [`QueryShared::drained`]).
    idle: Option<(u64, Instant)>,
}

#[derive(Debug)]
struct RunState {
    tasks: Vec<TaskState>,
    /// Epochs with input rows the tasks committed, and when the last one
    /// did.
    data_commits: (u64, Option<Instant>),
    terminated: bool,
    /// The error that ended the query, until someone takes it.
    error: Option<SluiceError>,
    error_text: Option<String>,
}

/// How long after the last commit of data every task must still find
/// nothing new for a query reading its own channels to have drained (see
/// [`QueryShared::drained`]).
const SETTLE: Duration = Duration::from_secs(1);

/// State shared by a query's epoch loops (one per task) and its handles.
/// An epoch loop reports through its task's slot, the `slot` argument.
#[derive(Debug)]
pub(crate) struct QueryShared {
    pub(crate) id: String,
    pub(crate) run_id: String,
    pub(crate) name: String,
    stop: watch::Sender<bool>,
    /// Bumped on every change of `state`, to wake waiters.
    changes: watch::Sender<u64>,
    state: Mutex<RunState>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// The task group sharing the query's tasks with other processes, if
    /// any: who owns the tasks not here.
    group: Mutex<Option<Arc<dyn crate::TaskAssigner>>>,
}

impl QueryShared {
    /// A query of `tasks` (one `None` when it is not divided).
    pub(crate) fn new(id: String, name: String, tasks: &[Option<TaskId>]) -> Arc<Self> {
        Arc::new(Self {
            id,
            run_id: uuid::Uuid::new_v4().to_string(),
            name,
            stop: watch::channel(false).0,
            changes: watch::channel(0).0,
            state: Mutex::new(RunState {
                tasks: tasks
                    .iter()
                    .map(|&task| TaskState {
                        task,
                        stop: watch::channel(false).0,
                        here: false,
                        phase: TaskPhase::Recovering,
                        status: QueryStatus {
                            message: "Initializing".into(),
                            is_data_available: false,
                            is_trigger_active: false,
                        },
                        recent: VecDeque::new(),
                        lag: Vec::new(),
                        totals: (0, 0, 0),
                        no_data_rounds: 0,
                        idle: None,
                    })
                    .collect(),
                data_commits: (0, None),
                terminated: false,
                error: None,
                error_text: None,
            }),
            task: Mutex::new(None),
            group: Mutex::new(None),
        })
    }

    /// The task group the query's tasks are shared through.
    pub(crate) fn set_group(&self, group: Arc<dyn crate::TaskAssigner>) {
        *self.group.lock().unwrap_or_else(|p| p.into_inner()) = Some(group);
    }

    fn lock(&self) -> MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut RunState)) {
        f(&mut self.lock());
        self.changes.send_modify(|n| *n += 1);
    }

    fn update_task(&self, slot: usize, f: impl FnOnce(&mut TaskState)) {
        self.update(|s| {
            if let Some(t) = s.tasks.get_mut(slot) {
                f(t)
            }
        });
    }

    pub(crate) fn set_task(&self, task: JoinHandle<()>) {
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    pub(crate) fn set_status(&self, slot: usize, message: &str, data: bool, active: bool) {
        self.update_task(slot, |t| {
            t.phase = TaskPhase::Running;
            t.status = QueryStatus {
                message: message.to_string(),
                is_data_available: data,
                is_trigger_active: active,
            }
        });
    }

    pub(crate) fn record_progress(&self, slot: usize, progress: QueryProgress) {
        self.update(|s| {
            if progress.num_input_rows > 0 {
                s.data_commits = (s.data_commits.0 + 1, Some(Instant::now()));
            }
            if let Some(t) = s.tasks.get_mut(slot) {
                let (epochs, rows, late) = t.totals;
                t.totals = (
                    epochs + 1,
                    rows + progress.num_input_rows,
                    late + progress.late_rows,
                );
                t.lag = progress
                    .sources
                    .iter()
                    .map(|s| (s.description.clone(), s.lag.clone()))
                    .collect();
                if t.recent.len() == RECENT_PROGRESS {
                    t.recent.pop_front();
                }
                t.recent.push_back(progress);
            }
        });
    }

    /// Task `slot` found nothing new: whether every task has too, with no
    /// epoch of data committed since any of them looked, the last of those
    /// commits at least [`SETTLE`] before each looked. With `available-now`
    /// through repartition channels, what the tasks write is the others'
    /// input: the query has drained what was there at its start only when
    /// none of them has anything left to read, nor will be sent anything.
    /// A commit returns before the broker has written its transaction's
    /// markers, until which the channel's last stable offset hides the
    /// records from the tasks reading them: hence the settling time.
    pub(crate) fn drained(&self, slot: usize) -> bool {
        self.drained_at(slot, Instant::now())
    }

    fn drained_at(&self, slot: usize, now: Instant) -> bool {
        let mut drained = false;
        self.update(|s| {
            let (commits, last) = s.data_commits;
            if let Some(t) = s.tasks.get_mut(slot) {
                t.idle = Some((commits, now));
            }
            drained = s.tasks.iter().all(|t| {
                t.idle.is_some_and(|(seen, at)| {
                    seen == commits && last.is_none_or(|last| at >= last + SETTLE)
                })
            });
        });
        drained
    }

    /// The last committed epoch of this run of task `slot`, if any.
    pub(crate) fn last_epoch(&self, slot: usize) -> Option<u64> {
        self.lock()
            .tasks
            .get(slot)
            .and_then(|t| t.recent.back())
            .map(|p| p.epoch)
    }

    /// Task `slot` found nothing new; its sources' `lag` then.
    pub(crate) fn record_no_data(&self, slot: usize, lag: Vec<(String, BTreeMap<String, i64>)>) {
        self.update_task(slot, |t| {
            t.no_data_rounds += 1;
            t.lag = lag;
            t.status.is_data_available = false;
        });
    }

    /// Task `slot` failed on an outage (an epoch, or its start) and waits
    /// to retry (for `backoff`, when known).
    pub(crate) fn set_retrying(&self, slot: usize, failure: &str, backoff: Option<Duration>) {
        let wait = backoff.map_or(String::new(), |b| format!(" {b:?}"));
        self.update_task(slot, |t| {
            t.phase = TaskPhase::Retrying {
                error: failure.to_string(),
            };
            t.status = QueryStatus {
                message: format!("Waiting{wait} to retry after: {failure}"),
                is_data_available: false,
                is_trigger_active: true,
            };
        });
    }

    pub(crate) fn finish(&self, result: Result<()>) {
        self.update(|s| {
            s.terminated = true;
            for t in &mut s.tasks {
                t.phase = TaskPhase::Stopped;
                t.status = QueryStatus {
                    message: "Stopped".into(),
                    is_data_available: false,
                    is_trigger_active: false,
                };
            }
            if let Err(e) = result {
                s.error_text = Some(e.to_string());
                s.error = Some(e);
            }
        });
    }

    /// Whether the query, or task `slot` alone, was asked to stop.
    pub(crate) fn stop_requested(&self, slot: usize) -> bool {
        *self.stop.borrow() || self.task_stop(slot).is_some_and(|s| *s.borrow())
    }

    fn task_stop(&self, slot: usize) -> Option<watch::Sender<bool>> {
        self.lock().tasks.get(slot).map(|t| t.stop.clone())
    }

    /// Asks task `slot` alone to stop after its epoch in progress.
    pub(crate) fn stop_task(&self, slot: usize) {
        if let Some(stop) = self.task_stop(slot) {
            stop.send_replace(true);
        }
    }

    /// Task `slot` starts (again) in this process.
    pub(crate) fn start_task(&self, slot: usize) {
        if let Some(stop) = self.task_stop(slot) {
            stop.send_replace(false);
        }
        self.update_task(slot, |t| {
            t.here = true;
            t.phase = TaskPhase::Recovering;
        });
    }

    /// Task `slot` no longer runs in this process, for `why`.
    pub(crate) fn task_left(&self, slot: usize, why: &str) {
        self.update_task(slot, |t| {
            t.here = false;
            t.phase = TaskPhase::Elsewhere;
            t.status = QueryStatus {
                message: why.to_string(),
                is_data_available: false,
                is_trigger_active: false,
            };
        });
    }

    /// Asks every task to stop after its epoch in progress.
    pub(crate) fn request_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves when the query, or task `slot` alone, is asked to stop.
    pub(crate) async fn stopped(&self, slot: usize) {
        let mut query = self.stop.subscribe();
        let task = self.task_stop(slot);
        let task_stopped = async {
            match task {
                Some(t) => {
                    let _ = t.subscribe().wait_for(|s| *s).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = query.wait_for(|s| *s) => {}
            _ = task_stopped => {}
        }
    }

    /// Resolves when the query is asked to stop.
    pub(crate) async fn query_stopped(&self) {
        let _ = self.stop.subscribe().wait_for(|s| *s).await;
    }

    /// Waits until `done` holds for the run state; errors if the query
    /// ended first without `done` holding.
    async fn wait(&self, mut done: impl FnMut(&RunState) -> bool) -> Result<()> {
        let mut rx = self.changes.subscribe();
        loop {
            {
                let s = self.lock();
                if done(&s) {
                    return Ok(());
                }
                if s.terminated {
                    return Err(SluiceError::Stopped(match &s.error_text {
                        Some(e) => format!("query '{}' failed: {e}", self.name),
                        None => format!("query '{}' has stopped", self.name),
                    }));
                }
            }
            if rx.changed().await.is_err() {
                return Err(SluiceError::Internal("query state dropped".into()));
            }
        }
    }
}

/// A running continuous query (Spark's `StreamingQuery`). Cheap to clone;
/// every clone controls the same query.
#[derive(Debug, Clone)]
pub struct StreamingQuery {
    shared: Arc<QueryShared>,
}

impl StreamingQuery {
    pub(crate) fn new(shared: Arc<QueryShared>) -> Self {
        Self { shared }
    }

    /// The query's id: its `pipeline.name` when it has one, else the id
    /// generated into its checkpoint (stable across restarts from it).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// This run's id: new on every start.
    pub fn run_id(&self) -> &str {
        &self.shared.run_id
    }

    /// The query's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// What the query is doing now; for a query divided into tasks, what
    /// each task is doing, and whether any has data or is processing.
    pub fn status(&self) -> QueryStatus {
        let s = self.shared.lock();
        match s.tasks.as_slice() {
            [one] => one.status.clone(),
            tasks => QueryStatus {
                message: tasks
                    .iter()
                    .map(|t| match t.task {
                        Some(task) => format!("task {}: {}", task.index, t.status.message),
                        None => t.status.message.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                is_data_available: tasks.iter().any(|t| t.status.is_data_available),
                is_trigger_active: tasks.iter().any(|t| t.status.is_trigger_active),
            },
        }
    }

    /// The tasks the query is divided into (empty when it is one task).
    pub fn tasks(&self) -> Vec<TaskId> {
        self.shared
            .lock()
            .tasks
            .iter()
            .filter_map(|t| t.task)
            .collect()
    }

    /// Each task as it is now: where it runs (for a task another process
    /// of its task group runs, which one, as the group last said), its
    /// phase, its last epoch.
    pub fn task_reports(&self) -> Vec<TaskReport> {
        let owners = self
            .shared
            .group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|g| g.owners())
            .unwrap_or_default();
        self.shared
            .lock()
            .tasks
            .iter()
            .map(|t| TaskReport {
                task: t.task.map(|task| task.index),
                here: t.here,
                owner: match t.task {
                    Some(task) if !t.here => owners.get(&task.index).cloned(),
                    _ => None,
                },
                phase: t.phase.clone(),
                status: t.status.clone(),
                last: t.recent.back().cloned(),
                lag: t.lag.clone(),
                epochs: t.totals.0,
                input_rows: t.totals.1,
                late_rows: t.totals.2,
            })
            .collect()
    }

    /// Whether the query is still running.
    pub fn is_active(&self) -> bool {
        !self.shared.lock().terminated
    }

    /// The progress of the last committed epoch (of any task).
    pub fn last_progress(&self) -> Option<QueryProgress> {
        self.shared
            .lock()
            .tasks
            .iter()
            .filter_map(|t| t.recent.back())
            .max_by(|a, b| (&a.timestamp, a.epoch).cmp(&(&b.timestamp, b.epoch)))
            .cloned()
    }

    /// The progress of the last (up to 300 per task) committed epochs,
    /// oldest first (by when each was planned, across tasks).
    pub fn recent_progress(&self) -> Vec<QueryProgress> {
        let s = self.shared.lock();
        let mut all: Vec<QueryProgress> = s
            .tasks
            .iter()
            .flat_map(|t| t.recent.iter().cloned())
            .collect();
        if s.tasks.len() > 1 {
            all.sort_by(|a, b| (&a.timestamp, a.epoch).cmp(&(&b.timestamp, b.epoch)));
        }
        all
    }

    /// The error that stopped the query, if any.
    pub fn exception(&self) -> Option<String> {
        self.shared.lock().error_text.clone()
    }

    /// Asks the query to stop after the epoch in progress, and waits until
    /// it has. Stopping a stopped query does nothing.
    pub async fn stop(&self) -> Result<()> {
        self.shared.request_stop();
        let task = self
            .shared
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            task.await
                .map_err(|e| SluiceError::Internal(format!("query task: {e}")))?;
        }
        Ok(())
    }

    /// Waits until the query stops; returns the error that stopped it, if
    /// any (to the first caller; later callers get its text).
    pub async fn await_termination(&self) -> Result<()> {
        let _ = self.shared.wait(|s| s.terminated).await;
        let mut s = self.shared.lock();
        match (s.error.take(), &s.error_text) {
            (Some(e), _) => Err(e),
            (None, Some(text)) => Err(SluiceError::Stopped(text.clone())),
            (None, None) => Ok(()),
        }
    }

    /// Like [`StreamingQuery::await_termination`], giving up after
    /// `timeout`: `Ok(true)` if the query stopped cleanly in time.
    pub async fn await_termination_timeout(&self, timeout: Duration) -> Result<bool> {
        match tokio::time::timeout(timeout, self.await_termination()).await {
            Ok(r) => r.map(|_| true),
            Err(_) => Ok(false),
        }
    }

    /// Waits until every row available in the sources when this is called
    /// has been processed and committed (Spark's `processAllAvailable`; for
    /// tests). Fails if the query stops first.
    pub async fn process_all_available(&self) -> Result<()> {
        // A look at the sources that *started* after this call and found
        // nothing proves everything before it was processed: the look in
        // progress now may predate the data, so wait for two.
        // Every task running here, each from its own count (a task that
        // leaves meanwhile is another process's to finish).
        let seen: Vec<Option<u64>> = self
            .shared
            .lock()
            .tasks
            .iter()
            .map(|t| t.here.then_some(t.no_data_rounds))
            .collect();
        self.shared
            .wait(|s| {
                s.tasks.iter().zip(&seen).all(|(t, seen)| match seen {
                    Some(seen) => !t.here || t.no_data_rounds >= seen + 2,
                    None => true,
                })
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_tasks() -> Arc<QueryShared> {
        let ids = [0, 1].map(|index| Some(TaskId { index, count: 2 }));
        QueryShared::new("q".into(), "q".into(), &ids)
    }

    #[test]
    fn a_query_drains_when_every_task_found_nothing_since_the_last_data_settled() {
        let shared = two_tasks();
        let t0 = Instant::now();
        // Task 1 has not looked yet.
        assert!(!shared.drained_at(0, t0));
        assert!(shared.drained_at(1, t0), "no data was ever committed");

        let shared = two_tasks();
        shared.record_progress(
            0,
            QueryProgress {
                num_input_rows: 5,
                ..QueryProgress::default()
            },
        );
        let now = Instant::now();
        // Task 1 looked before task 0's commit; task 0 just committed.
        assert!(!shared.drained_at(1, now));
        assert!(!shared.drained_at(0, now), "task 0's data has not settled");
        assert!(
            !shared.drained_at(0, now + SETTLE),
            "task 1 last looked before the data settled"
        );
        assert!(shared.drained_at(1, now + SETTLE));
        // An epoch without input rows is no data.
        shared.record_progress(1, QueryProgress::default());
        assert!(shared.drained_at(0, now + SETTLE));
    }
}
