//! The `blackhole` sink: discards rows (benchmarks measure the engine alone).

use async_trait::async_trait;

use super::EpochOutput;
use super::Sink;
use crate::checkpoint::EpochCommit;
use crate::error::Result;
use crate::source::Handover;

/// Discards every row.
#[derive(Debug)]
pub(crate) struct Blackhole;

#[async_trait]
impl Sink for Blackhole {
    async fn write_epoch(
        &self,
        _epoch: &EpochCommit,
        _output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        Ok(())
    }

    fn needs_checkpoint(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "blackhole".into()
    }
}
