//! [`StreamFrame`]: the DataFrame API over streams, and
//! [`DataStreamWriter`], which starts a query from one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion::catalog::TableProvider;
use datafusion::common::JoinType;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{ident, Expr};

use super::Session;
use crate::error::{Result, SluiceError};
use crate::launch::SinkChoice;
use crate::options::Options;
use crate::output_mode::OutputMode;
use crate::planner::{self, IncrementalPlan};
use crate::reference::BatchQuery;
use crate::settings::QuerySettings;
use crate::sink::{MemorySink, Sink};
use crate::table::replace_stream_scans;
use crate::task::TaskId;
use crate::watermark::WatermarkSpec;
use crate::window::Window;

/// An unbounded table: a stream and the transformations applied to it.
/// Transformations take DataFusion [`Expr`]s and return a new frame;
/// nothing runs until [`DataStreamWriter::start`].
///
/// ```
/// use sluice_engine::{datafusion::prelude::*, Session};
/// let session = Session::new();
/// let frame = session
///     .read_stream()
///     .format("rate")
///     .option("rows_per_second", "5")
///     .load()?
///     .filter((col("value") % lit(3)).not_eq(lit(0)))?
///     .with_column("doubled", col("value") * lit(2))?;
/// assert_eq!(frame.schema().field(2).name(), "doubled");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug, Clone)]
pub struct StreamFrame {
    pub(crate) session: Session,
    df: DataFrame,
}

impl StreamFrame {
    pub(crate) fn new(session: Session, df: DataFrame) -> Self {
        Self { session, df }
    }

    fn map(
        self,
        f: impl FnOnce(DataFrame) -> datafusion::error::Result<DataFrame>,
    ) -> Result<Self> {
        Ok(Self {
            df: f(self.df)?,
            session: self.session,
        })
    }

    /// Keeps the rows for which `predicate` is true.
    pub fn filter(self, predicate: Expr) -> Result<Self> {
        self.map(|df| df.filter(predicate))
    }

    /// Computes the given expressions as the new columns.
    pub fn select(self, exprs: Vec<Expr>) -> Result<Self> {
        self.map(|df| df.select(exprs))
    }

    /// Keeps the named columns.
    pub fn select_columns(self, columns: &[&str]) -> Result<Self> {
        self.map(|df| df.select_columns(columns))
    }

    /// Adds (or replaces) column `name` computed by `expr`.
    pub fn with_column(self, name: &str, expr: Expr) -> Result<Self> {
        self.map(|df| df.with_column(name, expr))
    }

    /// Renames a column.
    pub fn with_column_renamed(self, old: &str, new: &str) -> Result<Self> {
        self.map(|df| df.with_column_renamed(old, new))
    }

    /// Removes the named columns.
    pub fn drop_columns(self, columns: &[&str]) -> Result<Self> {
        self.map(|df| df.drop_columns(columns))
    }

    /// Expands list columns into one row per element.
    pub fn unnest_columns(self, columns: &[&str]) -> Result<Self> {
        self.map(|df| df.unnest_columns(columns))
    }

    /// Groups by `group_by` and computes `aggregates` per group (Spark's
    /// `groupBy(..).agg(..)`), incrementally across epochs: any DataFusion
    /// aggregate function works.
    pub fn aggregate(self, group_by: Vec<Expr>, aggregates: Vec<Expr>) -> Result<Self> {
        self.map(|df| df.aggregate(group_by, aggregates))
    }

    /// Declares `column` the event time of the streams this frame reads,
    /// with rows arriving at most `delay` out of order (Spark's
    /// `withWatermark`; SQL: `WATERMARK FOR ts AS ts - INTERVAL ...`). See
    /// the `watermark` module for the rules.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_engine::{Session, Window};
    /// let frame = Session::new()
    ///     .read_stream()
    ///     .format("rate")
    ///     .load()?
    ///     .with_watermark("timestamp", Duration::from_secs(5))?
    ///     .window(Window::tumble("timestamp", Duration::from_secs(10)))?;
    /// assert_eq!(frame.schema().field(3).name(), "window_end");
    /// # Ok::<(), sluice_engine::SluiceError>(())
    /// ```
    pub fn with_watermark(self, column: &str, delay: Duration) -> Result<Self> {
        let spec = WatermarkSpec::new(column, delay);
        let (state, plan) = self.df.into_parts();
        let mut found = 0;
        let plan = replace_stream_scans(plan, |table, _| {
            if table.schema().column_with_name(column).is_none() {
                return Ok(None);
            }
            found += 1;
            Ok(Some(Arc::new(table.with_watermark(spec.clone())?)))
        })?;
        if found == 0 {
            return Err(SluiceError::plan(format!(
                "with_watermark('{column}'): none of the streams this frame reads has a column \
                 '{column}'"
            )));
        }
        Ok(Self {
            df: DataFrame::new(state, plan),
            session: self.session,
        })
    }

    /// Adds `window_start` and `window_end` for each row's event-time
    /// window (HOP: one row per window). Group by them to aggregate per
    /// window; with a watermark, append mode emits each window once, when
    /// the watermark passes its end.
    pub fn window(self, window: Window) -> Result<Self> {
        Ok(Self {
            df: window.apply(self.df)?,
            session: self.session,
        })
    }

    /// Each distinct row once, the first time it is seen (SQL `SELECT
    /// DISTINCT`). The state holds every distinct row; when the rows carry
    /// a watermarked event-time column (or a window), rows behind the
    /// watermark leave it.
    pub fn distinct(self) -> Result<Self> {
        self.map(|df| df.distinct())
    }

    /// The first row seen for each distinct value of `columns` (Spark's
    /// `dropDuplicates(cols)`); bounded by the watermark like
    /// [`distinct`](Self::distinct) when `columns` include the event time.
    pub fn drop_duplicates(self, columns: &[&str]) -> Result<Self> {
        let on: Vec<Expr> = columns.iter().map(|c| ident(*c)).collect();
        let all: Vec<Expr> = self
            .df
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        self.map(|df| df.distinct_on(on, all, None))
    }

    /// Qualifies the frame's columns with `name` (SQL's `FROM s AS name`),
    /// to tell the two sides of a join apart.
    pub fn alias(self, name: &str) -> Result<Self> {
        self.map(|df| df.alias(name))
    }

    /// Joins `right` on `on`: equalities and an event-time bound make an
    /// interval join (`JoinType::Inner` or `JoinType::Left`), whose bound
    /// keeps the state finite (both time columns need a watermark).
    /// Equalities alone make an unbounded inner join, which keeps every row
    /// of both sides.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use sluice_engine::datafusion::prelude::*;
    /// # use sluice_engine::datafusion::common::{JoinType, ScalarValue};
    /// # use sluice_engine::arrow::datatypes::IntervalMonthDayNano;
    /// # fn demo(bids: sluice_engine::StreamFrame, auctions: sluice_engine::StreamFrame)
    /// #     -> sluice_engine::Result<sluice_engine::StreamFrame> {
    /// let hour = lit(ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(
    ///     0, 0, 3_600_000_000_000,
    /// ))));
    /// bids.alias("b")?.join(
    ///     auctions.alias("a")?,
    ///     JoinType::Inner,
    ///     vec![
    ///         col("b.auction").eq(col("a.id")),
    ///         col("b.ts").between(col("a.ts"), col("a.ts") + hour),
    ///     ],
    /// )
    /// # }
    /// ```
    pub fn join(self, right: StreamFrame, join_type: JoinType, on: Vec<Expr>) -> Result<Self> {
        self.map(|df| df.join_on(right.df, join_type, on))
    }

    /// Rows of both frames (UNION ALL).
    pub fn union(self, other: StreamFrame) -> Result<Self> {
        self.map(|df| df.union(other.df))
    }

    /// The output columns.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.df.schema().as_arrow().clone())
    }

    /// The DataFusion logical plan.
    pub fn logical_plan(&self) -> &LogicalPlan {
        self.df.logical_plan()
    }

    /// Starts describing where the output goes.
    pub fn write_stream(self) -> DataStreamWriter {
        DataStreamWriter {
            frame: self,
            sink: SinkChoice::None,
            options: Options::new(),
            output_mode: None,
            per_epoch: false,
            sends_watermarks: false,
            settings: QuerySettings::default(),
        }
    }
}

query_settings_builder!(DataStreamWriter);
connector_options_builder!(DataStreamWriter);

/// Builds and starts a query (Spark's `DataStreamWriter`).
#[derive(Debug, Clone)]
pub struct DataStreamWriter {
    pub(crate) frame: StreamFrame,
    pub(crate) sink: SinkChoice,
    pub(crate) options: Options,
    output_mode: Option<OutputMode>,
    /// Runs the statement over each epoch's rows alone, its GROUP BY
    /// included, keeping nothing between epochs (see
    /// [`planner::plan_per_epoch`]): a repartition step's pre-aggregation.
    pub(crate) per_epoch: bool,
    /// Writes its watermark after each epoch's rows to every partition of
    /// its sink, a repartition channel (see `watermark::aligned`).
    pub(crate) sends_watermarks: bool,
    pub(crate) settings: QuerySettings,
}

impl DataStreamWriter {
    /// The sink connector: `"kafka"`, `"console"`, `"blackhole"`, ...
    pub fn format(mut self, connector: &str) -> Self {
        self.sink = SinkChoice::Connector(connector.to_string());
        self
    }

    /// Writes to a [`MemorySink`] (tests).
    pub fn memory(self, sink: &MemorySink) -> Self {
        self.sink_instance(Arc::new(sink.clone()))
    }

    /// Writes to a sink built by the caller.
    pub fn sink_instance(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sink = SinkChoice::Instance(sink);
        self
    }

    /// What each epoch emits; the default is derived from the query.
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output_mode = Some(mode);
        self
    }

    /// The same statement over `frame` (its sink, options and settings
    /// kept).
    pub(crate) fn with_frame(self, frame: StreamFrame) -> Self {
        Self { frame, ..self }
    }

    pub(super) fn plan(&self) -> Result<IncrementalPlan> {
        self.plan_with_keys("", None)
    }

    /// The plan (reading `task`'s share of the inputs, when given), its
    /// inputs' checkpoint keys prefixed by `key_prefix`.
    pub(crate) fn plan_with_keys(
        &self,
        key_prefix: &str,
        task: Option<TaskId>,
    ) -> Result<IncrementalPlan> {
        let (state, connectors) = (
            self.frame.session.context().state(),
            self.frame.session.connectors(),
        );
        let plan = self.frame.logical_plan();
        let mut planned = if self.per_epoch {
            planner::plan_per_epoch(&state, &connectors, plan, key_prefix, task)?
        } else {
            planner::plan_query(
                &state,
                &connectors,
                plan,
                self.output_mode,
                key_prefix,
                task,
            )?
        };
        if self.sends_watermarks {
            planned.watermark_out = task;
            // Its watermark rows leave the data columns null, so the
            // channel's columns may all be null (as it is read back).
            planned.output_schema = crate::watermark::aligned::nullable(&planned.output_schema);
        }
        Ok(planned)
    }

    /// `plan`, planned from this writer, described with its sink.
    pub(crate) fn explain_plan(&self, plan: &IncrementalPlan) -> String {
        let sink = match &self.sink {
            SinkChoice::None => "(none chosen)".to_string(),
            SinkChoice::Connector(c) => c.clone(),
            SinkChoice::Instance(s) => s.describe(),
        };
        planner::explain(plan, &sink)
    }

    /// Plans the query for its batch answer over bounded input (what
    /// `sluice verify` compares a running query's output with), opening
    /// nothing: see [`BatchQuery`].
    pub fn batch_query(&self) -> Result<BatchQuery> {
        self.batch_query_in("", self.settings.checkpoint.clone())
    }

    /// The batch query of this writer as a statement of a query whose
    /// checkpoint is `checkpoint`, its inputs keyed with `key_prefix`.
    pub(crate) fn batch_query_in(
        &self,
        key_prefix: &str,
        checkpoint: Option<PathBuf>,
    ) -> Result<BatchQuery> {
        Ok(BatchQuery {
            name: self.settings.name.clone(),
            sink: match &self.sink {
                SinkChoice::Connector(c) => Some(c.clone()),
                SinkChoice::None | SinkChoice::Instance(_) => None,
            },
            sink_options: self.options.clone(),
            checkpoint,
            plan: self.plan_with_keys(key_prefix, None)?,
        })
    }
}
