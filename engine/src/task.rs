//! Tasks: a query divided by input partition, each part committing alone.
//!
//! With `'tasks' = 'per-partition'` (Kafka Streams' model), task *i* of a
//! query reads partition *i* of every input, so its inputs must have equal
//! partition counts. Each task owns:
//! - its epochs (numbered from 1 in each task);
//! - its operators' state;
//! - its checkpoint folder, `<checkpoint.location>/tasks/<i>`;
//! - its sink's transaction (a Kafka sink's transactional id and progress
//!   record end in `-<i>`).
//!
//! So tasks commit independently, and run side by side in one process, at
//! most `tasks.threads` epochs at a time.
//!
//! A query is divided only where that keeps its answer. A stateless query
//! always can be. A GROUP BY can be when one of its keys is what decides a
//! record's partition: the record key `_key` (Kafka's default partitioner
//! sends equal keys to one partition) or `_partition` itself. A GROUP BY on
//! anything else would count one key in several tasks, so its rows first
//! go through a repartition step (see `repartition`). Joins and stacked
//! stateful operators are refused at start, with what would work.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::str::FromStr;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};

use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::epoch::{EpochLoop, Recovered, MAX_BACKOFF, MIN_BACKOFF};
use crate::error::{Result, SluiceError};
use crate::launch::{Launcher, TaskPlan};
use crate::planner::IncrementalPlan;
use crate::query::QueryShared;

/// Which share of a divided query one task runs: partition `index` of each
/// of its inputs, which have `count` partitions.
///
/// ```
/// use sluice_engine::TaskId;
/// let task = TaskId { index: 2, count: 6 };
/// assert_eq!(task.to_string(), "task 2 of 6");
/// assert!(task.reads(2) && !task.reads(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    /// The task's number, from 0: the partition it reads.
    pub index: u32,
    /// How many tasks the query has: its inputs' partition count.
    pub count: u32,
}

impl TaskId {
    /// Whether this task reads `partition`.
    pub fn reads(&self, partition: i32) -> bool {
        u32::try_from(partition).is_ok_and(|p| p == self.index)
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} of {}", self.index, self.count)
    }
}

/// How a query is divided (SQL: `SET 'tasks'`).
///
/// ```
/// use sluice_engine::Tasks;
/// assert_eq!("per-partition".parse::<Tasks>().unwrap(), Tasks::PerPartition);
/// assert_eq!("1".parse::<Tasks>().unwrap(), Tasks::One);
/// assert!("4".parse::<Tasks>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tasks {
    /// The whole query is one task: one transaction per epoch for all its
    /// partitions (the default).
    #[default]
    One,
    /// One task per partition of the inputs.
    PerPartition,
}

impl FromStr for Tasks {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "one" => Ok(Self::One),
            "per-partition" | "per_partition" => Ok(Self::PerPartition),
            other => Err(SluiceError::config(format!(
                "'tasks' = '{other}' is not valid: use '1' (the query is one task) or \
                 'per-partition' (a task per partition of its Kafka inputs)"
            ))),
        }
    }
}

/// Hands a divided query's tasks out among the processes that run it, so
/// that each task runs in one process at a time (`'tasks.group' = 'true'`;
/// for Kafka inputs, Kafka's consumer-group protocol). The engine starts
/// the tasks it is given, stops those taken away, and says when they have
/// stopped.
pub trait TaskAssigner: Send + Sync + Debug {
    /// The task numbers this process owns now; changes as the group moves
    /// tasks between processes.
    fn owned(&self) -> tokio::sync::watch::Receiver<BTreeSet<u32>>;

    /// The engine has stopped `tasks`, which left this process: the group
    /// may hand them to their next owner now.
    fn released(&self, tasks: &BTreeSet<u32>);

    /// Leaves the group, once every task of this process has stopped: its
    /// tasks move to the other processes at once.
    fn leave(&self);
}

/// What EXPLAIN says of how `settings` divide the query: nothing for one
/// task.
pub(crate) fn explain(settings: &crate::QuerySettings) -> String {
    match (settings.tasks, settings.task_group) {
        (Tasks::One, _) => String::new(),
        (Tasks::PerPartition, false) => {
            "tasks: one per partition of the inputs (counted at start), each committing alone, \
             all in this process\n"
                .into()
        }
        (Tasks::PerPartition, true) => {
            "tasks: one per partition of the inputs (counted at start), each committing alone, \
             shared with the other processes of the query through its Kafka group \
             ('tasks.group')\n"
                .into()
        }
    }
}

/// How many tasks `plans` (planned undivided) divide into under
/// `'tasks' = 'per-partition'`: their inputs' common partition count.
/// Refuses, naming the statement and the reason, a query whose answer
/// would change if divided, and inputs that cannot be divided or differ in
/// partition count.
pub(crate) async fn count(plans: &[IncrementalPlan]) -> Result<u32> {
    let refuse = |why: String| {
        SluiceError::config(format!(
            "'tasks' = 'per-partition' cannot divide this query: {why}. Run it as one task \
             (SET 'tasks' = '1')"
        ))
    };
    for (index, plan) in plans.iter().enumerate() {
        let which = if plans.len() == 1 {
            "the query".to_string()
        } else {
            format!("statement {index}")
        };
        if plan.join.is_some() || !plan.stages.is_empty() {
            return Err(refuse(format!(
                "{which} joins streams or stacks stateful operators, which tasks cannot \
                 divide yet"
            )));
        }
    }
    let mut counts = Vec::new();
    for input in plans.iter().flat_map(|p| &p.inputs) {
        match input.source.partition_count().await? {
            Some(n) => counts.push((n, &input.description)),
            None => {
                return Err(refuse(format!(
                    "{} cannot be divided by partition (only Kafka streams can)",
                    input.description
                )))
            }
        }
    }
    let Some(&(first, _)) = counts.first() else {
        return Err(refuse("it reads no stream".into()));
    };
    if let Some((n, which)) = counts.iter().find(|(n, _)| *n != first) {
        return Err(refuse(format!(
            "its inputs have different partition counts ({first} for {}, {n} for {which}), and \
             task i reads partition i of every input",
            counts[0].1
        )));
    }
    if first == 0 {
        return Err(refuse("its input has no partitions".into()));
    }
    Ok(first)
}

/// Whether one of the GROUP BY keys of `aggregate` is an input's `_key`
/// or `_partition`, passed through projections, filters and aliases
/// unchanged.
pub(crate) fn keyed_by_partition(aggregate: &LogicalPlan) -> bool {
    let LogicalPlan::Aggregate(a) = aggregate else {
        return false;
    };
    a.group_expr.iter().any(|e| match e {
        Expr::Column(c) => from_partitioning_column(&a.input, c),
        _ => false,
    })
}

/// Whether `column` of `plan`'s output is a scanned stream's `_key` or
/// `_partition` column, unchanged.
fn from_partitioning_column(plan: &LogicalPlan, column: &Column) -> bool {
    let Ok(index) = plan.schema().index_of_column(column) else {
        return false;
    };
    match plan {
        LogicalPlan::TableScan(_) => {
            matches!(
                plan.schema().field(index).name().as_str(),
                "_key" | "_partition"
            )
        }
        LogicalPlan::Projection(p) => match p.expr[index].clone().unalias() {
            Expr::Column(c) => from_partitioning_column(&p.input, &c),
            _ => false,
        },
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            let input = plan.inputs()[0];
            let (qualifier, field) = input.schema().qualified_field(index);
            from_partitioning_column(input, &Column::from((qualifier, field)))
        }
        _ => false,
    }
}

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
                // Those gone, and any waiting to retry that went with them.
                for t in (0..group.count).filter(|t| !now.contains(t) && !running.contains(t)) {
                    shared.task_left(t as usize, OWNED_ELSEWHERE);
                }
                assigner.released(&gone);
                if let Some(e) = failed {
                    break Err(e);
                }
                if let Err(e) =
                    start_owned(&launcher, &group, &now, &mut running, &mut ended, &mut retry).await
                {
                    break Err(e);
                }
            }
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)),
                if retry_at.is_some() =>
            {
                let now = owned.borrow().clone();
                if let Err(e) =
                    start_owned(&launcher, &group, &now, &mut running, &mut ended, &mut retry).await
                {
                    break Err(e);
                }
            }
            Some(end) = ended.next(), if !ended.is_empty() => {
                if let Err(e) = task_ended(&shared, &mut running, end) {
                    break Err(e);
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
            Ok(handle) => {
                running.insert(task.index);
                ended.push(handle);
            }
            Err(e) if e.is_transient() => {
                let e = e.in_task(task);
                launcher
                    .shared
                    .task_left(task.index as usize, &format!("Waiting to retry after: {e}"));
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

/// Plans, opens and recovers `task`, and spawns its epoch loop.
async fn start(
    launcher: &Launcher,
    group: &TaskGroup,
    task: TaskId,
) -> Result<tokio::task::JoinHandle<(u32, Result<()>)>> {
    tracing::info!(query = %launcher.name, %task, "task starts in this process");
    let slot = task.index as usize;
    launcher.shared.start_task(slot);
    let plan = (group.plan)(task)?;
    let checkpoint = launcher.task_checkpoint(task)?;
    let (epochs, recovered) = launcher.open(slot, plan, checkpoint).await?;
    let index = task.index;
    Ok(tokio::spawn(
        async move { (index, epochs.run(recovered).await) },
    ))
}

/// Takes note of a task's end: a failure fails the query, except a task
/// fenced by its next owner, which is gone from this process.
fn task_ended(
    shared: &QueryShared,
    running: &mut BTreeSet<u32>,
    end: std::result::Result<(u32, Result<()>), tokio::task::JoinError>,
) -> Result<()> {
    let (index, result) =
        end.map_err(|e| SluiceError::Internal(format!("a task's epoch loop ended: {e}")))?;
    running.remove(&index);
    match result {
        Ok(()) => Ok(()),
        Err(SluiceError::Stopped(why)) => {
            tracing::warn!(query = %shared.name, task = index, "task taken over: {why}");
            shared.task_left(index as usize, "Taken over by another process");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
