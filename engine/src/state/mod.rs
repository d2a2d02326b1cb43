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
//! - [`remote`]: checkpoint files on object storage (`s3://`, `gs://`,
//!   `az://`), behind the same file operations as on disk.
//!
//! An operator keeps whatever state it needs (a [`KeyedState`], a join's
//! two buffers) and stages it through the operator lifecycle
//! (`operator::Operator::stage`); the chain writes what it stages, and
//! recovery hands the committed chain back to it. Nothing here knows of
//! windows, joins or epochs' output.

pub(crate) mod chain;
pub(crate) mod codec;
mod columns;
#[cfg(test)]
mod fuzz;
pub(crate) mod keyed;
pub(crate) mod remote;

pub(crate) use columns::compact_views;
pub use keyed::KeyedState;
pub(crate) use keyed::{row_converter, Located, OneStore};
