//! How a query divides into tasks (`'tasks' = 'per-partition'`): how many
//! tasks its inputs make, whether a GROUP BY is already partitioned by its
//! key, and what EXPLAIN says of it.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlan};

use super::check::reads_stream;
use super::{IncrementalPlan, Stage, StageConfig};
use crate::error::{Result, SluiceError};
use crate::settings::QuerySettings;
use crate::task::Tasks;

/// What EXPLAIN says of how `settings` divide the query: nothing for one
/// task.
pub(crate) fn explain(settings: &QuerySettings) -> String {
    match (settings.tasks, settings.task_group) {
        (Tasks::One, _) => String::new(),
        (Tasks::PerPartition, false) => {
            "tasks: one per partition of the inputs (counted at start), each committing alone, \
             all in this process\n"
                .into()
        }
        (Tasks::PerPartition, true) => {
            "tasks: one per partition of the inputs (counted at start), each committing alone, \
             shared with the other processes of the query through its Kafka group \
             ('tasks.group')\n"
                .into()
        }
    }
}

/// How many tasks `plans` (planned undivided) divide into under
/// `'tasks' = 'per-partition'`: their inputs' common partition count.
/// Refuses, naming the statement and the reason, a query whose answer
/// would change if divided, and inputs that cannot be divided or differ in
/// partition count.
pub(crate) async fn count(plans: &[IncrementalPlan]) -> Result<u32> {
    for (index, plan) in plans.iter().enumerate() {
        let which = if plans.len() == 1 {
            "the query".to_string()
        } else {
            format!("statement {index}")
        };
        divisible(plan, &which)?;
    }
    let mut counts = Vec::new();
    for input in plans.iter().flat_map(|p| &p.inputs) {
        match input.source.partition_count().await? {
            Some(n) => counts.push((n, &input.description)),
            None => {
                return Err(refuse(format!(
                    "{} cannot be divided by partition (only Kafka streams can)",
                    input.description
                )))
            }
        }
    }
    let Some(&(first, _)) = counts.first() else {
        return Err(refuse("it reads no stream".into()));
    };
    if let Some((n, which)) = counts.iter().find(|(n, _)| *n != first) {
        return Err(refuse(format!(
            "its inputs have different partition counts ({first} for {}, {n} for {which}), and \
             task i reads partition i of every input",
            counts[0].1
        )));
    }
    if first == 0 {
        return Err(refuse("its input has no partitions".into()));
    }
    Ok(first)
}

/// Refuses, naming `which` statement and the reason, a query whose answer
/// would change if divided: what no task division can run yet.
pub(crate) fn divisible(plan: &IncrementalPlan, which: &str) -> Result<()> {
    if plan.over.is_some() {
        return Err(refuse(format!(
            "{which} computes an OVER aggregation, which tasks cannot divide yet"
        )));
    }
    if plan.rank.is_some() {
        return Err(refuse(format!(
            "{which} ranks rows (a Top-N), which tasks cannot divide yet"
        )));
    }
    // Stacked operators divide as a chain of statements, each reading the
    // rows of the one under it, which must never change.
    if plan.stages.iter().any(changes) {
        return Err(refuse(format!(
            "{which} reads an upsert stream or stacks a stateful operator whose rows change \
             (an aggregation without a window, a join over changes), which tasks cannot \
             divide yet"
        )));
    }
    if plan.join.as_ref().is_some_and(|j| j.changelog.is_some()) {
        return Err(refuse(format!(
            "{which} joins streams whose rows change (or an outer join without a time bound), \
             which tasks cannot divide yet"
        )));
    }
    Ok(())
}

fn refuse(why: String) -> SluiceError {
    refuse_division(why, None)
}

/// The error refusing to divide a query into tasks: `why` (what stops
/// it), then `instead` (what would divide), or running it as one task.
///
/// ```text
/// 'tasks' = 'per-partition' cannot divide this query: <why>. <instead>, or
/// run it as one task (SET 'tasks' = '1')
/// ```
pub(crate) fn refuse_division(why: impl std::fmt::Display, instead: Option<&str>) -> SluiceError {
    let cannot = "'tasks' = 'per-partition' cannot divide this query";
    SluiceError::config(match instead {
        Some(instead) => {
            format!("{cannot}: {why}. {instead}, or run it as one task (SET 'tasks' = '1')")
        }
        None => format!("{cannot}: {why}. Run it as one task (SET 'tasks' = '1')"),
    })
}

/// Whether `stage` emits rows that change: a changelog.
fn changes(stage: &Stage) -> bool {
    match &stage.config {
        StageConfig::Aggregate(a) => a.changelog,
        StageConfig::Join(j) => j.changelog.is_some(),
        StageConfig::Normalize(_) => true,
    }
}

/// Whether one of the GROUP BY keys of `aggregate` is an input's `_key`
/// or `_partition`, passed through projections, filters and aliases
/// unchanged.
pub(crate) fn keyed_by_partition(aggregate: &LogicalPlan) -> bool {
    let LogicalPlan::Aggregate(a) = aggregate else {
        return false;
    };
    a.group_expr.iter().any(|e| match e {
        Expr::Column(c) => scanned_column(&a.input, c)
            .is_some_and(|c| matches!(c.name.as_str(), "_key" | "_partition")),
        _ => false,
    })
}

/// Whether the join of two streams in `plan` equates both sides' record
/// key `_key` (or `_partition`), passed through unchanged: with inputs
/// written by one partitioner and of equal partition counts, partition
/// *i* of each holds the same keys, so task *i* joins its partitions
/// without a repartition step (Kafka Streams' co-partitioning).
pub(crate) fn joined_by_partition(plan: &LogicalPlan) -> bool {
    let mut co_partitioned = false;
    let _ = plan.apply(|node| {
        let LogicalPlan::Join(j) = node else {
            return Ok(TreeNodeRecursion::Continue);
        };
        if !(reads_stream(&j.left) && reads_stream(&j.right)) {
            return Ok(TreeNodeRecursion::Continue);
        }
        let partitioning = |side: &LogicalPlan, e: &Expr| match e {
            Expr::Column(c) => scanned_column(side, c)
                .map(|c| c.name)
                .filter(|n| matches!(n.as_str(), "_key" | "_partition")),
            _ => None,
        };
        co_partitioned = j.on.iter().any(|(l, r)| {
            let l = partitioning(&j.left, l);
            l.is_some() && l == partitioning(&j.right, r)
        });
        Ok(TreeNodeRecursion::Stop)
    });
    co_partitioned
}

/// The scanned stream's column that `column` of `plan`'s output is,
/// passed through projections, filters, aliases and a window's unnesting
/// unchanged; `None` when it is computed on the way.
pub(crate) fn scanned_column(plan: &LogicalPlan, column: &Column) -> Option<Column> {
    let index = plan.schema().index_of_column(column).ok()?;
    match plan {
        LogicalPlan::TableScan(_) => {
            let (qualifier, field) = plan.schema().qualified_field(index);
            Some(Column::from((qualifier, field)))
        }
        LogicalPlan::Projection(p) => match p.expr[index].clone().unalias() {
            Expr::Column(c) => scanned_column(&p.input, &c),
            _ => None,
        },
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            let input = plan.inputs()[0];
            let (qualifier, field) = input.schema().qualified_field(index);
            scanned_column(input, &Column::from((qualifier, field)))
        }
        // A HOP or CUMULATE window repeats each row once per window: the
        // columns it does not unnest pass through under their names.
        LogicalPlan::Unnest(u) if u.input.schema().has_column(column) => {
            scanned_column(&u.input, column)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_division;

    #[test]
    fn a_refusal_says_what_stops_the_division_and_what_to_do() {
        let plain = refuse_division("it reads no stream", None).to_string();
        assert!(
            plain.ends_with(
                "'tasks' = 'per-partition' cannot divide this query: it reads no stream. Run it \
                 as one task (SET 'tasks' = '1')"
            ),
            "{plain}"
        );
        let with = refuse_division("it groups by x", Some("Group by `_key`")).to_string();
        assert!(
            with.ends_with(
                "cannot divide this query: it groups by x. Group by `_key`, or run it as one \
                 task (SET 'tasks' = '1')"
            ),
            "{with}"
        );
    }
}
