//! OVER aggregations over event time: `sum(v) OVER (PARTITION BY k ORDER BY
//! ts ROWS BETWEEN 3 PRECEDING AND CURRENT ROW)`, or `RANGE BETWEEN
//! INTERVAL '10' SECOND PRECEDING AND CURRENT ROW` (Flink's OVER windows).
//!
//! A row's value depends on the rows before it in event time, so it is
//! final once no row can still arrive before it: when the watermark passes
//! it (rows behind the watermark are late and dropped). Each row is
//! emitted once, then, and the output is append-only.
//!
//! The state is the rows not yet final (`pending`) and the final rows a
//! later row's frame can still reach (`history`): the last `n` of each
//! partition for `ROWS n PRECEDING`, those within the interval of the
//! watermark for `RANGE`. Per epoch the rows the watermark passed are
//! computed by DataFusion's own window functions over them and the history
//! (marked, so that only they are emitted), which gives each of them the
//! frame a batch query over the whole stream would. The pending rows and
//! a RANGE frame's history are bounded by the watermark; a ROWS frame's
//! history holds n rows of every partition seen. The operator writes them
//! whole each epoch.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::{
    concat_batches, filter_record_batch, lexsort_to_indices, SortColumn,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::collect;

use super::{buffers, Operator};
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{compact_views, row_converter};
use crate::table::EpochBatches;
use crate::watermark::{nanos, split_before};

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct OverConfig {
    /// The window's input rows, over the query's per-epoch stream tables.
    pub input: LogicalPlan,
    /// The window over `rows`.
    pub window: LogicalPlan,
    /// The rows `window` reads: `input`'s columns and a last flag, true
    /// for the rows to emit.
    pub rows: Arc<EpochBatches>,
    /// The rest of the query, reading `output`: the window's output
    /// without the flag.
    pub tail: LogicalPlan,
    pub output: Arc<EpochBatches>,
    /// The columns of `input` that are the PARTITION BY.
    pub partitions: Vec<usize>,
    /// The column of `input` the window is ordered by, watermarked.
    pub time: usize,
    /// The most rows a `ROWS n PRECEDING` frame reaches back.
    pub rows_back: Option<u64>,
    /// How far (ns) a `RANGE ... PRECEDING` frame reaches back.
    pub range_back: Option<i64>,
}

/// The running operator (see the module's text).
#[derive(Debug)]
pub(crate) struct OverOperator {
    config: OverConfig,
    /// Rows the watermark has not passed yet.
    pending: Option<RecordBatch>,
    /// Rows emitted that a later row's frame can reach.
    history: Option<RecordBatch>,
}

impl OverOperator {
    pub(crate) fn new(config: OverConfig) -> Self {
        Self {
            config,
            pending: None,
            history: None,
        }
    }

    /// The input's rows, as the state holds them (`rows` without the flag).
    fn schema(&self) -> SchemaRef {
        let rows = self.config.rows.schema_ref();
        let fields = &rows.fields()[..rows.fields().len() - 1];
        Arc::new(datafusion::arrow::datatypes::Schema::new(fields.to_vec()))
    }

    /// The window's values of `finals`, with `history` before them.
    async fn compute(
        &self,
        ctx: &SessionState,
        history: &RecordBatch,
        finals: &RecordBatch,
    ) -> Result<Vec<RecordBatch>> {
        let flagged = |b: &RecordBatch, emit: bool| -> Result<RecordBatch> {
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(BooleanArray::from(vec![emit; b.num_rows()])));
            Ok(RecordBatch::try_new(
                self.config.rows.schema_ref(),
                columns,
            )?)
        };
        let rows = vec![flagged(history, false)?, flagged(finals, true)?];
        let out = {
            let _rows = self.config.rows.with_input(vec![rows]);
            let physical = ctx.create_physical_plan(&self.config.window).await?;
            collect(physical, ctx.task_ctx()).await?
        };
        let flag = self.config.rows.schema_ref().fields().len() - 1;
        let schema = self.config.output.schema_ref();
        let mut emitted = Vec::new();
        for b in out.iter().filter(|b| b.num_rows() > 0) {
            let mask = b
                .column(flag)
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| SluiceError::Internal("an OVER window's flag vanished".into()))?
                .clone();
            let kept = filter_record_batch(b, &mask)?;
            let columns: Vec<_> = (0..kept.num_columns())
                .filter(|&i| i != flag)
                .map(|i| Arc::clone(kept.column(i)))
                .collect();
            emitted.push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
        }
        if emitted.is_empty() {
            return Ok(Vec::new());
        }
        let _input = self.config.output.with_input(vec![emitted]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// Of `rows` (the history and the rows just emitted), those a row at
    /// or after `watermark` can still reach: within the RANGE frame's
    /// reach of the watermark, or among the last `n` of their partition
    /// for a ROWS frame.
    fn reachable(&self, rows: &RecordBatch, watermark: i64) -> Result<RecordBatch> {
        let n = rows.num_rows();
        let mut keep = vec![false; n];
        if let Some(back) = self.config.range_back {
            let times = nanos(rows.column(self.config.time))?;
            let times = times
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| SluiceError::Internal("event times are not Int64".into()))?;
            let from = watermark.saturating_sub(back);
            for (i, k) in keep.iter_mut().enumerate() {
                *k |= times.is_valid(i) && times.value(i) >= from;
            }
        }
        if let Some(last) = self.config.rows_back {
            let mut columns: Vec<SortColumn> = self
                .config
                .partitions
                .iter()
                .map(|&i| SortColumn {
                    values: Arc::clone(rows.column(i)),
                    options: None,
                })
                .collect();
            columns.push(SortColumn {
                values: Arc::clone(rows.column(self.config.time)),
                options: None,
            });
            let order = lexsort_to_indices(&columns, None)?;
            let keys: Vec<_> = self
                .config
                .partitions
                .iter()
                .map(|&i| Arc::clone(rows.column(i)))
                .collect();
            let encoded =
                row_converter(keys.iter().map(|k| k.data_type()))?.convert_columns(&keys)?;
            let at = |j: usize| order.value(j) as usize;
            // Each partition's run in the sorted order; its last rows kept.
            let mut end = order.len();
            while end > 0 {
                let mut start = end - 1;
                while start > 0 && encoded.row(at(start - 1)) == encoded.row(at(end - 1)) {
                    start -= 1;
                }
                for j in end.saturating_sub(last as usize).max(start)..end {
                    keep[at(j)] = true;
                }
                end = start;
            }
        }
        Ok(filter_record_batch(rows, &BooleanArray::from(keep))?)
    }
}

#[async_trait]
impl Operator for OverOperator {
    fn name(&self) -> &'static str {
        "over"
    }

    /// A row's frame holds only rows before it; a row behind the
    /// watermark would change values already emitted.
    fn drops_late(&self) -> bool {
        true
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        let schema = self.schema();
        let physical = ctx.create_physical_plan(&self.config.input).await?;
        let new = collect(physical, ctx.task_ctx()).await?;
        let new = new
            .iter()
            .map(|b| RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let empty = RecordBatch::new_empty(Arc::clone(&schema));
        let pending = self.pending.take().unwrap_or_else(|| empty.clone());
        let pending = concat_batches(&schema, std::iter::once(&pending).chain(&new))?;
        let Some(watermark) = watermark else {
            self.pending = Some(compact_views(pending)?);
            return Ok(EpochOutput::default());
        };
        let (finals, pending) = split_before(&pending, self.config.time, watermark)?;
        self.pending = Some(compact_views(pending)?);
        if finals.num_rows() == 0 {
            return Ok(EpochOutput::default());
        }
        let history = self.history.take().unwrap_or(empty);
        let rows = self.compute(ctx, &history, &finals).await?;
        let seen = concat_batches(&schema, [&history, &finals])?;
        self.history = Some(compact_views(self.reachable(&seen, watermark)?)?);
        Ok(EpochOutput {
            rows,
            retracted: None,
        })
    }

    /// Written whole each epoch (see the module's text).
    fn stage(&mut self, _snapshot_due: bool) -> Result<Staged> {
        Ok(buffers::stage([&self.pending, &self.history]))
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        let schema = self.schema();
        let parts = [
            (&self.pending, Arc::clone(&schema)),
            (&self.history, schema),
        ];
        buffers::write(w, parts, "the OVER window's state")
    }

    async fn restore(&mut self, _ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        let schema = self.schema();
        let restored = buffers::restore(chain, [&schema, &schema], "the OVER window's snapshot")?;
        (self.pending, self.history) = restored.unzip();
        Ok(())
    }

    fn after_commit(&mut self) {}

    fn state_size(&self) -> crate::state::StateSize {
        buffers::size([&self.pending, &self.history])
    }
}
