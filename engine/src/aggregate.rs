//! Incremental GROUP BY aggregation through DataFusion's accumulator phases.
//!
//! Per epoch (DESIGN §3):
//! 1. `Partial` over the epoch's rows gives per-key partial states;
//! 2. `PartialReduce` over (those ∪ the stored states of the same keys)
//!    gives the keys' new states, which replace the stored ones;
//! 3. `Final` over the new states (update mode) or over every stored state
//!    (complete mode) gives the values to emit;
//! 4. the query's stateless tail (projection, HAVING) runs over them.
//!
//! So every aggregate function DataFusion has — count, sum, min, max, avg,
//! count(DISTINCT), approx_distinct, stddev, array_agg, UDAFs — works
//! without a line of its own: DataFusion's accumulators define the state
//! and how to merge it. The operator's state is the [`KeyedState`] of
//! partial states: flushed as a snapshot every epoch, before the commit.
//!
//! Deduplication is the same operator keyed by the distinct columns: a
//! key's row is emitted the first time the key is seen, never again.
//!
//! Event-time windows (a group key carrying a window bound, see `window`):
//! once the watermark reaches a window's end its groups are final. Append
//! mode emits them then, once, and only then; update mode emits groups as
//! they change. Either way the closed groups leave the state, which stays
//! bounded by the windows still open. Complete mode keeps every group.

use std::sync::Arc;

use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{collect, ExecutionPlan};

use crate::error::{Result, SluiceError};
use crate::state::KeyedState;
use crate::table::EpochBatches;
use crate::trigger::OutputMode;
use crate::window::WindowKey;

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
}

/// A running GROUP BY.
#[derive(Debug)]
pub(crate) struct AggregateOperator {
    config: AggregateConfig,
    /// Per key, the accumulators' partial state; `None` until the first
    /// epoch shows its schema.
    state: Option<KeyedState>,
}

/// The aggregate as DataFusion planned it, taken apart.
struct Phases {
    partial: Arc<AggregateExec>,
}

impl AggregateOperator {
    pub(crate) fn new(config: AggregateConfig) -> Self {
        Self {
            config,
            state: None,
        }
    }

    /// Whether its groups are event-time windows that close.
    pub(crate) fn is_windowed(&self) -> bool {
        self.config.window.is_some()
    }

    /// Rows and bytes held in state.
    pub(crate) fn state_size(&self) -> (u64, u64) {
        self.state
            .as_ref()
            .map_or((0, 0), |s| (s.num_rows(), s.num_bytes()))
    }

    /// The state as snapshot bytes, if any state exists yet.
    pub(crate) fn snapshot(&self) -> Result<Option<Vec<u8>>> {
        self.state.as_ref().map(KeyedState::snapshot).transpose()
    }

    /// Plans the phases for this epoch's input and finds DataFusion's own
    /// partial aggregation, whose group keys, aggregate expressions and
    /// input the three phases share.
    async fn phases(&self, state: &SessionState) -> Result<Phases> {
        let physical = state.create_physical_plan(&self.config.aggregate).await?;
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

    /// Runs one epoch over the input already set in the query's tables;
    /// returns the rows to emit.
    /// `watermark` is the query's watermark after this epoch's input.
    pub(crate) async fn run_epoch(
        &mut self,
        session: &SessionState,
        watermark: Option<i64>,
    ) -> Result<Vec<RecordBatch>> {
        let phases = self.phases(session).await?;
        let task = session.task_ctx();
        let partial_schema = phases.partial.schema();
        let partials: Vec<RecordBatch> = collect(phases.partial.clone(), Arc::clone(&task))
            .await?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        let group_columns = phases.partial.group_expr().expr().len();
        let state = match &mut self.state {
            Some(s) => s,
            None => self
                .state
                .insert(KeyedState::new(Arc::clone(&partial_schema), group_columns)?),
        };
        let mut first_seen = Vec::new();
        let changed = if partials.is_empty() {
            Vec::new()
        } else {
            let mut merge_input = partials.clone();
            let stored = state.lookup(&partials)?;
            if stored.num_rows() > 0 {
                // Stored states come from an earlier epoch's plan: same
                // columns, possibly other field metadata; rebind them.
                merge_input.push(RecordBatch::try_new(
                    Arc::clone(&partial_schema),
                    stored.columns().to_vec(),
                )?);
            }
            let reduce =
                Self::merge_exec(&phases.partial, AggregateMode::PartialReduce, merge_input)?;
            let new_states: Vec<RecordBatch> = collect(reduce, Arc::clone(&task))
                .await?
                .into_iter()
                .filter(|b| b.num_rows() > 0)
                .map(|b| RecordBatch::try_new(Arc::clone(&partial_schema), b.columns().to_vec()))
                .collect::<std::result::Result<_, _>>()?;
            if self.config.dedup {
                for b in &new_states {
                    first_seen.push(filter_record_batch(b, &state.unseen(b)?)?);
                }
            }
            state.upsert(&new_states)?;
            new_states
        };
        let closed = match (&self.config.window, watermark) {
            (Some(w), Some(watermark)) => Some(state.take_closed(w, watermark)?),
            _ => None,
        };
        let to_emit = match self.config.mode {
            OutputMode::Complete => vec![RecordBatch::try_new(
                Arc::clone(&partial_schema),
                state.all().columns().to_vec(),
            )?],
            _ if self.config.dedup => first_seen,
            OutputMode::Append => closed.into_iter().collect(),
            OutputMode::Update => changed,
        };
        if to_emit.iter().all(|b| b.num_rows() == 0) && self.config.mode != OutputMode::Complete {
            return Ok(Vec::new());
        }
        let finals = collect(
            Self::merge_exec(&phases.partial, AggregateMode::Final, to_emit)?,
            Arc::clone(&task),
        )
        .await?;
        // The tail reads the final values under the Aggregate's own schema.
        let out_schema = self.config.output.schema_ref();
        let finals = finals
            .into_iter()
            .map(|b| RecordBatch::try_new(Arc::clone(&out_schema), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.config.output.set_input(vec![finals]);
        let tail = session.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, task).await?;
        self.config.output.set_input(Vec::new());
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// Replaces the state with a snapshot (recovery). The schema is taken
    /// from DataFusion's plan, so it is known before the first epoch.
    pub(crate) async fn restore(&mut self, session: &SessionState, bytes: &[u8]) -> Result<()> {
        let phases = self.phases(session).await?;
        let mut state = KeyedState::new(
            phases.partial.schema(),
            phases.partial.group_expr().expr().len(),
        )?;
        state.restore(bytes)?;
        self.state = Some(state);
        Ok(())
    }
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
