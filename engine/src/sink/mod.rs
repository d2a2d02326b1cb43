//! Sinks: where each epoch's output goes.
//!
//! The engine calls [`Sink::write_epoch`] once per epoch with the epoch's
//! output, then records `commits/N` in the checkpoint. A sink that
//! [sends ahead](Sink::sends_ahead) is also given the output of appending
//! statements batch by batch while the epoch computes. A crash between the
//! two re-runs epoch N on restart, so a sink sees an epoch again unless it
//! remembers which epochs it has (the memory sink does; the plain Kafka
//! producer does not — that is at-least-once, and the transactional Kafka
//! sink closes the gap by committing output and progress together).

use std::fmt::Debug;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use crate::checkpoint::EpochCommit;
use crate::error::Result;
use crate::source::Handover;

mod blackhole;
mod console;
mod fan_out;
pub(crate) mod files;
mod memory;

pub(crate) use blackhole::Blackhole;
pub(crate) use console::Console;
pub use fan_out::FanOut;
pub use memory::MemorySink;

/// One statement's output in one epoch.
#[derive(Debug, Clone, Default)]
pub struct EpochOutput {
    /// Rows to emit.
    pub rows: Vec<RecordBatch>,
    /// Update mode: the keys (rows of the output's key columns) of groups
    /// that left the output this epoch (a HAVING no longer true), for an
    /// upsert sink to delete; Kafka writes a tombstone per key.
    pub retracted: Option<RecordBatch>,
}

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

    /// Whether [`Sink::committed_epoch`] reads a record the sink keeps
    /// itself (and so decides which epochs are committed). Default `false`.
    fn records_commits(&self) -> bool {
        false
    }

    /// Writes `output`, the output of the epoch `epoch` commits (its number,
    /// source ranges and state files), with what its sources hand over,
    /// and returns once it is durable in the sink (for Kafka: acknowledged
    /// or committed). MUST NOT return `Ok` before that: the engine marks
    /// the epoch committed right after.
    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        handover: &Handover,
    ) -> Result<()>;

    /// Writes the outputs of a statement set's statements as one epoch:
    /// `outputs[i]` is the output of the i-th statement this sink was made
    /// for (see [`Connector::sink_set`](crate::Connector::sink_set)). The
    /// same durability rule as [`Sink::write_epoch`]. The default, for a
    /// sink made for one statement, writes its one output with
    /// [`Sink::write_epoch`].
    async fn write_epoch_set(
        &self,
        epoch: &EpochCommit,
        outputs: &[EpochOutput],
        handover: &Handover,
    ) -> Result<()> {
        match outputs {
            [one] => self.write_epoch(epoch, one, handover).await,
            _ => Err(crate::SluiceError::Internal(format!(
                "{} was made for one statement but got {} outputs",
                self.describe(),
                outputs.len()
            ))),
        }
    }

    /// Whether the sink takes an epoch's output while it is computed
    /// ([`Sink::send_ahead`]), so that writing it overlaps computing and
    /// reading the rest. Default `false`.
    fn sends_ahead(&self) -> bool {
        false
    }

    /// Whether the engine sends ahead to this sink (when it
    /// [`sends_ahead`](Self::sends_ahead)) under `'epoch.pipeline' =
    /// 'auto'`, the default; `'true'` sends ahead to every sink that can
    /// take it, `'false'` to none. Default `true`.
    fn pipelines_by_default(&self) -> bool {
        true
    }

    /// Sends `rows`, part of the output of the `statement`-th statement
    /// in epoch `epoch`, before the epoch's output is complete (only when
    /// [`Sink::sends_ahead`], and only for outputs of appended rows).
    /// Nothing sent ahead may become visible before
    /// [`Sink::write_epoch_set`] for the same epoch makes it durable: the
    /// exactly-once Kafka sink sends it inside the epoch's transaction.
    /// The outputs `write_epoch_set` then gets hold these rows too: it
    /// sends what was not sent ahead, and everything again when it must
    /// retry, or when sending ahead failed (which this reports only for
    /// errors a retry cannot mend). The default does nothing.
    async fn send_ahead(&self, epoch: u64, statement: usize, rows: &RecordBatch) -> Result<()> {
        let _ = (epoch, statement, rows);
        Ok(())
    }

    /// Whether the sink writes what sources hand over with the epoch's
    /// output ([`Handover`]). Default `false`: a query whose sources hand
    /// something over is then refused at start.
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
