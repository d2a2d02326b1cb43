//! What can run on a stream: every node of the plan checked, the output
//! mode derived or checked, and what would work said when something
//! cannot.

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::JoinType;
use datafusion::logical_expr::{Expr, Join, LogicalPlan};

use super::over::over_reach;
use super::rank::{top_ns, window_problem};
use crate::error::{Result, SluiceError};
use crate::operator::changelog::SIGN;
use crate::operator::time_bounds::time_bounds;
use crate::output_mode::OutputMode;
use crate::table::as_stream_table;
use crate::upsert::DELETED;
use crate::watermark::processing_time;
use crate::window::{event_time_key, session_problem, WindowKey};

/// The table name of the scan that replaces the `i`-th stage.
pub(super) const STAGE_OUTPUT: &str = "__sluice_stage";

/// The nodes that run over streams: all of them but the static side of a
/// stream–static join, which DataFusion reads as a plain table.
pub(super) fn streaming_nodes(plan: &LogicalPlan) -> Vec<&LogicalPlan> {
    let mut out = vec![plan];
    match plan {
        LogicalPlan::Join(j) if reads_stream(&j.left) != reads_stream(&j.right) => {
            let side = if reads_stream(&j.left) {
                &j.left
            } else {
                &j.right
            };
            out.extend(streaming_nodes(side));
        }
        _ => {
            for input in plan.inputs() {
                out.extend(streaming_nodes(input));
            }
        }
    }
    out
}

/// Whether `plan` scans a stream, or the output of a stage (see
/// [`split_stages`]).
pub(super) fn reads_stream(plan: &LogicalPlan) -> bool {
    plan.exists(|n| {
        Ok(matches!(n, LogicalPlan::TableScan(scan)
            if scan.table_name.table().starts_with(STAGE_OUTPUT)
                || source_as_provider(&scan.source)
                .ok()
                .is_some_and(|p| as_stream_table(&p).is_some())))
    })
    .unwrap_or(false)
}

/// The kind of a query's outermost stateful operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    Aggregate,
    Join,
    /// A Top-N (see `rank`).
    Rank,
    /// An OVER aggregation (see `over`).
    Over,
}

/// What [`check_incremental`] found.
pub(super) struct Checked {
    pub mode: OutputMode,
    /// The query deduplicates (`SELECT DISTINCT`, `drop_duplicates`).
    pub dedup: bool,
    /// The columns the query's watermark follows: the watermarked
    /// event-time columns of the streams read, or on processing time the
    /// `PROCTIME()` columns.
    pub watermarked: Vec<String>,
    /// The query's windows are over processing time (see
    /// `watermark::processing_time`).
    pub processing_time: bool,
}

/// Rejects what cannot run incrementally, saying why and what would work;
/// returns the output mode (the one asked for, else the one derived).
pub(super) fn check_incremental(plan: &LogicalPlan, mode: Option<OutputMode>) -> Result<Checked> {
    let proctime = processing_time::columns(plan);
    let processing_time = windows_over(plan, &proctime);
    let watermarked = match processing_time {
        true => proctime,
        false => watermarked_columns(plan)?,
    };
    let mut shape = Shape {
        ranks: top_ns(plan)?
            .into_iter()
            .map(|(window, _)| window)
            .collect(),
        ..Shape::default()
    };
    for node in streaming_nodes(plan) {
        if let Some(problem) = shape.visit(node, &watermarked) {
            return Err(SluiceError::plan(format!(
                "this query cannot run on a stream: it {problem}"
            )));
        }
    }
    if !shape.ranks.is_empty() && shape.root != Some(Root::Rank) {
        return Err(SluiceError::plan(
            "this query cannot run on a stream: a Top-N (ROW_NUMBER() OVER ... with WHERE rn \
             <= N) feeds another stateful operator (an aggregation, a join, DISTINCT), which \
             Sluice does not run yet; write the Top-N to a stream and read that",
        ));
    }
    let mode = output_mode(plan, &shape, &watermarked, mode)?;
    Ok(Checked {
        mode,
        dedup: shape.dedup,
        watermarked,
        processing_time,
    })
}

/// Whether an aggregation of `plan` is windowed over one of `columns`.
fn windows_over(plan: &LogicalPlan, columns: &[String]) -> bool {
    !columns.is_empty()
        && plan
            .exists(|node| {
                Ok(matches!(node, LogicalPlan::Aggregate(a)
                    if event_time_key(a, columns).is_some_and(|k| columns.contains(&k.time_column))))
            })
            .unwrap_or(false)
}

/// The event-time columns of the watermarked streams `plan` scans.
fn watermarked_columns(plan: &LogicalPlan) -> Result<Vec<String>> {
    let mut watermarked = Vec::new();
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let provider = source_as_provider(&scan.source).ok();
            if let Some(spec) = provider
                .as_ref()
                .and_then(as_stream_table)
                .and_then(|s| s.definition().watermark.as_ref())
            {
                watermarked.push(spec.column.clone());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(watermarked)
}

/// What the walk over a query's streaming nodes, top down, finds.
#[derive(Default)]
struct Shape {
    /// The outermost stateful operator, which decides the output mode;
    /// those under it are stages (see `split_stages`).
    root: Option<Root>,
    /// The outermost aggregation's event-time window, if it has one.
    window: Option<WindowKey>,
    /// The query deduplicates (`SELECT DISTINCT`, `drop_duplicates`).
    dedup: bool,
    /// The `Window` nodes of the query's Top-Ns (see `rank::top_ns`).
    ranks: Vec<LogicalPlan>,
    /// The outermost operator is a join whose rows change (see
    /// [`emits_changes`]).
    join_changes: bool,
}

/// Whether `plan`'s rows may be taken back: it reads a Debezium or upsert
/// stream, or an aggregation of a stream without an event-time window, or
/// a join that emits changes.
pub(super) fn changes(plan: &LogicalPlan, watermarked: &[String]) -> bool {
    plan.exists(|n| {
        Ok(match n {
            LogicalPlan::TableScan(s) => {
                let schema = s.source.schema();
                schema.field_with_name(SIGN).is_ok() || schema.field_with_name(DELETED).is_ok()
            }
            // A static table's aggregation is the table's business; a
            // stream's without a window changes its rows (DISTINCT is
            // one, planned as a stage that emits changes).
            LogicalPlan::Aggregate(a) => {
                reads_stream(&a.input) && event_time_key(a, watermarked).is_none()
            }
            LogicalPlan::Distinct(d) => reads_stream(d.input()),
            LogicalPlan::Join(inner) => {
                reads_stream(&inner.left)
                    && reads_stream(&inner.right)
                    && emits_changes(inner, watermarked)
            }
            _ => false,
        })
    })
    .unwrap_or(false)
}

/// Whether a join of two streams emits rows it may take back: one of its
/// inputs changes (it reads a Debezium or upsert stream, or an
/// aggregation without an event-time window), or it is an outer join
/// without a time bound, whose unmatched rows may find a partner at any
/// time. Such a join runs as `operator::changelog_join`.
pub(super) fn emits_changes(j: &Join, watermarked: &[String]) -> bool {
    // A temporal join emits each row once, final (see `temporal`): its
    // versioned side's changes are versions, not rows taken back.
    if crate::operator::temporal_join::is_temporal(j) {
        return changes(&j.left, watermarked);
    }
    if changes(&j.left, watermarked) || changes(&j.right, watermarked) {
        return true;
    }
    j.join_type != JoinType::Inner
        && time_bounds(
            j.filter.as_ref(),
            &j.on,
            j.left.schema(),
            j.right.schema(),
            watermarked,
        )
        .is_none()
}

impl Shape {
    /// Takes note of `node`; says what it does that cannot run on a
    /// stream, if anything.
    fn visit(&mut self, node: &LogicalPlan, watermarked: &[String]) -> Option<String> {
        match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Unnest(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::EmptyRelation(_) => None,
            LogicalPlan::TableScan(scan) => {
                let provider = source_as_provider(&scan.source).ok();
                let stream = provider.as_ref().and_then(as_stream_table);
                stream.is_none().then(|| {
                    format!(
                        "reads '{}', which is a table, not a stream, on its own; a static table \
                         can only be joined with a stream (FROM stream JOIN table ON ...)",
                        scan.table_name
                    )
                })
            }
            LogicalPlan::Aggregate(agg) => {
                if self.root.is_none() {
                    self.root = Some(Root::Aggregate);
                    self.window = event_time_key(agg, watermarked);
                }
                agg.group_expr
                    .iter()
                    .any(|e| matches!(e, Expr::GroupingSet(_)))
                    .then(|| {
                        "uses GROUPING SETS / CUBE / ROLLUP, which is not supported".to_string()
                    })
            }
            // Deduplication: DataFusion turns it into an aggregation keyed by
            // the distinct columns, which emits each key once (see
            // `aggregate`).
            LogicalPlan::Distinct(_) => {
                if self.root.is_none() {
                    self.root = Some(Root::Aggregate);
                    self.dedup = true;
                }
                None
            }
            LogicalPlan::Join(j) => match (reads_stream(&j.left), reads_stream(&j.right)) {
                (true, true) => {
                    if self.root.is_none() {
                        self.root = Some(Root::Join);
                        self.join_changes = emits_changes(j, watermarked);
                    }
                    None
                }
                (stream_left, _) => static_join_problem(j, stream_left),
            },
            LogicalPlan::Sort(_) => Some(
                "sorts an unbounded stream (ORDER BY), which never finishes; remove the ORDER BY \
                 and sort where the output is read"
                    .to_string(),
            ),
            LogicalPlan::Limit(_) => Some(
                "uses LIMIT/OFFSET, which over an unbounded stream depends on epoch boundaries; \
                 remove it"
                    .to_string(),
            ),
            LogicalPlan::Window(_) if self.ranks.contains(node) => {
                self.root.get_or_insert(Root::Rank);
                window_problem(node)
            }
            LogicalPlan::Window(w) => match over_reach(w, watermarked) {
                Ok(_) => {
                    self.root.get_or_insert(Root::Over);
                    None
                }
                Err(problem) => Some(problem),
            },
            other => Some(format!(
                "uses {}, which cannot run incrementally",
                other
                    .display()
                    .to_string()
                    .split(':')
                    .next()
                    .unwrap_or("this operator")
            )),
        }
    }
}

/// A stream joined with a static table is stateless, each epoch's rows
/// joining the table, unless the table's unmatched rows would have to wait
/// for the whole stream.
fn static_join_problem(j: &Join, stream_left: bool) -> Option<String> {
    use JoinType::*;
    let keeps_stream_side = match j.join_type {
        Inner => true,
        Left | LeftSemi | LeftAnti | LeftMark => stream_left,
        Right | RightSemi | RightAnti | RightMark => !stream_left,
        Full => false,
    };
    (!keeps_stream_side).then(|| {
        format!(
            "joins a stream with a static table as a {} join, which would emit the table's \
             unmatched rows only after the endless stream ends; use an inner join, or an outer \
             join that keeps the stream's rows",
            j.join_type
        )
    })
}

/// The output mode of a query of `shape`: `mode` when asked for and
/// valid, else the one its shape gives.
fn output_mode(
    plan: &LogicalPlan,
    shape: &Shape,
    watermarked: &[String],
    mode: Option<OutputMode>,
) -> Result<OutputMode> {
    if shape.root == Some(Root::Rank) {
        // A better row replaces a ranked one: the output changes, unless
        // the first row by event time is kept and waits for the watermark.
        let first = keeps_first_by_event_time(plan, watermarked)?;
        return match (mode, first) {
            (None | Some(OutputMode::Append), true) => Ok(OutputMode::Append),
            (None | Some(OutputMode::Update), _) => Ok(OutputMode::Update),
            (Some(m), _) => Err(SluiceError::plan(format!(
                "output mode '{m}' does not fit a Top-N, whose ranked rows are replaced as \
                 better ones arrive: use 'update' (each partition's changed ranks, keyed by \
                 the partition and the rank); only keeping the first row by event time (rn = 1 \
                 ORDER BY a watermarked column ASC, over rows that are never taken back) runs \
                 in append mode"
            ))),
        };
    }
    if shape.root == Some(Root::Over) {
        // Each row is emitted once, when the watermark passes it.
        return match mode {
            None | Some(OutputMode::Append) => Ok(OutputMode::Append),
            Some(m) => Err(SluiceError::plan(format!(
                "output mode '{m}' does not fit an OVER aggregation, which emits each row once, \
                 when the watermark passes it: use 'append'"
            ))),
        };
    }
    if shape.root == Some(Root::Join) && shape.join_changes {
        // A pair is taken back when a row of it is, or, in an outer join,
        // when a row's first partner arrives.
        return match mode {
            None | Some(OutputMode::Update) => Ok(OutputMode::Update),
            Some(m) => Err(SluiceError::plan(format!(
                "output mode '{m}' does not fit this join, whose rows change (an input takes \
                 rows back, or an outer join's row padded with nulls is replaced when its \
                 partner arrives): use 'update' (keyed by the columns that identify its rows)"
            ))),
        };
    }
    if shape.root == Some(Root::Join) {
        // A joined pair never changes once emitted.
        return match mode {
            Some(OutputMode::Complete) => Err(SluiceError::plan(
                "output mode 'complete' needs an aggregation; a join emits each matched pair \
                 once: use 'append'",
            )),
            m => Ok(m.unwrap_or(OutputMode::Append)),
        };
    }
    if shape.dedup {
        // A distinct row never changes once emitted: append by default.
        return Ok(mode.unwrap_or(OutputMode::Append));
    }
    let aggregate = streaming_nodes(plan).into_iter().find_map(|n| match n {
        LogicalPlan::Aggregate(a) => Some(a),
        _ => None,
    });
    if let Some(problem) = aggregate.and_then(|a| session_problem(a, shape.window.as_ref(), mode)) {
        return Err(SluiceError::plan(problem));
    }
    if let Some(w) = &shape.window {
        let has_watermark = watermarked.contains(&w.time_column);
        return Ok(match mode {
            Some(OutputMode::Append) if !has_watermark => {
                return Err(SluiceError::plan(format!(
                    "output mode 'append' emits each window once, when the watermark passes its \
                 end, but '{}' has no watermark: declare one (WATERMARK FOR {} AS {} - INTERVAL \
                 '5' SECOND in CREATE STREAM, or with_watermark), or use 'update'",
                    w.time_column, w.time_column, w.time_column
                )))
            }
            Some(m) => m,
            None if has_watermark => OutputMode::Append,
            None => OutputMode::Update,
        });
    }
    match (shape.root, mode) {
        (None, Some(OutputMode::Complete)) => Err(SluiceError::plan(
            "output mode 'complete' needs an aggregation (it re-emits the whole result \
             table); this query is stateless: use 'append'",
        )),
        (None, m) => Ok(m.unwrap_or(OutputMode::Append)),
        (_, Some(OutputMode::Append)) => Err(SluiceError::plan(
            "output mode 'append' emits only rows that never change, but a GROUP BY without \
             an event-time window changes its rows every epoch: use 'update' (emit the groups \
             that changed; the default) or 'complete' (emit the whole result every epoch)",
        )),
        (_, m) => Ok(m.unwrap_or(OutputMode::Update)),
    }
}

/// Whether `plan`'s Top-N keeps each partition's first row by event time
/// over rows never taken back (`rn = 1`, ordered by one watermarked column
/// ascending): its row is final once the watermark passes it, so it can
/// wait for that and be emitted once (`operator::rank`'s append mode).
pub(super) fn keeps_first_by_event_time(
    plan: &LogicalPlan,
    watermarked: &[String],
) -> Result<bool> {
    let Some((LogicalPlan::Window(w), 1)) = top_ns(plan)?.into_iter().next() else {
        return Ok(false);
    };
    let [Expr::WindowFunction(f)] = w.window_expr.as_slice() else {
        return Ok(false);
    };
    if !f.fun.name().eq_ignore_ascii_case("row_number") {
        return Ok(false);
    }
    let by_event_time = match f.params.order_by.as_slice() {
        [sort] => {
            sort.asc && matches!(&sort.expr, Expr::Column(c) if watermarked.contains(&c.name))
        }
        _ => false,
    };
    Ok(by_event_time && !changes(&w.input, watermarked))
}
