//! The streaming planner: from a DataFusion `LogicalPlan` to what runs each
//! epoch.
//!
//! The planner checks that the query can run incrementally, binds each
//! stream scan to a fresh source and input slot for this query, and
//! optimises the plan once. Each epoch then turns that plan into a physical
//! plan over the epoch's batches (see `epoch`).
//!
//! Stateless parts (projection, filter, scalar functions, UDFs, unnest,
//! union of streams) run as DataFusion plans over each epoch's batches.
//! The stateful operators (aggregation, stream–stream join) are cut out of
//! the plan: the outermost one becomes the query's `aggregate` or `join`,
//! and any under it become stages that feed it (see [`split_stages`]).
//! What cannot run incrementally is rejected here, before anything runs,
//! with what would work instead.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, JoinType};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, TableScan};

use crate::aggregate::AggregateConfig;
use crate::changelog::{counts_live_rows, over_changelog, SIGN};
use crate::connector::ConnectorRegistry;
use crate::error::{Result, SluiceError};
use crate::join::{is_time_column, left_state_fields, time_bounds, JoinConfig};
use crate::source::Source;
use crate::table::{as_stream_table, EpochBatches, StreamTable};
use crate::trigger::OutputMode;
use crate::watermark::WatermarkTracker;
use crate::window::{is_session_bound, window_key, WindowKey};

/// One stream scan of a running query.
#[derive(Debug)]
pub(crate) struct Input {
    /// Key in the checkpoint's offset records: `<position>:<stream name>`,
    /// in a statement set prefixed by the statement's `<position>/`.
    pub key: String,
    /// The query's own table instance, fed each epoch.
    pub table: Arc<StreamTable>,
    /// The query's own source.
    pub source: Arc<dyn Source>,
    /// For progress and EXPLAIN.
    pub description: String,
    /// How many scans in the plan read it (a self-join, a stream on two
    /// paths): each epoch's input is read once and handed to all of them.
    pub scans: usize,
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
    /// The output mode: the one asked for, or the one derived.
    pub mode: OutputMode,
    /// The GROUP BY, when the query has one; `logical` is then unused.
    pub aggregate: Option<AggregateConfig>,
    /// The interval join, when the query has one; `logical` is then unused.
    pub join: Option<JoinConfig>,
    /// The stateful operators under the one above (`aggregate` or `join`),
    /// innermost first, when the query has several: each feeds what it
    /// emits to the operator above it.
    pub stages: Vec<Stage>,
    /// With stages, the plan before it was split into them: what one batch
    /// query runs for the batch answer.
    pub unsplit: Option<LogicalPlan>,
    /// The session state epochs are planned with.
    pub state: SessionState,
    /// Output columns carrying the whole GROUP BY key (see
    /// [`crate::SinkArgs::key_columns`]).
    pub key_columns: Vec<String>,
    /// The inputs' event-time watermarks.
    pub watermarks: WatermarkTracker,
}

/// A stateful operator that feeds another one (see [`split_stages`]).
#[derive(Debug)]
pub(crate) struct Stage {
    pub config: StageConfig,
    /// Where its rows go each epoch: the scan that replaced it (and the
    /// stateless segment above it) in the plan of the operator above.
    pub link: Arc<EpochBatches>,
}

/// What a [`Stage`] runs.
#[derive(Debug)]
pub(crate) enum StageConfig {
    Aggregate(Box<AggregateConfig>),
    Join(Box<JoinConfig>),
}

/// Optimizer rules that would take an aggregation apart in ways the
/// incremental operator cannot follow: rewriting `count(DISTINCT x)` into
/// two nested aggregations would keep only the inner one's state.
const UNSUPPORTED_RULES: &[&str] = &["single_distinct_aggregation_to_group_by"];

/// Rules run when the query is planned, but not again on the operators'
/// plans each epoch: computing equal aggregate expressions once (the sums
/// [`over_changelog`] writes after planning) would leave the operator's
/// partial states with fewer columns than its aggregation's output.
const PLANNING_ONLY_RULES: &[&str] = &["common_sub_expression_eliminate"];

/// `state` without the optimizer rules named in `without`.
fn without_rules(state: &SessionState, without: &[&[&str]]) -> SessionState {
    let rules = state
        .optimizers()
        .iter()
        .filter(|r| !without.iter().any(|names| names.contains(&r.name())))
        .cloned()
        .collect();
    SessionStateBuilder::new_from_existing(state.clone())
        .with_optimizer_rules(rules)
        .build()
}

/// Checks that `plan` can run incrementally in `mode` (derived when
/// `None`), and binds it; its inputs' keys start with `key_prefix`.
pub(crate) fn plan_query(
    state: &SessionState,
    registry: &ConnectorRegistry,
    plan: &LogicalPlan,
    mode: Option<OutputMode>,
    key_prefix: &str,
) -> Result<IncrementalPlan> {
    let Checked {
        mode,
        dedup,
        watermarked,
    } = check_incremental(plan, mode)?;
    let planning = without_rules(state, &[UNSUPPORTED_RULES]);
    let state = without_rules(state, &[UNSUPPORTED_RULES, PLANNING_ONLY_RULES]);
    let default_partitions = state.config().target_partitions();
    let mut inputs: Vec<Input> = Vec::new();
    // The stream tables bound so far (by identity: a DataFrame's streams may
    // share a name) and their inputs.
    let mut bound_tables: Vec<(*const (), usize)> = Vec::new();
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
            // A stream scanned again reads the same input: one read per
            // epoch, and every path sees the same rows (and the same late
            // ones), whatever arrives between two reads.
            let identity = Arc::as_ptr(&provider) as *const ();
            if let Some(&(_, i)) = bound_tables.iter().find(|(t, _)| *t == identity) {
                let input = &mut inputs[i];
                input.scans += 1;
                return Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                    source: provider_as_source(Arc::clone(&input.table) as Arc<dyn TableProvider>),
                    ..scan
                })));
            }
            let factory = table
                .factory(registry, default_partitions)
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let source = factory
                .create()
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let instance = table.for_query();
            bound_tables.push((identity, inputs.len()));
            inputs.push(Input {
                key: format!("{key_prefix}{}:{}", inputs.len(), table.definition().name),
                table: Arc::clone(&instance),
                source,
                description: format!("{} ← {}", table.definition().name, factory.describe()),
                scans: 1,
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
    let watermarks = WatermarkTracker::new(inputs.iter().map(|i| {
        let def = i.table.definition();
        (
            i.key.as_str(),
            def.name.as_str(),
            i.table.schema(),
            def.watermark.as_ref(),
        )
    }))?;
    let logical = planning.optimize(&bound)?;
    let output_schema = Arc::new(logical.schema().as_arrow().clone());
    let unsplit = logical.clone();
    let (logical, stages) = split_stages(logical, &watermarked)?;
    let unsplit = (!stages.is_empty()).then_some(unsplit);
    let mut aggregate = split_aggregate(&logical, mode, dedup, &watermarked)?;
    let join = match aggregate {
        Some(_) => None,
        None => split_join(&logical, &watermarked)?,
    };
    let key_columns: Vec<String> = aggregate
        .as_ref()
        .map(group_key_columns)
        .unwrap_or_default();
    if let Some(a) = &mut aggregate {
        // Only a filter after the aggregate (HAVING) drops a changed group.
        let filters = a
            .tail
            .exists(|p| Ok(matches!(p, LogicalPlan::Filter(_))))
            .unwrap_or(true);
        if a.mode == OutputMode::Update && !a.dedup && filters {
            a.retract_keys = key_columns.clone();
        }
    }
    Ok(IncrementalPlan {
        key_columns,
        logical,
        inputs,
        output_schema,
        mode,
        aggregate,
        join,
        stages,
        unsplit,
        state,
        watermarks,
    })
}

/// Whether `node` keeps state across epochs: an aggregation (GROUP BY,
/// DISTINCT) or a join of two streams.
fn is_stateful(node: &LogicalPlan) -> bool {
    match node {
        LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) => true,
        LogicalPlan::Join(j) => reads_stream(&j.left) && reads_stream(&j.right),
        _ => false,
    }
}

/// The stateful nodes over streams, outermost first (pre-order).
fn stateful_nodes(plan: &LogicalPlan) -> Vec<&LogicalPlan> {
    streaming_nodes(plan)
        .into_iter()
        .filter(|n| is_stateful(n))
        .collect()
}

/// The table name of the scan that replaces the `i`-th stage.
const STAGE_OUTPUT: &str = "__sluice_stage";

/// Splits a plan with several stateful operators into stages, innermost
/// first, until one is left (returned in the plan, for `split_aggregate`
/// or `split_join`). Each step takes an innermost operator N and the
/// input C of the nearest stateful operator above it that holds N: N with
/// the stateless segment up to the top of C becomes a stage, and C a scan
/// of what that stage emits.
///
/// A join's rows and those of an aggregation over event-time windows
/// (emitted once, when the watermark closes the window) never change, and
/// the operator above takes each as a new row. An aggregation without a
/// window changes its rows every epoch: it emits a changelog, which only an
/// aggregation can read (see [`over_changelog`]); under a join it is
/// refused.
fn split_stages(
    mut plan: LogicalPlan,
    watermarked: &[String],
) -> Result<(LogicalPlan, Vec<Stage>)> {
    let mut stages = Vec::new();
    loop {
        let nodes = stateful_nodes(&plan);
        if nodes.len() <= 1 {
            return Ok((plan, stages));
        }
        // Pre-order: the last node has no stateful node below it.
        let inner = nodes[nodes.len() - 1];
        let holds = |p: &LogicalPlan| p.exists(|n| Ok(n == inner)).unwrap_or(false);
        let Some(parent) = nodes[..nodes.len() - 1].iter().rev().find(|n| holds(n)) else {
            return Err(SluiceError::plan(
                "this query cannot run on a stream: it combines stateful operators side by \
                 side (e.g. a UNION of aggregations); write each to a stream and combine those",
            ));
        };
        let Some(child) = parent.inputs().into_iter().find(|c| holds(c)).cloned() else {
            return Err(SluiceError::Internal("a stage's input vanished".into()));
        };
        if stateful_nodes(&child).len() != 1 {
            return Err(SluiceError::plan(
                "this query cannot run on a stream: an operator reads several stateful \
                 operators through one input (e.g. a UNION of aggregations); write each to a \
                 stream and combine those",
            ));
        }
        let parent = (*parent).clone();
        // A stage's rows reach the operator above through a scan of its
        // output: `from` is replaced by `to` in the plan. That is C by the
        // scan, except under a changelog, where the aggregation above is
        // replaced by its rewrite over the scan.
        let name = format!("{STAGE_OUTPUT}{}", stages.len());
        let (config, link, from, to) = match inner {
            LogicalPlan::Join(_) => {
                let join = split_join(&child, watermarked)?
                    .ok_or_else(|| SluiceError::Internal("a stage's join vanished".into()))?;
                let (scan, link) = batches_scan(&name, child.schema(), &[])?;
                (StageConfig::Join(Box::new(join)), link, child, scan)
            }
            _ => {
                let vanished = || SluiceError::Internal("a stage's aggregate vanished".into());
                let agg = split_aggregate(&child, OutputMode::Append, false, watermarked)?
                    .ok_or_else(vanished)?;
                if agg.window.is_some() {
                    let (scan, link) = batches_scan(&name, child.schema(), &[])?;
                    (StageConfig::Aggregate(Box::new(agg)), link, child, scan)
                } else {
                    // Its rows change every epoch: only an aggregation can
                    // take an old row back.
                    let LogicalPlan::Aggregate(above) = &parent else {
                        return Err(SluiceError::plan(
                            "this query cannot run on a stream: it feeds an aggregation \
                             without an event-time window into a join. Its rows change every \
                             epoch, and a join cannot take a row it has matched back; group \
                             the aggregation by a TUMBLE or HOP window over a watermarked \
                             column (its rows are then final when emitted), or write it to a \
                             stream",
                        ));
                    };
                    let mut agg = split_aggregate(&child, OutputMode::Update, false, watermarked)?
                        .ok_or_else(vanished)?;
                    agg.changelog = true;
                    let sign = Field::new(SIGN, DataType::Int64, false);
                    let (scan, link) = batches_scan(&name, child.schema(), &[sign])?;
                    let rewritten = over_changelog(above, scan)?;
                    (
                        StageConfig::Aggregate(Box::new(agg)),
                        link,
                        parent,
                        rewritten,
                    )
                }
            }
        };
        plan = plan
            .transform_up(|n| {
                Ok(if n == from {
                    Transformed::yes(to.clone())
                } else {
                    Transformed::no(n)
                })
            })?
            .data;
        stages.push(Stage { config, link });
    }
}

/// The output columns that pass the group key through unchanged, if every
/// key column is among them, in output order.
fn group_key_columns(agg: &AggregateConfig) -> Vec<String> {
    let LogicalPlan::Aggregate(a) = &agg.aggregate else {
        return Vec::new();
    };
    let keys: Vec<&String> = a
        .schema
        .fields()
        .iter()
        .take(a.group_expr.len())
        .map(|f| f.name())
        .collect();
    // Down to the projection that names the output columns: the nodes
    // above it (a DataFrame's filter after the aggregate) keep the columns.
    let mut top = &agg.tail;
    while let LogicalPlan::Filter(_) | LogicalPlan::Sort(_) | LogicalPlan::Limit(_) = top {
        top = top.inputs()[0];
    }
    let LogicalPlan::Projection(top) = top else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (expr, field) in top.expr.iter().zip(top.schema.fields()) {
        // The tail reads the aggregate through an aliasing projection, so a
        // passed-through key is a column (maybe aliased) named like a key.
        if let Expr::Column(c) = expr.clone().unalias_nested().data {
            // Read straight from the aggregate's output batches, columns
            // have positional names (see `batches_scan`).
            let positional = c
                .relation
                .as_ref()
                .filter(|r| r.table() == AGGREGATE_OUTPUT)
                .and_then(|_| c.name.strip_prefix('c')?.parse::<usize>().ok())
                .filter(|&i| i < keys.len());
            if let Some(i) = positional.or_else(|| keys.iter().position(|k| **k == c.name)) {
                found.push((i, field.name().clone()));
            }
        }
    }
    let covered: std::collections::BTreeSet<usize> = found.iter().map(|(i, _)| *i).collect();
    if covered.len() == keys.len() {
        found.into_iter().map(|(_, name)| name).collect()
    } else {
        Vec::new()
    }
}

/// The table name the query after an aggregate reads its output under.
const AGGREGATE_OUTPUT: &str = "__sluice_aggregate";

/// Splits `plan` at its `Aggregate`: the aggregate itself, and the tail
/// after it reading the aggregate's values from an [`EpochBatches`].
fn split_aggregate(
    plan: &LogicalPlan,
    mode: OutputMode,
    dedup: bool,
    watermarked: &[String],
) -> Result<Option<AggregateConfig>> {
    // An aggregation inside a static table's side is the table's business.
    let Some(aggregate) = streaming_nodes(plan)
        .into_iter()
        .find(|n| matches!(n, LogicalPlan::Aggregate(_)))
        .cloned()
    else {
        return Ok(None);
    };
    let (tail, output) = cut_at(plan, &aggregate, AGGREGATE_OUTPUT)?;
    // Complete mode re-emits every window, so it keeps them all.
    let window = match (&aggregate, mode) {
        (_, OutputMode::Complete) => None,
        (LogicalPlan::Aggregate(a), _) => event_time_key(a, watermarked),
        _ => None,
    };
    let over_changelog = matches!(&aggregate, LogicalPlan::Aggregate(a) if counts_live_rows(a));
    Ok(Some(AggregateConfig {
        over_changelog,
        aggregate,
        tail,
        output,
        mode,
        window,
        dedup,
        retract_keys: Vec::new(),
        changelog: false,
    }))
}

/// A scan of a fresh [`EpochBatches`] with `schema`'s columns, under their
/// original qualifiers (so expressions written against `schema` resolve),
/// plus `extra` unqualified columns.
fn batches_scan(
    name: &str,
    schema: &DFSchema,
    extra: &[Field],
) -> Result<(LogicalPlan, Arc<EpochBatches>)> {
    // Positional names: a join's output may repeat a name (`l.k`, `r.k`),
    // which one unqualified table cannot; the projection restores them.
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| f.as_ref().clone().with_name(format!("c{i}")))
        .collect();
    fields.extend(extra.iter().cloned());
    let batches = Arc::new(EpochBatches::new(Arc::new(Schema::new(fields))));
    let scan = LogicalPlanBuilder::scan(
        name,
        provider_as_source(Arc::clone(&batches) as Arc<dyn TableProvider>),
        None,
    )?
    .build()?;
    let exprs: Vec<Expr> = scan
        .schema()
        .columns()
        .into_iter()
        .enumerate()
        .map(|(i, column)| match schema.iter().nth(i) {
            Some((qualifier, field)) => {
                Expr::Column(column).alias_qualified(qualifier.cloned(), field.name())
            }
            None => {
                let name = column.name.clone();
                Expr::Column(column).alias(name)
            }
        })
        .collect();
    let plan = LogicalPlanBuilder::from(scan).project(exprs)?.build()?;
    Ok((plan, batches))
}

/// `plan` with `node` replaced by a scan of its output, which the returned
/// [`EpochBatches`] holds each epoch: what runs after a stateful operator.
fn cut_at(
    plan: &LogicalPlan,
    node: &LogicalPlan,
    name: &str,
) -> Result<(LogicalPlan, Arc<EpochBatches>)> {
    let (replacement, output) = batches_scan(name, node.schema(), &[])?;
    let tail = plan
        .clone()
        .transform_up(|n| {
            if &n == node {
                Ok(Transformed::yes(replacement.clone()))
            } else {
                Ok(Transformed::no(n))
            }
        })?
        .data;
    Ok((tail, output))
}

/// Splits `plan` at its `Join`: the two sides, the join over their
/// buffers, and the tail after it.
fn split_join(plan: &LogicalPlan, watermarked: &[String]) -> Result<Option<JoinConfig>> {
    let mut found = None;
    plan.apply(|node| {
        if let LogicalPlan::Join(j) = node {
            if reads_stream(&j.left) && reads_stream(&j.right) {
                found = Some((node.clone(), j.clone()));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let Some((node, join)) = found else {
        return Ok(None);
    };
    if !matches!(join.join_type, JoinType::Inner | JoinType::Left) {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it uses a {} join; streams support inner and \
             LEFT (outer) interval joins",
            join.join_type
        )));
    }
    let bounds = time_bounds(
        join.filter.as_ref(),
        &join.on,
        join.left.schema(),
        join.right.schema(),
        watermarked,
    );
    match &bounds {
        None if join.join_type != JoinType::Inner => {
            return Err(SluiceError::plan(
                "a LEFT join of two streams needs a time bound on both sides: a left row is \
                 emitted unmatched once the bound and the watermark rule out any partner, \
                 which without one never happens. Add e.g. AND b.ts BETWEEN a.ts AND a.ts + \
                 INTERVAL '1' HOUR to the ON condition (both columns with a WATERMARK), or \
                 make it an inner join",
            ))
        }
        None => {}
        Some(bounds) => {
            let sides = [join.left.schema(), join.right.schema()];
            for (ts, side) in bounds.time_columns().into_iter().zip(sides) {
                if !is_time_column(side, ts, watermarked) {
                    return Err(SluiceError::plan(format!(
                        "the join's time bound uses '{ts}', which has no watermark, so the join \
                         could never forget a row: declare WATERMARK FOR {} AS {} - INTERVAL \
                         '...' on its stream",
                        ts.name, ts.name
                    )));
                }
            }
            for (c, side) in bounds.expiry_columns().into_iter().zip(sides) {
                let (_, field) = side.qualified_field_from_column(c)?;
                if !matches!(field.data_type(), DataType::Timestamp(..)) {
                    return Err(SluiceError::plan(format!(
                        "the join's time bound compares '{c}', which is a {} and not a \
                         timestamp; compare timestamp columns (CAST it to TIMESTAMP)",
                        field.data_type()
                    )));
                }
            }
        }
    }
    let (left_scan, left_in) = batches_scan(
        "__sluice_join_left",
        join.left.schema(),
        &left_state_fields(),
    )?;
    let (right_scan, right_in) = batches_scan("__sluice_join_right", join.right.schema(), &[])?;
    let (left_keys, right_keys): (Vec<Expr>, Vec<Expr>) = join.on.iter().cloned().unzip();
    let inner = LogicalPlanBuilder::from(left_scan)
        .join_with_expr_keys(
            right_scan,
            JoinType::Inner,
            (left_keys, right_keys),
            join.filter.clone(),
        )?
        .build()?;
    let (tail, output) = cut_at(plan, &node, "__sluice_join")?;
    Ok(Some(JoinConfig {
        left: (*join.left).clone(),
        right: (*join.right).clone(),
        join: inner,
        left_in,
        right_in,
        tail,
        output,
        join_type: join.join_type,
        bounds,
    }))
}

/// Our own errors travel through DataFusion's tree walk wrapped as
/// `External`; give them back their type.
pub(crate) fn unwrap_external(e: datafusion::error::DataFusionError) -> SluiceError {
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

/// Rejects what cannot run incrementally, saying why and what would work;
/// returns the output mode (the one asked for, else the one derived).
/// The nodes that run over streams: all of them but the static side of a
/// stream–static join, which DataFusion reads as a plain table.
fn streaming_nodes(plan: &LogicalPlan) -> Vec<&LogicalPlan> {
    let mut out = vec![plan];
    match plan {
        LogicalPlan::Join(j) if reads_stream(&j.left) != reads_stream(&j.right) => {
            let side = if reads_stream(&j.left) {
                &j.left
            } else {
                &j.right
            };
            out.extend(streaming_nodes(side));
        }
        _ => {
            for input in plan.inputs() {
                out.extend(streaming_nodes(input));
            }
        }
    }
    out
}

/// Whether `plan` scans a stream, or the output of a stage (see
/// [`split_stages`]).
fn reads_stream(plan: &LogicalPlan) -> bool {
    plan.exists(|n| {
        Ok(matches!(n, LogicalPlan::TableScan(scan)
            if scan.table_name.table().starts_with(STAGE_OUTPUT)
                || source_as_provider(&scan.source)
                .ok()
                .is_some_and(|p| as_stream_table(&p).is_some())))
    })
    .unwrap_or(false)
}

/// The kind of a query's outermost stateful operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    Aggregate,
    Join,
}

/// What [`check_incremental`] found.
struct Checked {
    mode: OutputMode,
    /// The query deduplicates (`SELECT DISTINCT`, `drop_duplicates`).
    dedup: bool,
    /// The watermarked event-time columns of the streams read.
    watermarked: Vec<String>,
}

fn check_incremental(plan: &LogicalPlan, mode: Option<OutputMode>) -> Result<Checked> {
    let mut problem = None;
    // The outermost stateful operator decides the output mode; those under
    // it are stages (see `split_stages`).
    let mut root = None;
    let mut window = None;
    let mut dedup = false;
    // Scans come first: a plan is visited top-down, so collect them before.
    let mut watermarked = Vec::new();
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let provider = source_as_provider(&scan.source).ok();
            if let Some(spec) = provider
                .as_ref()
                .and_then(as_stream_table)
                .and_then(|s| s.definition().watermark.as_ref())
            {
                watermarked.push(spec.column.clone());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    for node in streaming_nodes(plan) {
        let what = match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Unnest(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::EmptyRelation(_) => None,
            LogicalPlan::TableScan(scan) => {
                let provider = source_as_provider(&scan.source).ok();
                let stream = provider.as_ref().and_then(as_stream_table);
                stream.is_none().then(|| {
                    format!(
                        "reads '{}', which is a table, not a stream, on its own; a static table \
                         can only be joined with a stream (FROM stream JOIN table ON ...)",
                        scan.table_name
                    )
                })
            }
            LogicalPlan::Aggregate(agg) => {
                if root.is_none() {
                    root = Some(Root::Aggregate);
                    window = event_time_key(agg, &watermarked);
                }
                agg.group_expr
                    .iter()
                    .any(|e| matches!(e, Expr::GroupingSet(_)))
                    .then(|| {
                        "uses GROUPING SETS / CUBE / ROLLUP, which is not supported".to_string()
                    })
            }
            // Deduplication: DataFusion turns it into an aggregation keyed by
            // the distinct columns, which emits each key once (see
            // `aggregate`).
            LogicalPlan::Distinct(_) => {
                if root.is_none() {
                    root = Some(Root::Aggregate);
                    dedup = true;
                }
                None
            }
            LogicalPlan::Join(j) => match (reads_stream(&j.left), reads_stream(&j.right)) {
                (true, true) => {
                    root.get_or_insert(Root::Join);
                    None
                }
                // A stream against a static table: stateless, each epoch's
                // rows join the table, unless the table's unmatched rows
                // would have to wait for the whole stream.
                (stream_left, _) => {
                    use JoinType::*;
                    let keeps_stream_side = match j.join_type {
                        Inner => true,
                        Left | LeftSemi | LeftAnti | LeftMark => stream_left,
                        Right | RightSemi | RightAnti | RightMark => !stream_left,
                        Full => false,
                    };
                    (!keeps_stream_side).then(|| {
                        format!(
                            "joins a stream with a static table as a {} join, which would emit \
                             the table's unmatched rows only after the endless stream ends; use \
                             an inner join, or an outer join that keeps the stream's rows",
                            j.join_type
                        )
                    })
                }
            },
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
                other
                    .display()
                    .to_string()
                    .split(':')
                    .next()
                    .unwrap_or("this operator")
            )),
        };
        if let Some(w) = what {
            problem = Some(w);
            break;
        }
    }
    if let Some(p) = problem {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it {p}"
        )));
    }
    let checked = |mode| {
        Ok(Checked {
            mode,
            dedup,
            watermarked: watermarked.clone(),
        })
    };
    if root == Some(Root::Join) {
        // A joined pair never changes once emitted.
        return match mode {
            Some(OutputMode::Complete) => Err(SluiceError::plan(
                "output mode 'complete' needs an aggregation; a join emits each matched pair \
                 once: use 'append'",
            )),
            m => checked(m.unwrap_or(OutputMode::Append)),
        };
    }
    if dedup {
        // A distinct row never changes once emitted: append by default.
        return checked(mode.unwrap_or(OutputMode::Append));
    }
    if let Some(problem) = session_problem(plan, window.as_ref(), mode) {
        return Err(SluiceError::plan(problem));
    }
    if let Some(w) = &window {
        let has_watermark = watermarked.contains(&w.time_column);
        return checked(match mode {
            Some(OutputMode::Append) if !has_watermark => {
                return Err(SluiceError::plan(format!(
                    "output mode 'append' emits each window once, when the watermark passes its \
                 end, but '{}' has no watermark: declare one (WATERMARK FOR {} AS {} - INTERVAL \
                 '5' SECOND in CREATE STREAM, or with_watermark), or use 'update'",
                    w.time_column, w.time_column, w.time_column
                )))
            }
            Some(m) => m,
            None if has_watermark => OutputMode::Append,
            None => OutputMode::Update,
        });
    }
    checked(match (root, mode) {
        (None, Some(OutputMode::Complete)) => {
            return Err(SluiceError::plan(
                "output mode 'complete' needs an aggregation (it re-emits the whole result \
                 table); this query is stateless: use 'append'",
            ))
        }
        (None, m) => m.unwrap_or(OutputMode::Append),
        (_, Some(OutputMode::Append)) => {
            return Err(SluiceError::plan(
                "output mode 'append' emits only rows that never change, but a GROUP BY without \
                 an event-time window changes its rows every epoch: use 'update' (emit the groups \
                 that changed; the default) or 'complete' (emit the whole result every epoch)",
            ))
        }
        (_, m) => m.unwrap_or(OutputMode::Update),
    })
}

/// What is wrong with a GROUP BY over SESSION windows, if anything.
fn session_problem(
    plan: &LogicalPlan,
    window: Option<&WindowKey>,
    mode: Option<OutputMode>,
) -> Option<String> {
    let agg = streaming_nodes(plan).into_iter().find_map(|n| match n {
        LogicalPlan::Aggregate(a) => Some(a),
        _ => None,
    })?;
    let keys = &agg.schema.fields()[..agg.group_expr.len()];
    if !keys.iter().any(|f| is_session_bound(f)) {
        return None;
    }
    let Some(session) = window.and_then(|w| w.session.as_ref()) else {
        return Some(
            "a GROUP BY over SESSION windows needs both window_start and window_end among its \
             keys: a session is known by both bounds"
                .into(),
        );
    };
    if matches!(mode, Some(OutputMode::Update | OutputMode::Complete)) {
        return Some(
            "SESSION windows run in append mode: a session's bounds change as it grows, so each \
             session is emitted once, when the watermark passes its end"
                .into(),
        );
    }
    let others: BTreeSet<String> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != session.start && *i != session.end)
        .map(|(_, f)| f.name().clone())
        .collect();
    let partition: BTreeSet<String> = session.partition_by.iter().cloned().collect();
    (others != partition).then(|| {
        format!(
            "sessions are formed per PARTITION BY key, so the GROUP BY columns besides \
             window_start and window_end must be exactly those: PARTITION BY [{}], but they \
             are [{}]",
            session.partition_by.join(", "),
            others.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

/// The group key that carries event time, if any: a window bound (see
/// `window`), else a watermarked column itself, whose groups are final once
/// the watermark has passed the key (rows older than it are late).
pub(crate) fn event_time_key(
    agg: &datafusion::logical_expr::Aggregate,
    watermarked: &[String],
) -> Option<WindowKey> {
    let keys = &agg.schema.fields()[..agg.group_expr.len()];
    window_key(keys.iter().map(|f| f.as_ref())).or_else(|| {
        agg.group_expr
            .iter()
            .enumerate()
            .find_map(|(column, e)| match e {
                Expr::Column(c) if watermarked.contains(&c.name) => Some(WindowKey {
                    column,
                    to_end_ns: 1,
                    session: None,
                    time_column: c.name.clone(),
                }),
                _ => None,
            })
    })
}

/// The incremental plan as text, for `EXPLAIN` and `sluice explain`.
pub(crate) fn explain(plan: &IncrementalPlan, sink: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!("output mode: {}\n", plan.mode));
    out.push_str(&format!("sink: {sink}\n"));
    out.push_str("sources:\n");
    for i in &plan.inputs {
        out.push_str(&format!("  {}\n", i.description));
    }
    let marks: Vec<String> = plan
        .inputs
        .iter()
        .filter_map(|i| {
            let def = i.table.definition();
            let spec = def.watermark.as_ref()?;
            Some(format!("{}.{} - {:?}", def.name, spec.column, spec.delay))
        })
        .collect();
    out.push_str(&format!(
        "watermark: {}\n",
        if marks.is_empty() {
            "none".to_string()
        } else {
            format!("min({}) of the largest event time read", marks.join(", "))
        }
    ));
    let n = plan.stages.len() + 1;
    for (i, stage) in plan.stages.iter().enumerate() {
        let header = format!(
            "stateful operator {} of {n} (its rows go to {STAGE_OUTPUT}{i}, read above it):",
            i + 1
        );
        match &stage.config {
            StageConfig::Aggregate(a) => {
                explain_aggregate(&mut out, &header, a, OutputMode::Append)
            }
            StageConfig::Join(j) => explain_join(&mut out, &header, j),
        }
    }
    let header = if n > 1 {
        format!("stateful operator {n} of {n} (the query's output):")
    } else {
        "stateful operators:".to_string()
    };
    if let Some(j) = &plan.join {
        explain_join(&mut out, &header, j);
        return out;
    }
    match &plan.aggregate {
        None => {
            out.push_str("stateful operators: none\n");
            out.push_str("stateless segment (runs over each epoch's batches):\n");
            indent(&mut out, &plan.logical);
        }
        Some(agg) => explain_aggregate(&mut out, &header, agg, plan.mode),
    }
    out
}

/// `p` indented under a heading of [`explain`].
fn indent(out: &mut String, p: &LogicalPlan) {
    for line in p.display_indent().to_string().lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
}

/// A join's part of [`explain`].
fn explain_join(out: &mut String, header: &str, j: &JoinConfig) {
    let d = |ns: i64| {
        let sign = if ns < 0 { "-" } else { "+" };
        format!(
            "{sign} {:?}",
            std::time::Duration::from_nanos(ns.unsigned_abs())
        )
    };
    match &j.bounds {
        Some(b) => {
            let (lo, hi) = (&b.lower, &b.upper);
            let condition = if (&lo.left, &lo.right) == (&hi.left, &hi.right) {
                format!(
                    "{} - {} within [{}, {}]",
                    lo.left,
                    lo.right,
                    d(lo.ns),
                    d(hi.ns)
                )
            } else {
                format!(
                    "{} - {} >= {} and {} - {} <= {}",
                    lo.left,
                    lo.right,
                    d(lo.ns),
                    hi.left,
                    hi.right,
                    d(hi.ns)
                )
            };
            out.push_str(&format!(
                "{header}\n  interval join ({}), {condition}; each side's rows are kept until the \
                 watermark rules out a partner{}\n",
                j.join_type,
                if j.join_type == JoinType::Left {
                    ", then unmatched left rows are emitted with nulls"
                } else {
                    ""
                }
            ))
        }
        None => out.push_str(&format!(
            "{header}\n  join (Inner) without a time bound; each side's rows are kept for ever, \
             so the state grows with the input\n"
        )),
    }
    out.push_str("left side (per epoch):\n");
    indent(out, &j.left);
    out.push_str("right side (per epoch):\n");
    indent(out, &j.right);
    out.push_str("stateless segment after the join:\n");
    indent(out, &j.tail);
}

/// An aggregation's part of [`explain`].
fn explain_aggregate(out: &mut String, header: &str, agg: &AggregateConfig, mode: OutputMode) {
    if let LogicalPlan::Aggregate(a) = &agg.aggregate {
        let keys: Vec<String> = a.group_expr.iter().map(|e| e.to_string()).collect();
        out.push_str(&format!(
            "{header}\n  aggregate (Partial -> PartialReduce with stored states -> Final), state \
             keyed by [{}]\n",
            keys.join(", ")
        ));
        if let Some(w) = &agg.window {
            let key = a.schema.field(w.column).name();
            out.push_str(&format!(
                "  event-time windows on '{}': a window's group is final when the watermark \
                 reaches {key}{}; {} then evicted\n",
                w.time_column,
                if w.to_end_ns == 0 {
                    String::new()
                } else {
                    format!(
                        " + {:?}",
                        std::time::Duration::from_nanos(w.to_end_ns as u64)
                    )
                },
                if mode == OutputMode::Append {
                    "emitted once and"
                } else {
                    "its state is"
                }
            ));
        }
    }
    out.push_str("aggregate and the stateless segment under it (per epoch):\n");
    indent(out, &agg.aggregate);
    out.push_str("stateless segment after it:\n");
    indent(out, &agg.tail);
}
