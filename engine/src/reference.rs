//! The batch answer of a streaming query: the same plan over all of the
//! input it has read, run once by DataFusion as an ordinary batch query.
//!
//! `sluice verify` compares this answer with what a running query
//! committed, so it is computed independently of the incremental
//! operators: no state store, no partial aggregates merged across epochs,
//! no join buffers. What it shares with them is only the query's plan and
//! the rule for which windows an append-mode query has emitted (a window
//! whose end the committed watermark has reached, [`WindowKey::closed`]).
//!
//! What the answer means per output mode:
//! - append: every row the query has emitted, as a multiset (stateless
//!   queries, interval joins, windows closed by the watermark, DISTINCT);
//! - update and complete: the current row of every key, which is what the
//!   output folded by key must hold.
//!
//! Two differences from the running query are not modelled and show up as
//! differences: rows the query dropped as late (counted in progress as
//! `late_rows`), and input that was deleted from the source since the
//! query read it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::physical_plan::collect;

use crate::connector::SinkArgs;
use crate::error::{Result, SluiceError};
use crate::operator::aggregate::AggregateConfig;
use crate::options::Options;
use crate::output_mode::OutputMode;
use crate::planner::{IncrementalPlan, StageConfig};
use crate::source::{Partitions, Source};
use crate::table::EpochInput;
use crate::window::WindowKey;

/// A query planned for its batch answer, from
/// [`DataStreamWriter::batch_query`](crate::DataStreamWriter::batch_query).
///
/// ```
/// # #[tokio::main(flavor = "multi_thread")]
/// # async fn main() -> sluice_engine::Result<()> {
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
/// use sluice_engine::arrow::array::Int64Array;
/// use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// use sluice_engine::arrow::record_batch::RecordBatch;
/// use sluice_engine::datafusion::functions_aggregate::expr_fn::count;
/// use sluice_engine::datafusion::prelude::*;
/// use sluice_engine::{MemoryStream, OutputMode, Session};
///
/// let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
/// let input = MemoryStream::new(schema.clone());
/// let session = Session::new();
/// let mut query = session
///     .read_stream()
///     .memory(&input)?
///     .aggregate(vec![], vec![count(lit(1)).alias("n")])?
///     .write_stream()
///     .output_mode(OutputMode::Complete)
///     .batch_query()?;
/// let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2, 3]))])?;
/// let key = query.inputs()[0].0.to_string();
/// let answer = query
///     .answer(BTreeMap::from([(key, vec![vec![batch]])]), &BTreeMap::new())
///     .await?;
/// assert_eq!(answer.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct BatchQuery {
    pub(crate) name: Option<String>,
    pub(crate) sink: Option<String>,
    pub(crate) sink_options: Options,
    pub(crate) checkpoint: Option<PathBuf>,
    pub(crate) plan: IncrementalPlan,
}

impl BatchQuery {
    /// The query's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The sink connector's name (`"kafka"`, ...), if one was chosen.
    pub fn sink_connector(&self) -> Option<&str> {
        self.sink.as_deref()
    }

    /// Where the query keeps its checkpoint.
    pub fn checkpoint_location(&self) -> Option<&Path> {
        self.checkpoint.as_deref()
    }

    /// The output mode: the one asked for, or the one derived.
    pub fn output_mode(&self) -> OutputMode {
        self.plan.mode
    }

    /// What the query's sink connector was built from, for a query with id
    /// `query_id`: a connector reads its own options from it exactly as
    /// when the query runs.
    pub fn sink_args(&self, query_id: &str) -> SinkArgs {
        SinkArgs {
            options: self.sink_options.clone(),
            schema: Arc::clone(&self.plan.output_schema),
            output_mode: self.plan.mode,
            query_id: query_id.to_string(),
            query_name: self.name.clone().unwrap_or_default(),
            key_columns: self.plan.key_columns.clone(),
            task: None,
        }
    }

    /// The stream scans, in plan order: each one's key in the checkpoint's
    /// offset records (`<position>:<stream>`) and its own source.
    pub fn inputs(&self) -> Vec<(&str, &Arc<dyn Source>)> {
        self.plan
            .inputs
            .iter()
            .map(|i| (i.key.as_str(), &i.source))
            .collect()
    }

    /// Whether the batch answer depends on the watermark: an append-mode
    /// windowed aggregation emits only the windows it closed.
    pub fn closes_windows(&self) -> bool {
        self.plan.mode == OutputMode::Append
            && self
                .plan
                .aggregate
                .as_ref()
                .is_some_and(|a| a.window.is_some())
    }

    /// Why the batch answer would not be what this query emits, if it
    /// would not.
    pub fn unsupported(&self) -> Option<String> {
        if self.plan.temporal.is_some() {
            return Some(
                "this query is a temporal join (FOR SYSTEM_TIME AS OF), which emits each row \
                 once the watermark passes it; verify does not check it yet"
                    .into(),
            );
        }
        if self.plan.proctime.is_some() {
            return Some(
                "this query reads PROCTIME(), the time each epoch ran, which a batch query \
                 cannot know"
                    .into(),
            );
        }
        // A chain of stateful operators is one batch query when each of
        // its operators emits what a batch query would: not windows, which
        // are emitted as the watermark closes them, nor an outer join's
        // unmatched rows, emitted as it passes them.
        let windowed = |a: &AggregateConfig| a.window.is_some() && a.mode != OutputMode::Complete;
        let changing = self
            .plan
            .stages
            .iter()
            .filter_map(|s| match &s.config {
                StageConfig::Join(j) => Some(j.as_ref()),
                _ => None,
            })
            .chain(self.plan.join.as_ref())
            .any(|j| j.changelog.is_some());
        if changing {
            return Some(
                "this query joins inputs whose rows change (or outer joins without a time \
                 bound), and its output follows each change; verify does not check such joins \
                 yet"
                .into(),
            );
        }
        for stage in &self.plan.stages {
            let waits = match &stage.config {
                StageConfig::Aggregate(a) => windowed(a),
                StageConfig::Join(j) => j.join_type != JoinType::Inner,
                StageConfig::Normalize(_) => {
                    return Some(
                        "this query aggregates or ranks an upsert stream, whose batch answer \
                         is over each key's latest value; verify does not check it yet"
                            .into(),
                    )
                }
            };
            if waits {
                return Some(
                    "this query chains stateful operators, and one of them emits a window \
                     (or an outer join's unmatched row) once the watermark passes it; one batch \
                     query cannot tell which rows that let through, so verify checks chains \
                     of inner joins and aggregations without a window"
                        .into(),
                );
            }
        }
        if !self.plan.stages.is_empty() && self.plan.aggregate.as_ref().is_some_and(windowed) {
            return Some(
                "this query chains stateful operators under a windowed aggregation; verify \
                 checks such a window only over one stateful operator"
                    .into(),
            );
        }
        if let Some(a) = &self.plan.aggregate {
            if a.window.as_ref().is_some_and(|w| w.session.is_some()) {
                return Some(
                    "SESSION windows merge across epochs in a way a plain GROUP BY does not; \
                     verify checks TUMBLE, HOP and CUMULATE windows"
                        .into(),
                );
            }
        }
        if self.plan.current_watermark.is_some() {
            return Some(
                "CURRENT_WATERMARK depends on the epoch a row arrived in, which a batch query \
                 cannot tell; verify does not check queries that call it"
                    .into(),
            );
        }
        if self.plan.over.is_some() {
            return Some(
                "an OVER aggregation emits each row when the watermark passes it, which a \
                 batch query cannot tell; verify does not check it yet"
                    .into(),
            );
        }
        if self.plan.rank.is_some() {
            return Some(
                "a Top-N ranks rows with equal ORDER BY values in the order they arrived, \
                 which a batch query cannot tell; verify does not check Top-N queries yet"
                    .into(),
            );
        }
        if let Some(j) = &self.plan.join {
            if j.join_type != JoinType::Inner {
                return Some(
                    "an outer interval join emits an unmatched row when the watermark passes it, \
                     which a batch join cannot tell; verify checks inner interval joins"
                        .into(),
                );
            }
        }
        None
    }

    /// The answer over `inputs` (per input key, everything the query read)
    /// with the inputs' watermarks `watermarks` (per input key, ns since
    /// the Unix epoch, as committed): what the committed output must hold
    /// (see the module documentation).
    pub async fn answer(
        &mut self,
        mut inputs: BTreeMap<String, Partitions>,
        watermarks: &BTreeMap<String, i64>,
    ) -> Result<Vec<RecordBatch>> {
        if let Some(why) = self.unsupported() {
            return Err(SluiceError::plan(why));
        }
        let mut scopes = Vec::with_capacity(self.plan.inputs.len());
        for input in &self.plan.inputs {
            let partitions = inputs.remove(&input.key).ok_or_else(|| {
                SluiceError::Internal(format!("no input given for {}", input.key))
            })?;
            let partitions = input.table.compute(partitions)?;
            scopes.push(input.table.with_input(EpochInput::Read(partitions, None)));
        }
        self.plan.watermarks.restore(watermarks, &BTreeMap::new());
        let watermark = self.plan.watermarks.current();
        self.run(watermark).await
    }

    async fn run(&self, watermark: Option<i64>) -> Result<Vec<RecordBatch>> {
        let state = &self.plan.state;
        if let Some(whole) = &self.plan.unsplit {
            let physical = state.create_physical_plan(whole).await?;
            return Ok(collect(physical, state.task_ctx()).await?);
        }
        let Some(agg) = &self.plan.aggregate else {
            let physical = state.create_physical_plan(&self.plan.logical).await?;
            return Ok(collect(physical, state.task_ctx()).await?);
        };
        let physical = state.create_physical_plan(&agg.aggregate).await?;
        let mut groups = collect(physical, state.task_ctx()).await?;
        if let (OutputMode::Append, Some(window)) = (self.plan.mode, &agg.window) {
            groups = closed_only(groups, window, watermark)?;
        }
        // The rest of the query reads the groups as the running aggregate
        // hands them over: under the aggregate's own schema.
        let schema = agg.output.schema_ref();
        let groups = groups
            .into_iter()
            .map(|b| RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let _input = agg.output.with_input(vec![groups]);
        let tail = state.create_physical_plan(&agg.tail).await?;
        Ok(collect(tail, state.task_ctx()).await?)
    }
}

/// The groups whose window has closed by `watermark` (none without one).
fn closed_only(
    groups: Vec<RecordBatch>,
    window: &WindowKey,
    watermark: Option<i64>,
) -> Result<Vec<RecordBatch>> {
    let Some(watermark) = watermark else {
        return Ok(Vec::new());
    };
    groups
        .iter()
        .map(|b| {
            let closed = window.closed(b.column(window.column), watermark)?;
            Ok(filter_record_batch(b, &closed)?)
        })
        .collect()
}
