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
//! anything else would count one key in several tasks, so its rows first
//! go through a repartition step (see `session/repartition/`), as do
//! both sides of a join of two streams. Stacked stateful operators are
//! refused at start, with what would work.

//!
//! This module holds what every layer names: a task's identity, the
//! setting that divides a query, and the group that hands tasks out.
//! Deciding how a query divides is the planner's (`planner/tasks.rs`);
//! running the tasks is the launch's (`launch/tasks.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::str::FromStr;

use crate::error::{Result, SluiceError};

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

/// Hands a divided query's tasks out among the processes that run it, so
/// that each task runs in one process at a time (`'tasks.group' = 'true'`;
/// for Kafka inputs, Kafka's consumer-group protocol). The engine starts
/// the tasks it is given, stops those taken away, and says when they have
/// stopped.
pub trait TaskAssigner: Send + Sync + Debug {
    /// The task numbers this process owns now; changes as the group moves
    /// tasks between processes.
    fn owned(&self) -> tokio::sync::watch::Receiver<BTreeSet<u32>>;

    /// The engine has stopped `tasks`, which left this process: the group
    /// may hand them to their next owner now.
    fn released(&self, tasks: &BTreeSet<u32>);

    /// Leaves the group, once every task of this process has stopped: its
    /// tasks move to the other processes at once.
    fn leave(&self);

    /// Who owns each task now, as the group last said (a process's name,
    /// e.g. `sluice-<pid>@<host> at /<address>`), for the status page.
    /// Never waits: a group that must ask its coordinator answers from
    /// what it last learned and asks again in the background. Empty (the
    /// default) when unknown.
    fn owners(&self) -> BTreeMap<u32, String> {
        BTreeMap::new()
    }
}

/// This host's name, as a task's owner is named (by its task group, and on
/// the status page): the kernel's host name, else `$HOSTNAME`, else
/// `unknown-host`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

/// A channel's stream name (and its statements' checkpoint keys).
pub(crate) fn step_name(index: usize) -> String {
    format!("repartition-{index}")
}

/// Which repartition step's channel the input of checkpoint key `key`
/// reads (`<position>:repartition-<n>-<format>`, after its statement's
/// prefix), if it reads one: how `sluice verify` tells a divided query's
/// channels from its inputs.
///
/// ```
/// use sluice_engine::repartition_step_of;
/// assert_eq!(repartition_step_of("1.counts/0:repartition-2-avro"), Some(2));
/// assert_eq!(repartition_step_of("0.repartition-0/0:bids"), None);
/// ```
pub fn repartition_step_of(key: &str) -> Option<usize> {
    let (_, stream) = key.rsplit_once(':')?;
    stream
        .strip_prefix("repartition-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}
