//! Repartition steps: a GROUP BY whose key is not what partitions its
//! input, divided into tasks all the same.
//!
//! Kafka Streams' repartition topics. Divided by partition, task *i* reads
//! partition *i* of the input, where one group's rows are spread over every
//! partition. So a statement such as
//!
//! ```sql
//! INSERT INTO counts SELECT auction, count(*) FROM bids GROUP BY auction
//! ```
//!
//! becomes two sub-topologies, run as two statements of one set:
//! 1. **upstream**: each task reads its partition of `bids`, aggregates
//!    each epoch's rows per group (count, sum, min, max and avg; Flink's
//!    local-global aggregation), and writes one partial row per group to a
//!    channel the input's connector provides (a Kafka topic of the query's
//!    task count, `…-repartition-<n>`), keyed by the group key, so that all
//!    of a group's partials reach one partition of it. Aggregates that do
//!    not merge so (DISTINCT, FILTER, other functions) and changelog inputs
//!    send every row instead: the group key's value and the columns the
//!    aggregates read;
//! 2. **downstream**: task *i* reads partition *i* of the channel and
//!    aggregates it, as the statement did (merging partials: a count's
//!    by summing them).
//!
//! Both run in every task and commit in its one transaction: the rows a
//! task wrote to the channel, the channel offsets it read and its output
//! commit together, so the hop is exactly once. Downstream reads only what
//! upstream tasks have committed (`read_committed`), so a row crosses in
//! the epoch after the one that read it. Once a task has committed past a
//! channel record, the record is deleted.
//!
//! Event time crosses too. Over a stream with a watermark, every row
//! crosses with its event time, and each upstream task writes its
//! watermark to every partition of the channel after its rows; a
//! downstream task's watermark is the least of its upstream tasks' (see
//! `watermark::aligned`). Downstream judges rows late, closes windows and
//! counts late rows as the statement would.
//!
//! A join of two streams crosses too, each side through a channel of its
//! own to the partition of its join key's value (`join`); a GROUP BY's
//! crossing is `aggregate`'s. A statement that stacks windowed operators
//! is first cut into a chain of statements, one per operator, each reading
//! the one under it through a channel (`chain`), and each then crosses as
//! above.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};

use super::frame::DataStreamWriter;
use super::Session;
use crate::connector::RepartitionArgs;
use crate::error::{Result, SluiceError};
use crate::launch::SinkChoice;
use crate::planner::{refuse_division, IncrementalPlan};
use crate::table::{as_stream_table, StreamDefinition};
use crate::task::step_name;
use crate::watermark::{aligned, Aligned, WatermarkSpec};

mod aggregate;
mod chain;
mod join;

/// Whether `plan`, divided by partition, needs a repartition step: it
/// groups by columns that do not decide a record's partition, it joins
/// two streams (whose rows of one key each task must see) on anything but
/// both record keys, or it stacks stateful operators (each reading what
/// the one under it emits, keyed by something else).
pub(crate) fn needed(plan: &IncrementalPlan) -> bool {
    !plan.stages.is_empty()
        || plan.join.is_some() && !crate::planner::joined_by_partition(&plan.logical)
        || plan
            .aggregate
            .as_ref()
            .is_some_and(|a| !crate::planner::keyed_by_partition(&a.aggregate))
}

/// `writers` (planned undivided as `plans`) for a query divided into
/// `partitions` tasks: each statement that [`needs`](needed) a repartition
/// step replaced by its sub-topologies, upstream then downstream (a
/// stacked statement by its chain's statements, each so); the others as
/// they are. `query_id` names the channels.
pub(crate) fn divide(
    session: &Session,
    writers: Vec<DataStreamWriter>,
    plans: &[IncrementalPlan],
    query_id: &str,
    partitions: u32,
    idle_timeout: Option<Duration>,
) -> Result<Vec<DataStreamWriter>> {
    let mut divided = Vec::with_capacity(writers.len() + 1);
    let mut channels = 0;
    let to = |first| Channels {
        session,
        query_id,
        first,
        partitions,
        idle_timeout,
    };
    let mut push = |to: &Channels,
                    writer,
                    plan: &IncrementalPlan,
                    keyed: &BTreeSet<String>|
     -> Result<usize> {
        let split = match needed(plan) {
            true => split(to, writer, plan, keyed)?,
            false => Split::AsIs(writer),
        };
        let step = match split {
            Split::Step(step) => step,
            Split::AsIs(writer) => {
                divided.push(writer);
                return Ok(0);
            }
        };
        tracing::info!(channels = %step.channels, partitions, "repartition step");
        let count = step.upstream.len();
        divided.extend(step.upstream);
        divided.push(step.downstream);
        Ok(count)
    };
    for (writer, plan) in writers.into_iter().zip(plans) {
        if plan.stages.is_empty() {
            channels += push(&to(channels), writer, plan, &BTreeSet::new())?;
            continue;
        }
        let chain = chain::unstack(&to(channels), writer.output_mode(plan.mode))?;
        tracing::info!(links = %chain.channels.join(" and "), "stacked operators chained");
        channels += chain.channels.len();
        for statement in chain.statements {
            let planned = statement.plan()?;
            channels += push(&to(channels), statement, &planned, &chain.keyed)?;
        }
    }
    Ok(divided)
}

/// A statement divided at its repartition step, or as it is.
enum Split {
    Step(Step),
    /// It reads only what is keyed for it already.
    AsIs(DataStreamWriter),
}

/// `writer`'s statement (planned undivided as `plan`, one stateful
/// operator) at its repartition step; as it is when every stream it reads
/// is in `keyed` (a chain's links already keyed by what this statement
/// groups or joins by).
fn split(
    to: &Channels,
    writer: DataStreamWriter,
    plan: &IncrementalPlan,
    keyed: &BTreeSet<String>,
) -> Result<Split> {
    if plan
        .inputs
        .iter()
        .all(|i| keyed.contains(&i.table.definition().name))
    {
        return Ok(Split::AsIs(writer));
    }
    // The same output mode as undivided, though the regrouped plan might
    // derive another (`SELECT DISTINCT` is append).
    let writer = writer.output_mode(plan.mode);
    Ok(Split::Step(match plan.join.is_some() {
        true => join::split(to, writer, keyed)?,
        false => aggregate::split(to, writer)?,
    }))
}

/// Where a statement's channels go: the query's, numbered from `first`.
struct Channels<'a> {
    session: &'a Session,
    query_id: &'a str,
    first: usize,
    partitions: u32,
    idle_timeout: Option<Duration>,
}

/// Refuses a statement that cannot be repartitioned, saying why and what
/// would work.
fn refuse(why: impl std::fmt::Display) -> SluiceError {
    refuse_division(
        format!(
            "its GROUP BY is not on the record key, so its rows would go through a \
             repartition step, but {why}"
        ),
        Some("Add the record key `_key` (or `_partition`) to its GROUP BY"),
    )
}

/// What EXPLAIN adds for a statement that goes through a repartition
/// step under `settings`: its sub-topologies and the channels between (a
/// stacked statement's chain, each statement of it so). `plan` is the
/// statement planned undivided.
pub(crate) fn explain(
    writer: DataStreamWriter,
    plan: &IncrementalPlan,
    settings: &crate::QuerySettings,
) -> Result<String> {
    let session = writer.frame.session.clone();
    let id = settings
        .pipeline_name
        .clone()
        .unwrap_or_else(|| "<query id>".into());
    let to = |first| Channels {
        session: &session,
        query_id: &id,
        first,
        partitions: 0,
        idle_timeout: None,
    };
    if plan.stages.is_empty() {
        return Ok(explain_step(&to(0), writer, plan, &BTreeSet::new())?.0);
    }
    let chain = chain::unstack(&to(0), writer.output_mode(plan.mode))?;
    let mut out = format!(
        "chain: the statement stacks stateful operators; each under another runs as a \
         statement of its own, writing what it emits (closed windows) to {}, which the one \
         above reads back\n",
        chain.channels.join(" and ")
    );
    let mut channels = chain.channels.len();
    let last = chain.statements.len() - 1;
    for (i, statement) in chain.statements.into_iter().enumerate() {
        let planned = statement.plan()?;
        out.push_str(&match i == last {
            true => format!("-- chain statement {i}: the statement's outermost operator\n"),
            false => format!("-- chain statement {i}: writes {}\n", chain.channels[i]),
        });
        out.push_str(&statement.explain_plan(&planned));
        if needed(&planned) {
            let (step, count) = explain_step(&to(channels), statement, &planned, &chain.keyed)?;
            out.push_str(&step);
            channels += count;
        }
    }
    Ok(out)
}

/// [`explain`] of one statement with one stateful operator: its text, and
/// how many channels its step takes.
fn explain_step(
    to: &Channels,
    writer: DataStreamWriter,
    plan: &IncrementalPlan,
    keyed: &BTreeSet<String>,
) -> Result<(String, usize)> {
    let what = match plan.join.is_some() {
        true => "the join is",
        false => "the GROUP BY is",
    };
    let Split::Step(step) = split(to, writer, plan, keyed)? else {
        return Ok((
            "it reads only links of the chain already keyed by its key: no repartition step\n"
                .into(),
            0,
        ));
    };
    let mut out = format!(
        "repartition step: {what} not on the record key, so each task runs {} \
         sub-topologies joined by {}, committed in its one transaction\n",
        step.upstream.len() + 1,
        step.channels
    );
    for (i, upstream) in step.upstream.iter().enumerate() {
        let does = match (upstream.per_epoch, upstream.sends_watermarks) {
            (true, _) => {
                "aggregates each epoch's rows of its partition of the input per group, writes \
                 one partial row per group to the partition of its group key"
            }
            (false, false) => {
                "reads its partition of the input, writes each row to the partition of its key"
            }
            (false, true) => {
                "reads its partition of the input, writes each row to the partition of its \
                 key, then its watermark to every partition"
            }
        };
        out.push_str(&format!(
            "-- sub-topology {i}: {does}\n{}",
            upstream.explain_plan(&upstream.plan_with_keys("", None)?)
        ));
    }
    let aligned = match step.upstream.iter().any(|u| u.sends_watermarks) {
        true => ", its watermark the least of every upstream task's",
        false => "",
    };
    out.push_str(&format!(
        "-- sub-topology {}: reads its partition of each channel, {} it{aligned}\n{}",
        step.upstream.len(),
        match plan.join.is_some() {
            true => "joins",
            false => "aggregates",
        },
        step.downstream
            .explain_plan(&step.downstream.plan_with_keys("", None)?),
    ));
    Ok((out, step.upstream.len()))
}

/// A statement divided at its repartition step.
struct Step {
    /// Each reads an input, writes a channel.
    upstream: Vec<DataStreamWriter>,
    /// Reads the channels, aggregates or joins, writes the statement's
    /// sink.
    downstream: DataStreamWriter,
    /// The channels' names, formats and columns.
    channels: String,
}

/// One channel of a statement: the sub-topology that writes it, and what
/// reads it back.
struct Channel {
    upstream: DataStreamWriter,
    /// The stream that reads it back.
    stream: String,
    /// The channel read back, under the columns' names upstream read.
    restored: LogicalPlan,
    /// Its name, format and columns.
    description: String,
}

/// The channel `index` of `to` carrying `crossing` from `input` (of
/// `writer`'s statement): created through the input's connector, in the
/// same transaction as the statement's sink when it is the same connector.
/// `event_time` is the input's watermarked column.
fn channel(
    to: &Channels,
    writer: &DataStreamWriter,
    input: &StreamDefinition,
    crossing: Crossing,
    index: usize,
) -> Result<Channel> {
    let session = to.session;
    let event_time = input.watermark.as_ref().map(|w| w.column.as_str());
    let upstream_plan = crossing.upstream;
    let channel_schema = upstream_plan.schema().as_arrow().clone();
    // Downstream's window bounds are over the event time as it crossed.
    let channel_schema = match (&crossing.event_time, event_time) {
        (Some(carried), Some(original)) => crate::window::rename_time_column(
            &aligned::nullable(&channel_schema),
            original,
            carried,
        ),
        _ => Arc::new(channel_schema),
    };
    let connector = session.connectors().get(&input.connector)?;
    let sink = match &writer.sink {
        SinkChoice::Connector(name) if *name == input.connector => Some(writer.options.clone()),
        _ => None,
    };
    let channel = connector
        .repartition(RepartitionArgs {
            input: input.options.clone(),
            sink,
            query_id: to.query_id.to_string(),
            index,
            partitions: to.partitions,
            key_fields: crossing.key_fields,
            partition_field: crossing
                .event_time
                .as_ref()
                .map(|_| aligned::TO.to_string()),
        })?
        .ok_or_else(|| {
            refuse(format!(
                "connector '{}' of stream '{}' has no repartition channel",
                input.connector, input.name
            ))
        })?;
    let mut upstream = session
        .frame(upstream_plan)
        .write_stream()
        .format(&input.connector)
        .options(channel.sink.iter().map(|(k, v)| (k, v.to_string())))
        .query_name(&step_name(index));
    upstream.per_epoch = crossing.per_epoch;
    upstream.sends_watermarks = crossing.event_time.is_some();
    let watermark = crossing.event_time.map(|column| {
        WatermarkSpec::new(column, Duration::ZERO).aligned(Aligned {
            tasks: to.partitions,
            idle_timeout: to.idle_timeout,
        })
    });
    // The format is in the read-back stream's name, so in its offsets'
    // keys and the query's fingerprint: a restart that would read the
    // channel in another format than it was written in is refused.
    let stream = format!("{}-{}", step_name(index), channel.format);
    let read_back = session.read_definition(StreamDefinition {
        name: stream.clone(),
        connector: input.connector.clone(),
        options: channel.source,
        schema: Some(Arc::clone(&channel_schema)),
        watermark,
        late_sink: None,
        computed: Vec::new(),
    })?;
    let restored = LogicalPlanBuilder::from(read_back.logical_plan().clone())
        .project(crossing.restored)?
        .build()?;
    Ok(Channel {
        upstream,
        stream,
        restored,
        description: format!(
            "'{}' (one partition per task; {}: {})",
            channel.name,
            channel.format,
            crate::options::columns(&channel_schema)
        ),
    })
}

/// The columns the nodes of `plan` from `node` up read (`node`'s own
/// expressions included): what of its inputs must cross.
fn used_above(plan: &LogicalPlan, node: &LogicalPlan) -> BTreeSet<Column> {
    let mut used = BTreeSet::new();
    let stop = node;
    let _ = plan.apply(|node| {
        for e in node.expressions() {
            used.extend(e.column_refs().into_iter().cloned());
        }
        Ok(match node == stop {
            // Its inputs are what crosses.
            true => TreeNodeRecursion::Jump,
            false => TreeNodeRecursion::Continue,
        })
    });
    used
}

/// `plan` with its node `original` replaced by `by`, the nodes above it
/// re-planned over it.
fn replaced(plan: LogicalPlan, original: &LogicalPlan, by: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up(|node| {
            if &node == original {
                Ok(Transformed::yes(by.clone()))
            } else {
                node.recompute_schema().map(Transformed::yes)
            }
        })
        .map_err(SluiceError::from)?
        .data)
}

/// Whether an event-time column can cross under its own name: not a
/// connector's own column (`_timestamp`) nor one of the channel's.
fn own_name(name: &str) -> bool {
    let generated = |prefix: char| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    !name.starts_with('_')
        && ![aligned::FROM, aligned::WATERMARK, aligned::TO].contains(&name)
        && !['c', 'k', 'p', 's', 'n'].into_iter().any(generated)
}

/// What crosses a repartition step, and how the other side reads it.
struct Crossing {
    /// The upstream sub-topology's plan: its output is the channel's rows.
    upstream: LogicalPlan,
    /// Whether upstream runs over each epoch's rows alone (it
    /// pre-aggregates).
    per_epoch: bool,
    /// The channel's columns that make the key (the message key).
    key_fields: Vec<String>,
    /// Downstream's projection of the channel's columns.
    restored: Vec<Expr>,
    /// Over event time, the channel column carrying the rows' event time
    /// (the upstream output then ends with the watermark rows' columns).
    event_time: Option<String>,
}

/// Channel column `name`, as upstream writes it and downstream reads it:
/// the channel carries every type exactly (see `Connector::repartition`).
fn channel_column(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// The streams `plan` reads, in the order it reads them.
fn streams(plan: &LogicalPlan) -> Result<Vec<StreamDefinition>> {
    let mut found = Vec::new();
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let provider = source_as_provider(&scan.source)?;
            if let Some(table) = as_stream_table(&provider) {
                found.push(table.definition().clone());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// The one stream `plan` reads.
fn input_stream(plan: &LogicalPlan) -> Result<StreamDefinition> {
    match <[_; 1]>::try_from(streams(plan)?) {
        Ok([one]) => Ok(one),
        Err(_) => Err(refuse("it reads several streams")),
    }
}
