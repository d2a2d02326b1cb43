//! Top-N and deduplication: the rows ranked `1..=N` in each partition by
//! `ROW_NUMBER() OVER (PARTITION BY … ORDER BY …)`, kept as the input
//! arrives (Flink's Top-N; with `N = 1` its deduplication).
//!
//! The state is each partition's ranked rows, keyed by partition and rank
//! ([`KeyedState`]): `(p…, rn) → (order values…, row…)`. Per epoch, for
//! each partition the epoch's rows touch, the stored rows and the new ones
//! are ranked together; the rows whose rank changed are the partition's new
//! `(p…, rn)` entries, and are emitted in update mode keyed by the
//! partition and the rank. Over an append-only input a partition's row
//! count only grows, so every rank once filled stays filled and nothing is
//! retracted; rows pushed past `N` are forgotten, so the state holds at most
//! `N` rows per partition.
//!
//! Ties in the ORDER BY keep the rows already ranked ahead of new ones, and
//! new rows in their arrival order, as Flink does.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, AsArray, RecordBatch, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::compute::{concat_batches, lexsort_to_indices, take, SortColumn};
use datafusion::arrow::compute::{take_record_batch, SortOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::collect;
use foldhash::{HashSet, HashSetExt};

use super::Operator;
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{row_converter, KeyedState};
use crate::table::EpochBatches;

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct RankConfig {
    /// The rows to rank, over the query's per-epoch stream tables: the
    /// partition values (`partitions` columns), then the ORDER BY values
    /// (one per `order`), then the window's input row.
    pub input: LogicalPlan,
    /// How many leading columns of `input` are the partition.
    pub partitions: usize,
    /// The ORDER BY, one per order column of `input`.
    pub order: Vec<SortOptions>,
    /// The highest rank kept (`rn <= limit`).
    pub limit: u64,
    /// The rest of the query, reading `output`: the window's input row and
    /// its rank.
    pub tail: LogicalPlan,
    /// Where the ranked rows are put for `tail`.
    pub output: Arc<EpochBatches>,
}

/// The running Top-N operator (see the module's text).
#[derive(Debug)]
pub(crate) struct RankOperator {
    config: RankConfig,
    /// Created from the input plan's physical schema at the first epoch or
    /// restore.
    state: Option<KeyedState>,
}

impl RankOperator {
    pub(crate) fn new(config: RankConfig) -> Self {
        Self {
            config,
            state: None,
        }
    }

    /// The state, made for `input`'s columns (see [`RankConfig::input`]):
    /// `(p…, rn, o…, row…)`, keyed by the partition and the rank.
    fn state_for(&mut self, input: &Schema) -> Result<&mut KeyedState> {
        if self.state.is_none() {
            let k = self.config.partitions;
            let mut fields: Vec<Field> = input.fields()[..k]
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new("rn", DataType::UInt64, false));
            fields.extend(input.fields()[k..].iter().map(|f| f.as_ref().clone()));
            let fields = fields
                .into_iter()
                .enumerate()
                .map(|(i, f)| f.with_name(format!("s{i}")))
                .collect::<Vec<_>>();
            self.state = Some(KeyedState::new(Arc::new(Schema::new(fields)), k + 1)?);
        }
        self.state
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("the Top-N state vanished".into()))
    }

    /// The epoch's rows to rank, as one batch.
    async fn read(&self, ctx: &SessionState) -> Result<RecordBatch> {
        let physical = ctx.create_physical_plan(&self.config.input).await?;
        let schema = physical.schema();
        let batches = collect(physical, ctx.task_ctx()).await?;
        Ok(concat_batches(&schema, &batches)?)
    }

    /// Ranks the epoch's `rows` with the stored rows of their partitions;
    /// stores and returns the rows whose rank changed, as `(p…, rn, o…,
    /// row…)`.
    fn rank(&mut self, rows: &RecordBatch) -> Result<RecordBatch> {
        let (k, limit) = (self.config.partitions, self.config.limit);
        let order = self.config.order.clone();
        let state = self.state_for(&rows.schema())?;
        let state_schema = Arc::clone(state.all().schema_ref());
        let stored = state.lookup(&[probe(rows, k, limit, &state_schema)?])?;
        // Stored and new rows side by side, as `input`'s columns, with
        // where each came from (0 stored, 1 new) and its rank or arrival.
        let stored_columns: Vec<usize> = (0..stored.num_columns()).filter(|&c| c != k).collect();
        let candidates = concat_batches(
            &rows.schema(),
            &[
                RecordBatch::try_new(
                    rows.schema(),
                    stored.project(&stored_columns)?.columns().to_vec(),
                )?,
                rows.clone(),
            ],
        )?;
        let from_state = stored.num_rows();
        let source: ArrayRef = Arc::new(UInt8Array::from_iter_values(
            (0..candidates.num_rows()).map(|i| u8::from(i >= from_state)),
        ));
        let sequence: ArrayRef = Arc::new(UInt64Array::from_iter_values(
            stored
                .column(k)
                .as_primitive::<UInt64Type>()
                .values()
                .iter()
                .copied()
                .chain(0..rows.num_rows() as u64),
        ));
        let mut sort: Vec<SortColumn> = (0..k)
            .map(|c| SortColumn {
                values: Arc::clone(candidates.column(c)),
                options: None,
            })
            .collect();
        sort.extend(order.iter().enumerate().map(|(i, options)| SortColumn {
            values: Arc::clone(candidates.column(k + i)),
            options: Some(*options),
        }));
        sort.extend([source.clone(), sequence.clone()].map(|values| SortColumn {
            values,
            options: None,
        }));
        let sorted = lexsort_to_indices(&sort, None)?;
        // Walk each partition's rows in rank order.
        let partition = row_converter(
            candidates.schema().fields()[..k]
                .iter()
                .map(|f| f.data_type()),
        )?
        .convert_columns(&candidates.columns()[..k])?;
        let (source, sequence) = (
            source.as_primitive::<datafusion::arrow::datatypes::UInt8Type>(),
            sequence.as_primitive::<UInt64Type>(),
        );
        let (mut changed, mut ranks) = (Vec::new(), Vec::new());
        let mut rank = 0u64;
        for (n, i) in sorted.values().iter().map(|&i| i as usize).enumerate() {
            let first = n == 0 || partition.row(i) != partition.row(sorted.value(n - 1) as usize);
            rank = if first { 1 } else { rank + 1 };
            // A stored row that keeps its rank is already out there.
            if rank <= limit && !(source.value(i) == 0 && sequence.value(i) == rank) {
                changed.push(i as u32);
                ranks.push(rank);
            }
        }
        let changed = take_record_batch(&candidates, &UInt32Array::from(changed))?;
        let mut columns = changed.columns()[..k].to_vec();
        columns.push(Arc::new(UInt64Array::from(ranks)));
        columns.extend(changed.columns()[k..].iter().cloned());
        let changed = RecordBatch::try_new(state_schema, columns)?;
        state.upsert(std::slice::from_ref(&changed))?;
        Ok(changed)
    }

    /// The window's output for `changed` rows (the input row, then its
    /// rank) through the tail.
    async fn emit(&self, ctx: &SessionState, changed: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let k = self.config.partitions;
        let row_starts = k + 1 + self.config.order.len();
        let mut columns = changed.columns()[row_starts..].to_vec();
        columns.push(Arc::clone(changed.column(k)));
        let window_rows = RecordBatch::try_new(self.config.output.schema_ref(), columns)?;
        let _input = self.config.output.with_input(vec![vec![window_rows]]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }
}

/// The state keys `(p, 1..=limit)` of each partition `rows` touch.
fn probe(rows: &RecordBatch, k: usize, limit: u64, state: &SchemaRef) -> Result<RecordBatch> {
    let partition = row_converter(rows.schema().fields()[..k].iter().map(|f| f.data_type()))?
        .convert_columns(&rows.columns()[..k])?;
    let mut seen = HashSet::new();
    let (mut at, mut rank) = (Vec::new(), Vec::new());
    for i in 0..rows.num_rows() {
        if seen.insert(partition.row(i).as_ref().to_vec()) {
            for r in 1..=limit {
                at.push(i as u32);
                rank.push(r);
            }
        }
    }
    let at = UInt32Array::from(at);
    let mut columns = rows.columns()[..k]
        .iter()
        .map(|c| Ok(take(c.as_ref(), &at, None)?))
        .collect::<Result<Vec<ArrayRef>>>()?;
    columns.push(Arc::new(UInt64Array::from(rank)));
    let fields: Vec<Field> = state.fields()[..=k]
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

#[async_trait]
impl Operator for RankOperator {
    fn name(&self) -> &'static str {
        "rank"
    }

    fn drops_late(&self) -> bool {
        false
    }

    async fn process(
        &mut self,
        ctx: &SessionState,
        _watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        let rows = self.read(ctx).await?;
        if rows.num_rows() == 0 {
            return Ok(EpochOutput::default());
        }
        let changed = self.rank(&rows)?;
        Ok(EpochOutput {
            rows: self.emit(ctx, &changed).await?,
            retracted: None,
        })
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        match &self.state {
            None => Ok(Staged::Nothing),
            Some(_) if snapshot_due => Ok(Staged::Snapshot),
            Some(state) if state.has_changes() => Ok(Staged::Delta(state.pending_delta()?)),
            Some(_) => Ok(Staged::Unchanged),
        }
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        match &self.state {
            Some(state) => state.snapshot_to(w),
            None => Ok(()),
        }
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        let schema = ctx.create_physical_plan(&self.config.input).await?.schema();
        self.state = None;
        let state = self.state_for(&schema)?;
        if let Some(snapshot) = chain.next() {
            state.restore(snapshot?)?;
            for delta in chain {
                state.apply_delta(&delta?)?;
            }
        }
        Ok(())
    }

    fn after_commit(&mut self) {
        if let Some(state) = &mut self.state {
            state.clear_changes();
        }
    }

    fn state_size(&self) -> (u64, u64) {
        self.state
            .as_ref()
            .map_or((0, 0), |s| (s.num_rows(), s.num_bytes()))
    }
}
