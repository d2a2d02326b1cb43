//! Running a divided query's tasks: side by side in this process, or
//! shared with the other processes of the query through a task group,
//! which hands tasks in and takes them away while the query runs.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};

use super::{Launcher, TaskPlan};
use crate::epoch::{EpochLoop, Recovered, MAX_BACKOFF, MIN_BACKOFF};
use crate::error::{Result, SluiceError};
use crate::query::QueryShared;
use crate::task::TaskId;

/// A divided query's tasks shared with the other processes running it:
/// the group that hands them out, and how to plan one that comes here.
pub(crate) struct TaskGroup {
    /// How many tasks the query has.
    pub count: u32,
    /// The input whose group hands the tasks out (see
    /// [`Source::task_group`](crate::Source::task_group)).
    pub source: Arc<dyn crate::Source>,
    /// Plans a task's statements over its share of the inputs.
    pub plan: Arc<dyn Fn(TaskId) -> Result<TaskPlan> + Send + Sync>,
}

/// Runs epoch loops, one per task (each recovered), until all have ended:
/// the first to fail stops the others after their epoch in progress, and
/// its error is the query's.
pub(crate) async fn run_tasks(
    shared: Arc<QueryShared>,
    loops: Vec<(EpochLoop, Recovered)>,
) -> Result<()> {
    match <[_; 1]>::try_from(loops) {
        // One task runs here, as before queries had tasks.
        Ok([(one, recovered)]) => one.run(recovered).await,
        Err(loops) => {
            let mut running: FuturesUnordered<_> = loops
                .into_iter()
                .map(|(task, recovered)| tokio::spawn(task.run(recovered)))
                .collect();
            let mut first_error = None;
            while let Some(ended) = running.next().await {
                let ended = ended.unwrap_or_else(|e| {
                    Err(SluiceError::Internal(format!(
                        "a task's epoch loop ended: {e}"
                    )))
                });
                if let Err(e) = ended {
                    if first_error.is_none() {
                        tracing::error!(query = %shared.name, error = %e, "a task failed; stopping the others");
                        shared.request_stop();
                        first_error = Some(e);
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        }
    }
}

/// The status of a task another process runs.
const OWNED_ELSEWHERE: &str = "Owned by another process";

/// Runs the tasks `group` gives this process, until the query is stopped
/// or a task fails: a task handed here is planned, opened (its Kafka
/// producer fences the previous owner's), restored from the checkpoint and
/// started; a task taken away is stopped after its epoch in progress, and
/// the group told. A task fenced by a newer owner ends quietly. On the way
/// out the process leaves the group, so its tasks move at once.
pub(crate) async fn run_group(launcher: Arc<Launcher>, group: TaskGroup) -> Result<()> {
    let shared = Arc::clone(&launcher.shared);
    let assigner = group
        .source
        .task_group(
            &launcher.query_id,
            launcher.settings.task_group_session_timeout,
        )?
        .ok_or_else(|| {
            SluiceError::config(format!(
                "query '{}' shares its tasks ('tasks.group'), but its input has no group to \
                 share them through (only Kafka streams have)",
                launcher.name
            ))
        })?;
    shared.set_group(Arc::clone(&assigner));
    let mut owned = assigner.owned();
    let mut running: BTreeSet<u32> = BTreeSet::new();
    let mut ended: FuturesUnordered<tokio::task::JoinHandle<(u32, Result<()>)>> =
        FuturesUnordered::new();
    for slot in 0..group.count as usize {
        shared.task_left(slot, OWNED_ELSEWHERE);
    }
    let mut retry: Option<Retry> = None;
    let result = loop {
        let retry_at = retry.as_ref().map(|r| r.at);
        tokio::select! {
            // A stop comes first: a process asked to stop takes no new task.
            biased;
            _ = shared.query_stopped() => break Ok(()),
            changed = owned.changed() => {
                if changed.is_err() {
                    break Err(SluiceError::Internal("the task group ended".into()));
                }
                let now = owned.borrow_and_update().clone();
                let gone: BTreeSet<u32> = running.difference(&now).copied().collect();
                for &t in &gone {
                    shared.stop_task(t as usize);
                }
                let mut failed = None;
                while running.iter().any(|t| gone.contains(t)) {
                    let Some(end) = ended.next().await else { break };
                    if let Err(e) = task_ended(&shared, &mut running, end) {
                        failed.get_or_insert(e);
                    }
                }
                // Every task neither owned nor running is released, not only
                // those just stopped: the group's revoke waits on each, and
                // one waiting to retry its start, one that had ended, or one
                // handed here and taken away before this loop looked would
                // otherwise hold the hand-over for the whole release wait.
                let idle: BTreeSet<u32> = (0..group.count)
                    .filter(|t| !now.contains(t) && !running.contains(t))
                    .collect();
                for &t in &idle {
                    shared.task_left(t as usize, OWNED_ELSEWHERE);
                }
                assigner.released(&idle);
                if let Some(e) = failed {
                    break Err(e);
                }
                match start_unless_stopped(&launcher, &group, &now, &mut running, &mut ended, &mut retry).await {
                    Some(Err(e)) => break Err(e),
                    Some(Ok(())) => {}
                    None => break Ok(()),
                }
            }
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)),
                if retry_at.is_some() =>
            {
                let now = owned.borrow().clone();
                match start_unless_stopped(&launcher, &group, &now, &mut running, &mut ended, &mut retry).await {
                    Some(Err(e)) => break Err(e),
                    Some(Ok(())) => {}
                    None => break Ok(()),
                }
            }
            Some(end) = ended.next(), if !ended.is_empty() => {
                match task_ended(&shared, &mut running, end) {
                    Err(e) => break Err(e),
                    Ok(Some(t)) if owned.borrow().contains(&t) => {
                        // Fenced while the group still gives it here: no
                        // one took it over (an abort answered as fenced
                        // after an outage longer than the transaction
                        // timeout, an outside producer with its id). Left
                        // alone, its partition would have no runner; a new
                        // start fences whoever holds the id and resumes from
                        // the checkpoint. Had another process taken it, the
                        // group's revoke comes first and it is not started.
                        tracing::warn!(query = %shared.name, task = t, "a task this process still owns was fenced; starting it again");
                        shared.task_left(t as usize, "Fenced while owned here; starting again");
                        let now = tokio::time::Instant::now();
                        retry.get_or_insert(Retry {
                            since: std::time::Instant::now(),
                            at: now + MIN_BACKOFF,
                            backoff: MIN_BACKOFF,
                        });
                    }
                    Ok(_) => {}
                }
            }
        }
    };
    shared.request_stop();
    while let Some(end) = ended.next().await {
        let _ = task_ended(&shared, &mut running, end);
    }
    let leaving = Arc::clone(&assigner);
    let _ = tokio::task::spawn_blocking(move || leaving.leave()).await;
    result
}

/// Tasks this process owns that could not start for an outage (a broker
/// or the checkpoint store unreachable): retried with backoff until the
/// query's outage limit, as a failed epoch is.
struct Retry {
    since: std::time::Instant,
    at: tokio::time::Instant,
    backoff: std::time::Duration,
}

/// [`start_owned`], given up if the query is asked to stop first (`None`).
/// A task still starting has begun no transaction and committed nothing,
/// so it is left as it is: its next owner fences its producer. Starting
/// can wait long (another task's transaction open on the progress topic
/// until its new owner fences it), and a stop must not wait behind that.
async fn start_unless_stopped(
    launcher: &Launcher,
    group: &TaskGroup,
    owned: &BTreeSet<u32>,
    running: &mut BTreeSet<u32>,
    ended: &mut FuturesUnordered<tokio::task::JoinHandle<(u32, Result<()>)>>,
    retry: &mut Option<Retry>,
) -> Option<Result<()>> {
    tokio::select! {
        biased;
        _ = launcher.shared.query_stopped() => None,
        started = start_owned(launcher, group, owned, running, ended, retry) => Some(started),
    }
}

/// Starts the tasks of `owned` that do not run here yet, side by side
/// (each waits on Kafka: fencing, recovery). Those that meet an outage are
/// left to `retry`; any other failure fails the query.
async fn start_owned(
    launcher: &Launcher,
    group: &TaskGroup,
    owned: &BTreeSet<u32>,
    running: &mut BTreeSet<u32>,
    ended: &mut FuturesUnordered<tokio::task::JoinHandle<(u32, Result<()>)>>,
    retry: &mut Option<Retry>,
) -> Result<()> {
    let coming: Vec<TaskId> = owned
        .difference(running)
        .map(|&index| TaskId {
            index,
            count: group.count,
        })
        .collect();
    let started =
        futures::future::join_all(coming.iter().map(|&task| start(launcher, group, task))).await;
    let mut outage = None;
    for (task, started) in coming.into_iter().zip(started) {
        match started {
            Ok((epochs, recovered)) => {
                let index = task.index;
                running.insert(index);
                ended.push(tokio::spawn(
                    async move { (index, epochs.run(recovered).await) },
                ));
            }
            Err(e) if e.is_transient() => {
                let e = e.in_task(task);
                launcher
                    .shared
                    .set_retrying(task.index as usize, &e.to_string(), None);
                outage.get_or_insert(e);
            }
            Err(e) => return Err(e.in_task(task)),
        }
    }
    let Some(failure) = outage else {
        *retry = None;
        return Ok(());
    };
    let (since, backoff) = match retry.take() {
        Some(r) => (r.since, (r.backoff * 2).min(MAX_BACKOFF)),
        None => (std::time::Instant::now(), MIN_BACKOFF),
    };
    if since.elapsed() > launcher.settings.outage_limit {
        return Err(SluiceError::External {
            what: format!("query {}", launcher.name),
            message: format!(
                "tasks handed to this process could not start for {:.0?} (the outage limit); \
                 the last failure: {failure}",
                since.elapsed()
            ),
            hint: Some(
                "bring the brokers (and the checkpoint store) back and start the process \
                 again; 'outage.limit' sets how long a query waits"
                    .into(),
            ),
        });
    }
    tracing::warn!(query = %launcher.name, error = %failure, ?backoff, "a task could not start; retrying");
    *retry = Some(Retry {
        since,
        at: tokio::time::Instant::now() + backoff,
        backoff,
    });
    Ok(())
}

/// Plans, opens and recovers `task`, ready to run. Its epoch loop is
/// spawned once every task starting with it has started (see
/// [`start_owned`]), so a stop that gives the starts up leaves no loop
/// running untracked.
async fn start(
    launcher: &Launcher,
    group: &TaskGroup,
    task: TaskId,
) -> Result<(EpochLoop, Recovered)> {
    tracing::info!(query = %launcher.name, %task, "task starts in this process");
    let slot = task.index as usize;
    launcher.shared.start_task(slot);
    let plan = (group.plan)(task)?;
    let checkpoint = launcher.task_checkpoint(task)?;
    launcher.open(slot, plan, checkpoint).await
}

/// Takes note of a task's end: a failure fails the query, except a task
/// fenced by a newer producer of its transactional id (usually its next
/// owner, which is gone from this process), returned.
fn task_ended(
    shared: &QueryShared,
    running: &mut BTreeSet<u32>,
    end: std::result::Result<(u32, Result<()>), tokio::task::JoinError>,
) -> Result<Option<u32>> {
    let (index, result) =
        end.map_err(|e| SluiceError::Internal(format!("a task's epoch loop ended: {e}")))?;
    running.remove(&index);
    match result {
        Ok(()) => Ok(None),
        Err(SluiceError::Stopped(why)) => {
            tracing::warn!(query = %shared.name, task = index, "task fenced: {why}");
            shared.task_left(index as usize, "Taken over by another process");
            Ok(Some(index))
        }
        Err(e) => Err(e),
    }
}
