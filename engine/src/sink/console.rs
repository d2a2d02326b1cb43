//! The `console` sink: prints each epoch's rows as a table, as Spark's does,
//! and in update mode the keys the epoch deleted under them.

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;

use super::EpochOutput;
use super::Sink;
use crate::checkpoint::EpochCommit;
use crate::error::{Result, SluiceError};
use crate::source::Handover;

/// Prints each epoch's rows.
#[derive(Debug)]
pub(crate) struct Console {
    /// Rows printed per epoch; the rest are counted.
    num_rows: usize,
    /// The query's output columns, shown even for an epoch without rows.
    schema: SchemaRef,
}

impl Console {
    /// Prints at most `num_rows` rows per epoch, under the columns of
    /// `schema`.
    pub(crate) fn new(num_rows: usize, schema: SchemaRef) -> Self {
        Self { num_rows, schema }
    }
}

#[async_trait]
impl Sink for Console {
    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        let epoch = epoch.epoch();
        let batches = &output.rows;
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let mut shown = Vec::new();
        let mut left = self.num_rows;
        for b in batches {
            if left == 0 {
                break;
            }
            let n = b.num_rows().min(left);
            shown.push(b.slice(0, n));
            left -= n;
        }
        if shown.is_empty() {
            shown.push(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let table = pretty_format_batches(&shown)?;
        let mut out = std::io::stdout().lock();
        let io = |e| SluiceError::io("writing to stdout", e);
        writeln!(out, "-------------------------------------------").map_err(io)?;
        writeln!(out, "Epoch: {epoch}").map_err(io)?;
        writeln!(out, "-------------------------------------------").map_err(io)?;
        writeln!(out, "{table}").map_err(io)?;
        if total > self.num_rows {
            writeln!(out, "only showing top {} of {total} rows", self.num_rows).map_err(io)?;
        }
        if let Some(deleted) = output.retracted.as_ref().filter(|d| d.num_rows() > 0) {
            writeln!(out, "deleted keys:").map_err(io)?;
            writeln!(
                out,
                "{}",
                pretty_format_batches(std::slice::from_ref(deleted))?
            )
            .map_err(io)?;
        }
        out.flush().map_err(io)
    }

    fn needs_checkpoint(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "console".into()
    }
}
