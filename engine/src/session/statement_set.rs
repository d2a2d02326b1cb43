//! Statement sets: several INSERTs run as one query, committed together.
//!
//! Flink's `EXECUTE STATEMENT SET`: the statements share the query's
//! epochs, its checkpoint and its sink commit. Each epoch plans every
//! statement's inputs into one `offsets/N`, runs every statement, stages
//! every statement's state, and hands all the outputs to one sink. Kafka
//! sinks of one set share one transactional producer, so a `read_committed`
//! reader sees all of an epoch's output, on every topic, or none of it
//! (one transactional producer per query for all its Kafka sinks,
//! docs/architecture.md §4).
//!
//! Each statement reads its inputs itself: a topic two statements read is
//! fetched twice (sharing the read is an optimisation not made yet).
//!
//! ```no_run
//! # async fn demo(session: sluice_engine::Session) -> sluice_engine::Result<()> {
//! use sluice_engine::datafusion::prelude::{col, lit};
//! let ticks = session.read_stream().format("rate").load()?;
//! let even = ticks.clone().filter(col("value") % lit(2) .eq(lit(0)))?;
//! let query = session
//!     .statement_set()
//!     .add_insert(ticks.write_stream().format("console"))
//!     .add_insert(even.write_stream().format("console"))
//!     .checkpoint_location("/tmp/both")
//!     .start()
//!     .await?;
//! # query.stop().await }
//! ```

use std::sync::Arc;

use super::frame::DataStreamWriter;
use super::repartition;
use super::Session;
use crate::error::{Result, SluiceError};
use crate::launch::{launch, query_id, LateSink, QueryPlan, TaskGroup, TaskPlan};
use crate::query::StreamingQuery;
use crate::reference::BatchQuery;
use crate::settings::QuerySettings;
use crate::statement::Statement;
use crate::task::{TaskId, Tasks};
use crate::trigger::Trigger;

/// INSERTs to run as one query (see the module documentation). The
/// query-wide settings — checkpoint, trigger, name, state snapshots — are
/// the set's; an added writer that sets one of its own is refused at
/// [`start`](Self::start), and its name, if any, names its statement.
#[derive(Debug)]
pub struct StatementSet {
    session: Session,
    writers: Vec<DataStreamWriter>,
    settings: QuerySettings,
}

query_settings_builder!(StatementSet);

impl StatementSet {
    /// An empty set on `session` ([`Session::statement_set`]).
    pub(crate) fn new(session: &Session) -> Self {
        Self::with_settings(session, QuerySettings::default())
    }

    /// An empty set with `settings` (a writer started alone).
    pub(crate) fn with_settings(session: &Session, settings: QuerySettings) -> Self {
        Self {
            session: session.clone(),
            writers: Vec::new(),
            settings,
        }
    }

    /// Adds a statement: a frame with its sink, format, options and output
    /// mode chosen.
    pub fn add_insert(mut self, writer: DataStreamWriter) -> Self {
        self.writers.push(writer);
        self
    }

    /// Each statement's incremental plan, without starting anything.
    pub fn explain(&self) -> Result<String> {
        let mut out = format!(
            "statement set of {} statements, committed together each epoch\n",
            self.writers.len(),
        );
        for (i, writer) in self.writers.iter().enumerate() {
            out.push_str(&format!("\n-- statement {i}\n"));
            out.push_str(&writer.explain_in(&self.settings)?);
        }
        Ok(out)
    }

    /// Each statement planned for its batch answer (`sluice verify`), as it
    /// runs in this set: its inputs under the set's keys, the set's
    /// checkpoint.
    pub fn batch_queries(&self) -> Result<Vec<BatchQuery>> {
        let statements = self.writers.len();
        self.writers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                w.batch_query_in(
                    &key_prefix(i, statements, w),
                    self.settings.checkpoint.clone(),
                )
            })
            .collect()
    }

    /// Plans every statement, opens the checkpoint and the sinks, and starts
    /// the query's epoch loop on the current tokio runtime. A mistake in any
    /// statement fails the start before anything opens.
    pub async fn start(self) -> Result<StreamingQuery> {
        let count = self.writers.len();
        if count == 0 {
            return Err(SluiceError::config(
                "a statement set needs at least one INSERT INTO",
            ));
        }
        // Every statement planned and its operator built before anything
        // opens: opening the Kafka sink fences the query's running instance.
        for (i, writer) in self.writers.iter().enumerate() {
            refuse_own_settings(i, writer)?;
        }
        let mut writers = self.writers;
        let mut group = None;
        let mut new_id = None;
        let tasks = match self.settings.tasks {
            Tasks::One => vec![plan_task(&writers, None)?],
            Tasks::PerPartition => {
                // Refused here, before any task is planned: a task group
                // plans its tasks only as they come.
                for (i, writer) in writers.iter().enumerate() {
                    let plan = writer.plan_with_keys(&key_prefix(i, count, writer), None)?;
                    late_sinks(writer, &mut Statement::new(plan, i, count)?, i, true)?;
                }
                let mut undivided = writers
                    .iter()
                    .enumerate()
                    .map(|(i, w)| w.plan_with_keys(&key_prefix(i, count, w), None))
                    .collect::<Result<Vec<_>>>()?;
                let tasks = crate::planner::count_tasks(&undivided).await?;
                if undivided.iter().any(repartition::needed) {
                    let id = query_id(&self.settings)?;
                    writers = repartition::divide(
                        &self.session,
                        writers,
                        &undivided,
                        &id,
                        tasks,
                        self.settings.watermark_idle_timeout,
                    )?;
                    new_id = Some(id);
                }
                if self.settings.task_group {
                    if self.settings.pipeline_name.is_none() {
                        return Err(SluiceError::config(
                            "a query whose tasks are shared between processes ('tasks.group') \
                             needs SET 'pipeline.name': it is the identity they all share (their \
                             group, transactional ids and repartition topics); without one, \
                             processes starting together on a new checkpoint could each draw \
                             their own",
                        ));
                    }
                    if self.settings.trigger == Trigger::AvailableNow {
                        return Err(SluiceError::config(
                            "a query whose tasks are shared between processes ('tasks.group') \
                             runs until stopped: 'available-now' would end each process when \
                             its own tasks are done, whatever the others'. Run it in one \
                             process (no 'tasks.group') to process what is available now",
                        ));
                    }
                    let writers = Arc::new(std::mem::take(&mut writers));
                    group = Some(TaskGroup {
                        count: tasks,
                        source: Arc::clone(&undivided.swap_remove(0).inputs[0].source),
                        plan: Arc::new(move |task| plan_task(&writers, Some(task))),
                    });
                    Vec::new()
                } else {
                    drop(undivided);
                    (0..tasks)
                        .map(|index| {
                            plan_task(
                                &writers,
                                Some(TaskId {
                                    index,
                                    count: tasks,
                                }),
                            )
                        })
                        .collect::<Result<_>>()?
                }
            }
        };
        let name = self
            .settings
            .name
            .clone()
            .or_else(|| self.settings.pipeline_name.clone())
            .unwrap_or_else(|| format!("query-{}", self.session.next_number()));
        let query = launch(QueryPlan {
            name,
            new_id,
            settings: self.settings,
            tasks,
            group,
            connectors: self.session.connectors(),
            listeners: self.session.listeners(),
        })
        .await?;
        self.session.track(query.clone());
        Ok(query)
    }
}

/// Every statement of a set planned over `task`'s share of the inputs
/// (all of them when `None`), its operator built.
fn plan_task(writers: &[DataStreamWriter], task: Option<TaskId>) -> Result<TaskPlan> {
    let count = writers.len();
    let mut statements = Vec::with_capacity(count);
    let mut late = Vec::new();
    for (i, writer) in writers.iter().enumerate() {
        let plan = writer.plan_with_keys(&key_prefix(i, count, writer), task)?;
        let mut statement = Statement::new(plan, i, count)?;
        late.extend(late_sinks(writer, &mut statement, i, task.is_some())?);
        statements.push((statement, writer.sink.clone(), writer.options.clone()));
    }
    let mut streams = std::collections::BTreeSet::new();
    for l in &late {
        let input = &statements[l.statement].0.plan.inputs[l.input];
        let stream = &input.table.definition().name;
        if !streams.insert(stream.clone()) {
            return Err(SluiceError::config(format!(
                "two statements of this statement set drop late rows of stream '{stream}', \
                 whose 'late.sink' would then get them twice; read it in one of them, or run \
                 them as separate queries"
            )));
        }
    }
    Ok(TaskPlan {
        task,
        statements,
        late,
    })
}

/// Where `statement` (the `index`-th, written by `writer`) sends the rows
/// it drops as late: the `'late.sink'` of each input stream that has one,
/// when the statement drops late rows at all (an operator whose state the
/// watermark bounds); it then keeps those rows for the epoch loop. Refused
/// in a query `divided` into tasks.
fn late_sinks(
    writer: &DataStreamWriter,
    statement: &mut Statement,
    index: usize,
    divided: bool,
) -> Result<Vec<LateSink>> {
    let mut late = Vec::new();
    if !statement.drops_late() {
        return Ok(late);
    }
    for (input, scan) in statement.plan.inputs.iter().enumerate() {
        let definition = scan.table.definition();
        let Some(target) = &definition.late_sink else {
            continue;
        };
        if divided {
            return Err(SluiceError::config(format!(
                "stream '{}' sends its late rows to '{target}' ('late.sink'), which a query \
                 divided into tasks does not do yet; run it as one task (SET 'tasks' = '1')",
                definition.name
            )));
        }
        let Some(sink) = writer.frame.session.stream(target) else {
            return Err(SluiceError::config(format!(
                "stream '{}' sends its late rows to '{target}' ('late.sink'), which is not a \
                 declared stream: declare it (CREATE STREAM {target} WITH (connector = ...))",
                definition.name
            )));
        };
        late.push(LateSink {
            statement: index,
            input,
            connector: sink.connector,
            options: sink.options,
            schema: datafusion::catalog::TableProvider::schema(scan.table.as_ref()),
        });
    }
    for l in &late {
        statement.keep_late(l.input);
    }
    Ok(late)
}

/// A writer's own query-wide settings (checkpoint, trigger, state
/// snapshots) cannot apply to one statement of a set: refused, so that
/// none is silently ignored. Its name names the statement.
fn refuse_own_settings(index: usize, writer: &DataStreamWriter) -> Result<()> {
    match writer.settings.first_set() {
        Some(setting) => Err(SluiceError::config(format!(
            "statement {index} of the statement set sets its own '{setting}', which applies to \
             the whole query: set it on the statement set instead"
        ))),
        None => Ok(()),
    }
}

/// Statement `index`'s prefix of its inputs' checkpoint keys: none when
/// it is the query's only statement (so a single INSERT's checkpoint is the
/// same as before statement sets existed); in a set `<index>.<name>/`
/// (`<index>/` without a name), so a checkpoint whose statements were
/// reordered or renamed is refused rather than restored into the wrong
/// statement.
/// Checkpoint key `key` without its statement's prefix (see
/// `key_prefix`): the input's key in a query of that statement alone,
/// as its batch query keys it.
///
/// ```
/// use sluice_engine::unprefixed_key;
/// assert_eq!(unprefixed_key("0.repartition-0/0:bids"), "0:bids");
/// assert_eq!(unprefixed_key("0:bids"), "0:bids");
/// ```
pub fn unprefixed_key(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(_, k)| k)
}

fn key_prefix(index: usize, statements: usize, writer: &DataStreamWriter) -> String {
    match (statements, &writer.settings.name) {
        (1, _) => String::new(),
        (_, Some(name)) => format!("{index}.{name}/"),
        (_, None) => format!("{index}/"),
    }
}

/// A writer started alone runs as a statement set of one, and explains
/// itself as one.
impl DataStreamWriter {
    /// The incremental plan, without starting anything.
    pub fn explain(&self) -> Result<String> {
        self.explain_in(&self.settings)
    }

    /// The incremental plan as it runs with the query-wide `settings` (a
    /// statement set's): divided into tasks, its sub-topologies when its
    /// GROUP BY goes through a repartition step.
    pub(crate) fn explain_in(&self, settings: &QuerySettings) -> Result<String> {
        let plan = self.plan()?;
        let mut out = self.explain_plan(&plan);
        out.push_str(&crate::planner::explain_tasks(settings));
        if settings.tasks == crate::Tasks::PerPartition {
            crate::planner::divisible(&plan, "the query")?;
            if super::repartition::needed(&plan) {
                out.push_str(&super::repartition::explain(self.clone(), &plan, settings)?);
            }
        }
        Ok(out)
    }

    /// Plans the query, opens its checkpoint and sink, and starts its epoch
    /// loop on the current tokio runtime. Mistakes in the query or options
    /// are reported here, before anything runs.
    pub async fn start(mut self) -> Result<StreamingQuery> {
        let settings = std::mem::take(&mut self.settings);
        StatementSet::with_settings(&self.frame.session, settings)
            .add_insert(self)
            .start()
            .await
    }
}
