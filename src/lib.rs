#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Sluice: an embedded streaming SQL engine over Arrow and DataFusion.
//!
//! [`Session`] is the entry point: it knows every connector, Kafka included,
//! and runs SQL ([`Session::sql`]) or DataFrame-style pipelines
//! ([`Session::read_stream`]) as continuous queries, one micro-batch (epoch)
//! at a time.
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

use std::sync::Arc;

use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;

pub use sluice_engine::*;
pub use sluice_kafka::broker;
pub use sluice_sql::{PendingQuery, Prepared, SqlError, SqlRunner, StatementOutcome};

/// A Sluice session: every connector (the engine's built-ins, Kafka and
/// Nexmark), SQL ([`Session::sql`]) and the DataFrame API
/// ([`Session::read_stream`]); the one session type of the public API.
#[derive(Debug, Clone)]
pub struct Session(sluice_engine::Session);

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A session with all connectors, planning with one partition per core.
    pub fn new() -> Self {
        Self::with_engine(sluice_engine::Session::new())
    }

    /// A session with all connectors, planning in `ctx` (its settings,
    /// functions and UDFs).
    pub fn with_context(ctx: SessionContext) -> Self {
        Self::with_engine(sluice_engine::Session::with_context(ctx))
    }

    fn with_engine(session: sluice_engine::Session) -> Self {
        session.register_connector(Arc::new(sluice_kafka::KafkaConnector));
        session.register_connector(Arc::new(sluice_kafka::UpsertKafkaConnector));
        session.register_connector(Arc::new(sluice_nexmark::NexmarkConnector));
        session.register_connector(Arc::new(sluice_jdbc::JdbcConnector));
        // Flink's Nexmark q14 declares it with CREATE FUNCTION, which
        // resolves to a function registered here.
        session.context().register_udf(sluice_nexmark::count_char());
        Self(session)
    }

    /// Runs the statements of `text` (`CREATE STREAM`, `SET`, `INSERT INTO`,
    /// ...) in order; `INSERT INTO` starts a query.
    pub async fn sql(&self, text: &str) -> std::result::Result<Vec<StatementOutcome>, SqlError> {
        self.sql_runner("<sql>").run(text).await
    }

    /// A runner of SQL text on this session whose errors name `file`: to
    /// prepare (plan without starting) or run a file's statements.
    pub fn sql_runner(&self, file: &str) -> SqlRunner<'_> {
        SqlRunner::new(&self.0, file)
    }

    /// Starts describing a stream to read (Spark's `readStream`).
    pub fn read_stream(&self) -> DataStreamReader {
        self.0.read_stream()
    }

    /// Starts a statement set: several INSERTs run as one query, their
    /// outputs committed together each epoch.
    pub fn statement_set(&self) -> StatementSet {
        self.0.statement_set()
    }

    /// Declares a stream (what `CREATE STREAM` does).
    pub fn create_stream(&self, definition: StreamDefinition) -> Result<()> {
        self.0.create_stream(definition)
    }

    /// Removes a declared stream.
    pub fn drop_stream(&self, name: &str) -> Result<()> {
        self.0.drop_stream(name)
    }

    /// A declared stream's definition.
    pub fn stream(&self, name: &str) -> Option<StreamDefinition> {
        self.0.stream(name)
    }

    /// Every declared stream.
    pub fn streams(&self) -> Vec<StreamDefinition> {
        self.0.streams()
    }

    /// A frame over a declared stream.
    pub async fn table(&self, name: &str) -> Result<StreamFrame> {
        self.0.table(name).await
    }

    /// A frame over a `SELECT` of declared streams.
    pub async fn sql_frame(&self, select: &str) -> Result<StreamFrame> {
        self.0.sql_frame(select).await
    }

    /// A frame over a DataFusion plan of declared streams.
    pub fn frame(&self, plan: LogicalPlan) -> StreamFrame {
        self.0.frame(plan)
    }

    /// Adds a connector, usable in `connector = '...'` and `.format(..)`
    /// from now on.
    pub fn register_connector(&self, connector: Arc<dyn Connector>) {
        self.0.register_connector(connector)
    }

    /// The connectors known to this session.
    pub fn connectors(&self) -> ConnectorRegistry {
        self.0.connectors()
    }

    /// Adds a listener for the start, progress and end of every query
    /// started afterwards.
    pub fn add_listener(&self, listener: Arc<dyn StreamingQueryListener>) {
        self.0.add_listener(listener)
    }

    /// The queries started on this session that are still running.
    pub fn active_queries(&self) -> Vec<StreamingQuery> {
        self.0.active_queries()
    }

    /// The DataFusion context queries are planned in (register UDFs here).
    pub fn context(&self) -> &SessionContext {
        self.0.context()
    }
}
