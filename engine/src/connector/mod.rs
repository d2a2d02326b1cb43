//! The connector registry: how `connector = 'name'` finds its code.
//!
//! The engine registers the connectors that need nothing outside the process
//! (`rate`, `files`, `console`, `blackhole`); other crates add theirs with
//! [`ConnectorRegistry::register`] (the `sluice` facade adds Kafka). SQL and
//! the DataFrame API resolve names through the same registry.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use crate::error::{Result, SluiceError};
use crate::lookup::{LookupArgs, LookupSource};
use crate::options::{closest, Options};
use crate::output_mode::OutputMode;
use crate::sink::Sink;
use crate::source::SourceFactory;
use crate::task::TaskId;

mod builtin;

pub use builtin::{
    BlackholeConnector, ConsoleConnector, FilesConnector, FilesystemConnector, RateConnector,
};

/// What a connector gets to build a source.
#[derive(Debug, Clone)]
pub struct SourceArgs {
    /// The stream's name (for messages).
    pub stream: String,
    /// Options not yet taken; the connector takes its own, then calls
    /// [`Options::finish`].
    pub options: Options,
    /// The declared columns, when the user declared them.
    pub schema: Option<SchemaRef>,
    /// The session's default number of partitions (cores).
    pub default_partitions: usize,
}

/// What a connector gets to build a sink for one query.
#[derive(Debug, Clone)]
pub struct SinkArgs {
    /// Options not yet taken.
    pub options: Options,
    /// The query's output schema.
    pub schema: SchemaRef,
    /// The query's output mode.
    pub output_mode: OutputMode,
    /// The query's id (stable across restarts).
    pub query_id: String,
    /// The query's name.
    pub query_name: String,
    /// Output columns that carry the GROUP BY key unchanged, when all of
    /// them do: an upsert sink's natural key. Empty otherwise.
    pub key_columns: Vec<String>,
    /// The task this sink writes for, when the query is divided into
    /// tasks: each task commits alone, so a transactional sink needs an
    /// identity per task.
    pub task: Option<TaskId>,
}

/// What a connector gets to carry a divided query's rows from the task
/// that read them to the task that owns their group (see
/// [`Connector::repartition`]).
#[derive(Debug, Clone)]
pub struct RepartitionArgs {
    /// The options of the stream the rows come from (its brokers, its
    /// security settings).
    pub input: Options,
    /// The options of the statement's sink, when the statement writes to
    /// this connector: the rows should travel in the same transaction.
    pub sink: Option<Options>,
    /// The query's id (stable across restarts).
    pub query_id: String,
    /// Which of the query's repartition steps this is, from 0.
    pub index: usize,
    /// How many partitions the channel has: the query's task count.
    pub partitions: u32,
    /// The columns whose values decide a row's partition.
    pub key_fields: Vec<String>,
    /// An integer column that, where it is not null, names the partition
    /// a row must go to instead: the watermark rows an upstream task
    /// writes to every partition (see `watermark::aligned`).
    pub partition_field: Option<String>,
}

/// Where a repartition step's rows go and come back from: the options of
/// a sink that spreads rows over `partitions` partitions by `key_fields`
/// (equal keys to one partition), and of a stream that reads them back,
/// one partition per task, from the beginning.
#[derive(Debug, Clone)]
pub struct RepartitionChannel {
    /// A name for messages and EXPLAIN (a Kafka topic's).
    pub name: String,
    /// How rows are written on it (`"avro"`), for EXPLAIN and the query's
    /// fingerprint: a changed format is a changed query.
    pub format: String,
    /// The writing sink's options.
    pub sink: Options,
    /// The reading stream's options.
    pub source: Options,
}

/// A named kind of source and/or sink.
pub trait Connector: Send + Sync + Debug {
    /// The name users write in `connector = '...'` / `.format(..)`.
    fn name(&self) -> &str;

    /// Whether the connector can be read from. Default `false`.
    fn is_source(&self) -> bool {
        false
    }

    /// Whether the connector can be written to. Default `false`.
    fn is_sink(&self) -> bool {
        false
    }

    /// Builds a source. The default says the connector cannot be read from.
    fn source(&self, args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        let _ = args;
        Err(SluiceError::config(format!(
            "connector '{}' can only be written to, not read from",
            self.name()
        )))
    }

    /// Whether the connector answers lookups by key (a table joined `FOR
    /// SYSTEM_TIME AS OF` a processing time). Default `false`.
    fn is_lookup(&self) -> bool {
        false
    }

    /// Builds a lookup table's source. The default says the connector
    /// cannot be looked up.
    fn lookup(&self, args: LookupArgs) -> Result<Arc<dyn LookupSource>> {
        let _ = args;
        Err(SluiceError::config(format!(
            "connector '{}' cannot be looked up by key",
            self.name()
        )))
    }

    /// Builds a sink. The default says the connector cannot be written to.
    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        let _ = args;
        Err(SluiceError::config(format!(
            "connector '{}' can only be read from, not written to",
            self.name()
        )))
    }

    /// A channel that moves a divided query's rows between its tasks by
    /// key (Kafka: an internal topic), for a GROUP BY whose key is not
    /// the input's partitioning. `None` (the default): this connector's
    /// streams cannot be repartitioned.
    fn repartition(&self, args: RepartitionArgs) -> Result<Option<RepartitionChannel>> {
        let _ = args;
        Ok(None)
    }

    /// Builds one sink for the statements of a statement set that write to
    /// this connector, `args[i]` for the i-th; its
    /// [`Sink::write_epoch_set`] gets their outputs in that order. The
    /// default makes one sink per statement and writes them one after the
    /// other (each as at-least-once as it is alone); a connector whose sinks
    /// can commit together (Kafka: one transaction) combines them.
    fn sink_set(&self, args: Vec<SinkArgs>) -> Result<Arc<dyn Sink>> {
        let statements = args.len();
        let mut parts = Vec::with_capacity(statements);
        for (i, a) in args.into_iter().enumerate() {
            parts.push((self.sink(a)?, vec![i]));
        }
        crate::sink::FanOut::combine(parts, statements)
    }
}

/// Connectors by name.
#[derive(Debug, Clone, Default)]
pub struct ConnectorRegistry {
    connectors: BTreeMap<String, Arc<dyn Connector>>,
}

impl ConnectorRegistry {
    /// The registry with the engine's built-in connectors.
    pub fn with_builtins() -> Self {
        let mut r = Self::default();
        r.register(Arc::new(RateConnector));
        r.register(Arc::new(FilesConnector));
        r.register(Arc::new(ConsoleConnector));
        r.register(Arc::new(BlackholeConnector));
        r.register(Arc::new(FilesystemConnector));
        r
    }

    /// Adds (or replaces) a connector under its name.
    pub fn register(&mut self, connector: Arc<dyn Connector>) {
        self.connectors
            .insert(connector.name().to_ascii_lowercase(), connector);
    }

    /// The connector called `name`, or an error listing the known ones.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Connector>> {
        let key = name.to_ascii_lowercase();
        if let Some(c) = self.connectors.get(&key) {
            return Ok(Arc::clone(c));
        }
        let mut known: Vec<&str> = self.connectors.keys().map(String::as_str).collect();
        known.push("memory");
        let hint = closest(&key, known.iter().copied())
            .map(|c| format!(" (did you mean '{c}'?)"))
            .unwrap_or_default();
        let message = if key == "memory" {
            "connector 'memory' is available from the Rust API only: \
             session.read_stream().memory(&stream) / write_stream().memory(&sink)"
                .to_string()
        } else {
            format!(
                "unknown connector '{name}'{hint}; known connectors: {}",
                known.join(", ")
            )
        };
        Err(SluiceError::config(message))
    }

    /// Names of the registered connectors.
    pub fn names(&self) -> Vec<String> {
        self.connectors.keys().cloned().collect()
    }
}
