//! Cutting a plan at its stateful operators: each becomes an operator's
//! config (an aggregation's, a join's, a Top-N's), with the stateless segments under
//! it run per epoch inside it and the segment after it (its tail) reading
//! what it emits. With several stateful operators, the inner ones become
//! stages feeding the outer one ([`split_stages`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, JoinType};
use datafusion::logical_expr::{Expr, Join, LogicalPlan, LogicalPlanBuilder, Window};

use super::check::{emits_changes, reads_stream, streaming_nodes, STAGE_OUTPUT};
use super::closing::{arrives_in_order, JoinStages};
use super::outputs::{origin, AGGREGATE_OUTPUT, JOIN_OUTPUT};
use super::over::over_reach;
use super::rank::{rank_function, top_ns, trace, window_problem};
use super::{Stage, StageConfig};
use crate::error::{Result, SluiceError};
use crate::operator::aggregate::AggregateConfig;
use crate::operator::changelog::{counts_live_rows, over_changelog, SIGN};
use crate::operator::join::{left_state_fields, ChangelogSides, JoinConfig, JoinEmit};
use crate::operator::normalize::NormalizeConfig;
use crate::operator::over::OverConfig;
use crate::operator::rank::{RankConfig, RankFunction};
use crate::operator::sort_options;
use crate::operator::time_bounds::{is_time_column, time_bounds};
use crate::output_mode::OutputMode;
use crate::table::EpochBatches;
use crate::upsert::{is_key_column, is_upsert_scan, DELETED, KEY_METADATA};
use crate::window::event_time_key;

/// Whether `node` keeps state across epochs: an aggregation (GROUP BY,
/// DISTINCT), a join of two streams or a Top-N.
fn is_stateful(node: &LogicalPlan) -> bool {
    match node {
        // A window that passed `check` is a Top-N's.
        LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) | LogicalPlan::Window(_) => true,
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

/// A stateful operator under another one: the innermost of a plan's.
pub(crate) struct Nested {
    /// The operator with no stateful one under it.
    pub inner: LogicalPlan,
    /// The nearest stateful operator above it.
    pub parent: LogicalPlan,
    /// `parent`'s input that holds `inner`: what feeds `parent` the rows
    /// `inner` emits.
    pub child: LogicalPlan,
}

/// The innermost stateful operator of `plan` that another one reads, if
/// `plan` stacks any; refuses operators side by side under one input.
pub(crate) fn innermost_nested(plan: &LogicalPlan) -> Result<Option<Nested>> {
    let nodes = stateful_nodes(plan);
    if nodes.len() <= 1 {
        return Ok(None);
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
    Ok(Some(Nested {
        inner: inner.clone(),
        parent: (*parent).clone(),
        child,
    }))
}

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
/// refused. An aggregation over a join closes its groups only by a column
/// the join's bound closes (see `closing`): the join stages are returned
/// for the last operator's sake.
pub(super) fn split_stages(
    mut plan: LogicalPlan,
    watermarked: &[String],
) -> Result<(LogicalPlan, Vec<Stage>, JoinStages)> {
    let mut stages = Vec::new();
    let mut joins = JoinStages::default();
    loop {
        let Some(Nested {
            inner,
            parent,
            child,
        }) = innermost_nested(&plan)?
        else {
            return Ok((plan, stages, joins));
        };
        let inner = &inner;
        // A stage's rows reach the operator above through a scan of its
        // output: `from` is replaced by `to` in the plan. That is C by the
        // scan, except under a changelog, where the aggregation above is
        // replaced by its rewrite over the scan.
        let name = format!("{STAGE_OUTPUT}{}", stages.len());
        // Whether the stage's rows change: then it emits them signed, and
        // the operator above reads them as a changelog.
        let (config, changes) = match inner {
            LogicalPlan::Window(_) => {
                return Err(SluiceError::plan(
                    "this query cannot run on a stream: a Top-N (ROW_NUMBER() OVER ... with \
                     WHERE rn <= N) or an OVER aggregation feeds another stateful operator, \
                     which Sluice does not run yet; write it to a stream and read that",
                ))
            }
            LogicalPlan::Join(j) => {
                let changes = emits_changes(j, watermarked);
                let join = split_join(&child, &plan, watermarked, false)?
                    .ok_or_else(|| SluiceError::Internal("a stage's join vanished".into()))?;
                (StageConfig::Join(Box::new(join)), changes)
            }
            _ => {
                let vanished = || SluiceError::Internal("a stage's aggregate vanished".into());
                let mut agg = split_aggregate(&child, OutputMode::Append, false, watermarked)?
                    .ok_or_else(vanished)?;
                agg.window = joins.window_key(&agg);
                if agg.window.is_some() {
                    (StageConfig::Aggregate(Box::new(agg)), false)
                } else {
                    let mut agg = split_aggregate(&child, OutputMode::Update, false, watermarked)?
                        .ok_or_else(vanished)?;
                    agg.changelog = true;
                    (StageConfig::Aggregate(Box::new(agg)), true)
                }
            }
        };
        let (link, from, to) = if changes {
            let keys = match &config {
                StageConfig::Aggregate(agg) => stage_keys(agg),
                _ => Vec::new(),
            };
            changelog_link(&name, &parent, &child, &keys)?
        } else {
            let (scan, link) = batches_scan(&name, child.schema(), &[])?;
            if let StageConfig::Join(join) = &config {
                joins.add(join, inner, child.schema(), &link);
            }
            (link, child, scan)
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
        if matches!(parent, LogicalPlan::Join(_)) && changes {
            // The join above reads a sign now, and lost its input's.
            plan = plan
                .transform_up(|n| Ok(Transformed::yes(n.recompute_schema()?)))?
                .data;
        }
        stages.push(Stage { config, link });
    }
}

/// How the rows of a stage that change (`child`'s, signed) reach `parent`,
/// the operator above it: the stage's link, and the node to replace with
/// what. An aggregation above is rewritten over the changes (see
/// [`over_changelog`]), a Top-N ranks them with their signs, and a join
/// takes them in as a changelog side.
///
/// `keys` are the positions of the columns that identify the stage's rows
/// (an aggregation's group columns), marked so for a join above.
fn changelog_link(
    name: &str,
    parent: &LogicalPlan,
    child: &LogicalPlan,
    keys: &[usize],
) -> Result<(Arc<EpochBatches>, LogicalPlan, LogicalPlan)> {
    let sign = Field::new(SIGN, DataType::Int64, false);
    // A join's rows carry its inputs' signs, which the stage drops.
    let schema = without_signs(child.schema(), keys)?;
    let (scan, link) = batches_scan(name, &schema, &[sign])?;
    let to = match parent {
        LogicalPlan::Aggregate(above) => over_changelog(above, scan)?,
        LogicalPlan::Window(w) => {
            LogicalPlan::Window(Window::try_new(w.window_expr.clone(), Arc::new(scan))?)
        }
        LogicalPlan::Join(_) => {
            let inputs = parent
                .inputs()
                .into_iter()
                .map(|i| if i == child { scan.clone() } else { i.clone() })
                .collect();
            parent.with_new_exprs(parent.expressions(), inputs)?
        }
        _ => {
            return Err(SluiceError::plan(
                "this query cannot run on a stream: it deduplicates (DISTINCT) rows that \
                 change, an aggregation's without an event-time window or a join's over \
                 changing inputs; group them instead (GROUP BY every column)",
            ))
        }
    };
    Ok((link, parent.clone(), to))
}

/// The output columns of an aggregation stage that pass its group
/// columns on unchanged, when all of them are (else none: a part of the
/// key does not identify a row).
fn stage_keys(agg: &AggregateConfig) -> Vec<usize> {
    let LogicalPlan::Aggregate(a) = &agg.aggregate else {
        return Vec::new();
    };
    let groups = a.group_expr.len();
    let passed: Vec<(usize, usize)> = (0..agg.tail.schema().fields().len())
        .filter_map(|i| {
            origin(&agg.tail, i, AGGREGATE_OUTPUT)
                .filter(|o| *o < groups)
                .map(|o| (i, o))
        })
        .collect();
    let covered: std::collections::BTreeSet<usize> = passed.iter().map(|(_, o)| *o).collect();
    if covered.len() < groups {
        return Vec::new();
    }
    passed.into_iter().map(|(i, _)| i).collect()
}

/// `schema` without its columns named [`SIGN`], the columns at `keys`
/// marked as a key ([`KEY_METADATA`]).
fn without_signs(schema: &DFSchema, keys: &[usize]) -> Result<DFSchema> {
    let fields = schema
        .iter()
        .enumerate()
        .filter(|(_, (_, f))| f.name() != SIGN)
        .map(|(i, (q, f))| {
            let f = if keys.contains(&i) {
                let mut metadata = f.metadata().clone();
                metadata.insert(KEY_METADATA.to_string(), "true".to_string());
                Arc::new(f.as_ref().clone().with_metadata(metadata))
            } else {
                Arc::clone(f)
            };
            (q.cloned(), f)
        })
        .collect();
    Ok(DFSchema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )?)
}

/// The output columns that pass the group key through unchanged, if every
/// key column is among them, in output order.
pub(super) fn group_key_columns(agg: &AggregateConfig) -> Vec<String> {
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

/// Splits `plan` at its `Aggregate`: the aggregate itself, and the tail
/// after it reading the aggregate's values from an [`EpochBatches`].
pub(super) fn split_aggregate(
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
            // Qualified by the scan: a join of two changelogs has a sign
            // from each side.
            None => {
                let field = column.name.clone();
                Expr::Column(column).alias_qualified(Some(name), field)
            }
        })
        .collect();
    let plan = LogicalPlanBuilder::from(scan).project(exprs)?.build()?;
    Ok((plan, batches))
}

/// `plan` with `node` replaced by a scan of its output, which the returned
/// [`EpochBatches`] holds each epoch: what runs after a stateful operator.
pub(super) fn cut_at(
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

/// The first join of `plan` (outermost first) that `matches`, with its
/// node.
pub(super) fn find_join(
    plan: &LogicalPlan,
    matches: impl Fn(&Join) -> bool,
) -> Result<Option<(LogicalPlan, Join)>> {
    let mut found = None;
    plan.apply(|node| {
        if let LogicalPlan::Join(j) = node {
            if matches(j) {
                found = Some((node.clone(), j.clone()));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// Splits `plan` at its `Join`: the two sides, the join over their
/// buffers, and the tail after it.
/// A join whose rows change ([`emits_changes`]) runs over changelogs; as
/// the query's last operator (`root`) it writes its output keyed by the
/// columns that identify a row, else it feeds its changes to the operator
/// above. `query` is the whole query `plan` is part of.
pub(super) fn split_join(
    plan: &LogicalPlan,
    query: &LogicalPlan,
    watermarked: &[String],
    root: bool,
) -> Result<Option<JoinConfig>> {
    let Some((node, join)) = find_join(plan, |j| reads_stream(&j.left) && reads_stream(&j.right))?
    else {
        return Ok(None);
    };
    if emits_changes(&join, watermarked) {
        return changelog_join(plan, query, &node, &join, root).map(Some);
    }
    if !matches!(
        join.join_type,
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
    ) {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it uses a {} join with a time bound; \
             interval joins are inner, LEFT, RIGHT or FULL. Drop the time bound to run it as \
             a join over changes, which keeps every row",
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
    // A right or full outer join's right rows are flagged as its left
    // rows are, to emit those that never matched.
    let right_fields = match join.join_type {
        JoinType::Right | JoinType::Full => left_state_fields().to_vec(),
        _ => Vec::new(),
    };
    let (right_scan, right_in) =
        batches_scan("__sluice_join_right", join.right.schema(), &right_fields)?;
    let (left_keys, right_keys): (Vec<Expr>, Vec<Expr>) = join.on.iter().cloned().unzip();
    let inner = LogicalPlanBuilder::from(left_scan)
        .join_with_expr_keys(
            right_scan,
            JoinType::Inner,
            (left_keys, right_keys),
            join.filter.clone(),
        )?
        .build()?;
    let (tail, output) = cut_at(plan, &node, JOIN_OUTPUT)?;
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
        changelog: None,
    }))
}

/// The join `node` of `plan` (`join`), whose rows change, as the config
/// of a `changelog_join` operator.
fn changelog_join(
    plan: &LogicalPlan,
    query: &LogicalPlan,
    node: &LogicalPlan,
    join: &Join,
    root: bool,
) -> Result<JoinConfig> {
    use JoinType::*;
    if join.on.is_empty() {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: its join's inputs change (or it is an outer \
             join without a time bound), and it has no equality between them; a join over \
             changes keeps each input's rows by the values its ON condition equates (ON \
             a.k = b.k)",
        ));
    }
    if join.null_aware {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: it uses NOT IN over a subquery of a stream, \
             where one NULL in the subquery would hide every row; write NOT EXISTS (SELECT 1 \
             FROM ... WHERE ...) instead",
        ));
    }
    if matches!(join.join_type, LeftMark | RightMark) {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it uses a {} join (a subquery in an OR or a \
             SELECT list); write it as a join",
            join.join_type
        )));
    }
    let sign_of = |side: &LogicalPlan, name: &str| -> Result<Option<usize>> {
        let at: Vec<usize> = side
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name() == SIGN)
            .map(|(i, _)| i)
            .collect();
        match at.as_slice() {
            [] if side.exists(|n| Ok(is_changelog_scan(n)))? => Err(SluiceError::plan(format!(
                "this query cannot run: the {name} input of its join reads a changelog \
                 through an operator that leaves out the changes' signs; join the stream, or a \
                 selection and filter of it"
            ))),
            [] => Ok(None),
            [i] => Ok(Some(*i)),
            _ => Err(SluiceError::Internal(format!(
                "the {name} input of a join carries several signs"
            ))),
        }
    };
    let signs = [sign_of(&join.left, "left")?, sign_of(&join.right, "right")?];
    // What identifies the row a change takes back: the columns the query
    // reads above the join's inputs.
    let mut read = std::collections::HashSet::new();
    names_read_above(query, &join.left, &mut read);
    names_read_above(query, &join.right, &mut read);
    let identity = [&join.left, &join.right].map(|side| {
        side.schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| identifies_a_row(f.name()) && read.contains(f.name()))
            .map(|(i, _)| i)
            .collect()
    });
    let (left_keys, right_keys): (Vec<Expr>, Vec<Expr>) = join.on.iter().cloned().unzip();
    let (left_scan, left_in) = batches_scan("__sluice_join_left", join.left.schema(), &[])?;
    let (right_scan, right_in) = batches_scan("__sluice_join_right", join.right.schema(), &[])?;
    let joined = match LogicalPlanBuilder::from(left_scan)
        .join_with_expr_keys(
            right_scan,
            join.join_type,
            (left_keys.clone(), right_keys.clone()),
            join.filter.clone(),
        )?
        .build()?
    {
        // `IS NOT DISTINCT FROM` keys match NULL with NULL, as the query's.
        LogicalPlan::Join(mut j) => {
            j.null_equality = join.null_equality;
            LogicalPlan::Join(j)
        }
        other => other,
    };
    let (tail, output) = cut_at(plan, node, JOIN_OUTPUT)?;
    let emit = if root {
        JoinEmit::Keyed(join_output_key(join, &tail)?)
    } else {
        JoinEmit::Signed
    };
    Ok(JoinConfig {
        left: (*join.left).clone(),
        right: (*join.right).clone(),
        join: joined,
        left_in,
        right_in,
        tail,
        output,
        join_type: join.join_type,
        bounds: None,
        changelog: Some(ChangelogSides {
            signs,
            keys: [left_keys, right_keys],
            identity,
            emit,
        }),
    })
}

/// Whether `node` scans a changelog: a Debezium stream, or rows a stage
/// signs.
fn is_changelog_scan(node: &LogicalPlan) -> bool {
    matches!(node, LogicalPlan::TableScan(s) if s.source.schema().field_with_name(SIGN).is_ok())
}

/// The output columns of a changing join that identify its rows, which
/// its update-mode output is keyed by: each input's key (an aggregation's
/// group columns, an upsert stream's key, a Debezium stream's
/// 'key.fields'), less one the join condition equates with the other
/// input's columns where the join keeps that input's rows.
fn join_output_key(join: &Join, tail: &LogicalPlan) -> Result<Vec<String>> {
    use JoinType::*;
    let (left, right) = (side_key(&join.left), side_key(&join.right));
    let keyless: Vec<&str> = [("left", &left), ("right", &right)]
        .into_iter()
        .filter(|(_, k)| k.is_empty())
        .map(|(name, _)| name)
        .collect();
    let semi_left = matches!(join.join_type, LeftSemi | LeftAnti);
    let semi_right = matches!(join.join_type, RightSemi | RightAnti);
    let needs = |side: &str| match side {
        "left" => !semi_right,
        _ => !semi_left,
    };
    if let Some(side) = keyless.iter().find(|s| needs(s)) {
        let bound = if join.join_type == Inner {
            ""
        } else {
            ". An outer join of append-only streams can instead bound their event times both \
             ways (AND r.ts BETWEEN l.ts AND l.ts + INTERVAL '1' HOUR, both with a WATERMARK): \
             an interval join emits each unmatched row once, in append mode"
        };
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: its join's rows change, so its output is \
             written in update mode, keyed by what identifies a row, but its {side} input has \
             no key. An aggregation is keyed by its GROUP BY columns, an upsert-kafka stream by \
             its 'key.fields', a Debezium stream by the 'key.fields' declared for it (the \
             table's primary key); an append-only stream has none. Aggregate the join's output \
             (GROUP BY), or join inputs that have keys{bound}"
        )));
    }
    // Input columns the join condition equates with the other input's.
    let equated = |c: &Column, right_side: bool| {
        join.on.iter().any(|(l, r)| {
            let (mine, other) = if right_side { (r, l) } else { (l, r) };
            matches!((mine, other), (Expr::Column(m), Expr::Column(_)) if m == c)
        })
    };
    let right_follows = right.iter().all(|c| equated(c, true));
    let left_follows = left.iter().all(|c| equated(c, false));
    let needed: Vec<Column> = match join.join_type {
        LeftSemi | LeftAnti => left,
        RightSemi | RightAnti => right,
        Inner | Left if right_follows => left,
        Inner | Right if left_follows => right,
        _ => left.into_iter().chain(right).collect(),
    };
    let mut names = Vec::new();
    let mut missing = Vec::new();
    for c in &needed {
        let at = join.schema.index_of_column(c)?;
        let found =
            (0..tail.schema().fields().len()).find(|&i| origin(tail, i, JOIN_OUTPUT) == Some(at));
        match found {
            Some(i) => names.push(tail.schema().field(i).name().clone()),
            None => missing.push(c.flat_name()),
        }
    }
    if !missing.is_empty() {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: its join's rows change, so its output is \
             written in update mode, keyed by the columns that identify a row, and it leaves \
             out {}; select them as they are",
            missing.join(", ")
        )));
    }
    Ok(names)
}

/// The columns of a join's input `side` that identify its rows: its
/// scan's key (an aggregation stage's group columns, an upsert or
/// Debezium stream's 'key.fields', marked [`KEY_METADATA`]) when the side
/// passes every key column on and only selects, renames and filters the
/// scan's rows (a union or a join inside would repeat a key); else none.
fn side_key(side: &LogicalPlan) -> Vec<Column> {
    let is_key = is_key_column;
    let mut scans = Vec::new();
    let mut plain = true;
    let _ = side.apply(|n| {
        match n {
            LogicalPlan::TableScan(s) => scans.push(s.source.schema()),
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            }
            _ => plain = false,
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let [scan] = scans.as_slice() else {
        return Vec::new();
    };
    // A stage's scan names its columns by position: the key columns are
    // counted, each passed on once.
    let wanted = scan.fields().iter().filter(|f| is_key(f)).count();
    let keys: Vec<Column> = side
        .schema()
        .iter()
        .filter(|(_, f)| is_key(f))
        .map(|(q, f)| Column::new(q.cloned(), f.name()))
        .collect();
    if !plain || wanted == 0 || keys.len() != wanted {
        return Vec::new();
    }
    keys
}

/// The OVER aggregation of `plan` (not a Top-N's window), cut out: its
/// input, the window over the rows the operator hands it, and the tail.
/// `stages` are those under it.
pub(super) fn split_over(
    plan: &LogicalPlan,
    watermarked: &[String],
    stages: &[Stage],
) -> Result<Option<OverConfig>> {
    let Some(node) = streaming_nodes(plan)
        .into_iter()
        .find(|n| matches!(n, LogicalPlan::Window(_)))
        .cloned()
    else {
        return Ok(None);
    };
    let LogicalPlan::Window(w) = &node else {
        return Ok(None);
    };
    let reach = over_reach(w, watermarked).map_err(|problem| {
        SluiceError::plan(format!("this query cannot run on a stream: it {problem}"))
    })?;
    let input = w.input.schema();
    let column = |e: &Expr| match e {
        Expr::Column(c) => Ok(input.index_of_column(c)?),
        other => Err(SluiceError::Internal(format!(
            "an OVER window's column is {other}"
        ))),
    };
    let Some(Expr::WindowFunction(f)) = w
        .window_expr
        .first()
        .map(|e| e.clone().unalias_nested().data)
    else {
        return Err(SluiceError::Internal("an OVER window vanished".into()));
    };
    let time = match f.params.order_by.first() {
        Some(o) => column(&o.expr)?,
        None => {
            return Err(SluiceError::Internal(
                "an OVER window's order vanished".into(),
            ))
        }
    };
    // A stateful operator's rows may arrive behind the watermark (an
    // interval join pairs a new row with a buffered one), which would
    // change rows already emitted; an aggregation whose groups close
    // emits them in the order of the key that closes them.
    let over_stage = w.input.exists(|n| {
        Ok(matches!(n, LogicalPlan::TableScan(s) if s.table_name.table().starts_with(STAGE_OUTPUT)))
    })?;
    if over_stage && !arrives_in_order(&w.input, time, stages) {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: it computes an OVER window over another \
             stateful operator (an aggregation or a join), whose rows may arrive behind the \
             watermark; order the window by the window bound of an aggregation under it (or \
             by a column an interval join's bound closes, which it groups by), or write that \
             operator's output to a stream and compute the OVER window over it",
        ));
    }
    if input.fields().iter().any(|f| f.name() == SIGN) {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: it computes an OVER window over rows that \
             change (an aggregation without a window, a join over changes, a Debezium or \
             upsert stream), which Sluice does not run yet; OVER windows read append-only \
             rows",
        ));
    }
    let partitions = f
        .params
        .partition_by
        .iter()
        .map(column)
        .collect::<Result<Vec<_>>>()?;
    let emit = Field::new(OVER_EMIT, DataType::Boolean, false);
    let (scan, rows) = batches_scan(OVER_ROWS, input, &[emit])?;
    let window = LogicalPlan::Window(Window::try_new(w.window_expr.clone(), Arc::new(scan))?);
    let (tail, output) = cut_at(plan, &node, OVER_OUTPUT)?;
    Ok(Some(OverConfig {
        input: (*w.input).clone(),
        window,
        rows,
        tail,
        output,
        partitions,
        time,
        rows_back: reach.rows,
        range_back: reach.range_ns,
    }))
}

/// The table name an OVER window reads the rows it computes under.
const OVER_ROWS: &str = "__sluice_over_rows";
/// The column that marks the rows an OVER window emits.
const OVER_EMIT: &str = "__sluice_emit";
/// The table name the query after an OVER window reads its rows under.
const OVER_OUTPUT: &str = "__sluice_over";

/// The table name the query after a Top-N reads its ranked rows under.
const RANK_OUTPUT: &str = "__sluice_rank";

/// The Top-N of `plan` (there is at most one), cut out: the operator's
/// config, and the output columns that are its key (the PARTITION BY
/// columns and the rank; the PARTITION BY columns alone for `rn = 1`).
pub(super) fn split_rank(
    plan: &LogicalPlan,
    mode: OutputMode,
) -> Result<Option<(RankConfig, Vec<String>)>> {
    let Some((window, limit)) = top_ns(plan)?.into_iter().next() else {
        return Ok(None);
    };
    if let Some(problem) = window_problem(&window) {
        return Err(SluiceError::plan(format!(
            "this query cannot run on a stream: it {problem}"
        )));
    }
    let LogicalPlan::Window(w) = &window else {
        return Err(SluiceError::Internal("a Top-N's window vanished".into()));
    };
    let [Expr::WindowFunction(f)] = w.window_expr.as_slice() else {
        return Err(SluiceError::Internal("a Top-N's function vanished".into()));
    };
    let params = &f.params;
    // The rows to rank: partition values, order values, the input row.
    let mut exprs: Vec<Expr> = params
        .partition_by
        .iter()
        .enumerate()
        .map(|(i, e)| e.clone().alias(format!("__sluice_p{i}")))
        .collect();
    exprs.extend(
        params
            .order_by
            .iter()
            .enumerate()
            .map(|(i, s)| s.expr.clone().alias(format!("__sluice_o{i}"))),
    );
    exprs.extend(w.input.schema().columns().into_iter().map(Expr::Column));
    let input = datafusion::logical_expr::LogicalPlanBuilder::from((*w.input).clone())
        .project(exprs)?
        .build()?;
    let order = params.order_by.iter().map(sort_options).collect();
    // The output's key: the partition columns passed through, and the rank
    // unless only the first row is kept.
    let rank_index = w.schema.fields().len() - 1;
    let mut key: Vec<usize> = Vec::new();
    for e in &params.partition_by {
        let column = match e {
            Expr::Column(c) => w.input.schema().maybe_index_of_column(c),
            _ => None,
        };
        let Some(i) = column else {
            return Err(SluiceError::plan(format!(
                "this query cannot run on a stream: its Top-N partitions by {e}, which is not \
                 a column; compute it in a subquery and partition by that column (the \
                 partition columns are the output's key)"
            )));
        };
        key.push(i);
    }
    if limit > 1 {
        key.push(rank_index);
    }
    let function = rank_function(&f.fun.name().to_ascii_lowercase())
        .ok_or_else(|| SluiceError::Internal("a Top-N's ranking function vanished".into()))?;
    let names = plan.schema().fields().iter().map(|f| f.name().clone());
    // Ties share a RANK or DENSE_RANK: only the whole row tells two apart.
    let output_key: Vec<String> = match function {
        RankFunction::RowNumber => names
            .filter(|name| {
                trace(plan, name).is_some_and(|(node, i)| node == window && key.contains(&i))
            })
            .collect(),
        _ => names.collect(),
    };
    if function == RankFunction::RowNumber && output_key.len() != key.len() {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: its output leaves out the Top-N's PARTITION BY \
             columns or its row number; select them (unrenamed), as they are the output's key \
             in update mode (the row number may be left out with rn = 1)",
        ));
    }
    let (tail, output) = cut_at(plan, &window, RANK_OUTPUT)?;
    let mut filter_count = 0;
    tail.apply(|n| {
        if matches!(n, LogicalPlan::Filter(_)) {
            filter_count += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if filter_count > 1 {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: it filters a Top-N's rows after ranking them \
             (besides the bound on the row number), which would leave a rank's earlier row \
             downstream when its new row fails the filter; filter the rows before ranking \
             them, in the subquery",
        ));
    }
    // Over a changelog, the rows' signs, and what identifies the row a
    // change takes back: its partition and order values and the columns
    // the query reads after ranking (not a Kafka source's _offset, which
    // differs between a row's insert and its delete).
    let sign = input
        .schema()
        .fields()
        .iter()
        .position(|f| f.name() == SIGN);
    let mut read = std::collections::HashSet::new();
    names_read_above(plan, &window, &mut read);
    let values = params.partition_by.len() + params.order_by.len();
    let identity = (0..input.schema().fields().len())
        .filter(|&i| {
            let name = input.schema().field(i).name();
            i < values || (identifies_a_row(name) && read.contains(name))
        })
        .collect();
    Ok(Some((
        RankConfig {
            input,
            identity,
            partitions: params.partition_by.len(),
            order,
            limit,
            function,
            sign,
            key_columns: output_key.clone(),
            tail,
            output,
            // `check` lets only the first row by event time run in append mode.
            first_at_watermark: mode == OutputMode::Append,
        },
        output_key,
    )))
}

/// Whether a column named `name` can tell the row a change takes back: not
/// the sign, nor the Kafka columns that describe the change's message
/// (its topic, partition, offset and timestamp differ between a row's
/// insert and its delete).
fn identifies_a_row(name: &str) -> bool {
    !matches!(
        name,
        SIGN | "_topic" | "_partition" | "_offset" | "_timestamp"
    )
}

/// The names of the columns that the nodes of `plan` above `node` read.
fn names_read_above(
    plan: &LogicalPlan,
    node: &LogicalPlan,
    names: &mut std::collections::HashSet<String>,
) {
    if plan == node || !plan.exists(|n| Ok(n == node)).unwrap_or(false) {
        return;
    }
    let _ = plan.apply_expressions(|e| {
        names.extend(e.column_refs().into_iter().map(|c| c.name.clone()));
        Ok(TreeNodeRecursion::Continue)
    });
    for child in plan.inputs() {
        names_read_above(child, node, names);
    }
}

/// Whether `plan` has a stateful operator: an aggregation, a Top-N or a
/// join of two streams.
pub(super) fn has_stateful(plan: &LogicalPlan) -> Result<bool> {
    Ok(plan.exists(|n| {
        Ok(match n {
            LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_) | LogicalPlan::Window(_) => true,
            LogicalPlan::Join(j) => reads_stream(&j.left) && reads_stream(&j.right),
            _ => false,
        })
    })?)
}

/// The table name an aggregation or Top-N over an upsert stream reads the
/// stream's changes under.
const UPSERT_CHANGES: &str = "__sluice_stage_upserts";

/// For a query that aggregates, ranks or joins upsert streams: the plan
/// reading each stream's changes instead (signed rows, see `changelog`),
/// and per stream the stage that makes them from each key's previous
/// value (`normalize`). Other plans come back as they are.
pub(super) fn normalize_upserts(plan: LogicalPlan) -> Result<(LogicalPlan, Vec<Stage>)> {
    if !has_stateful(&plan)? {
        return Ok((plan, Vec::new()));
    }
    let mut scans = Vec::new();
    plan.apply(|n| {
        if is_upsert_scan(n) && !scans.contains(n) {
            scans.push(n.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut plan = plan;
    let mut stages = Vec::new();
    for (i, scan) in scans.iter().enumerate() {
        let Some((changes, stage)) = normalize(scan, &format!("{UPSERT_CHANGES}{i}"))? else {
            continue;
        };
        // The nodes above the scan see other columns now (no marker, a
        // sign, keys first): their schemas are derived again.
        plan = plan
            .transform_up(|n| {
                if &n == scan {
                    return Ok(Transformed::yes(changes.clone()));
                }
                Ok(Transformed::yes(n.recompute_schema()?))
            })?
            .data;
        stages.push(stage);
    }
    Ok((plan, stages))
}

/// The scan of an upsert stream's changes that replaces `scan`, and the
/// stage that makes them; `None` for a stream without key columns.
fn normalize(scan: &LogicalPlan, name: &str) -> Result<Option<(LogicalPlan, Stage)>> {
    // The stream's rows: its key columns, its values, the marker.
    let schema = scan.schema();
    let is_key = is_key_column;
    let columns: Vec<(usize, bool)> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name() != DELETED)
        .map(|(i, f)| (i, is_key(f)))
        .collect();
    let keys = columns.iter().filter(|(_, key)| *key).count();
    if keys == 0 {
        return Ok(None);
    }
    let column = |i: usize| {
        let (qualifier, field) = schema.qualified_field(i);
        Expr::Column(datafusion::common::Column::new(
            qualifier.cloned(),
            field.name(),
        ))
    };
    let ordered: Vec<Expr> = columns
        .iter()
        .filter(|(_, key)| *key)
        .chain(columns.iter().filter(|(_, key)| !*key))
        .map(|(i, _)| column(*i))
        .collect();
    let values = LogicalPlanBuilder::from(scan.clone())
        .project(ordered.clone())?
        .build()?;
    let mut with_marker = ordered;
    with_marker.push(column(
        schema
            .index_of_column_by_name(None, DELETED)
            .ok_or_else(|| {
                SluiceError::Internal("an upsert stream without its deletion marker".into())
            })?,
    ));
    let input = LogicalPlanBuilder::from(scan.clone())
        .project(with_marker)?
        .build()?;
    let sign = Field::new(SIGN, DataType::Int64, false);
    let (changes, link) = batches_scan(name, values.schema(), &[sign])?;
    let config = NormalizeConfig {
        input,
        keys,
        output: link.schema_ref(),
    };
    Ok(Some((
        changes,
        Stage {
            config: StageConfig::Normalize(Box::new(config)),
            link,
        },
    )))
}
