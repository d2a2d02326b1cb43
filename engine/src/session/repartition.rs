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
//! Not yet: stacked stateful operators and joins.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    cast, Aggregate, Distinct, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder,
};

use super::frame::DataStreamWriter;
use super::Session;
use crate::connector::RepartitionArgs;
use crate::error::{Result, SluiceError};
use crate::launch::SinkChoice;
use crate::planner::IncrementalPlan;
use crate::table::{as_stream_table, StreamDefinition};
use crate::watermark::{aligned, Aligned, WatermarkSpec};

/// A channel's stream name (and its statements' checkpoint keys).
fn step_name(index: usize) -> String {
    format!("repartition-{index}")
}

/// Which repartition step's channel the input of checkpoint key `key`
/// reads (`<position>:repartition-<n>-<format>`, after its statement's
/// prefix), if it reads one: how `sluice verify` tells a divided query's
/// channels from its inputs.
///
/// ```
/// use sluice_engine::repartition_step_of;
/// assert_eq!(repartition_step_of("1.counts/0:repartition-2-avro"), Some(2));
/// assert_eq!(repartition_step_of("0.repartition-0/0:bids"), None);
/// ```
pub fn repartition_step_of(key: &str) -> Option<usize> {
    let (_, stream) = key.rsplit_once(':')?;
    stream
        .strip_prefix("repartition-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether `plan`, divided by partition, needs a repartition step: it
/// groups by columns that do not decide a record's partition.
pub(crate) fn needed(plan: &IncrementalPlan) -> bool {
    plan.aggregate
        .as_ref()
        .is_some_and(|a| !crate::planner::keyed_by_partition(&a.aggregate))
}

/// `writers` (planned undivided as `plans`) for a query divided into
/// `partitions` tasks: each statement that [`needs`](needed) a repartition
/// step replaced by its two sub-topologies, upstream then downstream; the
/// others as they are. `query_id` names the channels.
pub(crate) fn divide(
    session: &Session,
    writers: Vec<DataStreamWriter>,
    plans: &[IncrementalPlan],
    query_id: &str,
    partitions: u32,
    idle_timeout: Option<Duration>,
) -> Result<Vec<DataStreamWriter>> {
    let mut divided = Vec::with_capacity(writers.len() + 1);
    let mut steps = 0;
    for (writer, plan) in writers.into_iter().zip(plans) {
        if !needed(plan) {
            divided.push(writer);
            continue;
        }
        // The same output mode as undivided, though the regrouped plan
        // might derive another (`SELECT DISTINCT` is append).
        let writer = writer.output_mode(plan.mode);
        let step = split(session, writer, query_id, steps, partitions, idle_timeout)?;
        tracing::info!(channel = %step.channel, partitions, "repartition step");
        divided.extend([step.upstream, step.downstream]);
        steps += 1;
    }
    Ok(divided)
}

/// Refuses a statement that cannot be repartitioned, saying why and what
/// would work.
fn refuse(why: impl std::fmt::Display) -> SluiceError {
    SluiceError::config(format!(
        "'tasks' = 'per-partition' cannot divide this query: its GROUP BY is not on the \
         record key, so its rows would go through a repartition step, but {why}. Add the \
         record key `_key` (or `_partition`) to its GROUP BY, or run it as one task \
         (SET 'tasks' = '1')"
    ))
}

/// What EXPLAIN adds for a statement that goes through a repartition
/// step under `settings`: its two sub-topologies and the channel between.
/// `plan` is the statement planned undivided.
pub(crate) fn explain(
    writer: DataStreamWriter,
    plan: &IncrementalPlan,
    settings: &crate::QuerySettings,
) -> Result<String> {
    let session = writer.frame.session.clone();
    let writer = writer.output_mode(plan.mode);
    let id = settings
        .pipeline_name
        .clone()
        .unwrap_or_else(|| "<query id>".into());
    let step = split(&session, writer, &id, 0, 0, None)?;
    let upstream = match (step.upstream.per_epoch, step.upstream.sends_watermarks) {
        (true, _) => {
            "aggregates each epoch's rows of its partition of the input per group, writes one \
             partial row per group to the partition of its group key"
        }
        (false, false) => {
            "reads its partition of the input, writes each row to the partition of its group key"
        }
        (false, true) => {
            "reads its partition of the input, writes each row to the partition of its group \
             key, then its watermark to every partition"
        }
    };
    let downstream = match step.upstream.sends_watermarks {
        true => ", its watermark the least of every upstream task's",
        false => "",
    };
    Ok(format!(
        "repartition step: the GROUP BY is not on the record key, so each task runs two \
         sub-topologies joined by {}, committed in its one \
         transaction\n-- sub-topology 0: {upstream}\n{}-- sub-topology 1: reads its partition of \
         the channel, aggregates it{downstream}\n{}",
        step.channel,
        step.upstream
            .explain_plan(&step.upstream.plan_with_keys("", None)?),
        step.downstream
            .explain_plan(&step.downstream.plan_with_keys("", None)?),
    ))
}

/// A statement divided at its repartition step.
struct Step {
    /// Reads the input, writes the channel.
    upstream: DataStreamWriter,
    /// Reads the channel, aggregates, writes the statement's sink.
    downstream: DataStreamWriter,
    /// The channel's name, format and columns.
    channel: String,
}

/// A statement's upstream and downstream sub-topologies (see the module
/// documentation); `index` numbers its channel.
fn split(
    session: &Session,
    writer: DataStreamWriter,
    query_id: &str,
    index: usize,
    partitions: u32,
    idle_timeout: Option<Duration>,
) -> Result<Step> {
    let plan = writer.frame.logical_plan().clone();
    let (original, aggregate) = only_aggregate(&plan)?;
    let input = input_stream(&aggregate.input)?;
    for e in aggregate.group_expr.iter().chain(&aggregate.aggr_expr) {
        if matches!(e, Expr::GroupingSet(_)) {
            return Err(refuse("it has GROUPING SETS, ROLLUP or CUBE"));
        }
    }
    // Per-epoch partials cannot say which of their rows were late: over
    // event time, the rows cross.
    let crossing = match (&original, &input.watermark) {
        (LogicalPlan::Aggregate(_), None) => pre_aggregated(&aggregate)?,
        _ => None,
    };
    let event_time = input.watermark.as_ref().map(|w| w.column.as_str());
    let crossing = match crossing {
        Some(c) => c,
        None => row_by_row(&aggregate, event_time)?,
    };
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
            query_id: query_id.to_string(),
            index,
            partitions,
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
            tasks: partitions,
            idle_timeout,
        })
    });

    // The format is in the read-back stream's name, so in its offsets'
    // keys and the query's fingerprint: a restart that would read the
    // channel in another format than it was written in is refused.
    let read_back = session.read_definition(StreamDefinition {
        name: format!("{}-{}", step_name(index), channel.format),
        connector: input.connector.clone(),
        options: channel.source,
        schema: Some(Arc::clone(&channel_schema)),
        watermark,
        late_sink: None,
        computed: Vec::new(),
    })?;
    let new_input = LogicalPlanBuilder::from(read_back.logical_plan().clone())
        .project(crossing.restored)?
        .build()?;
    let regrouped = match &original {
        LogicalPlan::Distinct(_) => LogicalPlan::Distinct(Distinct::All(Arc::new(new_input))),
        _ => LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(new_input),
            crossing.group,
            crossing.aggr,
        )?),
    };
    let regrouped = match crossing.finish {
        Some(exprs) => LogicalPlanBuilder::from(regrouped)
            .project(exprs)?
            .build()?,
        None => regrouped,
    };
    let downstream_plan = plan
        .transform_up(|node| {
            if node == original {
                Ok(Transformed::yes(regrouped.clone()))
            } else {
                node.recompute_schema().map(Transformed::yes)
            }
        })
        .map_err(SluiceError::from)?
        .data;
    let downstream = writer.with_frame(session.frame(downstream_plan));
    Ok(Step {
        upstream,
        downstream,
        channel: format!(
            "'{}' (one partition per task; {}: {})",
            channel.name,
            channel.format,
            crate::options::columns(&channel_schema)
        ),
    })
}

/// What crosses a repartition step, and how each side reads it.
struct Crossing {
    /// The upstream sub-topology's plan: its output is the channel's rows.
    upstream: LogicalPlan,
    /// Whether upstream runs over each epoch's rows alone (it
    /// pre-aggregates).
    per_epoch: bool,
    /// The channel's columns that make the group key (the message key).
    key_fields: Vec<String>,
    /// Downstream's projection of the channel's columns.
    restored: Vec<Expr>,
    /// Downstream's group keys and aggregates, under the names the nodes
    /// above the statement's aggregation read.
    group: Vec<Expr>,
    aggr: Vec<Expr>,
    /// A projection over downstream's aggregation giving the statement's
    /// aggregates from merged partials (an `avg` from its sum and count),
    /// when one needs it.
    finish: Option<Vec<Expr>>,
    /// Over event time, the channel column carrying the rows' event time
    /// (the upstream output then ends with the watermark rows' columns).
    event_time: Option<String>,
}

/// Channel column `name`, as upstream writes it and downstream reads it:
/// the channel carries every type exactly (see `Connector::repartition`).
fn channel_column(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// Each epoch's rows aggregated per group upstream (Flink's local-global
/// aggregation): one partial row per group, task and epoch crosses, and
/// downstream merges the partials (a count's by summing them, a sum's,
/// min's and max's by their own function, an avg from its sum and count).
/// `None` when an aggregate does not merge so (DISTINCT, FILTER, ORDER BY,
/// a decimal sum or avg whose precision would grow, anything but count,
/// sum, min, max and avg) or the input is a changelog: then the rows
/// cross as they are.
fn pre_aggregated(aggregate: &Aggregate) -> Result<Option<Crossing>> {
    let schema = aggregate.input.schema();
    let changes = schema
        .fields()
        .iter()
        .any(|f| f.name() == crate::CHANGELOG_SIGN || f.name() == crate::UPSERT_DELETED);
    if changes {
        return Ok(None);
    }
    let mut partials = Vec::new();
    let mut merged = Vec::new();
    let mut restored = Vec::new();
    // The statement's aggregates over the merged ones, by output name.
    let mut finished = Vec::new();
    let mut averaged = false;
    // Partial `name` of `partial` crosses, and downstream merges it with
    // `merge` under `output`.
    let mut cross = |partial: Expr, name: String, merge, output: Column| {
        partials.push(partial.alias(&name));
        restored.push(channel_column(&name));
        let call = AggregateFunction::new_udf(
            merge,
            vec![channel_column(&name)],
            false,
            None,
            Vec::new(),
            None,
        );
        merged.push(Expr::AggregateFunction(call).alias_qualified(output.relation, output.name));
    };
    for (m, e) in aggregate.aggr_expr.iter().enumerate() {
        let Expr::AggregateFunction(f) = e.clone().unalias() else {
            return Ok(None);
        };
        let p = &f.params;
        if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
            return Ok(None);
        }
        // Sums of integers and floats only: a decimal sum's precision
        // would grow with each merge.
        let numeric = match p.args.as_slice() {
            [arg] => {
                let t = arg.get_type(schema)?;
                t.is_integer() || t.is_floating()
            }
            _ => false,
        };
        let (relation, output) = e.qualified_name();
        let named = Column::new(relation.clone(), output.clone());
        let merge = match f.func.name() {
            "count" => sum_udaf(),
            "sum" if numeric => sum_udaf(),
            "min" => min_udaf(),
            "max" => max_udaf(),
            "avg" if numeric => {
                // Its sum and count cross; the division comes after the
                // merge, in double precision as `avg` itself computes.
                let arg = p.args[0].clone();
                let (sum, count) = (format!("s{m}"), format!("n{m}"));
                let summed = Column::from_name(format!("__sum_{m}"));
                let counted = Column::from_name(format!("__count_{m}"));
                cross(
                    datafusion::functions_aggregate::expr_fn::sum(arg.clone()),
                    sum,
                    sum_udaf(),
                    summed.clone(),
                );
                cross(
                    datafusion::functions_aggregate::expr_fn::count(arg),
                    count,
                    sum_udaf(),
                    counted.clone(),
                );
                let double = |c: Column| cast(Expr::Column(c), DataType::Float64);
                finished.push((double(summed) / double(counted)).alias_qualified(relation, output));
                averaged = true;
                continue;
            }
            _ => return Ok(None),
        };
        cross(e.clone().unalias(), format!("p{m}"), merge, named.clone());
        finished.push(Expr::Column(named));
    }
    let mut keys = Vec::new();
    let mut key_fields = Vec::new();
    let mut group = Vec::new();
    let mut passed = Vec::new();
    for (j, g) in aggregate.group_expr.iter().enumerate() {
        let name = format!("k{j}");
        keys.push(g.clone().unalias().alias(&name));
        restored.push(channel_column(&name));
        let (relation, output) = g.qualified_name();
        passed.push(Expr::Column(Column::new(relation.clone(), output.clone())));
        group.push(Expr::Column(Column::from_name(&name)).alias_qualified(relation, output));
        key_fields.push(name);
    }
    let upstream = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
        .aggregate(keys, partials)?
        .build()?;
    Ok(Some(Crossing {
        upstream,
        per_epoch: true,
        key_fields,
        restored,
        group,
        aggr: merged,
        finish: averaged.then(|| passed.into_iter().chain(finished).collect()),
        event_time: None,
    }))
}

/// Every row crosses: the columns the aggregates read and the group
/// columns, as `c<i>`, and each computed group key as its value, `k<j>`
/// (names that cannot clash with a connector's own columns). A column only
/// a computed key reads does not cross: downstream groups by the value.
/// Over event time (`event_time`, the input's watermarked column), that
/// column crosses too, and the watermark rows' columns follow.
fn row_by_row(aggregate: &Aggregate, event_time: Option<&str>) -> Result<Crossing> {
    let mut needed: BTreeSet<Column> = BTreeSet::new();
    for e in &aggregate.aggr_expr {
        needed.extend(e.column_refs().into_iter().cloned());
    }
    for g in &aggregate.group_expr {
        if let Expr::Column(c) = g.clone().unalias() {
            if event_time == Some(c.name.as_str()) {
                return Err(refuse(format!(
                    "it groups by the event-time column '{}' itself; group by a window of it \
                     (TUMBLE, HOP, CUMULATE) instead",
                    c.name
                )));
            }
            needed.insert(c);
        }
    }
    let input_schema = aggregate.input.schema();
    let timed = match event_time {
        Some(name) => {
            let column = input_schema
                .columns()
                .into_iter()
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    refuse(format!(
                        "its GROUP BY does not see the event-time column '{name}'; keep it in \
                         the rows the GROUP BY reads"
                    ))
                })?;
            needed.insert(column.clone());
            Some(column)
        }
        None => None,
    };
    let needed: Vec<Column> = input_schema
        .columns()
        .into_iter()
        .filter(|c| needed.contains(c))
        .collect();
    let carried = |c: &Column| needed.iter().position(|n| n == c).map(|i| format!("c{i}"));
    let mut crossing = Vec::with_capacity(needed.len());
    let mut restored = Vec::with_capacity(needed.len());
    for (i, c) in needed.iter().enumerate() {
        let name = format!("c{i}");
        crossing.push(Expr::Column(c.clone()).alias(&name));
        restored.push(channel_column(&name).alias_qualified(c.relation.clone(), c.name.clone()));
    }
    let mut key_fields = Vec::new();
    // Downstream's group keys: a group column as itself, a computed key
    // as the value that crossed, under the name the nodes above read.
    let mut group = Vec::with_capacity(aggregate.group_expr.len());
    for (j, g) in aggregate.group_expr.iter().enumerate() {
        match g.clone().unalias() {
            Expr::Column(c) if carried(&c).is_some() => {
                key_fields.extend(carried(&c));
                group.push(g.clone());
            }
            other => {
                let (relation, name) = g.qualified_name();
                crossing.push(other.alias(format!("k{j}")));
                key_fields.push(format!("k{j}"));
                restored.push(channel_column(&format!("k{j}")));
                group.push(channel_column(&format!("k{j}")).alias_qualified(relation, name));
            }
        }
    }
    let event_time = timed.as_ref().and_then(carried);
    if event_time.is_some() {
        crossing.extend(aligned::columns());
    }
    let upstream = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
        .project(crossing)?
        .build()?;
    Ok(Crossing {
        upstream,
        per_epoch: false,
        key_fields,
        restored,
        group,
        aggr: aggregate.aggr_expr.clone(),
        finish: None,
        event_time,
    })
}

/// The statement's one GROUP BY (a statement with several is refused
/// before this, as stacked stateful operators): the node, and it as an
/// aggregation (`SELECT DISTINCT` groups by every column).
fn only_aggregate(plan: &LogicalPlan) -> Result<(LogicalPlan, Aggregate)> {
    let mut found = Vec::new();
    plan.apply(|node| {
        match node {
            LogicalPlan::Aggregate(a) => found.push((node.clone(), a.clone())),
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let columns = input.schema().columns().into_iter().map(Expr::Column);
                let a = Aggregate::try_new(Arc::clone(input), columns.collect(), Vec::new())?;
                found.push((node.clone(), a));
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match <[_; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) if found.is_empty() => Err(refuse("its grouping is not an aggregation")),
        Err(_) => Err(refuse("it has several GROUP BYs")),
    }
}

/// The one stream `plan` reads.
fn input_stream(plan: &LogicalPlan) -> Result<StreamDefinition> {
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
    match <[_; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(_) => Err(refuse("it reads several streams")),
    }
}
