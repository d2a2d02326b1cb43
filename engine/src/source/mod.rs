//! Sources: where each epoch's rows come from.
//!
//! A source is replayable by offsets. Each epoch the engine asks every source
//! for its latest offset ([`Source::latest_offset`]), writes the ranges to the
//! checkpoint's `offsets/N`, then reads exactly those ranges
//! ([`Source::read`]). After a crash the same ranges are read again, so a
//! source MUST return the same rows for the same range.
//!
//! Offsets are the source's own JSON values; the engine only stores and
//! compares them.

use std::fmt::Debug;
use std::sync::Arc;

use std::collections::BTreeMap;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::Result;

mod files;
mod memory;
mod rate;

pub use files::FilesConnector;
pub use memory::{MemorySourceFactory, MemoryStream};
pub use rate::RateConnector;

/// A source's position, as the source's own JSON.
pub type Offset = serde_json::Value;

/// One epoch's input from one source: record batches per partition.
pub type Partitions = Vec<Vec<RecordBatch>>;

/// A running query's connection to one input stream.
#[async_trait]
pub trait Source: Send + Sync + Debug {
    /// The end (exclusive) of the next epoch's range starting at `start`
    /// (`None`: the source's initial position), or `None` when there is no
    /// new data. A source that caps records per epoch applies the cap here.
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>>;

    /// Reads `[start, end)`. MUST return the same rows for the same range,
    /// whenever it is called: replaying an epoch depends on it.
    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions>;

    /// Called once when the query runs with the available-now trigger: from
    /// then on, [`Source::latest_offset`] MUST NOT go past what is available
    /// now, so the query ends. The default does nothing, which is right for
    /// sources that never grow while a query runs.
    async fn prepare_available_now(&self) -> Result<()> {
        Ok(())
    }

    /// Records available beyond the end of the last planned range, per
    /// partition, as the last [`Source::latest_offset`] saw them (the
    /// backlog; Kafka: last stable offset minus the planned end). Empty when
    /// the source cannot tell.
    fn lag(&self) -> BTreeMap<String, i64> {
        BTreeMap::new()
    }
}

/// What a declared stream reads from: creates one [`Source`] per running
/// query, so that two queries over the same stream never share positions.
pub trait SourceFactory: Send + Sync + Debug {
    /// The rows' schema.
    fn schema(&self) -> SchemaRef;

    /// A new source for one query.
    fn create(&self) -> Result<Arc<dyn Source>>;

    /// A one-line description for progress and `EXPLAIN`, e.g. `rate(5 rows/s)`.
    fn describe(&self) -> String;
}
