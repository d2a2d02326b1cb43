//! Sinks: where each epoch's output goes.
//!
//! The engine calls [`Sink::write_epoch`] once per epoch with the epoch's
//! output, then records `commits/N` in the checkpoint. A crash between the
//! two re-runs epoch N on restart, so a sink sees an epoch again unless it
//! remembers which epochs it has (the memory sink does; the plain Kafka
//! producer does not — that is at-least-once, and the transactional Kafka
//! sink closes the gap by committing output and progress together).

use std::fmt::Debug;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use crate::checkpoint::EpochCommit;
use crate::error::Result;

mod blackhole;
mod console;
mod memory;

pub use blackhole::BlackholeConnector;
pub use console::ConsoleConnector;
pub use memory::MemorySink;

/// What a sink knows about which epochs it has committed.
#[derive(Debug, Clone, PartialEq)]
pub enum CommittedEpoch {
    /// The sink keeps no record; the checkpoint's `commits/` decides.
    NotRecorded,
    /// The sink's own durable record (the transactional Kafka sink's
    /// progress topic): the plan (number and source ranges) of the last
    /// epoch it committed, `None` if none. The engine trusts it over
    /// `commits/` and `offsets/`.
    Recorded(Option<EpochCommit>),
}

/// A running query's output.
#[async_trait]
pub trait Sink: Send + Sync + Debug {
    /// Connects and checks the destination before the first epoch, so that
    /// an unreachable broker or a missing topic fails the start of the query
    /// with a clear error. The default does nothing.
    async fn open(&self) -> Result<()> {
        Ok(())
    }

    /// The last epoch the sink itself recorded as committed. Called after
    /// [`Sink::open`], before the first epoch. Default: not recorded.
    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        Ok(CommittedEpoch::NotRecorded)
    }

    /// Writes the output of the epoch planned in `epoch` (its number and
    /// source ranges) and returns once it is durable in the sink (for
    /// Kafka: acknowledged or committed). MUST NOT return `Ok` before that:
    /// the engine marks the epoch committed right after.
    async fn write_epoch(&self, epoch: &EpochCommit, batches: &[RecordBatch]) -> Result<()>;

    /// Whether the sink writes what sources hand over with the epoch's
    /// output ([`EpochCommit::dead_letters`], [`EpochCommit::group_offsets`]).
    /// Default `false`: a query whose sources hand something over is then
    /// refused at start.
    fn accepts_source_commits(&self) -> bool {
        false
    }

    /// Whether the query needs a checkpoint location to run with this sink.
    /// Default `true`; sinks whose output does not outlive the process
    /// (console, memory, blackhole) return `false` and get a temporary one.
    fn needs_checkpoint(&self) -> bool {
        true
    }

    /// A one-line description for progress and `EXPLAIN`.
    fn describe(&self) -> String;
}
