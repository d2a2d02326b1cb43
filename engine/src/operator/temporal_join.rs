//! Event-time temporal joins (Flink's `JOIN r FOR SYSTEM_TIME AS OF
//! o.order_time`): each row of the probe side joins the version of the
//! versioned side that was valid at the row's time, the latest row of its
//! key at or before it.
//!
//! ```sql
//! SELECT o.id, o.amount * r.rate
//! FROM orders o JOIN rates FOR SYSTEM_TIME AS OF o.order_time AS r
//!   ON o.currency = r.currency
//! ```
//!
//! The versioned side is a stream whose rows are each a new version of
//! their key (the join's equality columns), at its event time; or an
//! upsert stream or Debezium changelog, whose deletions (a tombstone, a
//! row taken back) end their key's versions at their time, so that a
//! probe row after a deletion finds no version until the next. A
//! deletion and a version at the same time take effect in the order they
//! were read (a Debezium update's old row taken back, then its new row
//! added, leaves the new one). A probe
//! row's answer is final once no version at or before its time can still
//! arrive: when the query's watermark W (the least of both sides') passes
//! it, since later rows of either side are at W or after it (older ones
//! are late and dropped). So per epoch, with the epoch's new rows of each
//! side:
//!
//! 1. the probe rows join `pending`, the new versions join `versions`;
//! 2. the pending rows before W are joined, each with its key's latest
//!    version at or before its time (an inner join drops a row without
//!    one; a LEFT join pads it with nulls), emitted once and forgotten;
//! 3. of each key's versions before W only the latest stays (none, if it
//!    is a deletion): a future probe row, at W or after it, can reach no
//!    older one.
//!
//! The output is append-only. Both buffers are bounded by the watermark
//! (plus one version per key), and are written whole each epoch.
//!
//! SQL's clause reaches the planner as a join whose condition also calls
//! [`TemporalAsOf`] (`temporal_as_of(o.order_time, r.rate_time)`: the
//! probe row's time and the versioned side's event time); the DataFrame
//! API writes the same call in a join's filter. Outside a stream (a batch
//! query) the call is `rate_time <= order_time`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef, TimeUnit};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::common::{plan_err, JoinType};
use datafusion::error::Result as DfResult;
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, Join, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::physical_plan::collect;

use super::{buffers, Operator};
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{compact_views, row_converter};
use crate::table::EpochBatches;
use crate::watermark::{nanos, split_before};

/// The function's name.
const NAME: &str = "temporal_as_of";

/// `temporal_as_of(probe_time, version_time)`: marks a join of two streams
/// as a temporal join (see the module's text).
///
/// ```
/// use sluice_engine::TemporalAsOf;
/// use sluice_engine::datafusion::prelude::col;
///
/// // orders.join(rates, Inner, &["currency"], &["currency"],
/// //             Some(TemporalAsOf::call(col("order_time"), col("rate_time"))))
/// let marker = TemporalAsOf::call(col("order_time"), col("rate_time"));
/// # let _ = marker;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TemporalAsOf {
    signature: Signature,
}

impl TemporalAsOf {
    /// The function, to register in a session.
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::any(2, Volatility::Immutable),
        })
    }

    /// `temporal_as_of(probe_time, version_time)`.
    pub fn call(probe_time: Expr, version_time: Expr) -> Expr {
        Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(Self::udf()),
            vec![probe_time, version_time],
        ))
    }
}

impl ScalarUDFImpl for TemporalAsOf {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        match args {
            [DataType::Timestamp(..), DataType::Timestamp(..)] => Ok(DataType::Boolean),
            _ => plan_err!(
                "FOR SYSTEM_TIME AS OF compares two event times (TIMESTAMP columns), not {args:?}"
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let ns = |a: &ArrayRef| -> DfResult<ArrayRef> {
            let t = cast(a, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
            Ok(cast(&t, &DataType::Int64)?)
        };
        let (probe, version) = (ns(&arrays[0])?, ns(&arrays[1])?);
        let (probe, version) = (
            probe.as_primitive::<Int64Type>(),
            version.as_primitive::<Int64Type>(),
        );
        let out: BooleanArray = (0..probe.len())
            .map(|i| {
                (probe.is_valid(i) && version.is_valid(i))
                    .then(|| version.value(i) <= probe.value(i))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// Whether `e` is the temporal join's marker.
pub(crate) fn is_marker(e: &Expr) -> bool {
    matches!(e, Expr::ScalarFunction(f) if f.func.name() == NAME)
}

/// Whether `join` is a temporal join.
pub(crate) fn is_temporal(join: &Join) -> bool {
    join.filter
        .as_ref()
        .is_some_and(|f| split_conjunction(f).into_iter().any(is_marker))
}

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct TemporalJoinConfig {
    /// The probe side's rows, over the query's per-epoch stream tables.
    pub left: LogicalPlan,
    /// The versioned side's rows.
    pub right: LogicalPlan,
    /// Inner or Left.
    pub join_type: JoinType,
    /// The equality columns: a key of the versioned side.
    pub left_keys: Vec<usize>,
    pub right_keys: Vec<usize>,
    /// The probe rows' time, and the versions'.
    pub left_time: usize,
    pub right_time: usize,
    /// The versioned side's deletion marker (`upsert::DELETED`), for an
    /// upsert stream or a changelog.
    pub right_deleted: Option<usize>,
    /// The rest of the query, reading `output`: the joined rows (the probe
    /// side's columns, then the versioned side's).
    pub tail: LogicalPlan,
    pub output: Arc<EpochBatches>,
}

/// The running operator (see the module's text).
#[derive(Debug)]
pub(crate) struct TemporalJoinOperator {
    config: TemporalJoinConfig,
    /// Probe rows the watermark has not passed yet.
    pending: Option<RecordBatch>,
    /// The versions a probe row at or after the watermark can reach.
    versions: Option<RecordBatch>,
}

impl TemporalJoinOperator {
    pub(crate) fn new(config: TemporalJoinConfig) -> Self {
        Self {
            config,
            pending: None,
            versions: None,
        }
    }

    fn left_schema(&self) -> SchemaRef {
        Arc::new(self.config.left.schema().as_arrow().clone())
    }

    fn right_schema(&self) -> SchemaRef {
        Arc::new(self.config.right.schema().as_arrow().clone())
    }

    /// The epoch's new rows of `plan`, in `schema`.
    async fn read(
        ctx: &SessionState,
        plan: &LogicalPlan,
        schema: &SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let physical = ctx.create_physical_plan(plan).await?;
        collect(physical, ctx.task_ctx())
            .await?
            .iter()
            .map(|b| {
                Ok(RecordBatch::try_new(
                    Arc::clone(schema),
                    b.columns().to_vec(),
                )?)
            })
            .collect()
    }

    /// Which rows of `versions` are deletions; an error for one without a
    /// time, which would end its key's versions at no known time.
    fn deletions(&self, versions: &RecordBatch) -> Result<Vec<bool>> {
        let Some(marker) = self.config.right_deleted else {
            return Ok(vec![false; versions.num_rows()]);
        };
        let marker = versions.column(marker).as_boolean();
        let times = versions.column(self.config.right_time);
        let deleted: Vec<bool> = (0..versions.num_rows())
            .map(|i| marker.is_valid(i) && marker.value(i))
            .collect();
        if let Some(i) = (0..deleted.len()).find(|&i| deleted[i] && times.is_null(i)) {
            let key: Vec<String> = self
                .config
                .right_keys
                .iter()
                .map(|&k| {
                    array_value_to_string(versions.column(k), i).unwrap_or_else(|e| e.to_string())
                })
                .collect();
            return Err(SluiceError::plan(format!(
                "the temporal join's versioned side deletes key ({}) at no time: its time \
                 column is NULL in the deletion; take the versions' time from the record's \
                 timestamp (METADATA FROM 'timestamp')",
                key.join(", ")
            )));
        }
        Ok(deleted)
    }

    /// For each row of `probes`, the row of `versions` it joins: its key's
    /// latest version at or before its time, unless that is a deletion.
    fn match_versions(
        &self,
        probes: &RecordBatch,
        versions: &RecordBatch,
    ) -> Result<Vec<Option<u32>>> {
        let c = &self.config;
        let keys = |b: &RecordBatch, at: &[usize]| -> Vec<_> {
            at.iter().map(|&i| Arc::clone(b.column(i))).collect()
        };
        let (pk, vk) = (keys(probes, &c.left_keys), keys(versions, &c.right_keys));
        let converter = row_converter(vk.iter().map(|k| k.data_type()))?;
        let (pk, vk) = (
            converter.convert_columns(&pk)?,
            converter.convert_columns(&vk)?,
        );
        let vt = nanos(versions.column(c.right_time))?;
        let vt = vt.as_primitive::<Int64Type>();
        let deleted = self.deletions(versions)?;
        let mut by_key: HashMap<&[u8], Vec<(i64, u32)>> = HashMap::new();
        for i in 0..versions.num_rows() {
            // A key with a NULL joins nothing, as in an equi-join.
            let null_key = c.right_keys.iter().any(|&k| versions.column(k).is_null(i));
            if vt.is_valid(i) && !null_key {
                by_key
                    .entry(vk.row(i).data())
                    .or_default()
                    .push((vt.value(i), i as u32));
            }
        }
        // By time, then in the order read.
        for list in by_key.values_mut() {
            list.sort_unstable();
        }
        let pt = nanos(probes.column(c.left_time))?;
        let pt = pt.as_primitive::<Int64Type>();
        Ok((0..probes.num_rows())
            .map(|i| {
                let list = by_key.get(pk.row(i).data())?;
                let t = pt.value(i);
                let n = list.partition_point(|(vt, _)| *vt <= t);
                let (_, at) = *list.get(n.checked_sub(1)?)?;
                (!deleted[at as usize]).then_some(at)
            })
            .collect())
    }

    /// `probes` joined with `versions` (see [`Self::match_versions`]), as
    /// the join's output rows, through the rest of the query.
    async fn join(
        &self,
        ctx: &SessionState,
        probes: &RecordBatch,
        versions: &RecordBatch,
    ) -> Result<Vec<RecordBatch>> {
        let matched = self.match_versions(probes, versions)?;
        let keep: Vec<bool> = matched
            .iter()
            .map(|m| m.is_some() || self.config.join_type == JoinType::Left)
            .collect();
        let probes = filter_record_batch(probes, &BooleanArray::from(keep.clone()))?;
        if probes.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let indices = UInt32Array::from(
            matched
                .into_iter()
                .zip(keep)
                .filter(|(_, k)| *k)
                .map(|(m, _)| m)
                .collect::<Vec<_>>(),
        );
        let mut columns = probes.columns().to_vec();
        for column in versions.columns() {
            columns.push(take(column.as_ref(), &indices, None)?);
        }
        let joined = RecordBatch::try_new(self.config.output.schema_ref(), columns)?;
        let _input = self.config.output.with_input(vec![vec![joined]]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// Of `versions`, those at or after `watermark`, and each key's latest
    /// before it unless that is a deletion.
    fn reachable(&self, versions: &RecordBatch, watermark: i64) -> Result<RecordBatch> {
        let c = &self.config;
        let keys: Vec<_> = c
            .right_keys
            .iter()
            .map(|&i| Arc::clone(versions.column(i)))
            .collect();
        let encoded = row_converter(keys.iter().map(|k| k.data_type()))?.convert_columns(&keys)?;
        let times = nanos(versions.column(c.right_time))?;
        let times = times.as_primitive::<Int64Type>();
        let deleted = self.deletions(versions)?;
        let mut latest: HashMap<&[u8], (i64, usize)> = HashMap::new();
        let mut keep = vec![false; versions.num_rows()];
        for (i, k) in keep.iter_mut().enumerate() {
            if !times.is_valid(i) {
                continue;
            }
            let t = times.value(i);
            if t >= watermark {
                *k = true;
                continue;
            }
            let slot = latest.entry(encoded.row(i).data()).or_insert((t, i));
            if t >= slot.0 {
                *slot = (t, i);
            }
        }
        for (_, i) in latest.into_values() {
            keep[i] = !deleted[i];
        }
        Ok(filter_record_batch(versions, &BooleanArray::from(keep))?)
    }
}

#[async_trait]
impl Operator for TemporalJoinOperator {
    fn name(&self) -> &'static str {
        "temporal_join"
    }

    /// A version or probe row behind the watermark would change answers
    /// already emitted.
    fn drops_late(&self) -> bool {
        true
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        let (ls, rs) = (self.left_schema(), self.right_schema());
        let new_left = Self::read(ctx, &self.config.left, &ls).await?;
        let new_right = Self::read(ctx, &self.config.right, &rs).await?;
        let pending = self
            .pending
            .take()
            .unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(&ls)));
        let versions = self
            .versions
            .take()
            .unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(&rs)));
        let pending = concat_batches(&ls, std::iter::once(&pending).chain(&new_left))?;
        let versions = concat_batches(&rs, std::iter::once(&versions).chain(&new_right))?;
        let Some(watermark) = watermark else {
            self.pending = Some(compact_views(pending)?);
            self.versions = Some(compact_views(versions)?);
            return Ok(EpochOutput::default());
        };
        let (ready, pending) = split_before(&pending, self.config.left_time, watermark)?;
        let rows = if ready.num_rows() > 0 {
            self.join(ctx, &ready, &versions).await?
        } else {
            Vec::new()
        };
        self.pending = Some(compact_views(pending)?);
        self.versions = Some(compact_views(self.reachable(&versions, watermark)?)?);
        Ok(EpochOutput {
            rows,
            retracted: None,
        })
    }

    /// Written whole each epoch (see the module's text).
    fn stage(&mut self, _snapshot_due: bool) -> Result<Staged> {
        Ok(buffers::stage([&self.pending, &self.versions]))
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        let parts = [
            (&self.pending, self.left_schema()),
            (&self.versions, self.right_schema()),
        ];
        buffers::write(w, parts, "the temporal join's state")
    }

    async fn restore(&mut self, _ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        let schemas = [&self.left_schema(), &self.right_schema()];
        let restored = buffers::restore(chain, schemas, "the temporal join's snapshot")?;
        (self.pending, self.versions) = restored.unzip();
        Ok(())
    }

    fn after_commit(&mut self) {}

    fn state_size(&self) -> crate::state::StateSize {
        buffers::size([&self.pending, &self.versions])
    }
}
