#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Sluice: an embedded streaming SQL engine over Arrow and DataFusion.
//!
//! [`Session`] is the entry point: it knows every connector, Kafka included,
//! and runs SQL ([`Session::sql`]) or DataFrame-style pipelines
//! ([`Session::read_stream`](sluice_engine::Session::read_stream)) as
//! continuous queries, one micro-batch (epoch) at a time.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread")]
//! # async fn main() -> sluice::Result<()> {
//! use std::time::Duration;
//! use sluice::datafusion::prelude::*;
//! use sluice::{MemorySink, Session, Trigger};
//!
//! let session = Session::new();
//! let out = MemorySink::new();
//! let query = session
//!     .read_stream()
//!     .format("rate")
//!     .option("rows_per_second", "100")
//!     .load()?
//!     .filter((col("value") % lit(3)).not_eq(lit(0)))?
//!     .with_column("doubled", col("value") * lit(2))?
//!     .write_stream()
//!     .memory(&out)
//!     .trigger(Trigger::ProcessingTime(Duration::from_millis(100)))
//!     .start()
//!     .await?;
//! while out.num_rows() < 10 {
//!     tokio::time::sleep(Duration::from_millis(50)).await;
//! }
//! query.stop().await?;
//! # Ok(()) }
//! ```

use std::ops::Deref;
use std::sync::Arc;

pub use sluice_engine::*;
pub use sluice_kafka::broker;
pub use sluice_sql::{SqlError, StatementOutcome};

/// A session with every connector registered (the engine's built-ins and
/// Kafka), able to run SQL. Dereferences to [`sluice_engine::Session`].
#[derive(Debug, Clone)]
pub struct Session(sluice_engine::Session);

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A session with all connectors.
    pub fn new() -> Self {
        Self::from_engine(sluice_engine::Session::new())
    }

    /// A session with all connectors, planning in `ctx` (its settings,
    /// functions and UDFs).
    pub fn with_context(ctx: datafusion::prelude::SessionContext) -> Self {
        Self::from_engine(sluice_engine::Session::with_context(ctx))
    }

    /// Adds the Kafka and Nexmark connectors to an engine session.
    pub fn from_engine(session: sluice_engine::Session) -> Self {
        session.register_connector(Arc::new(sluice_kafka::KafkaConnector));
        session.register_connector(Arc::new(sluice_nexmark::NexmarkConnector));
        Self(session)
    }

    /// Runs the statements of `text` (`CREATE STREAM`, `SET`, `INSERT INTO`,
    /// ...) in order; `INSERT INTO` starts a query.
    pub async fn sql(&self, text: &str) -> std::result::Result<Vec<StatementOutcome>, SqlError> {
        sluice_sql::SqlRunner::new(&self.0, "<sql>").run(text).await
    }

    /// The engine session.
    pub fn engine(&self) -> &sluice_engine::Session {
        &self.0
    }
}

impl Deref for Session {
    type Target = sluice_engine::Session;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
