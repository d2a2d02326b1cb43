//! Streams as DataFusion tables.
//!
//! A declared stream is registered in the session's `SessionContext` as a
//! [`StreamTable`], so DataFusion plans SQL and DataFrame queries over it like
//! any table. When a query starts, each scan of a stream gets its own
//! [`StreamTable`] instance bound to the query's source; each epoch the
//! statement puts that epoch's batches in scope on it
//! ([`StreamTable::with_input`]) and plans over them.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::catalog::{Session as DfSession, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan, TableType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};

use crate::computed::{Computed, ComputedColumn};
use crate::connector::{ConnectorRegistry, SourceArgs};
use crate::error::{Result, SluiceError};
use crate::options::Options;
use crate::source::{LazyPartition, Partitions, SourceFactory};
use crate::watermark::WatermarkSpec;

/// A stream as declared: `CREATE STREAM name (cols) WITH (connector = ..)`
/// or `read_stream().format(..)`.
#[derive(Debug, Clone)]
pub struct StreamDefinition {
    /// The stream's name.
    pub name: String,
    /// The connector's name.
    pub connector: String,
    /// The `WITH` options, connector included.
    pub options: Options,
    /// The declared columns, if any.
    pub schema: Option<SchemaRef>,
    /// The declared event-time watermark, if any.
    pub watermark: Option<WatermarkSpec>,
    /// The stream its rows dropped as late go to (`'late.sink'`): a
    /// query that drops late rows of this stream writes them there, in
    /// the epoch that dropped them.
    pub late_sink: Option<String>,
    /// Columns computed from the others as rows are read (`name AS
    /// expression`), after the declared ones.
    pub computed: Vec<ComputedColumn>,
}

/// A stream registered as a DataFusion table.
#[derive(Debug)]
pub struct StreamTable {
    definition: Arc<StreamDefinition>,
    /// Built on first read, so a stream used only as a sink never needs
    /// source options.
    factory: Arc<OnceLock<Arc<dyn SourceFactory>>>,
    /// The schema and the current epoch's batches; batches are set only on
    /// a running query's instance.
    batches: Arc<EpochBatches>,
    /// The computed columns, and what the source yields without them.
    computed: Option<Arc<Computed>>,
    source_schema: SchemaRef,
}

impl StreamTable {
    /// A table over `factory`, whose schema it takes.
    pub fn from_factory(definition: StreamDefinition, factory: Arc<dyn SourceFactory>) -> Self {
        let schema = factory.schema();
        let cell = OnceLock::new();
        let _ = cell.set(factory);
        Self {
            definition: Arc::new(definition),
            factory: Arc::new(cell),
            batches: Arc::new(EpochBatches::new(Arc::clone(&schema))),
            computed: None,
            source_schema: schema,
        }
    }

    /// A table with declared columns whose source is built on first read.
    pub fn declared(definition: StreamDefinition, schema: SchemaRef) -> Self {
        Self {
            definition: Arc::new(definition),
            factory: Arc::default(),
            batches: Arc::new(EpochBatches::new(Arc::clone(&schema))),
            computed: None,
            source_schema: schema,
        }
    }

    /// The same table with the definition's computed columns, planned in
    /// `state`, after the source's.
    pub(crate) fn with_computed(mut self, state: &SessionState) -> Result<Self> {
        let def = &self.definition;
        if let Some(c) = Computed::plan(state, &def.name, &self.source_schema, &def.computed)? {
            self.batches = Arc::new(EpochBatches::new(Arc::clone(c.schema())));
            self.computed = Some(Arc::new(c));
        }
        Ok(self)
    }

    /// Whether the stream has computed columns: its input is then read
    /// whole before the plan runs, and [`compute`](Self::compute)d.
    pub(crate) fn computes(&self) -> bool {
        self.computed.is_some()
    }

    /// The source's `partitions` with the computed columns.
    pub(crate) fn compute(&self, partitions: Partitions) -> Result<Partitions> {
        match &self.computed {
            Some(c) => c.apply(partitions),
            None => Ok(partitions),
        }
    }

    /// A fresh instance over the same stream: same source and columns.
    fn again(&self, definition: Arc<StreamDefinition>) -> Self {
        Self {
            definition,
            factory: Arc::clone(&self.factory),
            batches: Arc::new(EpochBatches::new(Arc::clone(&self.batches.schema))),
            computed: self.computed.clone(),
            source_schema: Arc::clone(&self.source_schema),
        }
    }

    /// The stream's definition.
    pub fn definition(&self) -> &StreamDefinition {
        &self.definition
    }

    /// The source factory, built now if needed.
    pub fn factory(
        &self,
        registry: &ConnectorRegistry,
        default_partitions: usize,
    ) -> Result<Arc<dyn SourceFactory>> {
        if let Some(f) = self.factory.get() {
            return Ok(Arc::clone(f));
        }
        let def = &self.definition;
        let connector = registry.get(&def.connector)?;
        let factory = connector
            .source(SourceArgs {
                stream: def.name.clone(),
                options: def.options.clone(),
                schema: Some(Arc::clone(&self.source_schema)),
                default_partitions,
            })
            .map_err(|e| match e {
                SluiceError::Config { message } => {
                    SluiceError::config(format!("stream '{}' cannot be read: {message}", def.name))
                }
                other => other,
            })?;
        if factory.schema().fields() != self.source_schema.fields() {
            return Err(SluiceError::config(format!(
                "stream '{}' cannot be read: its connector yields other columns than declared",
                def.name
            )));
        }
        Ok(Arc::clone(self.factory.get_or_init(|| factory)))
    }

    /// The same stream with an event-time watermark (replacing any other).
    pub(crate) fn with_watermark(&self, spec: WatermarkSpec) -> Result<Self> {
        spec.check(&self.definition.name, &self.batches.schema)?;
        let mut definition = (*self.definition).clone();
        definition.watermark = Some(spec);
        Ok(self.again(Arc::new(definition)))
    }

    /// A new instance for one running query: same stream, own input slot.
    pub(crate) fn for_query(&self) -> Arc<Self> {
        Arc::new(self.again(Arc::clone(&self.definition)))
    }

    /// Puts the epoch's `input` in scope: the physical plans over this
    /// table made until the returned scope drops read it (see
    /// [`EpochBatches::with_input`]).
    pub(crate) fn with_input(&self, input: EpochInput) -> InputScope {
        let input = match input {
            EpochInput::Lazy(partitions) => TableInput::Lazy(
                partitions
                    .into_iter()
                    .map(|p| {
                        Arc::new(OneShot {
                            schema: Arc::clone(&self.batches.schema),
                            partition: Mutex::new(Some(p)),
                        }) as Arc<dyn PartitionStream>
                    })
                    .collect(),
            ),
            EpochInput::Read(partitions, _) => TableInput::Batches(Arc::new(partitions)),
        };
        self.batches.scope(input)
    }
}

/// One source's input to an epoch, as the epoch loop hands it to a
/// statement.
pub(crate) enum EpochInput {
    /// Read before the plan runs, with the source's ids of its partitions
    /// ([`crate::Source::partition_ids`]).
    Read(Partitions, Option<Vec<u32>>),
    /// Produced as the plan pulls it ([`crate::Source::read_lazily`]).
    Lazy(Vec<LazyPartition>),
}

#[async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.batches.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn DfSession,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        self.batches.scan_batches(projection)
    }
}

/// One epoch's batches as a table: what a stream scan reads (inside
/// [`StreamTable`]), and what the query after a stateful operator reads
/// (its output), so DataFusion plans both parts the same way.
///
/// Batches travel as values: whoever runs a plan over the table puts them
/// in scope with [`with_input`](Self::with_input), and the table is empty
/// again once that scope ends, whichever way it ends.
#[derive(Debug)]
pub(crate) struct EpochBatches {
    schema: SchemaRef,
    input: Mutex<TableInput>,
}

/// What the next scan of an [`EpochBatches`] reads.
#[derive(Debug, Clone)]
enum TableInput {
    Batches(Arc<Partitions>),
    Lazy(Vec<Arc<dyn PartitionStream>>),
}

impl Default for TableInput {
    fn default() -> Self {
        Self::Batches(Arc::default())
    }
}

/// An input in scope (see [`EpochBatches::with_input`]); dropping it empties
/// the table.
#[must_use = "the input is in scope only while this lives"]
pub(crate) struct InputScope {
    batches: Arc<EpochBatches>,
}

impl Drop for InputScope {
    fn drop(&mut self) {
        self.batches.set(TableInput::default());
    }
}

/// A lazily generated partition, handed to the one execution that asks.
struct OneShot {
    schema: SchemaRef,
    partition: Mutex<Option<LazyPartition>>,
}

impl std::fmt::Debug for OneShot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneShot")
    }
}

impl PartitionStream for OneShot {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let partition = self
            .partition
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // A second execution of the same epoch's plan is a bug in the
        // engine: fail it rather than silently read nothing.
        let batches: LazyPartition = partition.unwrap_or_else(|| {
            futures::stream::once(async {
                Err(SluiceError::Internal(
                    "an epoch's lazily read input was read twice".into(),
                ))
            })
            .boxed()
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            batches.map_err(|e| DataFusionError::External(Box::new(e))),
        ))
    }
}

impl EpochBatches {
    pub(crate) fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            input: Mutex::default(),
        }
    }

    /// The table's columns.
    pub(crate) fn schema_ref(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Puts `partitions` in scope: the physical plans over this table
    /// made until the returned scope drops read them.
    pub(crate) fn with_input(self: &Arc<Self>, partitions: Partitions) -> InputScope {
        self.scope(TableInput::Batches(Arc::new(partitions)))
    }

    fn scope(self: &Arc<Self>, input: TableInput) -> InputScope {
        self.set(input);
        InputScope {
            batches: Arc::clone(self),
        }
    }

    fn set(&self, input: TableInput) {
        *self.input.lock().unwrap_or_else(|p| p.into_inner()) = input;
    }

    fn scan_batches(
        &self,
        projection: Option<&Vec<usize>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let input = self.input.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match input {
            TableInput::Batches(input) => {
                let partitions: &[Vec<_>] = if input.is_empty() { &[vec![]] } else { &input };
                Ok(MemorySourceConfig::try_new_exec(
                    partitions,
                    Arc::clone(&self.schema),
                    projection.cloned(),
                )?)
            }
            TableInput::Lazy(partitions) => Ok(Arc::new(StreamingTableExec::try_new(
                Arc::clone(&self.schema),
                partitions,
                projection,
                None,
                false,
                None,
            )?)),
        }
    }
}

#[async_trait]
impl TableProvider for EpochBatches {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn DfSession,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        self.scan_batches(projection)
    }
}

/// Rewrites the scans of stream tables in `plan`, bottom up: `replace` gets
/// each stream table with its provider (whose address identifies the stream:
/// a DataFrame's streams may share a name) and returns the table to scan
/// instead, or `None` to leave the scan as it is.
pub(crate) fn replace_stream_scans(
    plan: LogicalPlan,
    mut replace: impl FnMut(
        &StreamTable,
        &Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>>,
) -> Result<LogicalPlan> {
    let replaced = plan.transform_up(|node| {
        let LogicalPlan::TableScan(scan) = node else {
            return Ok(Transformed::no(node));
        };
        let provider = source_as_provider(&scan.source)?;
        let Some(table) = as_stream_table(&provider) else {
            return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
        };
        match replace(table, &provider).map_err(|e| DataFusionError::External(Box::new(e)))? {
            Some(instead) => Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                source: provider_as_source(instead),
                ..scan
            }))),
            None => Ok(Transformed::no(LogicalPlan::TableScan(scan))),
        }
    })?;
    Ok(replaced.data)
}

/// Lets `Any`-based downcasts reach the concrete type from `dyn TableProvider`.
pub(crate) fn as_stream_table(provider: &Arc<dyn TableProvider>) -> Option<&StreamTable> {
    (provider.as_ref() as &dyn Any).downcast_ref::<StreamTable>()
}
