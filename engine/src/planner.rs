//! The streaming planner: from a DataFusion `LogicalPlan` to what runs each
//! epoch.
//!
//! The planner checks that the query can run incrementally, binds each
//! stream scan to a fresh source and input slot for this query, and
//! optimises the plan once. Each epoch then turns that plan into a physical
//! plan over the epoch's batches (see `epoch`).
//!
//! This version runs stateless queries — projection, filter, scalar
//! functions, UDFs, unnest, union of streams — whose output per epoch depends
//! only on the epoch's input. Operators that need state across epochs are
//! rejected here, before anything runs, with what would work instead.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::execution::SessionState;
use datafusion::logical_expr::{LogicalPlan, TableScan};

use crate::connector::ConnectorRegistry;
use crate::error::{Result, SluiceError};
use crate::source::Source;
use crate::table::{as_stream_table, StreamTable};
use crate::trigger::OutputMode;

/// One stream scan of a running query.
#[derive(Debug)]
pub(crate) struct Input {
    /// Key in the checkpoint's offset records: `<position>:<stream name>`.
    pub key: String,
    /// The query's own table instance, fed each epoch.
    pub table: Arc<StreamTable>,
    /// The query's own source.
    pub source: Arc<dyn Source>,
    /// For progress and EXPLAIN.
    pub description: String,
}

/// A query ready for the epoch loop.
#[derive(Debug)]
pub(crate) struct IncrementalPlan {
    /// The optimised logical plan, scanning the inputs' tables.
    pub logical: LogicalPlan,
    /// The stream scans, in plan order.
    pub inputs: Vec<Input>,
    /// The output schema.
    pub output_schema: SchemaRef,
}

/// Checks that `plan` can run incrementally in `mode`, and binds it.
pub(crate) fn plan_query(
    state: &SessionState,
    registry: &ConnectorRegistry,
    plan: &LogicalPlan,
    mode: OutputMode,
) -> Result<IncrementalPlan> {
    check_incremental(plan, mode)?;
    let default_partitions = state.config().target_partitions();
    let mut inputs = Vec::new();
    let bound = plan
        .clone()
        .transform_up(|node| {
            let LogicalPlan::TableScan(scan) = node else {
                return Ok(Transformed::no(node));
            };
            let provider = source_as_provider(&scan.source)?;
            let Some(table) = as_stream_table(&provider) else {
                return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
            };
            let factory = table
                .factory(registry, default_partitions)
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let source = factory
                .create()
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let instance = table.for_query();
            inputs.push(Input {
                key: format!("{}:{}", inputs.len(), table.definition().name),
                table: Arc::clone(&instance),
                source,
                description: format!("{} ← {}", table.definition().name, factory.describe()),
            });
            Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                source: provider_as_source(instance),
                ..scan
            })))
        })
        .map_err(unwrap_external)?
        .data;
    if inputs.is_empty() {
        return Err(SluiceError::plan(
            "the query reads no stream: a continuous query needs at least one stream in FROM",
        ));
    }
    let logical = state.optimize(&bound)?;
    let output_schema = Arc::new(logical.schema().as_arrow().clone());
    Ok(IncrementalPlan {
        logical,
        inputs,
        output_schema,
    })
}

/// Our own errors travel through DataFusion's tree walk wrapped as
/// `External`; give them back their type.
fn unwrap_external(e: datafusion::error::DataFusionError) -> SluiceError {
    match e {
        datafusion::error::DataFusionError::External(inner) => {
            match inner.downcast::<SluiceError>() {
                Ok(ours) => *ours,
                Err(other) => {
                    SluiceError::DataFusion(datafusion::error::DataFusionError::External(other))
                }
            }
        }
        other => SluiceError::DataFusion(other),
    }
}

/// Rejects what cannot run incrementally, saying why and what would work.
fn check_incremental(plan: &LogicalPlan, mode: OutputMode) -> Result<()> {
    let mut problem = None;
    plan.apply(|node| {
        let what = match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Unnest(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::EmptyRelation(_) => None,
            LogicalPlan::TableScan(scan) => {
                let is_stream = source_as_provider(&scan.source)
                    .ok()
                    .is_some_and(|p| as_stream_table(&p).is_some());
                (!is_stream).then(|| {
                    format!(
                        "reads '{}', which is a table, not a stream; joining a stream with a \
                         static table is not supported yet",
                        scan.table_name
                    )
                })
            }
            LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) => Some(
                "aggregates across epochs (GROUP BY / DISTINCT / aggregate functions), which needs \
                 the stateful aggregation operator; this version runs stateless queries only \
                 (projection, filter, scalar functions, UDFs, unnest, UNION ALL)"
                    .to_string(),
            ),
            LogicalPlan::Join(_) => Some(
                "joins streams, which needs the stateful join operator; this version runs \
                 stateless queries only"
                    .to_string(),
            ),
            LogicalPlan::Sort(_) => Some(
                "sorts an unbounded stream (ORDER BY), which never finishes; remove the ORDER BY \
                 and sort where the output is read"
                    .to_string(),
            ),
            LogicalPlan::Limit(_) => Some(
                "uses LIMIT/OFFSET, which over an unbounded stream depends on epoch boundaries; \
                 remove it"
                    .to_string(),
            ),
            LogicalPlan::Window(_) => Some(
                "uses an OVER (...) window function, which needs state across epochs; use a \
                 GROUP BY over TUMBLE/HOP windows instead once available"
                    .to_string(),
            ),
            other => Some(format!(
                "uses {}, which cannot run incrementally",
                other.display().to_string().split(':').next().unwrap_or("this operator")
            )),
        };
        if let Some(w) = what {
            problem = Some(w);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(p) = problem {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it {p}"
        )));
    }
    if mode == OutputMode::Complete {
        return Err(SluiceError::plan(
            "output mode 'complete' needs an aggregation (it re-emits the whole result table); \
             this query is stateless: use 'append'",
        ));
    }
    Ok(())
}

/// The incremental plan as text, for `EXPLAIN` and `sluice explain`.
pub(crate) fn explain(plan: &IncrementalPlan, mode: OutputMode, sink: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!("output mode: {mode}\n"));
    out.push_str(&format!("sink: {sink}\n"));
    out.push_str("sources:\n");
    for i in &plan.inputs {
        out.push_str(&format!("  {}\n", i.description));
    }
    out.push_str("stateful operators: none\n");
    out.push_str("stateless segment (runs over each epoch's batches):\n");
    for line in plan.logical.display_indent().to_string().lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}
