//! A statement that stacks stateful operators, divided as a chain of
//! statements: Kafka Streams' sub-topologies joined by repartition topics.
//!
//! Nexmark q5 counts bids per auction and window, takes the highest count
//! per window, and joins the counts with it: three operators, each keyed
//! by something else. Divided, each operator under another becomes a
//! statement of its own (a *link*) that writes what it emits to a channel,
//! and the operator above reads that channel back as a stream. Every
//! statement of the chain is then divided like any other: through a
//! repartition step of its own when its key is not what partitions what
//! it reads (see `aggregate` and `join`).
//!
//! Only rows that never change cross a link: a windowed operator's, which
//! carry their window's end. That end is the channel's event time: each
//! link task writes its watermark after its rows, as any upstream task
//! does, and the statement above takes the least of every link task's (see
//! `watermark::aligned`). A window closes in a link task once its
//! watermark passes the window's end, so the rows of a window reach the
//! channel before any watermark that passes their end: the operator above
//! never finds them late, and it closes its own windows when every link
//! task has closed the ones under them, as it would in one process.
//!
//! Each link commits in the transaction of the task that runs it, like
//! every sub-topology, so a chain is exactly once link by link.

use std::collections::BTreeSet;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};

use super::{channel, channel_column, replaced, streams, Channels, Crossing};
use crate::error::{Result, SluiceError};
use crate::planner::{innermost_nested, Nested};
use crate::session::frame::DataStreamWriter;
use crate::table::StreamDefinition;
use crate::watermark::aligned;

/// The channel column a link's window end crosses in: its event time.
const LINK_TIME: &str = "window_end";

/// A stacked statement as a chain: the link statements, innermost first,
/// then the statement's outermost operator over what they write.
pub(super) struct Unstacked {
    pub(super) statements: Vec<DataStreamWriter>,
    /// The links' channels: name, format and columns.
    pub(super) channels: Vec<String>,
    /// The streams reading back links keyed by what the operator above
    /// groups or joins them by: that operator's statement reads them as
    /// they are, without a repartition step of its own.
    pub(super) keyed: BTreeSet<String>,
}

/// `writer`'s statement with each stateful operator under another cut out
/// into a link statement writing channel `to.first + i` (innermost first),
/// read back where it was.
pub(super) fn unstack(to: &Channels, writer: DataStreamWriter) -> Result<Unstacked> {
    let mut plan = writer.frame.logical_plan().clone();
    let mut statements = Vec::new();
    let mut channels = Vec::new();
    let mut keyed = BTreeSet::new();
    while let Some(Nested {
        inner,
        parent,
        child,
    }) = innermost_nested(&plan)?
    {
        // Read on two paths alike (a self-join of a subquery), it is keyed
        // for neither.
        let mut reads = 0;
        plan.apply(|n| {
            reads += usize::from(n == &child);
            Ok(TreeNodeRecursion::Continue)
        })?;
        let key = match reads {
            1 => parent_key(&parent, &child)?,
            _ => None,
        };
        let (crossing, time) = link(&child, &inner, key.as_deref())?;
        let input = timed_input(&child, &time)?;
        let channel = channel(to, &writer, &input, crossing, to.first + statements.len())?;
        if key.is_some() {
            keyed.insert(channel.stream);
        }
        // Every read of it, should it be read on two paths alike.
        plan = replaced(plan, &child, channel.restored)?;
        statements.push(channel.upstream);
        channels.push(channel.description);
    }
    statements.push(writer.with_frame(to.session.frame(plan)));
    Ok(Unstacked {
        statements,
        channels,
        keyed,
    })
}

/// What `parent` partitions the rows of its input `child` by, over
/// `child`'s columns: an aggregation's group columns, or a join's
/// equalities on `child`'s side, each cast to the type both sides share
/// (as the other side's repartition step writes them). `None` where a
/// group key is computed, or there is none.
fn parent_key(parent: &LogicalPlan, child: &LogicalPlan) -> Result<Option<Vec<Expr>>> {
    Ok(match parent {
        LogicalPlan::Aggregate(a) => {
            let columns: Option<Vec<Expr>> = a
                .group_expr
                .iter()
                .map(|g| match g.clone().unalias() {
                    column @ Expr::Column(_) => Some(column),
                    _ => None,
                })
                .collect();
            columns.filter(|c| !c.is_empty())
        }
        LogicalPlan::Join(j) => {
            let (left, right) = super::join::equalities(j)?;
            match child {
                c if c == j.left.as_ref() => Some(left),
                c if c == j.right.as_ref() => Some(right),
                _ => None,
            }
        }
        _ => None,
    })
}

/// Refuses a stacked statement that cannot be chained, saying why.
fn refuse(why: impl std::fmt::Display) -> SluiceError {
    crate::planner::refuse_division(
        format!(
            "it stacks stateful operators, so each would run as a statement of its own that \
             reads the one under it through a channel, but {why}"
        ),
        None,
    )
}

/// What crosses from `child` (the input of the operator above `inner`, up
/// to that operator): every column, the window end as [`LINK_TIME`], and
/// the operator above's `key` as `k<j>` (the names a join's repartition
/// step gives its keys), keyed by it; without one, keyed by every column.
/// And the event-time column the window is over.
fn link(
    child: &LogicalPlan,
    inner: &LogicalPlan,
    key: Option<&[Expr]>,
) -> Result<(Crossing, String)> {
    let schema = child.schema();
    let Some((end, time)) = crate::window::window_end(schema.fields().iter().map(|f| f.as_ref()))
    else {
        let what = match inner {
            LogicalPlan::Join(_) => "a join",
            LogicalPlan::Window(_) => "a Top-N or OVER aggregation",
            _ => "an aggregation",
        };
        return Err(refuse(format!(
            "{what} under another operator emits rows without a window end: only a windowed \
             operator's rows (TUMBLE, HOP, CUMULATE or SESSION, passing its window_end on) \
             never change and cross between stacked operators"
        )));
    };
    let mut crossing = Vec::with_capacity(schema.fields().len() + 3);
    let mut restored = Vec::with_capacity(schema.fields().len());
    let mut names = Vec::with_capacity(schema.fields().len());
    for (i, c) in schema.columns().into_iter().enumerate() {
        let name = match i == end {
            true => LINK_TIME.to_string(),
            false => format!("c{i}"),
        };
        crossing.push(Expr::Column(c.clone()).alias(&name));
        restored.push(channel_column(&name).alias_qualified(c.relation.clone(), c.name.clone()));
        names.push(name);
    }
    let key_fields = match key {
        Some(key) => {
            let named: Vec<String> = (0..key.len()).map(|j| format!("k{j}")).collect();
            crossing.extend(key.iter().zip(&named).map(|(k, n)| k.clone().alias(n)));
            named
        }
        None => names,
    };
    crossing.extend(aligned::columns());
    let upstream = LogicalPlanBuilder::from(child.clone())
        .project(crossing)?
        .build()?;
    Ok((
        Crossing {
            upstream,
            per_epoch: false,
            key_fields,
            restored,
            event_time: Some(LINK_TIME.to_string()),
        },
        time,
    ))
}

/// The stream `plan` reads whose watermark is on `time`: the one whose
/// connector and event time the link's channel takes.
fn timed_input(plan: &LogicalPlan, time: &str) -> Result<StreamDefinition> {
    streams(plan)?
        .into_iter()
        .find(|s| s.watermark.as_ref().is_some_and(|w| w.column == time))
        .ok_or_else(|| {
            refuse(format!(
                "its windows are over '{time}', which is no stream's watermarked column"
            ))
        })
}
