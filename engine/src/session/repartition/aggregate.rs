//! A GROUP BY through a repartition step: what of its rows crosses (each
//! epoch's partials per group, or every row), and how downstream
//! aggregates it again.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ScalarValue};
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    cast, lit, Aggregate, Distinct, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder,
};

use super::{
    channel, channel_column, input_stream, own_name, refuse, replaced, Channels, Crossing, Step,
};
use crate::error::Result;
use crate::session::frame::DataStreamWriter;
use crate::session::Session;
use crate::watermark::aligned;

/// A GROUP BY's upstream and downstream sub-topologies (see the module
/// documentation).
pub(super) fn split(to: &Channels, writer: DataStreamWriter) -> Result<Step> {
    let plan = writer.frame.logical_plan().clone();
    let (original, aggregate) = only_aggregate(&plan)?;
    let input = input_stream(&aggregate.input)?;
    for e in aggregate.group_expr.iter().chain(&aggregate.aggr_expr) {
        if matches!(e, Expr::GroupingSet(_)) {
            return Err(refuse("it has GROUPING SETS, ROLLUP or CUBE"));
        }
    }
    // Per-epoch partials cannot say which of their rows were late: over
    // event time, the rows cross.
    let crossing = match (&original, &input.watermark) {
        (LogicalPlan::Aggregate(_), None) => pre_aggregated(&aggregate)?,
        _ => None,
    };
    let event_time = input.watermark.as_ref().map(|w| w.column.as_str());
    // Over event time, the rows cross below the windows where they can
    // (a HOP's rows repeat after the hop, not before): downstream runs
    // the whole statement over the channel.
    if let Some(time) = event_time {
        if let Some((scan, crossing)) = below_windows(to.session, &plan, &aggregate, time)? {
            let channel = channel(to, &writer, &input, crossing, to.first)?;
            let downstream_plan = replaced(plan, &scan, channel.restored)?;
            return Ok(Step {
                upstream: vec![channel.upstream],
                downstream: writer.with_frame(to.session.frame(downstream_plan)),
                channels: channel.description,
            });
        }
    }
    let (crossing, regroup) = match crossing {
        Some(c) => c,
        None => row_by_row(&aggregate, event_time)?,
    };
    let channel = channel(to, &writer, &input, crossing, to.first)?;
    let regrouped = match &original {
        LogicalPlan::Distinct(_) => {
            LogicalPlan::Distinct(Distinct::All(Arc::new(channel.restored)))
        }
        _ => LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(channel.restored),
            regroup.group,
            regroup.aggr,
        )?),
    };
    let regrouped = match regroup.finish {
        Some(exprs) => LogicalPlanBuilder::from(regrouped)
            .project(exprs)?
            .build()?,
        None => regrouped,
    };
    let downstream_plan = replaced(plan, &original, regrouped)?;
    Ok(Step {
        upstream: vec![channel.upstream],
        downstream: writer.with_frame(to.session.frame(downstream_plan)),
        channels: channel.description,
    })
}

/// The stream's rows cross as it gives them, before anything the
/// statement computes from them (a window's assignment included): the
/// scanned columns the statement reads (`time`, the event time, under its
/// own name, so that the windows downstream assigns are over a watermarked
/// column), and the group key's value computed from them, the window
/// bounds left out (all of a key's windows reach one task). The scan, and
/// what crosses; `None` when a group key other than a window bound is
/// computed on the way from the scan, or the event time cannot cross under
/// its own name: then the rows cross as the GROUP BY reads them.
fn below_windows(
    session: &Session,
    plan: &LogicalPlan,
    aggregate: &Aggregate,
    time: &str,
) -> Result<Option<(LogicalPlan, Crossing)>> {
    if !own_name(time) {
        return Ok(None);
    }
    let scans = scans(&aggregate.input);
    let [scan] = scans.as_slice() else {
        return Ok(None);
    };
    let bounds = &aggregate.schema.fields()[..aggregate.group_expr.len()];
    let mut keys = Vec::new();
    for (g, field) in aggregate.group_expr.iter().zip(bounds) {
        if crate::window::window_key([field.as_ref()]).is_some() {
            continue;
        }
        let mut traced = std::collections::HashMap::new();
        for c in g.column_refs() {
            match crate::planner::scanned_column(&aggregate.input, c) {
                Some(at_scan) => traced.insert(c.clone(), at_scan),
                None => return Ok(None),
            };
        }
        let at_scan = g
            .clone()
            .unalias()
            .transform(|e| match e {
                Expr::Column(c) => Ok(Transformed::yes(Expr::Column(
                    traced.get(&c).cloned().unwrap_or(c),
                ))),
                other => Ok(Transformed::no(other)),
            })?
            .data;
        keys.push(at_scan);
    }
    if keys.is_empty() {
        return Ok(None);
    }
    let used = scanned_by(session, plan, scan)?;
    let mut crossing = Vec::new();
    let mut restored = Vec::new();
    let mut timed = None;
    for (i, (qualifier, field)) in scan.schema().iter().enumerate() {
        let c = Column::from((qualifier, field));
        let is_time = c.name == time;
        if !used.contains(&c.name) && !is_time {
            // Downstream's plan still names it (a window's projection
            // passes every column through), and reads nothing of it.
            let none = ScalarValue::try_from(field.data_type())?;
            restored.push(lit(none).alias_qualified(c.relation, c.name));
            continue;
        }
        let name = match is_time {
            true => time.to_string(),
            false => format!("c{i}"),
        };
        if is_time {
            timed = Some(name.clone());
        }
        crossing.push(Expr::Column(c.clone()).alias(&name));
        restored.push(channel_column(&name).alias_qualified(c.relation.clone(), c.name.clone()));
    }
    if timed.is_none() {
        return Ok(None);
    }
    let mut key_fields = Vec::with_capacity(keys.len());
    for (j, k) in keys.into_iter().enumerate() {
        crossing.push(k.alias(format!("k{j}")));
        key_fields.push(format!("k{j}"));
    }
    crossing.extend(aligned::columns());
    let upstream = LogicalPlanBuilder::from(scan.clone())
        .project(crossing)?
        .build()?;
    Ok(Some((
        scan.clone(),
        Crossing {
            upstream,
            per_epoch: false,
            key_fields,
            restored,
            event_time: timed,
        },
    )))
}

/// The names of the columns `plan` reads of its `scan`, as DataFusion's
/// optimizer prunes them (a window's projections pass every column
/// through, so what they mention is not what is read).
fn scanned_by(
    session: &Session,
    plan: &LogicalPlan,
    scan: &LogicalPlan,
) -> Result<BTreeSet<String>> {
    let LogicalPlan::TableScan(scan) = scan else {
        return Ok(BTreeSet::new());
    };
    let optimized = session.context().state().optimize(plan)?;
    let mut names = BTreeSet::new();
    optimized.apply(|node| {
        if let LogicalPlan::TableScan(t) = node {
            if t.table_name == scan.table_name {
                names.extend(t.projected_schema.fields().iter().map(|f| f.name().clone()));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(names)
}

/// The stream scans under `plan`.
fn scans(plan: &LogicalPlan) -> Vec<LogicalPlan> {
    let mut found = Vec::new();
    let _ = plan.apply(|node| {
        if matches!(node, LogicalPlan::TableScan(_)) {
            found.push(node.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// How downstream aggregates what crossed.
struct Regroup {
    /// Downstream's group keys and aggregates, under the names the nodes
    /// above the statement's aggregation read.
    group: Vec<Expr>,
    aggr: Vec<Expr>,
    /// A projection over downstream's aggregation giving the statement's
    /// aggregates from merged partials (an `avg` from its sum and count),
    /// when one needs it.
    finish: Option<Vec<Expr>>,
}

/// Each epoch's rows aggregated per group upstream (Flink's local-global
/// aggregation): one partial row per group, task and epoch crosses, and
/// downstream merges the partials (a count's by summing them, a sum's,
/// min's and max's by their own function, an avg from its sum and count).
/// `None` when an aggregate does not merge so (DISTINCT, FILTER, ORDER BY,
/// a decimal sum or avg whose precision would grow, anything but count,
/// sum, min, max and avg) or the input is a changelog: then the rows
/// cross as they are.
fn pre_aggregated(aggregate: &Aggregate) -> Result<Option<(Crossing, Regroup)>> {
    let schema = aggregate.input.schema();
    let changes = schema
        .fields()
        .iter()
        .any(|f| f.name() == crate::CHANGELOG_SIGN || f.name() == crate::UPSERT_DELETED);
    if changes {
        return Ok(None);
    }
    let mut partials = Vec::new();
    let mut merged = Vec::new();
    let mut restored = Vec::new();
    // The statement's aggregates over the merged ones, by output name.
    let mut finished = Vec::new();
    let mut averaged = false;
    // Partial `name` of `partial` crosses, and downstream merges it with
    // `merge` under `output`.
    let mut cross = |partial: Expr, name: String, merge, output: Column| {
        partials.push(partial.alias(&name));
        restored.push(channel_column(&name));
        let call = AggregateFunction::new_udf(
            merge,
            vec![channel_column(&name)],
            false,
            None,
            Vec::new(),
            None,
        );
        merged.push(Expr::AggregateFunction(call).alias_qualified(output.relation, output.name));
    };
    for (m, e) in aggregate.aggr_expr.iter().enumerate() {
        let Expr::AggregateFunction(f) = e.clone().unalias() else {
            return Ok(None);
        };
        let p = &f.params;
        if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
            return Ok(None);
        }
        // Sums of integers and floats only: a decimal sum's precision
        // would grow with each merge.
        let numeric = match p.args.as_slice() {
            [arg] => {
                let t = arg.get_type(schema)?;
                t.is_integer() || t.is_floating()
            }
            _ => false,
        };
        let (relation, output) = e.qualified_name();
        let named = Column::new(relation.clone(), output.clone());
        let merge = match f.func.name() {
            "count" => sum_udaf(),
            "sum" if numeric => sum_udaf(),
            "min" => min_udaf(),
            "max" => max_udaf(),
            "avg" if numeric => {
                // Its sum and count cross; the division comes after the
                // merge, in double precision as `avg` itself computes.
                let arg = p.args[0].clone();
                let (sum, count) = (format!("s{m}"), format!("n{m}"));
                let summed = Column::from_name(format!("__sum_{m}"));
                let counted = Column::from_name(format!("__count_{m}"));
                cross(
                    datafusion::functions_aggregate::expr_fn::sum(arg.clone()),
                    sum,
                    sum_udaf(),
                    summed.clone(),
                );
                cross(
                    datafusion::functions_aggregate::expr_fn::count(arg),
                    count,
                    sum_udaf(),
                    counted.clone(),
                );
                let double = |c: Column| cast(Expr::Column(c), DataType::Float64);
                finished.push((double(summed) / double(counted)).alias_qualified(relation, output));
                averaged = true;
                continue;
            }
            _ => return Ok(None),
        };
        cross(e.clone().unalias(), format!("p{m}"), merge, named.clone());
        finished.push(Expr::Column(named));
    }
    let mut keys = Vec::new();
    let mut key_fields = Vec::new();
    let mut group = Vec::new();
    let mut passed = Vec::new();
    for (j, g) in aggregate.group_expr.iter().enumerate() {
        let name = format!("k{j}");
        keys.push(g.clone().unalias().alias(&name));
        restored.push(channel_column(&name));
        let (relation, output) = g.qualified_name();
        passed.push(Expr::Column(Column::new(relation.clone(), output.clone())));
        group.push(Expr::Column(Column::from_name(&name)).alias_qualified(relation, output));
        key_fields.push(name);
    }
    let upstream = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
        .aggregate(keys, partials)?
        .build()?;
    Ok(Some((
        Crossing {
            upstream,
            per_epoch: true,
            key_fields,
            restored,
            event_time: None,
        },
        Regroup {
            group,
            aggr: merged,
            finish: averaged.then(|| passed.into_iter().chain(finished).collect()),
        },
    )))
}

/// Every row crosses: the columns the aggregates read and the group
/// columns, as `c<i>`, and each computed group key as its value, `k<j>`
/// (names that cannot clash with a connector's own columns). A column only
/// a computed key reads does not cross: downstream groups by the value.
/// Over event time (`event_time`, the input's watermarked column), that
/// column crosses too, and the watermark rows' columns follow.
fn row_by_row(aggregate: &Aggregate, event_time: Option<&str>) -> Result<(Crossing, Regroup)> {
    let mut needed: BTreeSet<Column> = BTreeSet::new();
    for e in &aggregate.aggr_expr {
        needed.extend(e.column_refs().into_iter().cloned());
    }
    for (g, field) in aggregate.group_expr.iter().zip(aggregate.schema.fields()) {
        if let Expr::Column(c) = g.clone().unalias() {
            // A window's end read back from a chain's link is its event
            // time and still a window bound (its metadata says so);
            // another event-time column would lose its watermark under the
            // name it crosses in.
            let bound = crate::window::window_key([field.as_ref()]).is_some();
            if event_time == Some(c.name.as_str()) && !bound {
                return Err(refuse(format!(
                    "it groups by the event-time column '{}' itself; group by a window of it \
                     (TUMBLE, HOP, CUMULATE) instead",
                    c.name
                )));
            }
            needed.insert(c);
        }
    }
    let input_schema = aggregate.input.schema();
    let timed = match event_time {
        Some(name) => {
            let column = input_schema
                .columns()
                .into_iter()
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    refuse(format!(
                        "its GROUP BY does not see the event-time column '{name}'; keep it in \
                         the rows the GROUP BY reads"
                    ))
                })?;
            needed.insert(column.clone());
            Some(column)
        }
        None => None,
    };
    let needed: Vec<Column> = input_schema
        .columns()
        .into_iter()
        .filter(|c| needed.contains(c))
        .collect();
    let carried = |c: &Column| needed.iter().position(|n| n == c).map(|i| format!("c{i}"));
    let mut crossing = Vec::with_capacity(needed.len());
    let mut restored = Vec::with_capacity(needed.len());
    for (i, c) in needed.iter().enumerate() {
        let name = format!("c{i}");
        crossing.push(Expr::Column(c.clone()).alias(&name));
        restored.push(channel_column(&name).alias_qualified(c.relation.clone(), c.name.clone()));
    }
    let mut key_fields = Vec::new();
    // Downstream's group keys: a group column as itself, a computed key
    // as the value that crossed, under the name the nodes above read.
    let mut group = Vec::with_capacity(aggregate.group_expr.len());
    for (j, g) in aggregate.group_expr.iter().enumerate() {
        match g.clone().unalias() {
            Expr::Column(c) if carried(&c).is_some() => {
                key_fields.extend(carried(&c));
                group.push(g.clone());
            }
            other => {
                let (relation, name) = g.qualified_name();
                crossing.push(other.alias(format!("k{j}")));
                key_fields.push(format!("k{j}"));
                restored.push(channel_column(&format!("k{j}")));
                group.push(channel_column(&format!("k{j}")).alias_qualified(relation, name));
            }
        }
    }
    let event_time = timed.as_ref().and_then(carried);
    if event_time.is_some() {
        crossing.extend(aligned::columns());
    }
    let upstream = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
        .project(crossing)?
        .build()?;
    Ok((
        Crossing {
            upstream,
            per_epoch: false,
            key_fields,
            restored,
            event_time,
        },
        Regroup {
            group,
            aggr: aggregate.aggr_expr.clone(),
            finish: None,
        },
    ))
}

/// The statement's one GROUP BY (a statement with several is cut into a
/// chain before this): the node, and it as an
/// aggregation (`SELECT DISTINCT` groups by every column).
fn only_aggregate(plan: &LogicalPlan) -> Result<(LogicalPlan, Aggregate)> {
    let mut found = Vec::new();
    plan.apply(|node| {
        match node {
            LogicalPlan::Aggregate(a) => found.push((node.clone(), a.clone())),
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let columns = input.schema().columns().into_iter().map(Expr::Column);
                let a = Aggregate::try_new(Arc::clone(input), columns.collect(), Vec::new())?;
                found.push((node.clone(), a));
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match <[_; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) if found.is_empty() => Err(refuse("its grouping is not an aggregation")),
        Err(_) => Err(refuse("it has several GROUP BYs")),
    }
}
