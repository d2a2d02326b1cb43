//! One statement of a running query: its plan, its stateful operator and
//! that operator's chain of state files.
//!
//! A query runs one statement, or several (a statement set), which share
//! the query's epochs and commit; the epoch loop drives each through the
//! same steps: [`admit`](Statement::admit) the epoch's input (watermarks
//! move, late rows go), [`compute`](Statement::compute) the output,
//! [`stage`](Statement::stage) the state, [`committed`](Statement::committed)
//! once the sink has the epoch, and [`restore`](Statement::restore) after a
//! restart or a failure.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::{collect_partitioned, execute_stream};
use futures::StreamExt;

use crate::checkpoint::PartitionWatermarks;
use crate::error::{Result, SluiceError};
use crate::operator::aggregate::{AggregateConfig, AggregateOperator};
use crate::operator::changelog_join::ChangelogJoinOperator;
use crate::operator::join::{JoinConfig, JoinOperator};
use crate::operator::normalize::NormalizeOperator;
use crate::operator::over::OverOperator;
use crate::operator::pipeline::{Pipeline, PipelineStage};
use crate::operator::rank::RankOperator;
use crate::operator::temporal_join::TemporalJoinOperator;
use crate::operator::Operator;
use crate::options::columns;
use crate::planner::{IncrementalPlan, StageConfig};
use crate::sink::{EpochOutput, Sink};
use crate::state::chain::{Chain, SnapshotPolicy};
use crate::state::codec;
use crate::state::{StateBudget, StateSize, StateTtl};
use crate::table::EpochInput;

/// One statement of a query: its plan, and its state.
pub(crate) struct Statement {
    pub plan: IncrementalPlan,
    /// The statement's stateful operator, when it has one.
    operator: Option<Box<dyn Operator>>,
    /// The operator's committed state files, in a folder named after it,
    /// prefixed by the statement's position in a statement set.
    chain: Chain,
    /// What its state and offsets depend on (see [`fingerprint`]).
    fingerprint: String,
    /// Per input whose late rows go to a sink (`'late.sink'`), the rows
    /// the epoch dropped as late, until the epoch loop takes them.
    late: BTreeMap<usize, Vec<RecordBatch>>,
    /// Whether the epoch being computed read any row.
    read_rows: bool,
    /// The watermark its last watermark rows carried (a repartition
    /// step's upstream).
    sent_watermark: Option<i64>,
    /// The state TTL its operators' stores expire by (`state.ttl`), its
    /// clock set to each epoch's processing time.
    ttl: Option<Arc<StateTtl>>,
}

impl Statement {
    /// Statement `index` of a query with `statements` statements, its
    /// operator built from the plan.
    pub(crate) fn new(mut plan: IncrementalPlan, index: usize, statements: usize) -> Result<Self> {
        let fingerprint = fingerprint(&plan, index, statements);
        let operator = build_operator(&mut plan)?;
        let op = operator.as_ref().map_or("none", |o| o.name());
        let folder = if statements == 1 {
            op.to_string()
        } else {
            format!("{index}-{op}")
        };
        Ok(Self {
            plan,
            operator,
            chain: Chain::new(folder),
            fingerprint,
            late: BTreeMap::new(),
            read_rows: false,
            sent_watermark: None,
            ttl: None,
        })
    }

    /// Whether the statement drops rows behind the watermark (its
    /// operator's state is bounded by event time).
    pub(crate) fn drops_late(&self) -> bool {
        self.operator.as_ref().is_some_and(|o| o.drops_late())
    }

    /// Keeps the rows of input `input` that each epoch drops as late, for
    /// [`take_late`](Self::take_late).
    pub(crate) fn keep_late(&mut self, input: usize) {
        self.late.insert(input, Vec::new());
    }

    /// The rows of input `input` the epoch dropped as late (see
    /// [`keep_late`](Self::keep_late)).
    pub(crate) fn take_late(&mut self, input: usize) -> Vec<RecordBatch> {
        self.late
            .get_mut(&input)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether the statement keeps state across epochs.
    pub(crate) fn is_stateful(&self) -> bool {
        self.operator.is_some()
    }

    /// What the statement's state and offsets depend on, as text.
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The epoch's input with the watermarks moved: inputs with a
    /// watermark move it and lose their late rows first (when the operator
    /// drops late rows). Returns the input to compute over and the late
    /// rows dropped.
    pub(crate) fn admit(
        &mut self,
        read: Vec<EpochInput>,
        planned_at_ms: i64,
    ) -> Result<(Vec<EpochInput>, u64)> {
        // Late rows are judged by the watermark the previous epoch left;
        // only then does this epoch's input move it (see `watermark`).
        let drops_late = self.drops_late();
        let watermarks = &mut self.plan.watermarks;
        let previous = watermarks.current();
        watermarks.observe_clock(planned_at_ms);
        if let Some(value) = &self.plan.proctime {
            crate::watermark::processing_time::set(value, planned_at_ms);
        }
        if let Some(ttl) = &self.ttl {
            ttl.set_now(planned_at_ms);
        }
        if let Some(value) = &self.plan.current_watermark {
            crate::watermark::current::set(value, previous);
        }
        if let Some(op) = &mut self.operator {
            op.judge_by(previous);
        }
        let mut late_rows = 0;
        let mut admitted = Vec::with_capacity(read.len());
        self.read_rows = false;
        for (index, input) in read.into_iter().enumerate() {
            let (partitions, ids) = match input {
                EpochInput::Read(partitions, ids) => (partitions, ids),
                lazy @ EpochInput::Lazy(_) => {
                    self.read_rows = true;
                    admitted.push(lazy);
                    continue;
                }
            };
            let partitions =
                watermarks.take_upstream_watermarks(index, partitions, planned_at_ms)?;
            self.read_rows |= partitions.iter().flatten().any(|b| b.num_rows() > 0);
            watermarks.observe(index, &partitions, ids.as_deref())?;
            let partitions = if drops_late {
                let rows = self.late.get_mut(&index);
                let (kept, late, dropped) =
                    watermarks.drop_late(index, partitions, previous, rows.is_some())?;
                late_rows += late;
                if let Some(rows) = rows {
                    *rows = dropped;
                }
                kept
            } else {
                partitions
            };
            admitted.push(EpochInput::Read(partitions, None));
        }
        Ok((admitted, late_rows))
    }

    /// Runs the statement over the epoch's `input` (one per plan input, as
    /// [`admit`](Self::admit) returned it), in scope on the inputs' tables
    /// for as long as it runs. With `ahead` (a sink that sends ahead, the
    /// epoch, and this statement's index in the query), a statement that
    /// appends rows without state hands each output batch to the sink as
    /// it comes, while the plan still reads (see [`Sink::send_ahead`]).
    pub(crate) async fn compute(
        &mut self,
        input: Vec<EpochInput>,
        ahead: Option<(&dyn Sink, u64, usize)>,
    ) -> Result<EpochOutput> {
        let _scopes: Vec<_> = self
            .plan
            .inputs
            .iter()
            .zip(input)
            .map(|(i, input)| i.table.with_input(input))
            .collect();
        let ctx = &self.plan.state;
        if let Some(op) = &mut self.operator {
            // A chain's link: what the epoch closed, then its watermark.
            let mut out = op.process(ctx, self.plan.watermarks.current()).await?;
            out.rows.extend(self.watermark_rows()?);
            return Ok(out);
        }
        let physical = ctx.create_physical_plan(&self.plan.logical).await?;
        let ahead = ahead.filter(|_| self.plan.upsert.is_none());
        let Some((sink, epoch, index)) = ahead else {
            let mut rows: Vec<RecordBatch> = collect_partitioned(physical, ctx.task_ctx())
                .await?
                .into_iter()
                .flatten()
                .filter(|b| b.num_rows() > 0)
                .collect();
            rows.extend(self.watermark_rows()?);
            return match &self.plan.upsert {
                Some(upsert) => crate::upsert::split(rows, upsert),
                None => Ok(EpochOutput {
                    rows,
                    retracted: None,
                }),
            };
        };
        // One stream over all partitions, each run on a task of its own.
        let mut stream = execute_stream(physical, ctx.task_ctx())?;
        let mut rows = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if batch.num_rows() > 0 {
                sink.send_ahead(epoch, index, &batch).await?;
                rows.push(batch);
            }
        }
        if let Some(batch) = self.watermark_rows()? {
            sink.send_ahead(epoch, index, &batch).await?;
            rows.push(batch);
        }
        Ok(EpochOutput {
            rows,
            retracted: None,
        })
    }

    /// Runs the statement's operators within `budget`, the memory limit of
    /// the process's keyed state: its plan's session carries it, where an
    /// operator making a store finds it (`StateBudget::of`).
    pub(crate) fn within_budget(&mut self, budget: &Arc<StateBudget>) {
        self.with_extension(Arc::clone(budget));
    }

    /// Its plan's session with `value` in its config, where operators find
    /// it by type.
    fn with_extension<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        let config = self.plan.state.config().clone().with_extension(value);
        self.plan.state = SessionStateBuilder::new_from_existing(self.plan.state.clone())
            .with_config(config)
            .build();
    }

    /// Its operators' keys expire after `ttl` unwritten (`state.ttl`).
    /// Whether state has a TTL is part of the fingerprint, as the stores
    /// then keep each row's age: a checkpoint written with a TTL cannot be
    /// restored without one, or the reverse (as in Flink); the duration
    /// may change.
    pub(crate) fn expiring_after(&mut self, ttl: std::time::Duration) {
        if self.operator.is_none() {
            return;
        }
        let ttl = StateTtl::new(ttl);
        self.with_extension(Arc::clone(&ttl));
        self.ttl = Some(ttl);
        self.fingerprint
            .push_str("\nstate expires when unwritten for 'state.ttl'");
    }

    /// A repartition step's upstream, after an epoch that read rows or
    /// moved its watermark: its watermark, as one row to each partition of
    /// its channel, after the epoch's rows (see `watermark::aligned`). An
    /// epoch that read only watermark rows passes them on: a chain's last
    /// windows close when the input's last watermark has crossed every
    /// link.
    fn watermark_rows(&mut self) -> Result<Option<RecordBatch>> {
        let (Some(task), Some(watermark)) =
            (self.plan.watermark_out, self.plan.watermarks.current())
        else {
            return Ok(None);
        };
        if !self.read_rows && self.sent_watermark == Some(watermark) {
            return Ok(None);
        }
        self.sent_watermark = Some(watermark);
        crate::watermark::aligned::rows(&self.plan.output_schema, task.index, task.count, watermark)
            .map(Some)
    }

    /// Writes the operator's state of `epoch` into the checkpoint at `dir`:
    /// returns the statement's state files for the commit (its chain with
    /// the new file, or a new chain), and the state's size.
    pub(crate) fn stage(
        &mut self,
        dir: &Path,
        epoch: u64,
        run: &str,
        policy: SnapshotPolicy,
    ) -> Result<(Vec<String>, StateSize)> {
        let Some(op) = &mut self.operator else {
            return Ok((self.chain.files().to_vec(), StateSize::default()));
        };
        let staged = match op.stage_sliced(self.chain.slicing())? {
            Some(staged) => staged,
            None => op.stage(policy.snapshot_due(&self.chain))?,
        };
        let files = self
            .chain
            .write(dir, epoch, run, staged, &mut |w| op.write_snapshot(w))?;
        Ok((files, op.state_size()))
    }

    /// The epoch that staged `files` committed: they become the chain, old
    /// files beyond `policy`'s retention go, and the operator counts
    /// changes anew.
    pub(crate) fn committed(
        &mut self,
        dir: &Path,
        files: Vec<String>,
        policy: SnapshotPolicy,
    ) -> Result<()> {
        let Some(op) = &mut self.operator else {
            self.chain.set_committed(files);
            return Ok(());
        };
        op.after_commit();
        self.chain.committed(dir, files, policy.retained)
    }

    /// Goes back to what a commit recorded: of `files` (every statement's
    /// state files) this one's chain, loaded into the operator, and the
    /// inputs' `watermarks`. Nothing committed yet: empty state.
    pub(crate) async fn restore(
        &mut self,
        dir: &Path,
        files: &[String],
        watermarks: &BTreeMap<String, i64>,
        partition_watermarks: &PartitionWatermarks,
    ) -> Result<()> {
        self.chain.set_committed(self.chain.own(files));
        if let Some(op) = &mut self.operator {
            let mut chain = self.chain.read(dir);
            op.restore(&self.plan.state, &mut chain)
                .await
                .map_err(|e| match e {
                    // A damaged file names itself.
                    e @ SluiceError::Checkpoint { .. } => e,
                    // A missing file names itself in `e`.
                    e => SluiceError::checkpoint(
                        dir.join("state"),
                        format!("{}: {e}; {}", self.chain.files().join(", "), codec::DAMAGED),
                    ),
                })?;
        }
        self.plan
            .watermarks
            .restore(watermarks, partition_watermarks);
        Ok(())
    }
}

/// What a statement's committed state and offsets depend on, one line
/// each: what its inputs read (a Kafka topic, a directory), and each
/// stateful operator with the keys, functions, join condition and columns
/// its state is made of. A query restarted on a checkpoint whose commit
/// records another fingerprint would restore state into operators that do
/// not match it, or offsets of other inputs: it is refused. Stateless parts
/// (a filter or projection before or after the operators) are not in it,
/// and may change.
fn fingerprint(plan: &IncrementalPlan, index: usize, statements: usize) -> String {
    let at = if statements == 1 {
        String::new()
    } else {
        format!("statement {index}: ")
    };
    let mut lines: Vec<String> = plan
        .inputs
        .iter()
        .filter_map(|i| {
            Some(format!(
                "{at}input {} reads {}",
                i.key,
                i.identity.as_ref()?
            ))
        })
        .collect();
    let aggregate = |a: &AggregateConfig| match &a.aggregate {
        LogicalPlan::Aggregate(agg) => {
            let list = |exprs: &[datafusion::logical_expr::Expr]| {
                exprs
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "aggregate by [{}] of [{}]",
                list(&agg.group_expr),
                list(&agg.aggr_expr)
            )
        }
        other => format!("aggregate {}", other.display()),
    };
    let join = |j: &JoinConfig| {
        format!(
            "{} join {} of ({}) with ({})",
            j.join_type,
            j.join.display(),
            columns(&j.left_in.schema_ref()),
            columns(&j.right_in.schema_ref())
        )
    };
    let mut operators: Vec<String> = plan
        .stages
        .iter()
        .map(|s| match &s.config {
            StageConfig::Aggregate(a) => aggregate(a),
            StageConfig::Join(j) => join(j),
            StageConfig::Normalize(n) => format!(
                "each key's latest value of ({}), keyed by the first {}",
                columns(&n.output),
                n.keys
            ),
        })
        .collect();
    operators.extend(plan.aggregate.as_ref().map(aggregate));
    operators.extend(plan.join.as_ref().map(join));
    operators.extend(plan.over.as_ref().map(|o| {
        format!(
            "over {} of ({}) reaching back {:?} rows, {:?} ns",
            o.window.display(),
            columns(o.input.schema().as_arrow()),
            o.rows_back,
            o.range_back
        )
    }));
    operators.extend(plan.rank.as_ref().map(|r| {
        format!(
            "top {} of ({}) ranked by {:?}",
            r.limit,
            columns(r.input.schema().as_arrow()),
            r.order
        )
    }));
    lines.extend(
        operators
            .into_iter()
            .enumerate()
            .map(|(i, op)| format!("{at}operator {}: {op}", i + 1)),
    );
    lines.join("\n")
}

/// The operator that runs join `config`: an interval or unbounded inner
/// join of rows that never change, or a join over changes.
fn join_operator(config: JoinConfig) -> Result<Box<dyn Operator>> {
    Ok(match config.changelog {
        Some(_) => Box::new(ChangelogJoinOperator::new(config)?),
        None => Box::new(JoinOperator::new(config)?),
    })
}

/// The stateful operator of a planned query, if it has one: the outermost
/// one, with the stages under it as one [`Pipeline`].
fn build_operator(plan: &mut IncrementalPlan) -> Result<Option<Box<dyn Operator>>> {
    let root: Box<dyn Operator> = match (
        plan.aggregate.take(),
        plan.join.take(),
        plan.rank.take(),
        plan.over.take(),
    ) {
        (Some(a), _, _, _) => Box::new(AggregateOperator::new(a)),
        (None, Some(j), _, _) => join_operator(j)?,
        (None, None, Some(r), _) => Box::new(RankOperator::new(r)),
        (None, None, None, Some(o)) => Box::new(OverOperator::new(o)),
        (None, None, None, None) => match plan.temporal.take() {
            Some(t) => Box::new(TemporalJoinOperator::new(t)),
            None => return Ok(None),
        },
    };
    if plan.stages.is_empty() {
        return Ok(Some(root));
    }
    let mut stages = Vec::with_capacity(plan.stages.len() + 1);
    for stage in plan.stages.drain(..) {
        let operator: Box<dyn Operator> = match stage.config {
            StageConfig::Aggregate(a) => Box::new(AggregateOperator::new(*a)),
            StageConfig::Join(j) => join_operator(*j)?,
            StageConfig::Normalize(n) => Box::new(NormalizeOperator::new(*n)),
        };
        stages.push(PipelineStage::new(operator, Some(stage.link)));
    }
    stages.push(PipelineStage::new(root, None));
    Ok(Some(Box::new(Pipeline::new(stages))))
}
