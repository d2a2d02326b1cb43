//! The `blackhole` sink: discards rows (benchmarks measure the engine alone).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::Sink;
use crate::checkpoint::EpochCommit;
use crate::connector::{Connector, SinkArgs};
use crate::error::Result;

/// The `blackhole` connector.
#[derive(Debug, Default)]
pub struct BlackholeConnector;

impl Connector for BlackholeConnector {
    fn name(&self) -> &str {
        "blackhole"
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        args.options.finish("blackhole", &[])?;
        Ok(Arc::new(Blackhole))
    }
}

#[derive(Debug)]
struct Blackhole;

#[async_trait]
impl Sink for Blackhole {
    async fn write_epoch(&self, _epoch: &EpochCommit, _batches: &[RecordBatch]) -> Result<()> {
        Ok(())
    }

    fn needs_checkpoint(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "blackhole".into()
    }
}
