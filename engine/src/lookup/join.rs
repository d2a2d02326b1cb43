//! The lookup join: a hash join whose one side reads a [`LookupTable`]
//! becomes a [`LookupJoinExec`], which asks the table for the keys of the
//! other side's rows only.
//!
//! The rule runs last among the physical optimizer's rules, on every plan
//! the engine makes. Between the join and the table's scan it lets pass
//! what runs on the looked-up rows alone (projections, filters, and the
//! repartitions the planner adds); the join's keys on the table's side must
//! be the table's columns (through those projections, and casts).

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::{cast, concat, take};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::JoinType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{CastExpr, Column};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, PhysicalExprRef};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::TryStreamExt;

use super::{LookupScanExec, LookupTable};

/// Turns hash joins with a [`LookupTable`] into [`LookupJoinExec`]s (see
/// the module documentation).
///
/// ```
/// use datafusion::physical_optimizer::PhysicalOptimizerRule;
/// use sluice_engine::LookupJoinRule;
/// assert_eq!(LookupJoinRule.name(), "lookup_join");
/// ```
#[derive(Debug, Default)]
pub struct LookupJoinRule;

impl PhysicalOptimizerRule for LookupJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            Ok(match LookupJoinExec::try_new(join)? {
                Some(lookup) => Transformed::yes(Arc::new(lookup) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "lookup_join"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A join of a stream's rows with the rows a [`LookupTable`] holds for
/// their keys, per partition of the stream's rows.
#[derive(Debug)]
pub(crate) struct LookupJoinExec {
    /// The stream's side.
    probe: Arc<dyn ExecutionPlan>,
    lookup: Arc<Lookup>,
    properties: Arc<PlanProperties>,
}

/// What a [`LookupJoinExec`] runs over each partition of the probe's rows.
#[derive(Debug)]
struct Lookup {
    /// The join as planned, run over each partition's rows and their
    /// looked-up rows.
    join: HashJoinExec,
    probe_is_left: bool,
    probe_schema: SchemaRef,
    /// The table's side, from the join down to the scan.
    lookup_side: Arc<dyn ExecutionPlan>,
    scan: Arc<LookupScanExec>,
    /// Per key: its expression over the probe's rows, and the table's column.
    probe_keys: Vec<PhysicalExprRef>,
    table_columns: Vec<usize>,
}

impl LookupJoinExec {
    /// The lookup join `join` is, if one of its sides reads a lookup table.
    fn try_new(join: &HashJoinExec) -> DfResult<Option<Self>> {
        let (probe_is_left, lookup_side, scan) = match (scan_of(&join.left), scan_of(&join.right)) {
            (None, Some(scan)) => (true, Arc::clone(&join.right), scan),
            (Some(scan), None) => (false, Arc::clone(&join.left), scan),
            _ => return Ok(None),
        };
        let table = &scan.table.name;
        let keeps_probe = match join.join_type {
            JoinType::Inner => true,
            JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti => probe_is_left,
            JoinType::Right | JoinType::RightSemi | JoinType::RightAnti => !probe_is_left,
            _ => false,
        };
        if !keeps_probe {
            return Err(DataFusionError::Plan(format!(
                "a lookup join of table '{table}' looks up each of the stream's rows: write it \
                 as an INNER or LEFT JOIN from the stream (FROM s LEFT JOIN {table} FOR \
                 SYSTEM_TIME AS OF s.p_time AS t ON ...), not as a {} join",
                join.join_type
            )));
        }
        let mut probe_keys = Vec::new();
        let mut table_columns = Vec::new();
        for (left, right) in &join.on {
            let (probe_key, table_key) = match probe_is_left {
                true => (left, right),
                false => (right, left),
            };
            let column = column_of(table_key)
                .and_then(|c| table_column(&lookup_side, c))
                .ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "a lookup join of table '{table}' needs each of its join keys to be one \
                         of the table's columns (ON s.k = {table}.id); '{table_key}' is not"
                    ))
                })?;
            probe_keys.push(Arc::clone(probe_key));
            table_columns.push(column);
        }
        let probe = match probe_is_left {
            true => Arc::clone(&join.left),
            false => Arc::clone(&join.right),
        };
        let lookup = Lookup {
            join: join.builder().build()?,
            probe_is_left,
            probe_schema: probe.schema(),
            lookup_side,
            scan,
            probe_keys,
            table_columns,
        };
        Ok(Some(Self::over(probe, Arc::new(lookup))))
    }

    fn over(probe: Arc<dyn ExecutionPlan>, lookup: Arc<Lookup>) -> Self {
        let partitions = probe.output_partitioning().partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(lookup.join.schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            probe,
            lookup,
            properties: Arc::new(properties),
        }
    }
}

impl Lookup {
    /// The distinct, non-null keys of `rows`, as the table's column types.
    fn keys(&self, rows: &[RecordBatch]) -> DfResult<Vec<ArrayRef>> {
        let schema = self.scan.table.source.schema();
        let mut columns = Vec::with_capacity(self.probe_keys.len());
        for (expr, &column) in self.probe_keys.iter().zip(&self.table_columns) {
            let arrays = rows
                .iter()
                .map(|b| expr.evaluate(b)?.into_array(b.num_rows()))
                .collect::<DfResult<Vec<_>>>()?;
            let refs: Vec<&dyn datafusion::arrow::array::Array> =
                arrays.iter().map(|a| a.as_ref()).collect();
            let all = concat(&refs)?;
            columns.push(cast(&all, schema.field(column).data_type())?);
        }
        let fields = columns
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)?;
        let converted = converter.convert_columns(&columns)?;
        let mut seen = HashSet::new();
        let count = columns.first().map_or(0, |c| c.len());
        let distinct: Vec<u32> = (0..count)
            .filter(|&i| columns.iter().all(|c| c.is_valid(i)) && seen.insert(converted.row(i)))
            .map(|i| i as u32)
            .collect();
        let distinct = UInt32Array::from(distinct);
        columns
            .iter()
            .map(|c| Ok(take(c, &distinct, None)?))
            .collect()
    }

    /// Joins one partition's `rows` with the table's rows for their keys.
    async fn join_partition(
        self: Arc<Self>,
        rows: Vec<RecordBatch>,
        context: Arc<TaskContext>,
    ) -> DfResult<Vec<RecordBatch>> {
        let keys = self.keys(&rows)?;
        let found = match keys.first().is_some_and(|k| !k.is_empty()) {
            true => LookupTable::lookup(&self.scan.table, &self.table_columns, &keys)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?,
            false => Vec::new(),
        };
        let found = found
            .iter()
            .map(|b| b.project(&self.scan.projection))
            .collect::<Result<Vec<_>, _>>()?;
        let looked_up = MemorySourceConfig::try_new_exec(&[found], self.scan.schema(), None)?;
        let table_side = replace_scan(&self.lookup_side, looked_up)?;
        let probe_side =
            MemorySourceConfig::try_new_exec(&[rows], Arc::clone(&self.probe_schema), None)?;
        let children: Vec<Arc<dyn ExecutionPlan>> = match self.probe_is_left {
            true => vec![probe_side, table_side],
            false => vec![table_side, probe_side],
        };
        let join = self
            .join
            .builder()
            .with_new_children(children)?
            .with_partition_mode(PartitionMode::CollectLeft)
            .reset_state()
            .recompute_properties()
            .build_exec()?;
        collect(join, context).await
    }
}

/// The lookup table's scan under `plan`, through what may stand between
/// a join and it.
fn scan_of(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<LookupScanExec>> {
    if let Some(scan) = plan.downcast_ref::<LookupScanExec>() {
        return Some(Arc::new(scan.clone()));
    }
    if passes_through(plan) {
        return scan_of(plan.children().first()?);
    }
    None
}

/// Whether `plan` is one of what may stand between a join and a lookup
/// table's scan.
fn passes_through(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.is::<ProjectionExec>()
        || plan.is::<FilterExec>()
        || plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
}

/// Whether `plan` only moves rows between partitions.
fn only_moves(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.is::<RepartitionExec>() || plan.is::<CoalescePartitionsExec>()
}

/// The column `expr` reads, through casts.
fn column_of(expr: &PhysicalExprRef) -> Option<usize> {
    if let Some(c) = expr.downcast_ref::<Column>() {
        return Some(c.index());
    }
    column_of(expr.downcast_ref::<CastExpr>()?.expr())
}

/// The table's column that column `index` of `plan`'s output is.
fn table_column(plan: &Arc<dyn ExecutionPlan>, index: usize) -> Option<usize> {
    if let Some(scan) = plan.downcast_ref::<LookupScanExec>() {
        return scan.projection.get(index).copied();
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let column = p.expr().get(index)?.expr.downcast_ref::<Column>()?;
        return table_column(p.input(), column.index());
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        let index = match f.projection() {
            Some(p) => *p.get(index)?,
            None => index,
        };
        return table_column(f.input(), index);
    }
    if only_moves(plan) {
        return table_column(plan.children().first()?, index);
    }
    None
}

/// `plan` with the lookup table's scan replaced by `rows`, and without
/// the repartitions: the join runs over one partition.
fn replace_scan(
    plan: &Arc<dyn ExecutionPlan>,
    rows: Arc<dyn ExecutionPlan>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if plan.is::<LookupScanExec>() {
        return Ok(rows);
    }
    let Some(child) = plan.children().first().map(|c| Arc::clone(c)) else {
        return Err(DataFusionError::Internal(format!(
            "lookup join: no scan under {}",
            plan.name()
        )));
    };
    let child = replace_scan(&child, rows)?;
    if only_moves(plan) {
        return Ok(child);
    }
    #[allow(deprecated)]
    Arc::clone(plan).with_new_children(vec![child])
}

impl DisplayAs for LookupJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "LookupJoinExec: {} join of {}",
            self.lookup.join.join_type,
            self.lookup.scan.table.source.describe()
        )
    }
}

impl ExecutionPlan for LookupJoinExec {
    fn name(&self) -> &str {
        "LookupJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn schema(&self) -> SchemaRef {
        self.lookup.join.schema()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.probe]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        for key in &self.lookup.probe_keys {
            if f(key)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let probe = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("lookup join: no child given".into()))?;
        Ok(Arc::new(Self::over(probe, Arc::clone(&self.lookup))))
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let lookup = Arc::clone(&self.lookup);
        let rows = self.probe.execute(partition, Arc::clone(&context))?;
        let joined = async move {
            let rows: Vec<RecordBatch> = rows.try_collect().await?;
            lookup.join_partition(rows, context).await
        };
        let batches = futures::stream::once(joined)
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.lookup.join.schema(),
            batches,
        )))
    }
}
