//! An upsert stream's rows as a changelog (Flink's ChangelogNormalize): the
//! operator keeps each key's latest value, and turns each new value into
//! the previous one taken back (−1) and the new one added (+1), and each
//! deletion into the previous value taken back. An aggregation, a Top-N
//! or a join reads what it emits as it reads any changelog (see
//! `changelog`), so a `GROUP BY` over a compacted topic follows its keys'
//! updates and deletions.
//!
//! The state is one row per live key ([`KeyedState`], keyed by the upsert
//! key), as the source's table holds.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::collect;
use foldhash::{HashMap, HashMapExt};

use super::Operator;
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{row_converter, KeyedState, OneStore, StateTtl};

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct NormalizeConfig {
    /// The upsert stream's rows: its key columns first, then its values,
    /// then the deletion marker (`upsert::DELETED`).
    pub input: LogicalPlan,
    /// How many leading columns of `input` are the key.
    pub keys: usize,
    /// What it emits: `input`'s columns without the marker, then the sign.
    pub output: SchemaRef,
}

/// The running operator (see the module's text).
#[derive(Debug)]
pub(crate) struct NormalizeOperator {
    config: NormalizeConfig,
    /// Each live key's latest value (`input`'s columns without the marker).
    state: Option<KeyedState>,
}

impl NormalizeOperator {
    pub(crate) fn new(config: NormalizeConfig) -> Self {
        Self {
            config,
            state: None,
        }
    }

    /// The state, made at the first epoch or restore: each key's latest
    /// value, expiring after the query's state TTL.
    fn state(&mut self, ctx: &SessionState) -> Result<&mut KeyedState> {
        if self.state.is_none() {
            let fields = self.config.output.fields();
            let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(
                fields[..fields.len() - 1].to_vec(),
            ));
            self.state =
                Some(KeyedState::new(schema, self.config.keys)?.expiring(StateTtl::of(ctx))?);
        }
        self.state
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("the upsert state vanished".into()))
    }
}

/// Of `rows`, the last of each key (the first `keys` columns).
fn last_per_key(rows: &RecordBatch, keys: usize) -> Result<RecordBatch> {
    let encoded = row_converter(rows.schema().fields()[..keys].iter().map(|f| f.data_type()))?
        .convert_columns(&rows.columns()[..keys])?;
    let mut last: HashMap<&[u8], u32> = HashMap::new();
    for i in 0..rows.num_rows() {
        last.insert(encoded.row(i).data(), i as u32);
    }
    let mut at: Vec<u32> = last.into_values().collect();
    at.sort_unstable();
    Ok(take_record_batch(rows, &UInt32Array::from(at))?)
}

/// `rows` with a last column of `sign`, as `schema`.
fn signed(rows: &RecordBatch, sign: i64, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut columns = rows.columns().to_vec();
    columns.push(Arc::new(Int64Array::from(vec![sign; rows.num_rows()])));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

#[async_trait]
impl Operator for NormalizeOperator {
    fn name(&self) -> &'static str {
        "normalize"
    }

    fn drops_late(&self) -> bool {
        false
    }

    async fn process(
        &mut self,
        ctx: &SessionState,
        _watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        // Keys past the TTL leave first: their next value has no previous.
        let keys = self.config.keys;
        self.state(ctx)?.expire(keys)?;
        let physical = ctx.create_physical_plan(&self.config.input).await?;
        let schema = physical.schema();
        let rows = concat_batches(&schema, &collect(physical, ctx.task_ctx()).await?)?;
        if rows.num_rows() == 0 {
            return Ok(EpochOutput::default());
        }
        let rows = last_per_key(&rows, self.config.keys)?;
        let marker = rows.num_columns() - 1;
        let deleted: BooleanArray = rows
            .column(marker)
            .as_boolean_opt()
            .ok_or_else(|| {
                SluiceError::Internal("an upsert deletion marker is not boolean".into())
            })?
            .iter()
            .map(|d| Some(d.unwrap_or(false)))
            .collect();
        let values = rows.project(&(0..marker).collect::<Vec<_>>())?;
        let output = Arc::clone(&self.config.output);
        let state = self.state(ctx)?;
        let values = RecordBatch::try_new(state.all()?.schema(), values.columns().to_vec())?;
        let previous = state.lookup(std::slice::from_ref(&values))?;
        let live = filter_record_batch(&values, &datafusion::arrow::compute::not(&deleted)?)?;
        state.remove_keys(&filter_record_batch(&values, &deleted)?)?;
        state.upsert(std::slice::from_ref(&live))?;
        Ok(EpochOutput {
            rows: vec![signed(&previous, -1, &output)?, signed(&live, 1, &output)?],
            retracted: None,
        })
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        self.state.stage(snapshot_due)
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        self.state.write_snapshot(w)
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        self.state = None;
        self.state(ctx)?.restore_chain(chain)
    }

    fn after_commit(&mut self) {
        self.state.after_commit();
    }

    fn state_size(&self) -> crate::state::StateSize {
        self.state.size()
    }
}
