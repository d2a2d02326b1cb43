//! Query launch: from planned statements to a running epoch loop.
//!
//! ```text
//! (statements planned) ─► open the checkpoint (query id) ─► build the sinks
//!   ─► open them (a Kafka sink fences older instances) ─► recover from the
//!   checkpoint and the sink's record ─► spawn the epoch loop
//! ```
//!
//! Everything that can be refused is refused before the sinks open: a
//! mistake in any statement, a sink that needs a checkpoint location, a
//! source that needs a Kafka sink to commit with.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use crate::checkpoint::Checkpoint;
use crate::connector::{ConnectorRegistry, SinkArgs};
use crate::epoch::{
    check_clusters, check_fingerprint, check_inputs, clusters, run_query, EpochLoop, Recovered,
};
use crate::error::{Result, SluiceError};
use crate::options::Options;
use crate::output_mode::OutputMode;
use crate::progress::StreamingQueryListener;
use crate::query::{QueryShared, StreamingQuery};
use crate::settings::QuerySettings;
use crate::sink::{FanOut, Sink};
use crate::state::StateBudget;
use crate::statement::Statement;
use crate::task::TaskId;

mod tasks;

use tasks::run_tasks;
pub(crate) use tasks::TaskGroup;

/// Where a statement's output goes.
#[derive(Debug, Clone)]
pub(crate) enum SinkChoice {
    None,
    /// A connector by name, built with the statement's options.
    Connector(String),
    /// A sink built by the caller.
    Instance(Arc<dyn Sink>),
}

/// A query ready to launch: its statements planned, each with where its
/// output goes, for each of its tasks.
pub(crate) struct QueryPlan {
    pub name: String,
    /// The id a new query gets, when it had to be known before launch (it
    /// names a repartition step's channel); else launch draws one.
    pub new_id: Option<String>,
    pub settings: QuerySettings,
    /// One undivided task, or one per partition (see `task`); none when
    /// `group` hands them out.
    pub tasks: Vec<TaskPlan>,
    /// Tasks shared with other processes: planned when they come here.
    pub group: Option<TaskGroup>,
    pub connectors: ConnectorRegistry,
    pub listeners: Vec<Arc<dyn StreamingQueryListener>>,
}

/// One task's statements, planned over its share of the inputs.
pub(crate) struct TaskPlan {
    /// `None`: the query is not divided.
    pub task: Option<TaskId>,
    /// Each statement with its sink and the sink's options.
    pub statements: Vec<(Statement, SinkChoice, Options)>,
    /// Where the statements' late rows go: outputs after the statements'.
    pub late: Vec<LateSink>,
}

/// Where a statement's rows dropped as late from one input go: the input
/// stream's `'late.sink'`, written like a statement's output in the same
/// epoch (in a Kafka transaction shared with the query's Kafka sinks).
pub(crate) struct LateSink {
    /// The statement, and the index of the input among its plan's inputs.
    pub statement: usize,
    pub input: usize,
    /// The stream written: its connector and options.
    pub connector: String,
    pub options: Options,
    /// The columns of the input stream, which its late rows have.
    pub schema: SchemaRef,
}

/// Opens `query`'s checkpoint and, for each task, its checkpoint folder
/// and sinks; recovers each; and spawns the query's epoch loops on the
/// current tokio runtime. Nothing runs unless every task recovered.
pub(crate) async fn launch(query: QueryPlan) -> Result<StreamingQuery> {
    let QueryPlan {
        name,
        new_id,
        settings,
        tasks,
        group,
        connectors,
        listeners,
    } = query;
    let declared = settings.pipeline_name.clone();
    if let Some(name) = &declared {
        QuerySettings::check_pipeline_name(name)?;
    }
    let new_id = declared
        .clone()
        .or(new_id)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let checkpoint = settings
        .checkpoint
        .as_ref()
        .map(|dir| Checkpoint::open(dir, &new_id))
        .transpose()?;
    if let (Some(declared), Some(cp)) = (&declared, &checkpoint) {
        let theirs = &cp.metadata().query_id;
        if theirs != declared {
            return Err(SluiceError::config(format!(
                "the checkpoint at {} belongs to query '{theirs}', but this query's \
                 'pipeline.name' is '{declared}': a checkpoint holds one query's progress. Give \
                 this query a checkpoint location of its own, or to go on with that query set \
                 'pipeline.name' = '{theirs}'",
                cp.dir().display()
            )));
        }
    }
    let query_id = checkpoint
        .as_ref()
        .map_or(new_id, |c| c.metadata().query_id.clone());
    let ids: Vec<Option<TaskId>> = match &group {
        Some(g) => (0..g.count)
            .map(|index| {
                Some(TaskId {
                    index,
                    count: g.count,
                })
            })
            .collect(),
        None => tasks.iter().map(|t| t.task).collect(),
    };
    if let Some(cp) = &checkpoint {
        check_division(cp, &ids)?;
    }
    let divided = ids.iter().any(Option::is_some);
    let shared = QueryShared::new(query_id.clone(), name.clone(), &ids);
    let permits = divided.then(|| {
        let threads = settings.task_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        Arc::new(tokio::sync::Semaphore::new(threads.max(1)))
    });
    let query_listeners = listeners.clone();
    let budget = settings
        .state_memory_limit
        .map(|limit| StateBudget::for_process(limit, settings.state_local_dir.clone()));
    let launcher = Launcher {
        name,
        settings,
        query_id,
        connectors,
        listeners,
        shared: Arc::clone(&shared),
        permits,
        root: checkpoint.as_ref().map(|c| c.dir().to_path_buf()),
        budget,
    };
    let body: futures::future::BoxFuture<'static, Result<()>> = match group {
        Some(group) => {
            if launcher.root.is_none() {
                return Err(SluiceError::config(format!(
                    "query '{}' shares its tasks with other processes ('tasks.group'), which \
                     restore each other's tasks from the checkpoint: set a checkpoint location \
                     all of them reach",
                    launcher.name
                )));
            }
            Box::pin(tasks::run_group(Arc::new(launcher), group))
        }
        None => {
            let mut root = checkpoint;
            let mut loops = Vec::with_capacity(tasks.len());
            for (slot, plan) in tasks.into_iter().enumerate() {
                // Without a location, each task gets a temporary one (when
                // its sink can do without).
                let checkpoint = match plan.task {
                    Some(task) => launcher.task_checkpoint(task)?,
                    None => root.take(),
                };
                shared.start_task(slot);
                loops.push(launcher.open(slot, plan, checkpoint).await?);
            }
            Box::pin(run_tasks(Arc::clone(&shared), loops))
        }
    };
    shared.set_task(tokio::spawn(run_query(
        Arc::clone(&shared),
        body,
        query_listeners,
    )));
    Ok(StreamingQuery::new(shared))
}

/// The id the query launched with `settings` will have: its
/// 'pipeline.name', else the one its checkpoint holds (opened, or created
/// with a new id, now).
pub(crate) fn query_id(settings: &QuerySettings) -> Result<String> {
    if let Some(name) = &settings.pipeline_name {
        return Ok(name.clone());
    }
    let new_id = uuid::Uuid::new_v4().to_string();
    Ok(match &settings.checkpoint {
        Some(dir) => Checkpoint::open(dir, &new_id)?.metadata().query_id.clone(),
        None => new_id,
    })
}

/// A query is divided into tasks, or not, for its whole life: the
/// checkpoint at `root` must have been written the way `tasks` divide it,
/// or be new. A query that ran as one task keeps its offsets and state at
/// the root, which its tasks would not see, and the other way round.
fn check_division(root: &Checkpoint, tasks: &[Option<TaskId>]) -> Result<()> {
    let as_one = root.latest_commit_epoch()?.is_some();
    let before = root.tasks()?;
    let divided = tasks.iter().any(Option::is_some);
    let refuse = |was: &str, now: &str| {
        Err(SluiceError::config(format!(
            "the checkpoint at {} was written by this query running {was}, but it now runs \
             {now} ('tasks' changed): its offsets and state cannot move between the two. Set \
             'tasks' back, or run the changed query as a new one (a new 'pipeline.name' and \
             checkpoint location)",
            root.dir().display()
        )))
    };
    if divided && as_one {
        return refuse("as one task", "divided into tasks");
    }
    if !divided && !before.is_empty() {
        return refuse("divided into tasks", "as one task");
    }
    if let (Some(&i), Some(Some(task))) = (before.last(), tasks.first()) {
        if i >= task.count {
            return Err(SluiceError::config(format!(
                "the checkpoint at {} has task {i}, but the query's inputs now have {} \
                 partitions: partitions were removed, or the topic recreated. Run the query as a \
                 new one (a new 'pipeline.name' and checkpoint location)",
                root.dir().display(),
                task.count
            )));
        }
    }
    Ok(())
}

fn temp_checkpoint() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("sluice-checkpoint-")
        .tempdir()
        .map_err(|e| SluiceError::io("creating a temporary checkpoint", e))
}

/// What every task of a query launches with, at the query's start or,
/// when its tasks move between processes, whenever one comes to this one.
pub(crate) struct Launcher {
    pub name: String,
    pub settings: QuerySettings,
    pub query_id: String,
    pub connectors: ConnectorRegistry,
    pub listeners: Vec<Arc<dyn StreamingQueryListener>>,
    pub shared: Arc<QueryShared>,
    /// With tasks, the epochs they may run at once (`tasks.threads`).
    pub permits: Option<Arc<tokio::sync::Semaphore>>,
    /// The checkpoint location, when the query has one.
    pub root: Option<PathBuf>,
    /// The memory limit its keyed state shares with the process's other
    /// queries (`state.memory.limit`), when set.
    pub budget: Option<Arc<StateBudget>>,
}

impl Launcher {
    /// Task `task`'s checkpoint folder, `<location>/tasks/<i>`.
    pub(crate) fn task_checkpoint(&self, task: TaskId) -> Result<Option<Checkpoint>> {
        self.root
            .as_ref()
            .map(|root| {
                Checkpoint::open(
                    root.join("tasks").join(task.index.to_string()),
                    &self.query_id,
                )
            })
            .transpose()
    }

    /// Builds and opens `plan`'s sinks over `checkpoint` (the task's
    /// folder; `None` when the query has no location), and recovers the
    /// task in `slot`: its epoch loop, ready to run.
    pub(crate) async fn open(
        &self,
        slot: usize,
        plan: TaskPlan,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(EpochLoop, Recovered)> {
        let Launcher {
            name,
            settings,
            query_id,
            connectors,
            listeners,
            shared,
            permits,
            root: _,
            budget,
        } = self;
        let (name, query_id) = (name.as_str(), query_id.as_str());
        let task = plan.task;
        let (mut planned, outputs): (Vec<Statement>, Vec<(SinkChoice, Options)>) = plan
            .statements
            .into_iter()
            .map(|(statement, sink, options)| (statement, (sink, options)))
            .unzip();
        if let Some(budget) = budget {
            for statement in &mut planned {
                statement.within_budget(budget);
            }
        }
        if let Some(ttl) = settings.state_ttl {
            for statement in &mut planned {
                statement.expiring_after(ttl);
            }
        }
        let late: Vec<(usize, usize)> = plan.late.iter().map(|l| (l.statement, l.input)).collect();
        let sink = sinks(
            connectors, outputs, &planned, plan.late, query_id, name, task,
        )?;
        if settings.pipeline_name.is_none() && sink.records_commits() && slot == 0 {
            tracing::warn!(
                query = %name,
                id = %query_id,
                "query '{name}' has no 'pipeline.name', so its identity is the id generated into \
                 its checkpoint ({query_id}): started from another checkpoint location it would \
                 be a new query that writes its output again. Set one (SQL: SET \
                 'pipeline.name' = '{name}'; API: .pipeline_name(..)) to keep one identity \
                 whatever the checkpoint location"
            );
        }
        let (mut checkpoint, temp_dir) = match checkpoint {
            Some(c) => (c, None),
            None if sink.needs_checkpoint() => {
                return Err(SluiceError::config(format!(
                    "query '{name}' writes to {}, which needs a checkpoint location to know \
                     what it already wrote: set .checkpoint_location(dir), or in SQL \
                     SET 'checkpoint.location' = './checkpoints/{name}'",
                    sink.describe()
                )))
            }
            None => {
                let dir = temp_checkpoint()?;
                (Checkpoint::open(dir.path(), query_id)?, Some(dir))
            }
        };
        // A changed query is refused before its sink opens, which would
        // fence the running instance of the unchanged one.
        let mut fingerprint = planned
            .iter()
            .map(Statement::fingerprint)
            .collect::<Vec<_>>()
            .join("\n");
        // A task's offsets are its partition's whatever the partition count;
        // its state holds the keys of its partition only while the count
        // stays (adding partitions moves keys between them).
        match task {
            Some(task) if planned.iter().any(Statement::is_stateful) => {
                fingerprint.push_str(&format!("\n{task}"))
            }
            Some(task) => fingerprint.push_str(&format!("\ntask {}", task.index)),
            None => {}
        }
        let clusters = clusters(planned.iter().flat_map(|s| &s.plan.inputs)).await?;
        if sink.records_commits() {
            checkpoint.cache_epoch_log();
        }
        if let Some(epoch) = checkpoint.latest_commit_epoch()? {
            match checkpoint.read_commit(epoch) {
                Ok(commit) => {
                    let inputs = planned.iter().flat_map(|s| &s.plan.inputs);
                    check_inputs(&commit.plan, inputs, checkpoint.dir())?;
                    let whose = format!("checkpoint {}", checkpoint.dir().display());
                    check_fingerprint(&commit, &fingerprint, &whose)?;
                    check_clusters(&commit, &clusters, &whose)?;
                }
                // A cached record damaged by an operating-system crash:
                // recovery checks the sink's own record and rewrites it.
                Err(SluiceError::Checkpoint { .. }) if checkpoint.epoch_log_is_cache() => {}
                Err(e) => return Err(e),
            }
        }
        if !sink.accepts_source_commits() {
            for input in planned.iter().flat_map(|s| &s.plan.inputs) {
                input.source.record_offsets_apart();
                if let Some(option) = input.source.commits_through_sink() {
                    return Err(SluiceError::config(format!(
                        "query '{name}' reads {} with {option}, which needs a Kafka sink to \
                         commit it with the epoch's output; {} cannot: write to Kafka, or \
                         remove {option}",
                        input.description,
                        sink.describe()
                    )));
                }
            }
        }
        sink.open().await?;
        let mut epochs = EpochLoop {
            shared: Arc::clone(shared),
            task,
            slot,
            permits: permits.clone(),
            statements: planned,
            late,
            snapshots: settings.snapshots(),
            fingerprint,
            clusters,
            recoveries: 0,
            sink_description: sink.describe(),
            sink,
            checkpoint,
            temp_dir,
            trigger: settings.trigger,
            read_ahead: settings.read_ahead,
            pipelining: settings.pipelining,
            outage_limit: settings.outage_limit,
            listeners: listeners.clone(),
        };
        let recovered = epochs.recover().await.map_err(|e| match task {
            Some(task) => e.in_task(task),
            None => e,
        })?;
        Ok((epochs, recovered))
    }
}

/// One sink for all the statements: each connector's
/// [`sink_set`](crate::Connector::sink_set) for the statements writing to
/// it, sink instances as they are, and, when that makes several parts, a
/// [`FanOut`] over them.
fn sinks(
    connectors: &ConnectorRegistry,
    outputs: Vec<(SinkChoice, Options)>,
    statements: &[Statement],
    late: Vec<LateSink>,
    query_id: &str,
    name: &str,
    task: Option<TaskId>,
) -> Result<Arc<dyn Sink>> {
    let count = outputs.len() + late.len();
    let mut parts: Vec<(Arc<dyn Sink>, Vec<usize>)> = Vec::new();
    // Per connector, in order of first use: its statements and their args.
    let mut groups: Vec<(String, Vec<usize>, Vec<SinkArgs>)> = Vec::new();
    for (i, ((sink, options), statement)) in outputs.into_iter().zip(statements).enumerate() {
        let plan = &statement.plan;
        match sink {
            SinkChoice::None => {
                return Err(SluiceError::config(format!(
                    "query '{name}' has no sink: choose one with .format(\"kafka\"), one of {}",
                    connectors.names().join(", ")
                )))
            }
            SinkChoice::Instance(s) if task.is_some() => {
                return Err(SluiceError::config(format!(
                    "query '{name}' is divided into tasks ('tasks' = 'per-partition'), whose \
                     epochs commit alone, so it writes through a connector: {} is one instance \
                     all tasks would share",
                    s.describe()
                )))
            }
            SinkChoice::Instance(s) => {
                options.finish(&s.describe(), &[])?;
                // Two statements writing one instance would overwrite each
                // other's epochs (a memory sink keeps one batch per epoch).
                if parts.iter().any(|(p, _)| Arc::ptr_eq(p, &s)) {
                    return Err(SluiceError::config(format!(
                        "two statements of query '{name}' write to the same {}: give each its \
                         own sink",
                        s.describe()
                    )));
                }
                parts.push((s, vec![i]));
            }
            SinkChoice::Connector(c) => {
                let args = SinkArgs {
                    options,
                    schema: Arc::clone(&plan.output_schema),
                    output_mode: plan.mode,
                    query_id: query_id.to_string(),
                    query_name: name.to_string(),
                    key_columns: plan.key_columns.clone(),
                    task,
                };
                join_group(&mut groups, c, i, args);
            }
        }
    }
    for (j, l) in late.into_iter().enumerate() {
        let args = SinkArgs {
            options: l.options,
            schema: l.schema,
            output_mode: OutputMode::Append,
            query_id: query_id.to_string(),
            query_name: name.to_string(),
            key_columns: Vec::new(),
            task,
        };
        join_group(&mut groups, l.connector, statements.len() + j, args);
    }
    for (connector, indices, args) in groups {
        parts.push((connectors.get(&connector)?.sink_set(args)?, indices));
    }
    FanOut::combine(parts, count)
}

/// Adds output `i`'s `args` to its connector's group (see [`sinks`]).
fn join_group(
    groups: &mut Vec<(String, Vec<usize>, Vec<SinkArgs>)>,
    connector: String,
    i: usize,
    args: SinkArgs,
) {
    match groups.iter_mut().find(|(name, _, _)| *name == connector) {
        Some((_, indices, all)) => {
            indices.push(i);
            all.push(args);
        }
        None => groups.push((connector, vec![i], vec![args])),
    }
}
