//! Tasks: a query divided by input partition, each part committing alone.
//!
//! With `'tasks' = 'per-partition'` (Kafka Streams' model), task *i* of a
//! query reads partition *i* of every input, so its inputs must have equal
//! partition counts. Each task owns:
//! - its epochs (numbered from 1 in each task);
//! - its operators' state;
//! - its checkpoint folder, `<checkpoint.location>/tasks/<i>`;
//! - its sink's transaction (a Kafka sink's transactional id and progress
//!   record end in `-<i>`).
//!
//! So tasks commit independently, and run side by side in one process, at
//! most `tasks.threads` epochs at a time.
//!
//! A query is divided only where that keeps its answer. A stateless query
//! always can be. A GROUP BY can be when one of its keys is what decides a
//! record's partition: the record key `_key` (Kafka's default partitioner
//! sends equal keys to one partition) or `_partition` itself. A GROUP BY on
//! anything else would count one key in several tasks: refused at start
//! with what would work, as are joins.

use std::str::FromStr;

use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::error::{Result, SluiceError};
use crate::planner::IncrementalPlan;

/// Which share of a divided query one task runs: partition `index` of each
/// of its inputs, which have `count` partitions.
///
/// ```
/// use sluice_engine::TaskId;
/// let task = TaskId { index: 2, count: 6 };
/// assert_eq!(task.to_string(), "task 2 of 6");
/// assert!(task.reads(2) && !task.reads(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    /// The task's number, from 0: the partition it reads.
    pub index: u32,
    /// How many tasks the query has: its inputs' partition count.
    pub count: u32,
}

impl TaskId {
    /// Whether this task reads `partition`.
    pub fn reads(&self, partition: i32) -> bool {
        u32::try_from(partition).is_ok_and(|p| p == self.index)
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} of {}", self.index, self.count)
    }
}

/// How a query is divided (SQL: `SET 'tasks'`).
///
/// ```
/// use sluice_engine::Tasks;
/// assert_eq!("per-partition".parse::<Tasks>().unwrap(), Tasks::PerPartition);
/// assert_eq!("1".parse::<Tasks>().unwrap(), Tasks::One);
/// assert!("4".parse::<Tasks>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tasks {
    /// The whole query is one task: one transaction per epoch for all its
    /// partitions (the default).
    #[default]
    One,
    /// One task per partition of the inputs.
    PerPartition,
}

impl FromStr for Tasks {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "one" => Ok(Self::One),
            "per-partition" | "per_partition" => Ok(Self::PerPartition),
            other => Err(SluiceError::config(format!(
                "'tasks' = '{other}' is not valid: use '1' (the query is one task) or \
                 'per-partition' (a task per partition of its Kafka inputs)"
            ))),
        }
    }
}

/// How many tasks `plans` (planned undivided) divide into under
/// `'tasks' = 'per-partition'`: their inputs' common partition count.
/// Refuses, naming the statement and the reason, a query whose answer
/// would change if divided, and inputs that cannot be divided or differ in
/// partition count.
pub(crate) async fn count(plans: &[IncrementalPlan]) -> Result<u32> {
    let refuse = |why: String| {
        SluiceError::config(format!(
            "'tasks' = 'per-partition' cannot divide this query: {why}. Run it as one task \
             (SET 'tasks' = '1')"
        ))
    };
    for (index, plan) in plans.iter().enumerate() {
        let which = if plans.len() == 1 {
            "the query".to_string()
        } else {
            format!("statement {index}")
        };
        if plan.join.is_some() || !plan.stages.is_empty() {
            return Err(refuse(format!(
                "{which} joins streams or stacks stateful operators, which tasks cannot \
                 divide yet"
            )));
        }
        if let Some(aggregate) = &plan.aggregate {
            if !keyed_by_partition(&aggregate.aggregate) {
                return Err(refuse(format!(
                    "{which} groups by columns that do not decide a record's partition, so \
                     one group's rows would be counted in several tasks; add the record key \
                     `_key` (or `_partition`) to its GROUP BY"
                )));
            }
        }
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

/// Whether one of the GROUP BY keys of `aggregate` is an input's `_key`
/// or `_partition`, passed through projections, filters and aliases
/// unchanged.
fn keyed_by_partition(aggregate: &LogicalPlan) -> bool {
    let LogicalPlan::Aggregate(a) = aggregate else {
        return false;
    };
    a.group_expr.iter().any(|e| match e {
        Expr::Column(c) => from_partitioning_column(&a.input, c),
        _ => false,
    })
}

/// Whether `column` of `plan`'s output is a scanned stream's `_key` or
/// `_partition` column, unchanged.
fn from_partitioning_column(plan: &LogicalPlan, column: &Column) -> bool {
    let Ok(index) = plan.schema().index_of_column(column) else {
        return false;
    };
    match plan {
        LogicalPlan::TableScan(_) => {
            matches!(
                plan.schema().field(index).name().as_str(),
                "_key" | "_partition"
            )
        }
        LogicalPlan::Projection(p) => match p.expr[index].clone().unalias() {
            Expr::Column(c) => from_partitioning_column(&p.input, &c),
            _ => false,
        },
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            let input = plan.inputs()[0];
            let (qualifier, field) = input.schema().qualified_field(index);
            from_partitioning_column(input, &Column::from((qualifier, field)))
        }
        _ => false,
    }
}
