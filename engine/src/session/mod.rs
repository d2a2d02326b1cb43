//! [`Session`]: the entry point — streams, connectors, listeners, queries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::connector::{Connector, ConnectorRegistry, SourceArgs};
use crate::error::{Result, SluiceError};
use crate::options::Options;
use crate::progress::StreamingQueryListener;
use crate::query::StreamingQuery;
use crate::source::{MemorySourceFactory, MemoryStream, SourceFactory};
use crate::table::{StreamDefinition, StreamTable};

/// The query-wide settings' builder methods, the same on a
/// [`DataStreamWriter`] and a [`StatementSet`]: written once here.
macro_rules! query_settings_builder {
    ($builder:ty) => {
        impl $builder {
            /// Where the query records its progress; required by sinks whose
            /// output outlives the process (Kafka, files).
            pub fn checkpoint_location(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
                self.settings.checkpoint = Some(dir.into());
                self
            }

            /// When epochs run.
            pub fn trigger(mut self, trigger: $crate::Trigger) -> Self {
                self.settings.trigger = trigger;
                self
            }

            /// How often operator state is written whole: every `epochs`
            /// state files, the others being deltas of one epoch's changes
            /// (default 10; 1 writes a snapshot every epoch). Restoring reads
            /// the last snapshot and at most `epochs - 1` deltas.
            pub fn state_snapshot_interval(mut self, epochs: u64) -> Self {
                self.settings.state_snapshot_interval = epochs.max(1);
                self
            }

            /// How many snapshots (each with its deltas) stay in the
            /// checkpoint (default 2); older state files are deleted once a
            /// newer snapshot is committed.
            pub fn state_retained_snapshots(mut self, snapshots: usize) -> Self {
                self.settings.state_retained_snapshots = snapshots.max(1);
                self
            }

            /// Every query-wide setting at once, replacing those set before
            /// (the SQL `SET`s arrive this way).
            pub fn settings(mut self, settings: $crate::QuerySettings) -> Self {
                self.settings = settings;
                self
            }

            /// The query's stable identity, whatever its checkpoint location
            /// (SQL: `SET 'pipeline.name'`; see
            /// [`QuerySettings::pipeline_name`](crate::QuerySettings::pipeline_name)).
            pub fn pipeline_name(mut self, name: &str) -> Self {
                self.settings.pipeline_name = Some(name.to_string());
                self
            }

            /// The query's name (progress, logs, metrics).
            pub fn query_name(mut self, name: &str) -> Self {
                self.settings.name = Some(name.to_string());
                self
            }

            /// One query-wide setting by its SQL name and from its text, as
            /// `SET` takes it (a row of [`SETTINGS`](crate::SETTINGS)):
            /// `.set("outage.limit", "1 minute")?`.
            pub fn set(mut self, name: &str, value: &str) -> $crate::Result<Self> {
                self.settings.set(name, value)?;
                Ok(self)
            }
        }
    };
}

/// A connector's options taken one by one or several at once, the same on
/// a [`DataStreamReader`] and a [`DataStreamWriter`]: written once here.
macro_rules! connector_options_builder {
    ($builder:ty) => {
        impl $builder {
            /// One connector option.
            pub fn option(mut self, key: &str, value: impl Into<String>) -> Self {
                self.options.set(key, value);
                self
            }

            /// Several connector options.
            pub fn options<K: AsRef<str>, V: Into<String>>(
                mut self,
                pairs: impl IntoIterator<Item = (K, V)>,
            ) -> Self {
                for (k, v) in pairs {
                    self.options.set(k.as_ref(), v);
                }
                self
            }
        }
    };
}

connector_options_builder!(DataStreamReader);

pub(crate) mod frame;
pub(crate) mod repartition;
pub(crate) mod statement_set;

use frame::StreamFrame;
use statement_set::StatementSet;

/// A Sluice session: declares streams, starts queries, and holds the
/// DataFusion `SessionContext` they are planned in (register UDFs there).
///
/// ```
/// # #[tokio::main(flavor = "multi_thread")]
/// # async fn main() -> sluice_engine::Result<()> {
/// use sluice_engine::{datafusion::prelude::*, MemorySink, Session, Trigger};
///
/// let session = Session::new();
/// let ticks = session.read_stream().format("rate").option("rows_per_second", "1000").load()?;
/// let out = MemorySink::new();
/// let query = ticks
///     .filter(col("value").gt_eq(lit(10)))?
///     .select(vec![(col("value") * lit(2)).alias("doubled")])?
///     .write_stream()
///     .memory(&out)
///     .trigger(Trigger::ProcessingTime(std::time::Duration::from_millis(100)))
///     .start()
///     .await?;
/// while out.num_rows() == 0 {
///     tokio::time::sleep(std::time::Duration::from_millis(50)).await;
/// }
/// query.stop().await?;
/// assert!(query.last_progress().is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: SessionContext,
    connectors: RwLock<ConnectorRegistry>,
    listeners: RwLock<Vec<Arc<dyn StreamingQueryListener>>>,
    /// Streams declared by name (`CREATE STREAM`), readable or not.
    streams: RwLock<BTreeMap<String, StreamDefinition>>,
    queries: Mutex<Vec<StreamingQuery>>,
    /// Numbers anonymous streams and queries.
    counter: AtomicUsize,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.inner.ctx.session_id())
            .finish_non_exhaustive()
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A session with the built-in connectors, planning with one partition
    /// per core.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::with_context(SessionContext::new_with_config(
            SessionConfig::new().with_target_partitions(cores),
        ))
    }

    /// A session planning in `ctx` (its functions, UDFs and settings).
    /// Unquoted identifiers keep their case, as in Flink SQL: `emailAddress`
    /// names the column `emailAddress`, not `emailaddress` (function names
    /// stay case-insensitive); joins stay the joins the query wrote.
    pub fn with_context(ctx: SessionContext) -> Self {
        // Joins with a lookup table ask it for their rows' keys only.
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state())
            .with_physical_optimizer_rule(Arc::new(crate::lookup::LookupJoinRule))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.state_ref()
            .write()
            .config_mut()
            .options_mut()
            .sql_parser
            .enable_ident_normalization = false;
        // DataFusion rewrites an inner join whose right side is unique on
        // the join keys, and whose right columns no one reads, into a semi
        // join (Nexmark q5 and q8 as Flink writes them). A batch runs that
        // cheaper; a stream's window and interval joins are built as the
        // joins the query wrote, so keep them so.
        ctx.remove_optimizer_rule("eliminate_join");
        ctx.register_udf(crate::watermark::CurrentWatermark::unset());
        ctx.register_udf(crate::watermark::Proctime::wall_clock());
        ctx.register_udf(crate::operator::temporal_join::TemporalAsOf::udf());
        crate::functions::register(&ctx);
        Self {
            inner: Arc::new(Inner {
                ctx,
                connectors: RwLock::new(ConnectorRegistry::with_builtins()),
                listeners: RwLock::default(),
                streams: RwLock::default(),
                queries: Mutex::default(),
                counter: AtomicUsize::new(0),
            }),
        }
    }

    /// The DataFusion context queries are planned in.
    pub fn context(&self) -> &SessionContext {
        &self.inner.ctx
    }

    /// Adds a connector (e.g. Kafka), usable in `connector = '...'` and
    /// `.format(..)` from now on.
    pub fn register_connector(&self, connector: Arc<dyn Connector>) {
        write(&self.inner.connectors).register(connector);
    }

    /// The connectors known to this session.
    pub fn connectors(&self) -> ConnectorRegistry {
        read(&self.inner.connectors).clone()
    }

    /// Adds a listener for the start, progress and end of every query
    /// started afterwards.
    pub fn add_listener(&self, listener: Arc<dyn StreamingQueryListener>) {
        write(&self.inner.listeners).push(listener);
    }

    pub(crate) fn listeners(&self) -> Vec<Arc<dyn StreamingQueryListener>> {
        read(&self.inner.listeners).clone()
    }

    /// Starts a statement set: several INSERTs run as one query, their
    /// outputs committed together each epoch (see [`StatementSet`]).
    pub fn statement_set(&self) -> StatementSet {
        StatementSet::new(self)
    }

    /// Starts describing a stream to read.
    pub fn read_stream(&self) -> DataStreamReader {
        DataStreamReader {
            session: self.clone(),
            format: None,
            options: Options::new(),
            schema: None,
        }
    }

    /// Declares a named stream (`CREATE STREAM`). When it can be read —
    /// its columns are declared, or its connector knows them (rate, files) —
    /// it becomes a table queries can select from; otherwise it can only be
    /// written to, and reading it reports why.
    pub fn create_stream(&self, mut definition: StreamDefinition) -> Result<()> {
        take_late_sink(&mut definition);
        let name = definition.name.clone();
        if read(&self.inner.streams).contains_key(&name) {
            return Err(SluiceError::plan(format!(
                "stream '{name}' already exists; DROP STREAM {name} first to redefine it"
            )));
        }
        let registry = self.connectors();
        let connector = registry.get(&definition.connector)?;
        // A source connector builds its factory now, so the table gets the
        // connector's full schema (declared columns plus any virtual ones)
        // and a source-only connector's mistakes surface here. A connector
        // that is also a sink may hold sink options: if it cannot build a
        // source, the stream is written only, and reading it reports why;
        // but a stream that computes columns or declares a watermark is
        // meant to be read, and its source's mistake is the one to report.
        let read = !definition.computed.is_empty() || definition.watermark.is_some();
        let factory = if connector.is_source() {
            match connector.source(self.source_args(&definition, None)) {
                Ok(f) => Some(f),
                Err(e) if !connector.is_sink() || read => return Err(e),
                Err(_) => None,
            }
        } else {
            None
        };
        let table = match (factory, &definition.schema) {
            (Some(f), _) => Some(StreamTable::from_factory(definition.clone(), f)),
            (None, Some(schema)) => Some(StreamTable::declared(
                definition.clone(),
                Arc::clone(schema),
            )),
            (None, None) if !definition.computed.is_empty() => {
                return Err(SluiceError::plan(format!(
                    "stream '{name}' computes columns from columns it does not declare: declare \
                     them, CREATE STREAM {name} (column TYPE, ..., name AS expression)"
                )))
            }
            (None, None) => None,
        };
        let table = match table {
            Some(t) => Some(t.with_computed(&self.inner.ctx.state())?),
            None => None,
        };
        if let (Some(table), Some(spec)) = (&table, &definition.watermark) {
            spec.check(&name, &table.schema())?;
        }
        if let Some(table) = table {
            self.inner.ctx.register_table(&name, Arc::new(table))?;
        }
        write(&self.inner.streams).insert(name, definition);
        Ok(())
    }

    /// Forgets a declared stream.
    pub fn drop_stream(&self, name: &str) -> Result<()> {
        if write(&self.inner.streams).remove(name).is_none() {
            return Err(SluiceError::plan(format!("stream '{name}' does not exist")));
        }
        self.inner.ctx.deregister_table(name)?;
        Ok(())
    }

    /// The declared stream called `name`.
    pub fn stream(&self, name: &str) -> Option<StreamDefinition> {
        read(&self.inner.streams).get(name).cloned()
    }

    /// All declared streams, by name.
    pub fn streams(&self) -> Vec<StreamDefinition> {
        read(&self.inner.streams).values().cloned().collect()
    }

    /// Why the declared stream `name` cannot be read, if it cannot.
    pub fn unreadable_reason(&self, name: &str) -> Option<String> {
        let def = self.stream(name)?;
        if self.inner.ctx.table_exist(name).unwrap_or(false) {
            return None;
        }
        let err = self
            .connectors()
            .get(&def.connector)
            .and_then(|c| c.source(self.source_args(&def, None)).map(|_| ()))
            .err()?;
        Some(format!("stream '{name}' cannot be read: {err}"))
    }

    /// A frame over a declared stream.
    pub async fn table(&self, name: &str) -> Result<StreamFrame> {
        let df =
            self.inner
                .ctx
                .table(name)
                .await
                .map_err(|e| match self.unreadable_reason(name) {
                    Some(reason) => SluiceError::plan(reason),
                    None => SluiceError::DataFusion(e),
                })?;
        Ok(StreamFrame::new(self.clone(), df))
    }

    /// A frame over a DataFusion logical plan that scans declared streams.
    pub fn frame(&self, plan: LogicalPlan) -> StreamFrame {
        StreamFrame::new(self.clone(), DataFrame::new(self.inner.ctx.state(), plan))
    }

    /// Plans a `SELECT` over declared streams as a frame.
    pub async fn sql_frame(&self, select: &str) -> Result<StreamFrame> {
        let df = self.inner.ctx.sql(select).await?;
        Ok(StreamFrame::new(self.clone(), df))
    }

    /// The queries started in this session that are still running.
    pub fn active_queries(&self) -> Vec<StreamingQuery> {
        let mut queries = self.inner.queries.lock().unwrap_or_else(|p| p.into_inner());
        queries.retain(StreamingQuery::is_active);
        queries.clone()
    }

    pub(crate) fn track(&self, query: StreamingQuery) {
        self.inner
            .queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(query);
    }

    pub(crate) fn next_number(&self) -> usize {
        self.inner.counter.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn default_partitions(&self) -> usize {
        self.inner.ctx.state().config().target_partitions()
    }

    fn source_args(&self, def: &StreamDefinition, schema: Option<SchemaRef>) -> SourceArgs {
        SourceArgs {
            stream: def.name.clone(),
            options: def.options.clone(),
            schema: schema.or_else(|| def.schema.clone()),
            default_partitions: self.default_partitions(),
        }
    }

    /// A frame reading the stream `def` describes, through its connector.
    pub(crate) fn read_definition(&self, mut def: StreamDefinition) -> Result<StreamFrame> {
        take_late_sink(&mut def);
        let connector = self.connectors().get(&def.connector)?;
        let factory = connector.source(self.source_args(&def, None))?;
        self.frame_over(def, factory)
    }

    fn frame_over(
        &self,
        def: StreamDefinition,
        factory: Arc<dyn SourceFactory>,
    ) -> Result<StreamFrame> {
        let table = StreamTable::from_factory(def, factory);
        let df = self.inner.ctx.read_table(Arc::new(table))?;
        Ok(StreamFrame::new(self.clone(), df))
    }
}

/// Builds a stream to read (Spark's `DataStreamReader`).
#[derive(Debug)]
pub struct DataStreamReader {
    session: Session,
    format: Option<String>,
    options: Options,
    schema: Option<SchemaRef>,
}

impl DataStreamReader {
    /// The connector: `"rate"`, `"files"`, `"kafka"`, ...
    pub fn format(mut self, connector: &str) -> Self {
        self.format = Some(connector.to_string());
        self
    }

    /// The rows' columns, for connectors that cannot know them.
    pub fn schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Validates the options and returns the stream as a frame.
    pub fn load(self) -> Result<StreamFrame> {
        let connector_name = self.format.clone().ok_or_else(|| {
            SluiceError::config(format!(
                "read_stream() needs a connector: .format(\"rate\"), one of {}",
                self.session.connectors().names().join(", ")
            ))
        })?;
        // Named after its connector: the name keys the source's offsets in
        // the checkpoint, so it must be the same when the query restarts.
        let def = StreamDefinition {
            name: connector_name.clone(),
            connector: connector_name,
            options: self.options,
            schema: self.schema,
            watermark: None,
            late_sink: None,
            computed: Vec::new(),
        };
        self.session.read_definition(def)
    }

    /// Reads a [`MemoryStream`] (tests).
    pub fn memory(self, stream: &MemoryStream) -> Result<StreamFrame> {
        let def = StreamDefinition {
            name: "memory".into(),
            connector: "memory".into(),
            options: Options::new(),
            schema: Some(stream.schema()),
            watermark: None,
            late_sink: None,
            computed: Vec::new(),
        };
        let factory = Arc::new(MemorySourceFactory::new(stream.clone()));
        self.session.frame_over(def, factory)
    }
}

/// Moves the `'late.sink'` option, which is the engine's and not the
/// connector's, into the definition's own field.
fn take_late_sink(def: &mut StreamDefinition) {
    if let Some(sink) = def.options.take("late.sink") {
        def.late_sink = Some(sink);
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}
