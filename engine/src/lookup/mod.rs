//! Lookup joins: a stream's rows joined, by key, to the rows an external
//! table holds when the epoch runs.
//!
//! Flink writes a lookup join as a temporal join as of processing time:
//!
//! ```sql
//! SELECT o.id, c.name FROM orders AS o
//!   JOIN customers FOR SYSTEM_TIME AS OF o.p_time AS c ON o.customer = c.id
//! ```
//!
//! where `customers` is a table of a connector that answers lookups by key
//! (`'connector' = 'jdbc'`). Such a table is registered as a
//! [`LookupTable`]; reading it whole is refused. When a query joins it on
//! an equality with one of its columns, the [`join`] rule replaces the
//! join with one that, each epoch and per partition of the stream's rows,
//! asks the table only for the keys those rows carry (the [`cache`] answers
//! the keys it holds), then joins the rows with DataFusion's own hash join,
//! so the join's meaning (inner or left, extra conditions, NULL keys) is
//! DataFusion's.
//!
//! A lookup answers with the table as it is when the epoch runs, as Flink's
//! does when the row is processed: a replayed epoch may see newer rows. The
//! join keeps no state of its own.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session as CatalogSession;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};

use crate::error::Result;
use crate::options::Options;

pub(crate) mod cache;
pub(crate) mod join;

pub use cache::LookupCacheConfig;
pub use join::LookupJoinRule;

/// An external table that answers lookups by key (a database table).
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use datafusion::arrow::array::ArrayRef;
/// use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
/// use datafusion::arrow::record_batch::RecordBatch;
/// use sluice_engine::{LookupSource, Result};
///
/// /// A table that holds nothing.
/// #[derive(Debug)]
/// struct Empty(SchemaRef);
///
/// #[async_trait]
/// impl LookupSource for Empty {
///     fn describe(&self) -> String {
///         "an empty table".into()
///     }
///     fn schema(&self) -> SchemaRef {
///         Arc::clone(&self.0)
///     }
///     async fn check(&self) -> Result<()> {
///         Ok(())
///     }
///     async fn lookup(&self, _columns: &[usize], _keys: &[ArrayRef]) -> Result<RecordBatch> {
///         Ok(RecordBatch::new_empty(Arc::clone(&self.0)))
///     }
/// }
/// let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
/// let table = Empty(schema);
/// assert_eq!(table.describe(), "an empty table");
/// ```
#[async_trait]
pub trait LookupSource: Debug + Send + Sync {
    /// The table, for messages (`PostgreSQL table 'customers' at ...`).
    fn describe(&self) -> String;

    /// The table's columns, as declared.
    fn schema(&self) -> SchemaRef;

    /// Reaches the table and checks that it has the declared columns:
    /// called when the table is declared, so that a table that cannot be
    /// looked up fails there, within the connector's timeout.
    async fn check(&self) -> Result<()>;

    /// The table's rows (every declared column) whose `columns` equal one
    /// of the `keys`: row `i` of each array of `keys` is one key, its value
    /// for the column at the same place in `columns`. The keys are
    /// distinct and none is NULL.
    async fn lookup(&self, columns: &[usize], keys: &[ArrayRef]) -> Result<RecordBatch>;
}

/// What a connector gets to build a lookup table.
#[derive(Debug, Clone)]
pub struct LookupArgs {
    /// The table's name in SQL.
    pub table: String,
    /// The declared columns.
    pub schema: SchemaRef,
    /// Options not yet taken (the cache's are taken already).
    pub options: Options,
}

/// A table read by key only, through a [`LookupSource`] and its cache.
#[derive(Debug)]
pub struct LookupTable {
    name: String,
    source: Arc<dyn LookupSource>,
    cache: cache::LookupCache,
}

impl LookupTable {
    /// Table `name` over `source`, its answers kept as `cache` says.
    pub fn new(name: &str, source: Arc<dyn LookupSource>, cache: LookupCacheConfig) -> Self {
        Self {
            name: name.to_string(),
            source,
            cache: cache::LookupCache::new(cache),
        }
    }

    /// The rows whose `columns` equal one of the distinct, non-null `keys`,
    /// from the cache where it holds them.
    pub(crate) async fn lookup(
        &self,
        columns: &[usize],
        keys: &[ArrayRef],
    ) -> Result<Vec<RecordBatch>> {
        self.cache
            .lookup(columns, keys, |missing| async move {
                self.source.lookup(columns, &missing).await
            })
            .await
    }
}

#[async_trait]
impl TableProvider for LookupTable {
    fn schema(&self) -> SchemaRef {
        self.source.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn CatalogSession,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(LookupScanExec::new(
            Arc::new(Self {
                name: self.name.clone(),
                source: Arc::clone(&self.source),
                cache: self.cache.clone(),
            }),
            projection.cloned(),
        )?))
    }
}

/// The scan of a [`LookupTable`] in a physical plan: a place holder that
/// the [`join`] rule replaces by the rows each epoch looks up. Run on its
/// own (the table read whole), it fails.
#[derive(Debug, Clone)]
pub(crate) struct LookupScanExec {
    pub(crate) table: Arc<LookupTable>,
    /// The table's columns this scan gives, in order.
    pub(crate) projection: Vec<usize>,
    properties: Arc<PlanProperties>,
}

impl LookupScanExec {
    fn new(
        table: Arc<LookupTable>,
        projection: Option<Vec<usize>>,
    ) -> datafusion::error::Result<Self> {
        let full = table.source.schema();
        let projection = projection.unwrap_or_else(|| (0..full.fields().len()).collect());
        let schema = Arc::new(full.project(&projection)?);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Self {
            table,
            projection,
            properties: Arc::new(properties),
        })
    }
}

impl DisplayAs for LookupScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "LookupScanExec: {}", self.table.source.describe())
    }
}

impl ExecutionPlan for LookupScanExec {
    fn name(&self) -> &str {
        "LookupScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        Err(DataFusionError::Plan(format!(
            "table '{}' is looked up by key, never read whole: join it FOR SYSTEM_TIME AS OF a \
             processing time, on an equality with one of its columns (JOIN {} FOR SYSTEM_TIME AS \
             OF s.p_time AS t ON s.k = t.id)",
            self.table.name, self.table.name
        )))
    }
}
