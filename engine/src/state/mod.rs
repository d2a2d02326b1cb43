//! The state layer: every operator's state, in memory and in the
//! checkpoint.
//!
//! - [`keyed`]: the keyed state store, an operator's rows in memory indexed
//!   by key ([`KeyedState`]); what aggregations and deduplication keep.
//!   `columns` writes its upserts into the stored columns.
//! - [`codec`]: the one byte format of checkpoint files (framing and
//!   checksums) and of the state in them (Arrow IPC parts).
//! - [`chain`]: snapshot-and-deltas chains in the checkpoint, and the
//!   policy that picks a snapshot or a delta.
//! - [`budget`]: the memory limit of a process's keyed state, and the
//!   local disk its coldest keys go to past it (`keyed` spills them).
//! - [`remote`]: checkpoint files on object storage (`s3://`, `gs://`,
//!   `az://`), behind the same file operations as on disk.
//!
//! An operator keeps whatever state it needs (a [`KeyedState`], a join's
//! two buffers) and stages it through the operator lifecycle
//! (`operator::Operator::stage`); the chain writes what it stages, and
//! recovery hands the committed chain back to it. Nothing here knows of
//! windows, joins or epochs' output.

pub(crate) mod budget;
pub(crate) mod chain;
pub(crate) mod codec;
mod columns;
#[cfg(test)]
mod fuzz;
pub(crate) mod keyed;
pub(crate) mod remote;

pub use budget::StateBudget;
pub(crate) use columns::compact_views;

/// What an operator's state holds: rows, and bytes in memory and on
/// local disk (past `state.memory.limit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StateSize {
    pub rows: u64,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
}

impl std::ops::Add for StateSize {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            rows: self.rows + other.rows,
            memory_bytes: self.memory_bytes + other.memory_bytes,
            disk_bytes: self.disk_bytes + other.disk_bytes,
        }
    }
}

impl StateSize {
    /// Rows and bytes, all in memory.
    pub(crate) fn in_memory(rows: u64, bytes: u64) -> Self {
        Self {
            rows,
            memory_bytes: bytes,
            disk_bytes: 0,
        }
    }
}
pub use keyed::KeyedState;
pub(crate) use keyed::{row_converter, Located, OneStore, StateTtl};
