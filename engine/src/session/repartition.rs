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
//! 1. **upstream**: each task reads its partition of `bids`, evaluates the
//!    group key and the columns the aggregates need, and writes them to a
//!    channel the input's connector provides (a Kafka topic of the query's
//!    task count, `…-repartition-<n>`), keyed by the group key, so that all
//!    of a group's rows reach one partition of it;
//! 2. **downstream**: task *i* reads partition *i* of the channel and
//!    aggregates it, as the statement did.
//!
//! Both run in every task and commit in its one transaction: the rows a
//! task wrote to the channel, the channel offsets it read and its output
//! commit together, so the hop is exactly once. Downstream reads only what
//! upstream tasks have committed (`read_committed`), so a row crosses in
//! the epoch after the one that read it. Once a task has committed past a
//! channel record, the record is deleted.
//!
//! Not yet: event-time windows and watermarks through the channel (each
//! upstream task's watermark would have to reach every downstream task),
//! stacked stateful operators and joins.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::logical_expr::{cast, Aggregate, Distinct, Expr, LogicalPlan, LogicalPlanBuilder};

use super::frame::DataStreamWriter;
use super::Session;
use crate::connector::RepartitionArgs;
use crate::error::{Result, SluiceError};
use crate::launch::SinkChoice;
use crate::planner::IncrementalPlan;
use crate::table::{as_stream_table, StreamDefinition};

/// A channel's stream name (and its statements' checkpoint keys).
fn step_name(index: usize) -> String {
    format!("repartition-{index}")
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
        let step = split(session, writer, query_id, steps, partitions)?;
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
    let step = split(&session, writer, &id, 0, 0)?;
    Ok(format!(
        "repartition step: the GROUP BY is not on the record key, so each task runs two \
         sub-topologies joined by '{}' (one partition per task), committed in its one \
         transaction\n-- sub-topology 0: reads its partition of the input, writes each row to the \
         partition of its group key\n{}-- sub-topology 1: reads its partition of '{}', aggregates \
         it\n{}",
        step.channel,
        step.upstream
            .explain_plan(&step.upstream.plan_with_keys("", None)?),
        step.channel,
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
    /// The channel's name.
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
) -> Result<Step> {
    let plan = writer.frame.logical_plan().clone();
    let (original, aggregate) = only_aggregate(&plan)?;
    let input = input_stream(&aggregate.input)?;
    if input.watermark.is_some() {
        return Err(refuse(format!(
            "stream '{}' has an event-time watermark, which cannot cross a repartition step yet",
            input.name
        )));
    }

    // What crosses: the columns the aggregates read and the group columns,
    // as `c<i>`, and each computed group key as its value, `k<j>` (names
    // that cannot clash with a connector's own columns). A column only a
    // computed key reads does not cross: downstream groups by the value.
    let mut needed: BTreeSet<Column> = BTreeSet::new();
    for e in aggregate.group_expr.iter().chain(&aggregate.aggr_expr) {
        if matches!(e, Expr::GroupingSet(_)) {
            return Err(refuse("it has GROUPING SETS, ROLLUP or CUBE"));
        }
    }
    for e in &aggregate.aggr_expr {
        needed.extend(e.column_refs().into_iter().cloned());
    }
    for g in &aggregate.group_expr {
        if let Expr::Column(c) = g.clone().unalias() {
            needed.insert(c);
        }
    }
    let needed: Vec<Column> = aggregate
        .input
        .schema()
        .columns()
        .into_iter()
        .filter(|c| needed.contains(c))
        .collect();
    let carried = |c: &Column| needed.iter().position(|n| n == c).map(|i| format!("c{i}"));
    let input_schema = aggregate.input.schema();
    // The channel is JSON, which has no NaN or infinity: a float crosses
    // as its text (shortest exact form, "NaN", "inf"), read back exactly.
    let float = |c: &Column| {
        input_schema
            .qualified_field_from_column(c)
            .map(|(_, f)| f)
            .is_ok_and(|f| f.data_type().is_floating())
    };
    let mut crossing: Vec<Expr> = needed
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let column = Expr::Column(c.clone());
            match float(c) {
                true => cast(column, DataType::Utf8).alias(format!("c{i}")),
                false => column.alias(format!("c{i}")),
            }
        })
        .collect();
    let mut key_fields = Vec::new();
    // Downstream's group keys: a group column as itself, a computed key
    // as the value that crossed, under the name the nodes above read.
    let mut regroup = Vec::with_capacity(aggregate.group_expr.len());
    let mut computed = Vec::new();
    for (j, g) in aggregate.group_expr.iter().enumerate() {
        match g.clone().unalias() {
            Expr::Column(c) if carried(&c).is_some() => {
                key_fields.extend(carried(&c));
                regroup.push(g.clone());
            }
            other => {
                let (relation, name) = g.qualified_name();
                crossing.push(other.alias(format!("k{j}")));
                key_fields.push(format!("k{j}"));
                computed.push(Expr::Column(Column::from_name(format!("k{j}"))));
                regroup.push(
                    Expr::Column(Column::from_name(format!("k{j}")))
                        .alias_qualified(relation, name),
                );
            }
        }
    }
    let upstream_plan = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
        .project(crossing)?
        .build()?;
    let channel_schema = Arc::new(upstream_plan.schema().as_arrow().clone());

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
            key_fields,
        })?
        .ok_or_else(|| {
            refuse(format!(
                "connector '{}' of stream '{}' has no repartition channel",
                input.connector, input.name
            ))
        })?;

    let upstream = session
        .frame(upstream_plan)
        .write_stream()
        .format(&input.connector)
        .options(channel.sink.iter().map(|(k, v)| (k, v.to_string())))
        .query_name(&step_name(index));

    let read_back = session.read_definition(StreamDefinition {
        name: step_name(index),
        connector: input.connector.clone(),
        options: channel.source,
        schema: Some(channel_schema),
        watermark: None,
        late_sink: None,
        computed: Vec::new(),
    })?;
    let mut restored: Vec<Expr> = needed
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let column = Expr::Column(Column::from_name(format!("c{i}")));
            let column = match input_schema.qualified_field_from_column(c).map(|(_, f)| f) {
                Ok(f) if f.data_type().is_floating() => cast(column, f.data_type().clone()),
                _ => column,
            };
            column.alias_qualified(c.relation.clone(), c.name.clone())
        })
        .collect();
    restored.extend(computed);
    let new_input = LogicalPlanBuilder::from(read_back.logical_plan().clone())
        .project(restored)?
        .build()?;
    let regrouped = match &original {
        LogicalPlan::Distinct(_) => LogicalPlan::Distinct(Distinct::All(Arc::new(new_input))),
        _ => LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(new_input),
            regroup,
            aggregate.aggr_expr.clone(),
        )?),
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
        channel: channel.name,
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray, Float64Array};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{DataType, Float64Type};

    /// What a float becomes on the channel and back: the same bits, NaN
    /// and the infinities included (JSON numbers would make them null).
    #[test]
    fn a_float_crosses_the_channel_as_text_exactly() {
        let values = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.1,
            1e308,
            f64::MIN_POSITIVE,
            5e-324,
            -123456.789e-30,
        ];
        let floats = Float64Array::from(values.to_vec());
        let text = cast(&floats, &DataType::Utf8).unwrap();
        let back = cast(&text, &DataType::Float64).unwrap();
        let back = back.as_primitive::<Float64Type>();
        assert_eq!(back.null_count(), 0);
        for (i, v) in values.iter().enumerate() {
            let got = back.value(i);
            assert!(
                got.to_bits() == v.to_bits() || (got.is_nan() && v.is_nan()),
                "{v} came back as {got} (text {:?})",
                text.as_string::<i32>().value(i)
            );
        }
    }
}
