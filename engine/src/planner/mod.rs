//! The streaming planner: from a DataFusion `LogicalPlan` to what runs each
//! epoch.
//!
//! The planner checks that the query can run incrementally, binds each
//! stream scan to a fresh source and input slot for this query, and
//! optimises the plan once. Each epoch then turns that plan into a physical
//! plan over the epoch's batches (see `epoch`).
//!
//! Stateless parts (projection, filter, scalar functions, UDFs, unnest,
//! union of streams) run as DataFusion plans over each epoch's batches.
//! The stateful operators (aggregation, stream–stream join, Top-N) are cut
//! out of the plan: the outermost one becomes the query's `aggregate`,
//! `join` or `rank`,
//! and any under it become stages that feed it (see `split`).
//! What cannot run incrementally is rejected here, before anything runs,
//! with what would work instead.
//!
//! - [`check`]: what can run on a stream, and the output mode;
//! - [`bind`]: each stream scan bound to the query's own source;
//! - [`split`]: the plan cut at its stateful operators;
//! - [`rank`]: Top-N queries found (`split` cuts them out);
//! - [`explain`]: the incremental plan as text.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNode;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;

use crate::connector::ConnectorRegistry;
use crate::error::{Result, SluiceError};
use crate::operator::aggregate::AggregateConfig;
use crate::operator::changelog::SIGN;
use crate::operator::join::{JoinConfig, JoinEmit};
use crate::operator::over::OverConfig;
use crate::operator::rank::RankConfig;
use crate::operator::temporal_join::TemporalJoinConfig;
use crate::output_mode::OutputMode;
use crate::source::Source;
use crate::table::{EpochBatches, StreamTable};
use crate::task::TaskId;
use crate::watermark::WatermarkTracker;

mod bind;
mod check;
mod closing;
mod explain;
mod outputs;
mod over;
mod rank;
mod split;
mod tasks;
mod temporal;

use check::{check_incremental, Checked};
pub(crate) use explain::explain;
use split::{group_key_columns, split_aggregate, split_join, split_over, split_rank, split_stages};
pub(crate) use split::{innermost_nested, Nested};
pub(crate) use tasks::{
    count as count_tasks, divisible, explain as explain_tasks, joined_by_partition,
    keyed_by_partition, refuse_division, scanned_column,
};

/// One stream scan of a running query.
#[derive(Debug)]
pub(crate) struct Input {
    /// Key in the checkpoint's offset records: `<position>:<stream name>`,
    /// in a statement set prefixed by the statement's `<position>/`.
    pub key: String,
    /// The query's own table instance, fed each epoch.
    pub table: Arc<StreamTable>,
    /// The query's own source.
    pub source: Arc<dyn Source>,
    /// For progress and EXPLAIN.
    pub description: String,
    /// What the source reads (see `SourceFactory::identity`).
    pub identity: Option<String>,
    /// How many scans in the plan read it (a self-join, a stream on two
    /// paths): each epoch's input is read once and handed to all of them.
    pub scans: usize,
}

/// A query ready for the epoch loop.
#[derive(Debug)]
pub(crate) struct IncrementalPlan {
    /// The optimised logical plan, scanning the inputs' tables.
    pub logical: LogicalPlan,
    /// The stream scans, in plan order.
    pub inputs: Vec<Input>,
    /// The output schema.
    pub output_schema: SchemaRef,
    /// The output mode: the one asked for, or the one derived.
    pub mode: OutputMode,
    /// The GROUP BY, when the query has one; `logical` is then unused.
    pub aggregate: Option<AggregateConfig>,
    /// The interval join, when the query has one; `logical` is then unused.
    pub join: Option<JoinConfig>,
    /// The Top-N, when the query has one; `logical` is then unused.
    pub rank: Option<RankConfig>,
    /// The OVER aggregation, when the query has one; `logical` is then
    /// unused.
    pub over: Option<OverConfig>,
    /// An event-time temporal join (`FOR SYSTEM_TIME AS OF`), the query's
    /// only stateful operator.
    pub temporal: Option<TemporalJoinConfig>,
    /// The stateful operators under the one above (`aggregate` or `join`),
    /// innermost first, when the query has several: each feeds what it
    /// emits to the operator above it.
    pub stages: Vec<Stage>,
    /// With stages, the plan before it was split into them: what one batch
    /// query runs for the batch answer.
    pub unsplit: Option<LogicalPlan>,
    /// The session state epochs are planned with.
    pub state: SessionState,
    /// Output columns carrying the whole GROUP BY key (see
    /// [`crate::SinkArgs::key_columns`]).
    pub key_columns: Vec<String>,
    /// The inputs' event-time watermarks.
    pub watermarks: WatermarkTracker,
    /// Reading an upsert stream: how its rows become upserts and deletes.
    pub upsert: Option<crate::upsert::UpsertOutput>,
    /// The value of the query's `CURRENT_WATERMARK`, when it calls it (see
    /// `watermark::current`).
    pub current_watermark: Option<Arc<AtomicI64>>,
    /// The value of the query's `PROCTIME()`, when it calls it (see
    /// `watermark::processing_time`).
    pub proctime: Option<Arc<AtomicI64>>,
    /// A repartition step's upstream (task): it writes its watermark to
    /// every partition of its channel after each epoch's rows (see
    /// `watermark::aligned`).
    pub watermark_out: Option<TaskId>,
}

/// A stateful operator that feeds another one (see `split`).
#[derive(Debug)]
pub(crate) struct Stage {
    pub config: StageConfig,
    /// Where its rows go each epoch: the scan that replaced it (and the
    /// stateless segment above it) in the plan of the operator above.
    pub link: Arc<EpochBatches>,
}

/// What a [`Stage`] runs.
#[derive(Debug)]
pub(crate) enum StageConfig {
    Aggregate(Box<AggregateConfig>),
    Join(Box<JoinConfig>),
    /// An upsert stream's rows as a changelog (see `operator::normalize`).
    Normalize(Box<crate::operator::normalize::NormalizeConfig>),
}

/// Optimizer rules that would take an aggregation apart in ways the
/// incremental operator cannot follow: rewriting `count(DISTINCT x)` into
/// two nested aggregations would keep only the inner one's state.
const UNSUPPORTED_RULES: &[&str] = &["single_distinct_aggregation_to_group_by"];

/// Rules run when the query is planned, but not again on the operators'
/// plans each epoch: computing equal aggregate expressions once (the sums
/// `changelog::over_changelog` writes after planning) would leave the operator's
/// partial states with fewer columns than its aggregation's output.
const PLANNING_ONLY_RULES: &[&str] = &["common_sub_expression_eliminate"];

/// `state` without the optimizer rules named in `without`.
fn without_rules(state: &SessionState, without: &[&[&str]]) -> SessionState {
    let rules = state
        .optimizers()
        .iter()
        .filter(|r| !without.iter().any(|names| names.contains(&r.name())))
        .cloned()
        .collect();
    SessionStateBuilder::new_from_existing(state.clone())
        .with_optimizer_rules(rules)
        .build()
}

/// A query's plan reading its changelog and upsert inputs as their
/// operators need them (see [`read_changes`]).
struct Changes {
    bound: LogicalPlan,
    /// The stages that make each upsert stream's changes.
    normalize: Vec<Stage>,
    /// Reading upsert streams (or keyed changelogs) without state: how its
    /// rows become upserts and deletes.
    upsert: Option<crate::upsert::UpsertOutput>,
    /// It joins inputs whose rows change.
    joins_changes: bool,
}

/// `bound` reading its upsert streams' changes where an operator takes
/// them (`split::normalize_upserts`), a keyed changelog that nothing
/// aggregates, ranks or joins as an upsert stream, its changelogs' signs
/// where a reader needs them (`changelog::read_changelogs`), and a
/// stateless copy of upsert rows with their deletion marker
/// (`upsert::plan`).
fn read_changes(bound: LogicalPlan, watermarked: &[String]) -> Result<Changes> {
    // A temporal join, the query's only stateful operator, reads its
    // versioned side's upserts or changes as they are: each a version.
    if let Some(bound) = temporal::versioned_changes(&bound)? {
        return Ok(Changes {
            bound,
            normalize: Vec::new(),
            upsert: None,
            joins_changes: false,
        });
    }
    let (bound, normalize) = split::normalize_upserts(bound)?;
    let stream_join = |p: &LogicalPlan| matches!(p, LogicalPlan::Join(j) if check::reads_stream(&j.left) && check::reads_stream(&j.right));
    let bound = if split::has_stateful(&bound)? {
        bound
    } else {
        crate::upsert::changes_as_upserts(bound)?
    };
    let bound = crate::operator::changelog::read_changelogs(
        bound,
        &stream_join,
        &crate::upsert::is_changes_as_upserts,
    )?;
    let (bound, upsert) = match crate::upsert::plan(&bound)? {
        Some((carried, output)) => (carried, Some(output)),
        None => (bound, None),
    };
    let joins_changes = bound.exists(|p| {
        Ok(matches!(p, LogicalPlan::Join(j) if stream_join(p) && check::emits_changes(j, watermarked)))
    })?;
    Ok(Changes {
        bound,
        normalize,
        upsert,
        joins_changes,
    })
}

/// Whether `plan` scans rows that carry a change: a changelog's sign or an
/// upsert stream's deletion marker.
fn is_change_scan(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::TableScan(s) if {
        let schema = s.source.schema();
        schema.field_with_name(SIGN).is_ok()
            || schema.field_with_name(crate::upsert::DELETED).is_ok()
    })
}

/// The output columns that are the query's key in update mode: an upsert
/// copy's key, a Top-N's partition and rank, a GROUP BY's key, or a join
/// over changes' inputs' keys.
fn output_key(
    upsert: Option<&crate::upsert::UpsertOutput>,
    rank_key: Option<Vec<String>>,
    aggregate: Option<&AggregateConfig>,
    join: Option<&JoinConfig>,
) -> Vec<String> {
    match (upsert, rank_key) {
        (Some(u), _) => u.key_columns.clone(),
        (None, Some(key)) => key,
        (None, None) => match (aggregate, join.and_then(|j| j.changelog.as_ref())) {
            (Some(a), _) => group_key_columns(a),
            (None, Some(sides)) => match &sides.emit {
                JoinEmit::Keyed(keys) => keys.clone(),
                JoinEmit::Signed => Vec::new(),
            },
            (None, None) => Vec::new(),
        },
    }
}

/// Sets which output keys an update-mode aggregation retracts: the groups
/// a HAVING drops, and the sessions a merge ends (which need the key).
fn retract_ended_groups(a: &mut AggregateConfig, key_columns: &[String]) -> Result<()> {
    // Only a filter after the aggregate (HAVING) drops a changed group.
    let filters = a
        .tail
        .exists(|p| Ok(matches!(p, LogicalPlan::Filter(_))))
        .unwrap_or(true);
    // A session that merges into a longer one ends its key.
    let sessions = a.window.as_ref().is_some_and(|w| w.session.is_some());
    if a.mode != OutputMode::Update || a.dedup {
        return Ok(());
    }
    if sessions && key_columns.is_empty() {
        return Err(SluiceError::plan(
            "SESSION windows in update mode take a session's row back when it merges into a \
             longer one, by its key: select window_start, window_end and the PARTITION BY \
             columns unchanged, or use append mode (each session once, when it closes)",
        ));
    }
    if filters || sessions {
        a.retract_keys = key_columns.to_vec();
    }
    Ok(())
}

/// A query bound to its inputs, with the session states it is planned
/// and run with.
struct Bound {
    /// Optimises the query as written.
    planning: SessionState,
    /// Plans each epoch's physical plan.
    state: SessionState,
    bound: LogicalPlan,
    inputs: Vec<Input>,
}

/// `plan` with each stream scan bound to a source of its own (see
/// `bind`), refused if it reads no stream.
fn bind_query(
    state: &SessionState,
    registry: &ConnectorRegistry,
    plan: &LogicalPlan,
    key_prefix: &str,
    task: Option<TaskId>,
) -> Result<Bound> {
    let planning = without_rules(state, &[UNSUPPORTED_RULES]);
    let state = without_rules(state, &[UNSUPPORTED_RULES, PLANNING_ONLY_RULES]);
    let (bound, inputs) = bind::bind_inputs(
        plan,
        registry,
        key_prefix,
        state.config().target_partitions(),
        task,
    )?;
    if inputs.is_empty() {
        return Err(SluiceError::plan(
            "the query reads no stream: a continuous query needs at least one stream in FROM",
        ));
    }
    Ok(Bound {
        planning,
        state,
        bound,
        inputs,
    })
}

/// `plan` run over each epoch's rows alone, whatever it holds (a GROUP
/// BY too), keeping nothing between epochs: its output is appended, each
/// epoch's rows once. The upstream of a repartition step pre-aggregates so
/// (Flink's local-global aggregation): one partial row per group crosses
/// the channel, not one per record. Never a user's query: an aggregation
/// over one epoch alone is no streaming answer.
pub(crate) fn plan_per_epoch(
    state: &SessionState,
    registry: &ConnectorRegistry,
    plan: &LogicalPlan,
    key_prefix: &str,
    task: Option<TaskId>,
) -> Result<IncrementalPlan> {
    let Bound {
        planning,
        state,
        bound,
        inputs,
    } = bind_query(state, registry, plan, key_prefix, task)?;
    let watermarks = watermarks_of(&inputs, false)?;
    let logical = planning.optimize(&bound)?;
    Ok(IncrementalPlan {
        key_columns: Vec::new(),
        output_schema: Arc::new(logical.schema().as_arrow().clone()),
        logical,
        inputs,
        mode: OutputMode::Append,
        aggregate: None,
        join: None,
        rank: None,
        over: None,
        temporal: None,
        stages: Vec::new(),
        unsplit: None,
        state,
        watermarks,
        upsert: None,
        current_watermark: None,
        proctime: None,
        watermark_out: None,
    })
}

/// The watermarks of a query's `inputs` (see `WatermarkTracker::new`).
fn watermarks_of(inputs: &[Input], processing_time: bool) -> Result<WatermarkTracker> {
    let declared = inputs.iter().map(|i| {
        let def = i.table.definition();
        (
            i.key.as_str(),
            def.name.as_str(),
            i.table.schema(),
            def.watermark.as_ref(),
        )
    });
    WatermarkTracker::new(declared, processing_time)
}

/// Checks that `plan` can run incrementally in `mode` (derived when
/// `None`), and binds it (to `task`'s share of its inputs, when given);
/// its inputs' keys start with `key_prefix`.
pub(crate) fn plan_query(
    state: &SessionState,
    registry: &ConnectorRegistry,
    plan: &LogicalPlan,
    mode: Option<OutputMode>,
    key_prefix: &str,
    task: Option<TaskId>,
) -> Result<IncrementalPlan> {
    let requested = mode;
    let Checked {
        mode,
        dedup,
        watermarked,
        processing_time,
    } = check_incremental(plan, mode)?;
    let Bound {
        planning,
        state,
        bound,
        inputs,
    } = bind_query(state, registry, plan, key_prefix, task)?;
    let watermarks = watermarks_of(&inputs, processing_time)?;
    let (bound, current_watermark) = crate::watermark::current::for_query(bound)?;
    let (bound, proctime) = crate::watermark::processing_time::for_query(bound)?;
    let Changes {
        bound,
        normalize,
        upsert,
        joins_changes,
    } = read_changes(bound, &watermarked)?;
    // Rows of one key must reach the operators and the sink in the order
    // they were read (an update's old row before its new one): no
    // round-robin repartition, which interleaves batches.
    let state = if bound.exists(|p| Ok(is_change_scan(p)))? || !normalize.is_empty() {
        let mut config = state.config().clone();
        config
            .options_mut()
            .optimizer
            .enable_round_robin_repartition = false;
        SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build()
    } else {
        state
    };
    let mode = match (&upsert, requested) {
        (None, _) => mode,
        (Some(_), Some(OutputMode::Append)) => {
            return Err(SluiceError::plan(
                "a query over an upsert stream writes each key's latest value and deletions: \
                 its output mode is update, not append",
            ))
        }
        (Some(_), _) => OutputMode::Update,
    };
    // A join over changelogs reads its inputs' signs, which nothing above
    // it uses: pruning unused columns would drop them.
    let planning = if joins_changes {
        without_rules(&planning, &[&["optimize_projections"]])
    } else {
        planning
    };
    let logical = planning.optimize(&bound)?;
    let output_schema = match &upsert {
        Some(u) => Arc::clone(&u.schema),
        None => Arc::new(logical.schema().as_arrow().clone()),
    };
    let unsplit = logical.clone();
    // From the query as written: the optimizer would push a filter above
    // the join into its versioned side, dropping versions, and a row would
    // join an older version that passes instead of being filtered out.
    let temporal = temporal::split_temporal(&bound)?;
    let (logical, mut stages, joins) = match temporal {
        Some(_) => (logical, Vec::new(), closing::JoinStages::default()),
        None => split_stages(logical, &watermarked)?,
    };
    let unsplit = (!stages.is_empty()).then_some(unsplit);
    // A Top-N over a changelog source reads the rows' signs, which nothing
    // above it uses: the optimizer would prune them, so it is cut from the
    // plan as bound (each epoch's plan is optimized when it runs). Over
    // stages, their scans carry the signs in.
    let rank_plan = if stages.is_empty() { &bound } else { &logical };
    let (rank, rank_key) = match split_rank(rank_plan, mode)? {
        Some((rank, key)) => (Some(rank), Some(key)),
        None => (None, None),
    };
    // The upsert stream's changes come first, before every stage.
    stages.splice(0..0, normalize);
    let mut aggregate = match temporal {
        Some(_) => None,
        None => split_aggregate(&logical, mode, dedup, &watermarked)?,
    };
    let mode = match &mut aggregate {
        Some(a) => closing::close_over_joins(a, &joins, requested)?,
        None => mode,
    };
    let join = match (&aggregate, &temporal) {
        (None, None) => split_join(&logical, &logical, &watermarked, true)?,
        _ => None,
    };
    // A join over changes leaves its inputs' signs (which a `*` selects)
    // out of its output.
    let changing_join = join.as_ref().is_some_and(|j| j.changelog.is_some());
    let output_schema = if changing_join {
        let kept: Vec<usize> = (0..output_schema.fields().len())
            .filter(|&i| output_schema.field(i).name() != SIGN)
            .collect();
        Arc::new(output_schema.project(&kept)?)
    } else {
        output_schema
    };
    let over = match (&rank, &aggregate, &join, &temporal) {
        (None, None, None, None) => split_over(&logical, &watermarked, &stages)?,
        _ => None,
    };
    let key_columns = output_key(upsert.as_ref(), rank_key, aggregate.as_ref(), join.as_ref());
    if let Some(a) = &mut aggregate {
        retract_ended_groups(a, &key_columns)?;
    }
    Ok(IncrementalPlan {
        key_columns,
        logical,
        inputs,
        output_schema,
        mode,
        aggregate,
        join,
        rank,
        over,
        temporal,
        stages,
        unsplit,
        state,
        watermarks,
        upsert,
        current_watermark,
        proctime,
        watermark_out: None,
    })
}
