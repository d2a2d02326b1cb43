//! Groups that a join's time bound closes: an aggregation over an interval
//! join, grouped by a column the join's bound compares with the other
//! side's event time, has groups that are final once the watermark passes
//! that column, as a window's are. Nexmark q6 is the case:
//!
//! ```sql
//! SELECT MAX(B.price) AS final, A.seller, A.expires
//! FROM auction A, bid B
//! WHERE A.id = B.auction AND B.ts BETWEEN A.ts AND A.expires
//! GROUP BY A.id, A.seller, A.expires
//! ```
//!
//! No bid still to come can join an auction whose `expires` the watermark
//! passed (see `TimeBounds::closing_columns`), so each auction's
//! highest bid is final then: the aggregation emits it once, in append mode,
//! and an OVER window above it can order by `expires` (the last 10 closed
//! auctions of each seller), which it could not over rows that change.

use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{Expr, LogicalPlan};

use super::outputs::{origin, AGGREGATE_OUTPUT, JOIN_OUTPUT};
use super::{Stage, StageConfig};
use crate::error::{Result, SluiceError};
use crate::operator::aggregate::AggregateConfig;
use crate::operator::join::JoinConfig;
use crate::output_mode::OutputMode;
use crate::table::EpochBatches;
use crate::window::WindowKey;

/// A column of a stage's output that closes the rows carrying it: no row
/// still to come has a value `c` with `c + to_end_ns <= W`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Closing {
    /// The column, as the plan above the stage reads it.
    column: Column,
    to_end_ns: i64,
    /// The event-time column whose watermark closes it (for EXPLAIN).
    time_column: String,
}

/// The join stages of a query (joins of streams whose rows never change,
/// feeding an operator above them), and the columns of their outputs that
/// their time bounds close.
///
/// An aggregation over a join's output cannot close a group by a
/// watermarked column as it does over a stream: a row the join keeps
/// pairs with a new row of the other side at any time its bound allows,
/// so the pair's event time may lie behind the watermark (with `b.ts
/// BETWEEN a.ts AND a.ts + INTERVAL '10' SECOND`, an `a.ts` up to 10 s
/// behind it). Over a join stage only a column its bound closes closes a
/// group, after the delay the bound gives it.
#[derive(Debug, Default)]
pub(super) struct JoinStages {
    links: Vec<Arc<EpochBatches>>,
    closing: Vec<Closing>,
}

impl JoinStages {
    /// Takes note of `join`, cut from the query's join `node`, whose rows
    /// reach the plan above through `link` with the schema `output` (that
    /// of `join`'s tail).
    pub(super) fn add(
        &mut self,
        join: &JoinConfig,
        node: &LogicalPlan,
        output: &DFSchema,
        link: &Arc<EpochBatches>,
    ) {
        self.links.push(Arc::clone(link));
        let Some(bounds) = &join.bounds else {
            return;
        };
        let closing = bounds.closing_columns();
        let time = &bounds.lower.right.name;
        self.closing
            .extend((0..output.fields().len()).filter_map(|i| {
                let at = origin(&join.tail, i, JOIN_OUTPUT)?;
                let joined = Column::from(node.schema().qualified_field(at));
                let (_, to_end_ns) = closing.iter().find(|(c, _)| **c == joined)?;
                Some(Closing {
                    column: Column::from(output.qualified_field(i)),
                    to_end_ns: *to_end_ns,
                    time_column: time.clone(),
                })
            }));
    }

    /// The group key that closes the groups of `agg`: over a join stage,
    /// one of the columns its bound closes (if any); else the window key
    /// found for it.
    pub(super) fn window_key(&self, agg: &AggregateConfig) -> Option<WindowKey> {
        let LogicalPlan::Aggregate(a) = &agg.aggregate else {
            return agg.window.clone();
        };
        let over_join = self.links.iter().any(|l| scan_of(&a.input, l).is_some());
        if !over_join || agg.mode == OutputMode::Complete {
            return agg.window.clone();
        }
        a.group_expr
            .iter()
            .enumerate()
            .find_map(|(column, e)| match e {
                Expr::Column(c) => {
                    self.closing
                        .iter()
                        .find(|k| k.column == *c)
                        .map(|k| WindowKey {
                            column,
                            to_end_ns: k.to_end_ns,
                            time_column: k.time_column.clone(),
                            session: None,
                        })
                }
                _ => None,
            })
    }
}

/// Sets the window key of `agg`, the query's last operator, as `joins`
/// say; returns the query's output mode. Over a join stage whose bound
/// closes none of its group keys, an aggregation derived as append (its
/// key a watermarked column or a window's bound, which a join's rows may
/// lie behind) changes its groups: update mode, unless append was asked
/// for.
pub(super) fn close_over_joins(
    agg: &mut AggregateConfig,
    joins: &JoinStages,
    requested: Option<OutputMode>,
) -> Result<OutputMode> {
    agg.window = joins.window_key(agg);
    if agg.window.is_some() || agg.mode != OutputMode::Append || agg.dedup {
        return Ok(agg.mode);
    }
    if requested == Some(OutputMode::Append) {
        return Err(SluiceError::plan(
            "output mode 'append' emits each group once, when the watermark closes it, but \
             this aggregation reads a join's output, whose rows may lie behind the watermark \
             (a row the join keeps pairs with a new one later), and it groups by no column \
             the join's time bound closes: group by the column the bound compares with the \
             other side's time (GROUP BY a.expires under b.ts BETWEEN a.ts AND a.expires), or \
             use 'update'",
        ));
    }
    agg.mode = OutputMode::Update;
    Ok(OutputMode::Update)
}

/// Whether the rows of `input` (an OVER window's) arrive in the order of
/// its column `time` across epochs, never behind the watermark the window
/// has passed: `time` passes on the window key of an aggregation stage,
/// which emits each group once, when the watermark passes that key, so
/// every row it emits later has a later key.
pub(super) fn arrives_in_order(input: &LogicalPlan, time: usize, stages: &[Stage]) -> bool {
    stages.iter().any(|stage| {
        let StageConfig::Aggregate(agg) = &stage.config else {
            return false;
        };
        let Some(key) = agg.window.as_ref().filter(|k| k.session.is_none()) else {
            return false;
        };
        scan_of(input, &stage.link)
            .and_then(|scan| origin(input, time, &scan))
            .and_then(|at| origin(&agg.tail, at, AGGREGATE_OUTPUT))
            .is_some_and(|group| group == key.column)
    })
}

/// The name of the scan of `plan` that reads `link`.
fn scan_of(plan: &LogicalPlan, link: &Arc<EpochBatches>) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let reads = source_as_provider(&scan.source)
                .is_ok_and(|p| std::ptr::addr_eq(Arc::as_ptr(&p), Arc::as_ptr(link)));
            if reads {
                found = Some(scan.table_name.table().to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}
