//! Which join of a query is an event-time temporal join, and the
//! [`TemporalJoinConfig`] that runs it (see `operator::temporal_join`).
//!
//! SQL's `JOIN r FOR SYSTEM_TIME AS OF o.order_time` reaches the planner
//! as a join whose condition also calls `TemporalAsOf`
//! (`temporal_as_of(o.order_time, r.rate_time)`: the probe row's time and
//! the versioned side's event time); the DataFrame API writes the same
//! call in a join's filter. Outside a stream (a batch query) the call is
//! `rate_time <= order_time`.
//!
//! The versioned side is an append-only stream (each row a new version of
//! its key), or an upsert stream or a keyed changelog (Debezium) whose
//! deletions end a key's versions ([`versioned_changes`]): its rows keep
//! their deletion marker, and the join's key is its primary key.

use std::sync::Arc;

use datafusion::arrow::datatypes::Field;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, JoinType};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator, Projection};

use super::check::reads_stream;
use super::split::{cut_at, find_join};
use crate::computed::COMPUTED_FROM;
use crate::error::{Result, SluiceError};
use crate::operator::changelog::SIGN;
use crate::operator::temporal_join::{is_marker, is_temporal, TemporalJoinConfig};
use crate::upsert::{
    carry_marker, changes_as_upserts, is_key_column, is_upsert_scan, key_names, DELETED,
};

/// The table name the rest of the query reads the joined rows under.
const TEMPORAL_OUTPUT: &str = "__sluice_temporal";

/// The temporal join of `plan`, if it has one, as an operator's config.
pub(super) fn split_temporal(plan: &LogicalPlan) -> Result<Option<TemporalJoinConfig>> {
    let Some((node, join)) = find_join(plan, is_temporal)? else {
        return Ok(None);
    };
    let refuse = |why: &str| SluiceError::plan(format!("this temporal join cannot run: {why}"));
    if !reads_stream(&join.left) || !reads_stream(&join.right) {
        return Err(refuse(
            "both sides must be streams; a static table is looked up as of a PROCTIME() column",
        ));
    }
    let stateful_below = [&join.left, &join.right].into_iter().any(|side| {
        side.exists(|n| {
            Ok(matches!(
                n,
                LogicalPlan::Aggregate(_)
                    | LogicalPlan::Distinct(_)
                    | LogicalPlan::Window(_)
                    | LogicalPlan::Join(_)
            ))
        })
        .unwrap_or(false)
    });
    let stateful_above = cut_at(plan, &node, TEMPORAL_OUTPUT)?.0.exists(|n| {
        Ok(matches!(
            n,
            LogicalPlan::Aggregate(_)
                | LogicalPlan::Distinct(_)
                | LogicalPlan::Window(_)
                | LogicalPlan::Join(_)
        ))
    })?;
    if stateful_below || stateful_above {
        return Err(refuse(
            "it must be the query's only stateful operator for now (no aggregation, window \
             or other join before or after it); write its output to a stream and read that",
        ));
    }
    let changing = join
        .left
        .schema()
        .fields()
        .iter()
        .any(|f| f.name() == DELETED || f.name() == SIGN);
    if changing {
        return Err(refuse(
            "the rows it looks up for come from an upsert or Debezium stream, whose rows \
             change; the side before FOR SYSTEM_TIME AS OF is an append-only stream",
        ));
    }
    if !matches!(join.join_type, JoinType::Inner | JoinType::Left) {
        return Err(refuse(&format!(
            "it is a {} join; a temporal join is inner or LEFT",
            join.join_type
        )));
    }
    let filter = join
        .filter
        .as_ref()
        .map(split_conjunction)
        .unwrap_or_default();
    let (markers, rest): (Vec<&Expr>, Vec<&Expr>) = filter.into_iter().partition(|e| is_marker(e));
    let (ls, rs) = (join.left.schema(), join.right.schema());
    // The plan as written keeps the ON condition's equalities in the
    // filter; the optimizer would move them to `on`.
    let mut on = join.on.clone();
    let rest: Vec<&Expr> = rest
        .into_iter()
        .filter(|e| match equated(e, ls, rs) {
            Some(pair) => {
                on.push(pair);
                false
            }
            None => true,
        })
        .collect();
    if on.is_empty() {
        return Err(refuse(
            "it equates no columns: the versioned side's key is what its ON condition equates \
             (ON o.currency = r.currency)",
        ));
    }
    if markers.len() != 1 || !rest.is_empty() {
        return Err(refuse(&format!(
            "its ON condition holds more than the key's equalities and one FOR SYSTEM_TIME AS \
             OF: {}",
            conjunction(rest.into_iter().cloned())
                .map(|e| e.to_string())
                .unwrap_or_default()
        )));
    }
    let Expr::ScalarFunction(marker) = markers[0] else {
        return Err(SluiceError::Internal(
            "the temporal marker is a function".into(),
        ));
    };
    let index = |e: &Expr, schema: &DFSchema, what: &str| -> Result<usize> {
        match e {
            Expr::Column(c) => Ok(schema.index_of_column(c)?),
            other => Err(refuse(&format!(
                "{what} is '{other}', not a column; compute it in a subquery first"
            ))),
        }
    };
    let (mut left_keys, mut right_keys) = (Vec::new(), Vec::new());
    for (l, r) in &on {
        left_keys.push(index(l, ls, "a join key")?);
        right_keys.push(index(r, rs, "a join key")?);
    }
    let left_time = index(&marker.args[0], ls, "the time it looks up as of")?;
    let right_time = index(&marker.args[1], rs, "the versions' time")?;
    let right_deleted = rs.index_of_column_by_name(None, DELETED);
    if right_deleted.is_some() {
        versioned_by_key(&join.right, &right_keys)?;
        deletions_have_time(&join.right, right_time)?;
    }
    let (tail, output) = cut_at(plan, &node, TEMPORAL_OUTPUT)?;
    Ok(Some(TemporalJoinConfig {
        left: (*join.left).clone(),
        right: (*join.right).clone(),
        join_type: join.join_type,
        left_keys,
        right_keys,
        left_time,
        right_time,
        right_deleted,
        tail,
        output,
    }))
}

/// For a query whose temporal join versions an upsert stream or a keyed
/// changelog: the plan with that side's deletion marker carried to the
/// join (a changelog's rows taken back as its key's deletions, a filter's
/// failing rows as deletions too), and left out of the query's output.
/// `None` for other plans.
pub(super) fn versioned_changes(bound: &LogicalPlan) -> Result<Option<LogicalPlan>> {
    let Some((node, join)) = find_join(bound, is_temporal)? else {
        return Ok(None);
    };
    let changelog = |p: &LogicalPlan| matches!(p, LogicalPlan::TableScan(s) if s.source.schema().field_with_name(SIGN).is_ok());
    if !join
        .right
        .exists(|p| Ok(is_upsert_scan(p) || changelog(p)))?
    {
        return Ok(None);
    }
    // Each node's schema derived again, up to the join's side: a marker
    // added below an alias reaches the join through it.
    let right = carry_marker(changes_as_upserts((*join.right).clone())?)?
        .transform_up(|n| Ok(Transformed::yes(n.recompute_schema()?)))?
        .data;
    if right
        .schema()
        .index_of_column_by_name(None, DELETED)
        .is_none()
    {
        return Err(SluiceError::plan(
            "this temporal join cannot run: its versioned side is a Debezium stream without \
             a declared key; declare its PRIMARY KEY (...) NOT ENFORCED, the key its versions \
             are of",
        ));
    }
    let joined = node.with_new_exprs(node.expressions(), vec![(*join.left).clone(), right])?;
    let plan = bound
        .clone()
        .transform_up(|n| {
            if n == node {
                return Ok(Transformed::yes(joined.clone()));
            }
            Ok(Transformed::yes(n.recompute_schema()?))
        })?
        .data;
    // A `*` over the join names the marker, and a changelog's sign.
    let schema = Arc::clone(plan.schema());
    let kept: Vec<Expr> = schema
        .iter()
        .filter(|(_, f)| f.name() != DELETED && f.name() != SIGN)
        .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
        .collect();
    if kept.len() == schema.fields().len() {
        return Ok(Some(plan));
    }
    let projection = Projection::try_new(kept, Arc::new(plan))?;
    Ok(Some(LogicalPlan::Projection(projection)))
}

/// `e` as a pair of a left column and a right column it equates.
fn equated(e: &Expr, left: &DFSchema, right: &DFSchema) -> Option<(Expr, Expr)> {
    let Expr::BinaryExpr(BinaryExpr {
        left: a,
        op: Operator::Eq,
        right: b,
    }) = e
    else {
        return None;
    };
    match (a.as_ref(), b.as_ref()) {
        (Expr::Column(x), Expr::Column(y)) if left.has_column(x) && right.has_column(y) => {
            Some((a.as_ref().clone(), b.as_ref().clone()))
        }
        (Expr::Column(x), Expr::Column(y)) if left.has_column(y) && right.has_column(x) => {
            Some((b.as_ref().clone(), a.as_ref().clone()))
        }
        _ => None,
    }
}

/// Refuses a versioned side of upserts or changes whose join key is not
/// its primary key: a deletion ends its key's versions, so the rows one
/// probe row can reach must be those of one key.
fn versioned_by_key(right: &LogicalPlan, right_keys: &[usize]) -> Result<()> {
    let schema = right.schema();
    let primary = key_names(right);
    let equated: Vec<&String> = right_keys
        .iter()
        .map(|&i| schema.field(i))
        .filter(|f| is_key_column(f))
        .map(|f| f.name())
        .collect();
    if equated.len() == right_keys.len() && primary.iter().all(|k| equated.contains(&k)) {
        return Ok(());
    }
    Err(SluiceError::plan(format!(
        "this temporal join cannot run: its versioned side's versions are of its primary key \
         ({}), and its ON condition must equate exactly those columns (it equates {})",
        primary.join(", "),
        right_keys
            .iter()
            .map(|&i| schema.field(i).name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Refuses a versioned side whose time a deletion does not carry: a
/// tombstone has no value, and a Debezium delete's row is the old one, so
/// only the record's timestamp (and the key) say when a key was deleted.
fn deletions_have_time(right: &LogicalPlan, time: usize) -> Result<()> {
    let name = right.schema().field(time).name().clone();
    let mut from = Vec::new();
    let traced = read_from(right, &name, &mut from)?;
    if traced
        && !from.is_empty()
        && from
            .iter()
            .all(|f| f.name() == "_timestamp" || is_key_column(f))
    {
        return Ok(());
    }
    Err(SluiceError::plan(format!(
        "this temporal join cannot run: its versions' time '{name}' is read from the record's \
         value, which a deletion does not carry (a tombstone has no value; a Debezium delete \
         holds the old row). Take the versions' time from the record's timestamp (declare \
         `{name} TIMESTAMP(3) METADATA FROM 'timestamp'` and its WATERMARK), or read a topic \
         that never deletes with connector 'kafka', each record a version"
    )))
}

/// Collects into `from` the scan fields that `column` of `plan` is read
/// from, through projections, filters and aliases (for a computed column,
/// the fields it is computed from, see [`COMPUTED_FROM`]); false where
/// another node stands between.
fn read_from(plan: &LogicalPlan, column: &str, from: &mut Vec<Field>) -> Result<bool> {
    match plan {
        LogicalPlan::Projection(p) => {
            let Some(i) = p.schema.index_of_column_by_name(None, column) else {
                return Ok(false);
            };
            for c in p.expr[i].column_refs() {
                if !read_from(&p.input, &c.name, from)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            read_from(plan.inputs()[0], column, from)
        }
        LogicalPlan::TableScan(s) => {
            let schema = s.source.schema();
            let Ok(field) = schema.field_with_name(column) else {
                return Ok(false);
            };
            match field.metadata().get(COMPUTED_FROM) {
                Some(reads) => {
                    for name in reads.split(',').filter(|n| !n.is_empty()) {
                        let Ok(f) = schema.field_with_name(name) else {
                            return Ok(false);
                        };
                        from.push(f.clone());
                    }
                }
                None => from.push(field.clone()),
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}
