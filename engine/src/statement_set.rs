//! Statement sets: several INSERTs run as one query, committed together.
//!
//! Flink's `EXECUTE STATEMENT SET`: the statements share the query's
//! epochs, its checkpoint and its sink commit. Each epoch plans every
//! statement's inputs into one `offsets/N`, runs every statement, stages
//! every statement's state, and hands all the outputs to one sink. Kafka
//! sinks of one set share one transactional producer, so a `read_committed`
//! reader sees all of an epoch's output, on every topic, or none of it
//! (DESIGN §6: one transactional producer per query for all its Kafka
//! sinks).
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

use std::path::PathBuf;
use std::sync::Arc;

use crate::batch::BatchQuery;
use crate::checkpoint::Checkpoint;
use crate::connector::SinkArgs;
use crate::epoch::{Branch, EpochLoop};
use crate::error::{Result, SluiceError};
use crate::frame::{DataStreamWriter, QuerySettings, SinkChoice};
use crate::operator::Operator;
use crate::query::{QueryShared, StreamingQuery};
use crate::session::Session;
use crate::sink::{FanOut, Sink};
use crate::trigger::Trigger;

/// INSERTs to run as one query (see the module documentation). The
/// query-wide settings — checkpoint, trigger, name, state retention — are
/// the set's; those of the added writers are not used.
#[derive(Debug)]
pub struct StatementSet {
    session: Session,
    writers: Vec<DataStreamWriter>,
    settings: QuerySettings,
}

impl StatementSet {
    /// An empty set on `session`.
    pub fn new(session: &Session) -> Self {
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

    /// Where the query keeps its checkpoint.
    pub fn checkpoint_location(mut self, dir: impl Into<PathBuf>) -> Self {
        self.settings.checkpoint = Some(dir.into());
        self
    }

    /// When epochs run.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.settings.trigger = trigger;
        self
    }

    /// The query's name (progress, logs, metrics).
    pub fn query_name(mut self, name: &str) -> Self {
        self.settings.name = Some(name.to_string());
        self
    }

    /// See [`DataStreamWriter::state_snapshot_interval`].
    pub fn state_snapshot_interval(mut self, epochs: u64) -> Self {
        self.settings.snapshot_every = epochs.max(1);
        self
    }

    /// See [`DataStreamWriter::state_retained_snapshots`].
    pub fn state_retained_snapshots(mut self, snapshots: usize) -> Self {
        self.settings.retained_snapshots = snapshots.max(1);
        self
    }

    /// Each statement's incremental plan, without starting anything.
    pub fn explain(&self) -> Result<String> {
        let mut out = format!(
            "statement set of {} statements, committed together each epoch\n",
            self.writers.len()
        );
        for (i, writer) in self.writers.iter().enumerate() {
            out.push_str(&format!("\n-- statement {i}\n"));
            out.push_str(&writer.explain()?);
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
        let session = self.session.clone();
        let statements = self.writers.len();
        if statements == 0 {
            return Err(SluiceError::config(
                "a statement set needs at least one INSERT INTO",
            ));
        }
        // Every statement planned and its operator built before anything
        // opens: opening the Kafka sink fences the query's running instance.
        let mut branches = Vec::with_capacity(statements);
        for (i, writer) in self.writers.iter().enumerate() {
            let mut plan = writer.plan_with_keys(&key_prefix(i, statements, writer))?;
            let operator = Operator::for_plan(&mut plan)?;
            branches.push(Branch::new(plan, operator, i, statements));
        }
        let name = self
            .settings
            .name
            .clone()
            .unwrap_or_else(|| format!("query-{}", session.next_number()));
        let new_id = uuid::Uuid::new_v4().to_string();
        let checkpoint = self
            .settings
            .checkpoint
            .as_ref()
            .map(|dir| Checkpoint::open(dir, &new_id))
            .transpose()?;
        let query_id = checkpoint
            .as_ref()
            .map_or(new_id, |c| c.metadata().query_id.clone());
        let sink = sinks(&session, self.writers, &branches, &query_id, &name)?;
        let (checkpoint, temp_dir) = match checkpoint {
            Some(c) => (c, None),
            None if sink.needs_checkpoint() => {
                return Err(SluiceError::config(format!(
                    "query '{name}' writes to {}, which needs a checkpoint location to know what \
                     it already wrote: set .checkpoint_location(dir), or in SQL \
                     SET 'checkpoint.location' = './checkpoints/{name}'",
                    sink.describe()
                )))
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("sluice-checkpoint-")
                    .tempdir()
                    .map_err(|e| SluiceError::io("creating a temporary checkpoint", e))?;
                (Checkpoint::open(dir.path(), &query_id)?, Some(dir))
            }
        };
        if !sink.accepts_source_commits() {
            for input in branches.iter().flat_map(|b| &b.plan.inputs) {
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
        let shared = QueryShared::new(query_id, name);
        let mut epochs = EpochLoop {
            shared: Arc::clone(&shared),
            branches,
            snapshot_every: self.settings.snapshot_every,
            retained_snapshots: self.settings.retained_snapshots,
            recoveries: 0,
            sink_description: sink.describe(),
            sink,
            checkpoint,
            temp_dir,
            trigger: self.settings.trigger,
            listeners: session.listeners(),
        };
        let recovered = epochs.recover().await?;
        shared.set_task(tokio::spawn(epochs.run(recovered)));
        let query = StreamingQuery::new(shared);
        session.track(query.clone());
        Ok(query)
    }
}

/// Statement `index`'s prefix of its inputs' checkpoint keys: none when
/// it is the query's only statement (so a single INSERT's checkpoint is the
/// same as before statement sets existed); in a set `<index>.<name>/`
/// (`<index>/` without a name), so a checkpoint whose statements were
/// reordered or renamed is refused rather than restored into the wrong
/// statement.
fn key_prefix(index: usize, statements: usize, writer: &DataStreamWriter) -> String {
    match (statements, &writer.settings.name) {
        (1, _) => String::new(),
        (_, Some(name)) => format!("{index}.{name}/"),
        (_, None) => format!("{index}/"),
    }
}

/// One sink for all the statements: each connector's
/// [`sink_set`](crate::Connector::sink_set) for the statements writing to
/// it, sink instances as they are, and, when that makes several parts, a
/// [`FanOut`] over them.
fn sinks(
    session: &Session,
    writers: Vec<DataStreamWriter>,
    branches: &[Branch],
    query_id: &str,
    name: &str,
) -> Result<Arc<dyn Sink>> {
    let statements = writers.len();
    let mut parts: Vec<(Arc<dyn Sink>, Vec<usize>)> = Vec::new();
    // Per connector, in order of first use: its statements and their args.
    let mut groups: Vec<(String, Vec<usize>, Vec<SinkArgs>)> = Vec::new();
    for (i, (writer, branch)) in writers.into_iter().zip(branches).enumerate() {
        let plan = &branch.plan;
        match writer.sink {
            SinkChoice::None => {
                return Err(SluiceError::config(format!(
                    "query '{name}' has no sink: choose one with .format(\"kafka\"), one of {}",
                    session.connectors().names().join(", ")
                )))
            }
            SinkChoice::Instance(s) => {
                writer.options.finish(&s.describe(), &[])?;
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
                    options: writer.options,
                    schema: Arc::clone(&plan.output_schema),
                    output_mode: plan.mode,
                    query_id: query_id.to_string(),
                    query_name: name.to_string(),
                    key_columns: plan.key_columns.clone(),
                };
                match groups.iter_mut().find(|(name, _, _)| *name == c) {
                    Some((_, indices, all)) => {
                        indices.push(i);
                        all.push(args);
                    }
                    None => groups.push((c, vec![i], vec![args])),
                }
            }
        }
    }
    for (connector, indices, args) in groups {
        parts.push((
            session.connectors().get(&connector)?.sink_set(args)?,
            indices,
        ));
    }
    FanOut::combine(parts, statements)
}
