#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Sluice's streaming engine.
//!
//! A [`Session`] declares streams and starts continuous queries over them.
//! A query is a DataFusion plan run one micro-batch (*epoch*) at a time: each
//! epoch plans source offsets and records them in the checkpoint, reads those
//! ranges as Arrow record batches, runs the plan over them, hands the output
//! to the sink and records the commit (`docs/architecture.md` §2 follows one
//! epoch through the modules). A restart from the same checkpoint continues with
//! the next epoch, re-running an epoch that was planned but not committed
//! over exactly the same offsets.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread")]
//! # async fn main() -> sluice_engine::Result<()> {
//! use std::sync::Arc;
//! use sluice_engine::arrow::array::Int64Array;
//! use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
//! use sluice_engine::arrow::record_batch::RecordBatch;
//! use sluice_engine::datafusion::prelude::*;
//! use sluice_engine::{MemorySink, MemoryStream, Session};
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
//! let input = MemoryStream::new(schema.clone());
//! let session = Session::new();
//! let out = MemorySink::new();
//! let query = session
//!     .read_stream()
//!     .memory(&input)?
//!     .filter(col("x").gt(lit(1)))?
//!     .write_stream()
//!     .memory(&out)
//!     .start()
//!     .await?;
//! input.add_batch(RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2, 3]))])?)?;
//! query.process_all_available().await?;
//! assert_eq!(out.num_rows(), 2);
//! query.stop().await?;
//! # Ok(()) }
//! ```

mod checkpoint;
mod computed;
mod connector;
mod epoch;
mod error;
mod fail_point;
pub mod functions;
mod launch;
mod lookup;
mod memory;
mod metrics;
mod operator;
mod options;
mod output_mode;
mod planner;
mod progress;
mod query;
mod reference;
mod session;
mod settings;
mod sink;
mod source;
mod state;
mod statement;
mod table;
mod task;
mod trigger;
mod upsert;
mod watermark;
mod window;

pub use checkpoint::{
    Checkpoint, EpochCommit, Metadata, OffsetRecord, PartitionWatermarks, SourceRange,
    FORMAT_VERSION,
};
pub use computed::ComputedColumn;
pub use connector::{
    BlackholeConnector, Connector, ConnectorRegistry, ConsoleConnector, FilesConnector,
    FilesystemConnector, RateConnector, RepartitionArgs, RepartitionChannel, SinkArgs, SourceArgs,
};
pub use error::{Result, SluiceError};
pub use fail_point::fail_point;
pub use lookup::{LookupArgs, LookupCacheConfig, LookupJoinRule, LookupSource, LookupTable};
pub use memory::tune_allocator;
pub use metrics::Metrics;
pub use operator::changelog::SIGN as CHANGELOG_SIGN;
pub use operator::temporal_join::TemporalAsOf;
pub use options::{
    closest, columns, is_sensitive, parse_duration, quoted_list, redact_secrets, register_secret,
    url_userinfo, Options, REDACTED,
};
pub use output_mode::OutputMode;
pub use progress::{
    lag_records, PhaseDurations, QueryProgress, QueryStartedEvent, QueryTerminatedEvent,
    SourceProgress, StreamingQueryListener,
};
pub use query::{QueryStatus, StreamingQuery, TaskPhase, TaskReport};
pub use reference::BatchQuery;
pub use session::frame::{DataStreamWriter, StreamFrame};
pub use session::statement_set::{unprefixed_key, StatementSet};
pub use session::{DataStreamReader, Session};
pub use settings::{unknown_setting, Pipelining, QuerySettings, Setting, SETTINGS};
pub use sink::{CommittedEpoch, EpochOutput, FanOut, MemorySink, Sink};
pub use source::{
    DeadLetter, GroupOffsets, Handover, LazyPartition, MemorySourceFactory, MemoryStream, Offset,
    Partitions, Rejected, Source, SourceFactory,
};
pub use state::{KeyedState, StateBudget};
pub use table::{StreamDefinition, StreamTable};
pub use task::{host_name, repartition_step_of, TaskAssigner, TaskId, Tasks};
pub use trigger::Trigger;
pub use upsert::{DELETED as UPSERT_DELETED, KEY_METADATA as UPSERT_KEY_METADATA};
pub use watermark::processing_time::columns as processing_time_columns;
pub use watermark::{CurrentWatermark, Proctime, WatermarkSpec};
pub use window::Window;

pub use datafusion;
pub use datafusion::arrow;

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        assert_send_sync::<crate::Session>();
        assert_send_sync::<crate::StreamingQuery>();
        assert_send_sync::<crate::StreamFrame>();
        assert_send_sync::<crate::MemorySink>();
        assert_send_sync::<crate::MemoryStream>();
        assert_send_sync::<crate::SluiceError>();
    }
}
