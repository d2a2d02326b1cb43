//! Which join of a query is an event-time temporal join, and the
//! [`TemporalJoinConfig`] that runs it (see `operator::temporal_join`).
//!
//! SQL's `JOIN r FOR SYSTEM_TIME AS OF o.order_time` reaches the planner
//! as a join whose condition also calls `TemporalAsOf`
//! (`temporal_as_of(o.order_time, r.rate_time)`: the probe row's time and
//! the versioned side's event time); the DataFrame API writes the same
//! call in a join's filter. Outside a stream (a batch query) the call is
//! `rate_time <= order_time`.

use datafusion::common::tree_node::TreeNode;
use datafusion::common::{DFSchema, JoinType};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Expr, LogicalPlan};

use super::check::reads_stream;
use super::split::{cut_at, find_join};
use crate::error::{Result, SluiceError};
use crate::operator::changelog::SIGN;
use crate::operator::temporal_join::{is_marker, is_temporal, TemporalJoinConfig};
use crate::upsert::DELETED;

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
        .right
        .schema()
        .fields()
        .iter()
        .chain(join.left.schema().fields())
        .any(|f| f.name() == DELETED || f.name() == SIGN);
    if changing {
        return Err(refuse(
            "its versioned side is an upsert or Debezium stream, whose deletions a temporal \
             join does not take yet; version an append-only stream (each row a new version of \
             its key, at its event time)",
        ));
    }
    if !matches!(join.join_type, JoinType::Inner | JoinType::Left) {
        return Err(refuse(&format!(
            "it is a {} join; a temporal join is inner or LEFT",
            join.join_type
        )));
    }
    if join.on.is_empty() {
        return Err(refuse(
            "it equates no columns: the versioned side's key is what its ON condition equates \
             (ON o.currency = r.currency)",
        ));
    }
    let filter = join
        .filter
        .as_ref()
        .map(split_conjunction)
        .unwrap_or_default();
    let (markers, rest): (Vec<&Expr>, Vec<&Expr>) = filter.into_iter().partition(|e| is_marker(e));
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
    let (ls, rs) = (join.left.schema(), join.right.schema());
    let (mut left_keys, mut right_keys) = (Vec::new(), Vec::new());
    for (l, r) in &join.on {
        left_keys.push(index(l, ls, "a join key")?);
        right_keys.push(index(r, rs, "a join key")?);
    }
    let left_time = index(&marker.args[0], ls, "the time it looks up as of")?;
    let right_time = index(&marker.args[1], rs, "the versions' time")?;
    let (tail, output) = cut_at(plan, &node, TEMPORAL_OUTPUT)?;
    Ok(Some(TemporalJoinConfig {
        left: (*join.left).clone(),
        right: (*join.right).clone(),
        join_type: join.join_type,
        left_keys,
        right_keys,
        left_time,
        right_time,
        tail,
        output,
    }))
}
