//! A join of two streams through repartition steps: each side's rows
//! cross to the partition of their join key's value, and downstream joins
//! what it reads back of both, as the statement does.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::type_coercion::binary::comparison_coercion;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    cast, Expr, ExprSchemable, Join, LogicalPlan, LogicalPlanBuilder, Operator,
};

use super::{channel, channel_column, input_stream, own_name, replaced, Channels, Crossing, Step};
use crate::error::{Result, SluiceError};
use crate::session::frame::DataStreamWriter;
use crate::watermark::aligned;

/// A join's sub-topologies: each side's rows cross to the partition of
/// their join key's value (the equalities of its ON condition), so that
/// the rows of one key from both sides reach one task, which joins them as
/// the statement does.
///
/// A side that reads a stream of `keyed` (a chain's link, already keyed by
/// this join's key as the other side's channel is) is joined as it is read.
pub(super) fn split(
    to: &Channels,
    writer: DataStreamWriter,
    keyed: &BTreeSet<String>,
) -> Result<Step> {
    let plan = writer.frame.logical_plan().clone();
    let (original, join) = only_join(&plan)?;
    let (left_keys, right_keys) = equalities(&join)?;
    let used = super::used_above(&plan, &original);
    let mut upstream = Vec::with_capacity(2);
    let mut restored = Vec::with_capacity(2);
    let mut described = Vec::with_capacity(2);
    for (input_plan, keys) in [(&join.left, &left_keys), (&join.right, &right_keys)] {
        let input = input_stream(input_plan)?;
        if keyed.contains(&input.name) {
            restored.push(input_plan.as_ref().clone());
            described.push(format!(
                "'{}' (keyed by the join's key already)",
                input.name
            ));
            continue;
        }
        let event_time = input.watermark.as_ref().map(|w| w.column.as_str());
        let crossing = side_by_side(input_plan, keys, event_time, &used)?;
        let channel = channel(to, &writer, &input, crossing, to.first + upstream.len())?;
        upstream.push(channel.upstream);
        restored.push(channel.restored);
        described.push(channel.description);
    }
    let right = restored
        .pop()
        .ok_or_else(|| SluiceError::Internal("no right side".into()))?;
    let left = restored
        .pop()
        .ok_or_else(|| SluiceError::Internal("no left side".into()))?;
    let rejoined = LogicalPlan::Join(Join::try_new(
        Arc::new(left),
        Arc::new(right),
        join.on.clone(),
        join.filter.clone(),
        join.join_type,
        join.join_constraint,
        join.null_equality,
        join.null_aware,
    )?);
    let downstream_plan = replaced(plan, &original, rejoined)?;
    Ok(Step {
        upstream,
        downstream: writer.with_frame(to.session.frame(downstream_plan)),
        channels: described.join(" and "),
    })
}

/// The statement's one join of two streams: the node, and it as a join.
fn only_join(plan: &LogicalPlan) -> Result<(LogicalPlan, Join)> {
    let mut found = Vec::new();
    plan.apply(|node| {
        if let LogicalPlan::Join(j) = node {
            found.push((node.clone(), j.clone()));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match <[_; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(_) => Err(refuse_join("it has several joins")),
    }
}

/// Refuses a join that cannot be repartitioned, saying why.
fn refuse_join(why: impl std::fmt::Display) -> SluiceError {
    crate::planner::refuse_division(
        format!("its join would go through a repartition step, but {why}"),
        None,
    )
}

/// The join's equalities of a left and a right expression (its `on`
/// pairs, and the conjuncts `l = r` of its filter), each pair cast to one
/// type so that equal keys are written alike on both channels.
pub(super) fn equalities(join: &Join) -> Result<(Vec<Expr>, Vec<Expr>)> {
    let (left_schema, right_schema) = (join.left.schema(), join.right.schema());
    let of = |e: &Expr, schema: &DFSchema| {
        let refs = e.column_refs();
        !refs.is_empty() && refs.iter().all(|c| schema.has_column(c))
    };
    let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
    if let Some(filter) = &join.filter {
        for conjunct in split_conjunction(filter) {
            let Expr::BinaryExpr(b) = conjunct else {
                continue;
            };
            if b.op != Operator::Eq {
                continue;
            }
            let (l, r) = (b.left.as_ref(), b.right.as_ref());
            if of(l, left_schema) && of(r, right_schema) {
                pairs.push((l.clone(), r.clone()));
            } else if of(r, left_schema) && of(l, right_schema) {
                pairs.push((r.clone(), l.clone()));
            }
        }
    }
    if pairs.is_empty() {
        return Err(refuse_join(
            "its ON condition has no equality of a left and a right column to partition by",
        ));
    }
    let mut left = Vec::with_capacity(pairs.len());
    let mut right = Vec::with_capacity(pairs.len());
    for (l, r) in pairs {
        let (lt, rt) = (l.get_type(left_schema)?, r.get_type(right_schema)?);
        let common = comparison_coercion(&lt, &rt).ok_or_else(|| {
            refuse_join(format!(
                "its keys {l} and {r} have no common type ({lt}, {rt})"
            ))
        })?;
        // A key already of the common type crosses as it is: a column
        // the join also reads then crosses once (see `side_by_side`).
        left.push(if lt == common {
            l
        } else {
            cast(l, common.clone())
        });
        right.push(if rt == common { r } else { cast(r, common) });
    }
    Ok((left, right))
}

/// One side of a join crossing: the columns of the side that the join
/// and what follows it read (`used`) as `c<i>` (the event-time column
/// under its own name, so that the join's time bound still names it), its
/// keys' values as `k<j>` (a key that is such a column crossing once, as
/// `k<j>`: both sides name key *j* alike, so equal keys are written
/// alike), and over event time the watermark rows' columns.
fn side_by_side(
    side: &LogicalPlan,
    keys: &[Expr],
    event_time: Option<&str>,
    used: &BTreeSet<Column>,
) -> Result<Crossing> {
    let schema = side.schema();
    let mut crossing = Vec::new();
    let mut restored = Vec::new();
    let mut timed = None;
    // The keys that are columns, each crossing once under its key's name.
    let mut key_columns: Vec<(Column, usize)> = Vec::new();
    for (j, k) in keys.iter().enumerate() {
        if let Expr::Column(c) = k {
            if event_time != Some(c.name.as_str()) && !key_columns.iter().any(|(k, _)| k == c) {
                key_columns.push((c.clone(), j));
            }
        }
    }
    let carried = schema
        .columns()
        .into_iter()
        .filter(|c| used.contains(c) || event_time == Some(c.name.as_str()));
    for (i, c) in carried.enumerate() {
        let key = key_columns.iter().find(|(k, _)| *k == c).map(|(_, j)| *j);
        let name = match (event_time, key) {
            (Some(t), _) if c.name == t && own_name(t) => t.to_string(),
            (_, Some(j)) => format!("k{j}"),
            _ => format!("c{i}"),
        };
        if event_time == Some(c.name.as_str()) {
            timed = Some(name.clone());
        }
        crossing.push(Expr::Column(c.clone()).alias(&name));
        restored.push(channel_column(&name).alias_qualified(c.relation.clone(), c.name.clone()));
    }
    if let (Some(t), None) = (event_time, &timed) {
        return Err(refuse_join(format!(
            "a side of it does not carry its event-time column '{t}' to the join"
        )));
    }
    if let (Some(t), Some(name)) = (event_time, &timed) {
        if name != t {
            return Err(refuse_join(format!(
                "its event-time column '{t}' cannot cross under its own name; rename it (a \
                 computed column, `event_time AS {t}`)"
            )));
        }
    }
    let mut key_fields = Vec::with_capacity(keys.len());
    for (j, k) in keys.iter().enumerate() {
        let crossed = key_columns
            .iter()
            .any(|(c, at)| *at == j && used.contains(c));
        if !crossed {
            crossing.push(k.clone().alias(format!("k{j}")));
        }
        key_fields.push(format!("k{j}"));
    }
    if timed.is_some() {
        crossing.extend(aligned::columns());
    }
    let upstream = LogicalPlanBuilder::from(side.clone())
        .project(crossing)?
        .build()?;
    Ok(Crossing {
        upstream,
        per_epoch: false,
        key_fields,
        restored,
        event_time: timed,
    })
}
