//! The `memory` sink: collects output in memory, for tests and notebooks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::EpochOutput;
use super::Sink;
use crate::checkpoint::EpochCommit;
use crate::error::Result;
use crate::source::Handover;

/// Output collected per epoch: its rows and, in update mode, the keys of
/// the groups it retracted. An epoch written twice (replayed after a
/// restart within one process) is kept once, as Spark's memory sink does.
///
/// ```no_run
/// # async fn f(frame: sluice_engine::StreamFrame) -> sluice_engine::Result<()> {
/// let out = sluice_engine::MemorySink::new();
/// let query = frame.write_stream().memory(&out).start().await?;
/// query.process_all_available().await?;
/// println!("{} rows so far", out.num_rows());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    epochs: Arc<Mutex<BTreeMap<u64, Written>>>,
}

#[derive(Debug, Clone, Default)]
struct Written {
    rows: Vec<RecordBatch>,
    retracted: Option<RecordBatch>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The epochs written so far, in order.
    pub fn epochs(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    /// All rows written so far, epoch by epoch.
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.lock()
            .values()
            .flat_map(|w| w.rows.iter().cloned())
            .collect()
    }

    /// Takes every row written so far out of the sink, epoch by epoch: a
    /// long run that reads its output as it goes holds none of it twice.
    /// An epoch taken and written again (replayed after a restart within
    /// one process) comes back.
    pub fn take(&self) -> Vec<RecordBatch> {
        std::mem::take(&mut *self.lock())
            .into_values()
            .flat_map(|w| w.rows)
            .collect()
    }

    /// The rows of one epoch.
    pub fn epoch_batches(&self, epoch: u64) -> Vec<RecordBatch> {
        self.lock()
            .get(&epoch)
            .map(|w| w.rows.clone())
            .unwrap_or_default()
    }

    /// The keys of the groups one epoch retracted: groups that left an
    /// update-mode output (HAVING, or a count fallen to 0 over a
    /// changelog), which an upsert sink deletes.
    pub fn epoch_retracted(&self, epoch: u64) -> Option<RecordBatch> {
        self.lock().get(&epoch).and_then(|w| w.retracted.clone())
    }

    /// All rows as one batch with `schema` (empty when nothing was written).
    pub fn to_batch(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        Ok(concat_batches(schema, &self.batches())?)
    }

    /// Number of rows written so far.
    pub fn num_rows(&self) -> usize {
        self.lock()
            .values()
            .flat_map(|w| &w.rows)
            .map(RecordBatch::num_rows)
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Written>> {
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Sink for MemorySink {
    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        self.lock().entry(epoch.epoch()).or_insert_with(|| Written {
            rows: output.rows.clone(),
            retracted: output.retracted.clone(),
        });
        Ok(())
    }

    fn needs_checkpoint(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
