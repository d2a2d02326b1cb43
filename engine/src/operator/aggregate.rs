//! Incremental GROUP BY aggregation through DataFusion's accumulator phases.
//!
//! Per epoch:
//! 1. `Partial` over the epoch's rows gives per-key partial states;
//! 2. merging those with the stored states of the same keys gives the
//!    keys' new states, which replace the stored ones;
//! 3. `Final` over the new states (update mode) or over every stored state
//!    (complete mode) gives the values to emit;
//! 4. the query's stateless tail (projection, HAVING) runs over them.
//!
//! Steps 2 and 3 drive each function's `GroupsAccumulator` directly: the
//! state store's index says which partial rows are one key
//! ([`KeyedState::locate`]), so the accumulators merge by group index and
//! no hash aggregation runs again over keys already hashed once. Where
//! that cannot be (SESSION windows, whose groups merge; a function without
//! a groups accumulator; a global aggregate) DataFusion's `PartialReduce`
//! and `Final` steps run instead.
//!
//! So every aggregate function DataFusion has — count, sum, min, max, avg,
//! count(DISTINCT), approx_distinct, stddev, array_agg, UDAFs — works
//! without a line of its own: DataFusion's accumulators define the state
//! and how to merge it. The operator's state is the [`KeyedState`] of
//! partial states, staged as a delta (or every k epochs a snapshot) before
//! each commit.
//!
//! Deduplication is the same operator keyed by the distinct columns: a
//! key's row is emitted the first time the key is seen, never again.
//!
//! An aggregation without a window that feeds another one (Nexmark q4's
//! average of per-auction maxima) emits a changelog (see `changelog`).
//!
//! Event-time windows (a group key carrying a window bound, see `window`):
//! once the watermark reaches a window's end its groups are final. Append
//! mode emits them then, once, and only then; update mode emits groups as
//! they change. Either way the closed groups leave the state, which stays
//! bounded by the windows still open. Complete mode keeps every group.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::compute::{cast, concat, concat_batches, filter_record_batch, interleave};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{EmitTo, LogicalPlan};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{collect, ExecutionPlan};

use async_trait::async_trait;
use foldhash::HashSet;

use super::changelog;
use super::Operator;
use crate::error::{Result, SluiceError};
use crate::output_mode::OutputMode;
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Slicing, Staged};
use crate::state::{row_converter, KeyedState, Located, OneStore, StateBudget, StateTtl};
use crate::table::EpochBatches;
use crate::window::{merge_sessions, WindowKey};

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct AggregateConfig {
    /// The `Aggregate` node, over the query's per-epoch stream tables.
    pub aggregate: LogicalPlan,
    /// The rest of the query, reading `output`.
    pub tail: LogicalPlan,
    /// Where the aggregate's final values are put for `tail`.
    pub output: Arc<EpochBatches>,
    /// Update: emit changed keys; complete: emit all; append: emit each
    /// window once, when it closes.
    pub mode: OutputMode,
    /// The group key that is a window bound, for a windowed aggregation
    /// in append or update mode: its groups close with the watermark.
    pub window: Option<WindowKey>,
    /// Deduplication (`SELECT DISTINCT`, `drop_duplicates`): a key's row
    /// is emitted once, the first time the key is seen, in append and
    /// update modes alike.
    pub dedup: bool,
    /// Update mode, when the tail can drop a group (HAVING) or a group can
    /// end (a SESSION merged into another), and the output carries the
    /// whole group key: the output's key columns. A group emitted before an
    /// epoch and gone after it is then retracted.
    pub retract_keys: Vec<String>,
    /// A stage feeding an aggregation above it, without a window: emit each
    /// changed group's previous row signed −1 and its new row +1, in a last
    /// column [`changelog::SIGN`], so the aggregation above can take the old
    /// row back.
    pub changelog: bool,
    /// An aggregation over a changelog (see [`changelog::over_changelog`]):
    /// a group whose rows were all taken back leaves the state, as it
    /// leaves the output, so short-lived groups do not pile up.
    pub over_changelog: bool,
}

impl AggregateConfig {
    /// `state` as the aggregation keeps it. Its keys expire after the
    /// query's state TTL unless it is windowed: a window's groups leave
    /// when it closes (Flink's TTL does not reach window aggregations
    /// either). It is within the memory limit when the query sets one and
    /// the state is read by key: complete mode emits all of it each epoch,
    /// and a session's partitions are taken out whole. A window's closed
    /// groups are found on disk by their bound (`cold_lowest`).
    fn keep(&self, ctx: &SessionState, state: KeyedState) -> Result<KeyedState> {
        let state = match &self.window {
            None => state.expiring(StateTtl::of(ctx))?,
            Some(_) => state,
        };
        let sessions = self.window.as_ref().is_some_and(|w| w.session.is_some());
        if self.mode == OutputMode::Complete || sessions {
            return Ok(state);
        }
        let state = state.within(StateBudget::of(ctx))?;
        Ok(match &self.window {
            Some(w) => {
                let column = w.column;
                state.leaving_by(Box::new(move |rows| {
                    let bounds = crate::watermark::nanos(rows.column(column))?;
                    Ok(datafusion::arrow::compute::min(
                        bounds.as_primitive::<Int64Type>(),
                    ))
                }))
            }
            None => state,
        })
    }
}

/// A running GROUP BY.
///
/// Per epoch: [`process`](Operator::process) merges the epoch's partial
/// states into `state`, then takes the closed windows out and emits. Per checkpoint: the state's
/// changed and removed keys as a delta, or all of it as a snapshot.
#[derive(Debug)]
pub(crate) struct AggregateOperator {
    config: AggregateConfig,
    /// Per key, the accumulators' partial state; `None` until the first
    /// epoch shows its schema. Flushed to the checkpoint at each stage.
    state: Option<KeyedState>,
}

/// The aggregate as DataFusion planned it, taken apart.
#[derive(Debug)]
struct Phases {
    partial: Arc<AggregateExec>,
}

/// One epoch's merge, what [`Operator::process`] emits from.
#[derive(Debug)]
struct Processed {
    phases: Phases,
    /// The changed groups' new partial states.
    changed: Vec<RecordBatch>,
    /// The changed groups' states before this epoch, when retractions or
    /// a changelog are wanted.
    before: Option<RecordBatch>,
    /// Deduplication: the rows of keys seen for the first time.
    first_seen: Vec<RecordBatch>,
}

impl AggregateOperator {
    pub(crate) fn new(config: AggregateConfig) -> Self {
        Self {
            config,
            state: None,
        }
    }

    /// Plans the phases for this epoch's input and finds DataFusion's own
    /// partial aggregation, whose group keys, aggregate expressions and
    /// input the three phases share.
    async fn phases(&self, ctx: &SessionState) -> Result<Phases> {
        let physical = ctx.create_physical_plan(&self.config.aggregate).await?;
        let lowest = lowest_aggregate(&physical).ok_or_else(|| {
            SluiceError::Internal("no aggregation in the aggregate's physical plan".into())
        })?;
        let partial = AggregateExec::try_new(
            AggregateMode::Partial,
            lowest.group_expr().clone(),
            lowest.aggr_expr().to_vec(),
            lowest.filter_expr().to_vec(),
            Arc::clone(lowest.input()),
            lowest.input_schema(),
        )?;
        Ok(Phases {
            partial: Arc::new(partial),
        })
    }

    fn merge_exec(
        partial: &AggregateExec,
        mode: AggregateMode,
        input: Vec<RecordBatch>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let source = MemorySourceConfig::try_new_exec(&[input], partial.schema(), None)?;
        Ok(Arc::new(AggregateExec::try_new(
            mode,
            partial.group_expr().as_final(),
            partial.aggr_expr().to_vec(),
            vec![None; partial.aggr_expr().len()],
            source,
            partial.input_schema(),
        )?))
    }

    /// Merges the epoch's partial states into the stored ones (see
    /// [`Operator::process`]).
    async fn merge(&mut self, ctx: &SessionState) -> Result<Processed> {
        let phases = self.phases(ctx).await?;
        let task = ctx.task_ctx();
        let partial_schema = phases.partial.schema();
        let partials: Vec<RecordBatch> = collect(phases.partial.clone(), Arc::clone(&task))
            .await?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        let group_columns = phases.partial.group_expr().expr().len();
        let state = match &mut self.state {
            Some(s) => s,
            None => self.state.insert(self.config.keep(
                ctx,
                KeyedState::new(Arc::clone(&partial_schema), group_columns)?,
            )?),
        };
        // Keys past the TTL leave first: they are met as new.
        state.expire(group_columns)?;
        // The last commit's state within the memory limit, and the keys
        // this epoch meets back from disk.
        state.settle()?;
        state.fault_in(&partials)?;
        let mut first_seen = Vec::new();
        // The changed groups' states before this epoch, when retractions
        // are wanted: for sessions, the ones of the touched partitions,
        // whose keys a merge may end.
        let mut before = None;
        let wanted = !self.config.retract_keys.is_empty() || self.config.changelog;
        let changed = if partials.is_empty() {
            Vec::new()
        } else {
            let sessions = self.config.window.as_ref().and_then(|w| w.session.as_ref());
            if sessions.is_none() && merges_directly(&phases.partial) {
                let located = state.locate(&partials)?;
                // Stored states come from an earlier epoch's plan: same
                // columns, possibly other field metadata; rebind them.
                let stored = RecordBatch::try_new(
                    Arc::clone(&partial_schema),
                    located.stored.columns().to_vec(),
                )?;
                let merged = merge_located(&phases.partial, &partials, &stored, &located)?;
                if wanted && stored.num_rows() > 0 {
                    before = Some(stored);
                }
                if self.config.dedup {
                    // A dedup key is emitted once, when it is not stored
                    // yet, and written only then: a later row of it
                    // changes nothing (nor restarts its TTL, as in Flink).
                    let new = merged.slice(
                        located.positions.len(),
                        merged.num_rows() - located.positions.len(),
                    );
                    state.upsert(std::slice::from_ref(&new))?;
                    first_seen.push(new);
                } else {
                    state.upsert_located(&located, &merged)?;
                }
                vec![merged]
            } else {
                let mut merge_input = partials.clone();
                let stored = match sessions {
                    // The sessions of the same partitions may merge with the
                    // new rows: take them out, they come back merged.
                    Some(s) => {
                        let partition: Vec<usize> = (0..group_columns)
                            .filter(|&c| c != s.start && c != s.end)
                            .collect();
                        state.take_matching(&partials, &partition)?
                    }
                    None => state.lookup(&partials)?,
                };
                if stored.num_rows() > 0 {
                    let stored = RecordBatch::try_new(
                        Arc::clone(&partial_schema),
                        stored.columns().to_vec(),
                    )?;
                    if wanted {
                        before = Some(stored.clone());
                    }
                    merge_input.push(stored);
                }
                if let Some(s) = sessions {
                    let all = concat_batches(&partial_schema, &merge_input)?;
                    merge_input = vec![merge_sessions(&all, s, group_columns)?];
                }
                let reduce =
                    Self::merge_exec(&phases.partial, AggregateMode::PartialReduce, merge_input)?;
                let new_states = collect(reduce, Arc::clone(&task))
                    .await?
                    .into_iter()
                    .filter(|b| b.num_rows() > 0)
                    .map(|b| {
                        RecordBatch::try_new(Arc::clone(&partial_schema), b.columns().to_vec())
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                if self.config.dedup {
                    for b in &new_states {
                        first_seen.push(filter_record_batch(b, &state.unseen(b)?)?);
                    }
                    state.upsert(&first_seen)?;
                } else {
                    state.upsert(&new_states)?;
                }
                match (sessions, before.take()) {
                    // The sessions of a touched partition came out of the
                    // state whole; those no row reached are neither
                    // changed nor gone.
                    (Some(_), Some(stored)) => {
                        let after = concat_batches(&partial_schema, &new_states)?;
                        before = Some(concat_batches(
                            &partial_schema,
                            &other_rows(std::slice::from_ref(&stored), &after)?,
                        )?);
                        other_rows(&new_states, &stored)?
                    }
                    (_, stored) => {
                        before = stored;
                        new_states
                    }
                }
            }
        };
        if self.config.over_changelog {
            state.remove_keys(&dead_groups(&phases.partial, &changed)?)?;
        }
        Ok(Processed {
            phases,
            changed,
            before,
            first_seen,
        })
    }

    /// What the epoch emits once the watermark moved (see
    /// [`Operator::advance_watermark`]).
    async fn emit(
        &mut self,
        ctx: &SessionState,
        processed: Processed,
        watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        let Processed {
            phases,
            changed,
            before,
            first_seen,
        } = processed;
        let Some(state) = &mut self.state else {
            return Ok(EpochOutput::default());
        };
        let closed = match (&self.config.window, watermark) {
            (Some(w), Some(watermark)) => {
                let closed = |rows: &RecordBatch| w.closed(rows.column(w.column), watermark);
                let in_memory = state.remove_where(closed)?;
                // Groups on disk close too: looked for there only once the
                // least bound on disk has closed.
                if state
                    .cold_lowest()
                    .is_some_and(|low| w.closed_at(low, watermark))
                {
                    let on_disk = state.remove_cold_where(closed)?;
                    Some(concat_batches(&in_memory.schema(), [&in_memory, &on_disk])?)
                } else {
                    Some(in_memory)
                }
            }
            _ => None,
        };
        let to_emit = match self.config.mode {
            OutputMode::Complete => vec![RecordBatch::try_new(
                phases.partial.schema(),
                state.all()?.columns().to_vec(),
            )?],
            _ if self.config.dedup => first_seen,
            OutputMode::Append => closed.into_iter().collect(),
            OutputMode::Update => changed,
        };
        if to_emit.iter().all(|b| b.num_rows() == 0) && self.config.mode != OutputMode::Complete {
            return Ok(EpochOutput::default());
        }
        let rows = self.emitted(ctx, &phases, to_emit).await?;
        if self.config.changelog {
            let old = match before {
                Some(states) => self.emitted(ctx, &phases, vec![states]).await?,
                None => Vec::new(),
            };
            return Ok(EpochOutput {
                rows: changelog::signed(&old, &rows)?,
                retracted: None,
            });
        }
        let retracted = match before {
            Some(states) => {
                let before = self.emitted(ctx, &phases, vec![states]).await?;
                changelog::retracted(&before, &rows, &self.config.retract_keys)?
            }
            None => None,
        };
        Ok(EpochOutput { rows, retracted })
    }

    /// What the query emits for groups with partial `states`: their final
    /// values through the tail.
    async fn emitted(
        &self,
        ctx: &SessionState,
        phases: &Phases,
        states: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        let task = ctx.task_ctx();
        // The tail reads the final values under the Aggregate's own schema.
        let out_schema = self.config.output.schema_ref();
        let finals = if merges_directly(&phases.partial) {
            vec![finals(&phases.partial, &states, &out_schema)?]
        } else {
            collect(
                Self::merge_exec(&phases.partial, AggregateMode::Final, states)?,
                Arc::clone(&task),
            )
            .await?
            .into_iter()
            .map(|b| RecordBatch::try_new(Arc::clone(&out_schema), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?
        };
        let _input = self.config.output.with_input(vec![finals]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, task).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }
}

#[async_trait]
impl Operator for AggregateOperator {
    fn name(&self) -> &'static str {
        "aggregate"
    }

    fn drops_late(&self) -> bool {
        self.config.window.is_some()
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        let processed = self.merge(ctx).await?;
        self.emit(ctx, processed, watermark).await
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        self.state.stage(snapshot_due)
    }

    fn stage_sliced(&mut self, slicing: Slicing) -> Result<Option<Staged>> {
        match &mut self.state {
            Some(state) => state.stage_sliced(slicing),
            None => Ok(None),
        }
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        self.state.write_snapshot(w)
    }

    /// The schema is taken from DataFusion's plan, so it is known before
    /// the first epoch.
    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        let phases = self.phases(ctx).await?;
        let state = KeyedState::new(
            phases.partial.schema(),
            phases.partial.group_expr().expr().len(),
        )?;
        let mut state = self.config.keep(ctx, state)?;
        state.restore_chain(chain)?;
        self.state = Some(state);
        Ok(())
    }

    fn after_commit(&mut self) {
        self.state.after_commit();
    }

    fn state_size(&self) -> crate::state::StateSize {
        self.state.size()
    }
}

/// Whether the epoch's partial states can be merged by driving the
/// aggregation's accumulators directly ([`merge_located`], [`finals`]):
/// one set of group keys (no grouping sets), at least one key (a global
/// aggregate over no rows still has its one row), and every function
/// with a groups accumulator.
fn merges_directly(partial: &AggregateExec) -> bool {
    partial.group_expr().is_single()
        && !partial.group_expr().expr().is_empty()
        && partial
            .aggr_expr()
            .iter()
            .all(|e| e.groups_accumulator_supported())
}

/// The new partial states of the groups `located` found: per aggregate
/// function, one accumulator merges the stored states and the epoch's
/// partial states by group index, then gives its state back. The state
/// store has already told which rows are one key, so no hash aggregation
/// runs (DataFusion's `PartialReduce` would hash every key again).
fn merge_located(
    partial: &AggregateExec,
    partials: &[RecordBatch],
    stored: &RecordBatch,
    located: &Located,
) -> Result<RecordBatch> {
    let schema = partial.schema();
    let keys = partial.group_expr().expr().len();
    let groups = stored.num_rows() + located.new_rows.len();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for c in 0..keys {
        let new: Vec<&dyn Array> = partials.iter().map(|b| b.column(c).as_ref()).collect();
        let new = interleave(&new, &located.new_rows)?;
        columns.push(concat(&[stored.column(c).as_ref(), new.as_ref()])?);
    }
    let stored_groups: Vec<usize> = (0..stored.num_rows()).collect();
    for (expr, state) in state_columns(partial)? {
        let mut acc = expr.create_groups_accumulator()?;
        acc.merge_batch(&stored.columns()[state.clone()], &stored_groups, groups)?;
        for (batch, of_rows) in partials.iter().zip(&located.groups) {
            acc.merge_batch(&batch.columns()[state.clone()], of_rows, groups)?;
        }
        columns.extend(acc.state(EmitTo::All)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The final values of `states` (one row per key) as rows of `schema`:
/// the keys, then each function's accumulator fed its state and
/// evaluated, as DataFusion's `Final` step does after hashing the keys,
/// which are unique here.
fn finals(
    partial: &AggregateExec,
    states: &[RecordBatch],
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let states = concat_batches(&partial.schema(), states)?;
    let n = states.num_rows();
    let identity: Vec<usize> = (0..n).collect();
    let mut columns: Vec<ArrayRef> = states.columns()[..partial.group_expr().expr().len()].to_vec();
    for (expr, state) in state_columns(partial)? {
        let mut acc = expr.create_groups_accumulator()?;
        acc.merge_batch(&states.columns()[state], &identity, n)?;
        columns.push(acc.evaluate(EmitTo::All)?);
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The groups of `states` (partial states, one row per group) of an
/// aggregation over a changelog whose live rows ([`changelog::LIVE`])
/// number zero.
fn dead_groups(partial: &AggregateExec, states: &[RecordBatch]) -> Result<RecordBatch> {
    let live = state_columns(partial)?
        .into_iter()
        .find(|(expr, _)| expr.name() == changelog::LIVE)
        .map(|(_, columns)| columns.start)
        .ok_or_else(|| {
            SluiceError::Internal("an aggregation over a changelog counts no live rows".into())
        })?;
    let mut dead = Vec::with_capacity(states.len());
    for b in states {
        let rows = cast(b.column(live), &DataType::Int64)?;
        let mask: BooleanArray = rows
            .as_primitive::<Int64Type>()
            .iter()
            .map(|n| Some(n.unwrap_or(0) == 0))
            .collect();
        dead.push(filter_record_batch(b, &mask)?);
    }
    Ok(concat_batches(&partial.schema(), &dead)?)
}

/// Each aggregate function of `partial` with the columns of its state in
/// the partial states' rows (after the group keys).
fn state_columns(
    partial: &AggregateExec,
) -> Result<Vec<(&Arc<AggregateFunctionExpr>, Range<usize>)>> {
    let mut at = partial.group_expr().expr().len();
    let mut out = Vec::with_capacity(partial.aggr_expr().len());
    for expr in partial.aggr_expr() {
        let width = expr.state_fields()?.len();
        out.push((expr, at..at + width));
        at += width;
    }
    Ok(out)
}

/// The aggregation nearest the input: DataFusion's `Partial` (or `Single`)
/// step, whose input is the epoch's rows.
fn lowest_aggregate(plan: &Arc<dyn ExecutionPlan>) -> Option<&AggregateExec> {
    for child in plan.children() {
        if let Some(found) = lowest_aggregate(child) {
            return Some(found);
        }
    }
    let agg = plan.downcast_ref::<AggregateExec>()?;
    matches!(
        agg.mode(),
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
    )
    .then_some(agg)
}

/// The rows of `rows` that are not also rows of `other` (equal in every
/// column).
fn other_rows(rows: &[RecordBatch], other: &RecordBatch) -> Result<Vec<RecordBatch>> {
    let schema = other.schema();
    let converter = row_converter(schema.fields().iter().map(|f| f.data_type()))?;
    let known = converter.convert_columns(other.columns())?;
    let known: HashSet<&[u8]> = known.iter().map(|r| r.data()).collect();
    rows.iter()
        .map(|b| {
            let encoded = converter.convert_columns(b.columns())?;
            let new: BooleanArray = encoded
                .iter()
                .map(|r| Some(!known.contains(r.data())))
                .collect();
            Ok(filter_record_batch(b, &new)?)
        })
        .collect()
}
