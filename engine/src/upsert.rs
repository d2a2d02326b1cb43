//! Upsert streams: a source whose rows are each key's latest value, a
//! delete marking a key gone (Flink's `upsert-kafka`, a compacted topic).
//!
//! Such a source marks its key columns in their field metadata
//! ([`KEY_METADATA`]) and each row with [`DELETED`]: `false` for a key's
//! new value, `true` for its deletion (the key columns set, the others
//! null). It gives every record as a row, in the order of its partition:
//! a key may change several times in one epoch, and its last row decides.
//!
//! A query over it keeps the keys and their values as they are, and is a
//! stateless view of the table: [`plan`] carries the marker through its
//! projections, the output is in update mode keyed by the key columns,
//! and each epoch's rows [`split`] into the values to upsert and the keys
//! to delete, which an upsert sink (Kafka: a tombstone) deletes.
//!
//! A filter keeps the table a table without any state: a key's new value
//! that fails it deletes the key downstream, since its previous value may
//! have passed (a compacted reader sees the last value per key where the
//! filter holds; a key that never passed gets a tombstone it did not need,
//! which a compacted topic drops). An aggregation, a Top-N or a join with another
//! stream over an upsert stream reads its changes instead, made by
//! `operator::normalize` from each key's previous value (Flink's
//! ChangelogNormalize); a join with a static table is refused.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Column;
use datafusion::functions::core::expr_fn::coalesce;
use datafusion::logical_expr::{lit, not, Expr, Filter, LogicalPlan, Projection};

use crate::error::{Result, SluiceError};
use crate::operator::changelog::SIGN;
use crate::sink::EpochOutput;

/// The column marking a row of an upsert stream as its key's deletion.
pub const DELETED: &str = "__sluice_deleted";

/// The field metadata key (value `"true"`) marking an upsert stream's key
/// columns.
pub const KEY_METADATA: &str = "sluice.key";

/// How a query over an upsert stream writes its output.
#[derive(Debug, Clone)]
pub(crate) struct UpsertOutput {
    /// The position of [`DELETED`] in the plan's output.
    pub marker: usize,
    /// The positions of the plan's output columns the sink gets: all but
    /// the marker and a changelog's sign.
    pub columns: Vec<usize>,
    /// The positions of the key columns in the output without the marker.
    pub keys: Vec<usize>,
    /// The output without the marker: what the sink gets.
    pub schema: SchemaRef,
    /// The key columns' names.
    pub key_columns: Vec<String>,
}

/// Whether `f` is one of an upsert stream's (or keyed changelog's) key
/// columns ([`KEY_METADATA`]).
pub(crate) fn is_key_column(f: &datafusion::arrow::datatypes::Field) -> bool {
    f.metadata().get(KEY_METADATA).map(String::as_str) == Some("true")
}

pub(crate) fn is_upsert_scan(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::TableScan(s) if s.source.schema().field_with_name(DELETED).is_ok())
}

/// Whether `plan` gives an upsert stream's rows: its scan, or a keyed
/// changelog's changes read as upserts ([`changes_as_upserts`]).
fn is_upsert_source(plan: &LogicalPlan) -> bool {
    is_upsert_scan(plan) || is_changes_as_upserts(plan)
}

/// Whether `plan` is the projection [`changes_as_upserts`] puts over a
/// changelog scan.
pub(crate) fn is_changes_as_upserts(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Projection(p)
        if p.schema.field_with_unqualified_name(DELETED).is_ok()
            && matches!(p.input.as_ref(), LogicalPlan::TableScan(s)
                if s.source.schema().field_with_name(SIGN).is_ok()))
}

/// A query that reads a changelog (a Debezium stream) whose key is
/// declared ('key.fields', marked [`KEY_METADATA`]), and has no stateful
/// operator: each changelog scan becomes its changes read as an upsert
/// stream's rows — a row added is its key's new value, a row taken back
/// its key's deletion — so that a copy or filter of it is a table keyed
/// by its key, as one of an upsert stream is. The last change of a key in
/// an epoch decides ([`split`]): an update's old row and new row leave the
/// new one, a delete the deletion. Other plans come back as they are.
pub(crate) fn changes_as_upserts(plan: LogicalPlan) -> Result<LogicalPlan> {
    let keyed = |p: &LogicalPlan| {
        matches!(p, LogicalPlan::TableScan(s) if {
            let schema = s.source.schema();
            schema.field_with_name(SIGN).is_ok()
                && schema.fields().iter().any(|f| is_key_column(f))
        })
    };
    Ok(plan
        .transform_up(|p| {
            if !keyed(&p) {
                return Ok(Transformed::no(p));
            }
            let schema = Arc::clone(p.schema());
            // The sign stays, for a `*` above to name; the output leaves it
            // out.
            let mut exprs: Vec<Expr> = schema
                .iter()
                .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
                .collect();
            let (q, sign) = schema.qualified_field_with_unqualified_name(SIGN)?;
            exprs.push(
                Expr::Column(Column::new(q.cloned(), sign.name()))
                    .lt(lit(0i64))
                    .alias(DELETED),
            );
            let projection = Projection::try_new(exprs, Arc::new(p))?;
            Ok(Transformed::yes(LogicalPlan::Projection(projection)))
        })?
        .data)
}

/// For a plan reading an upsert stream: the plan with [`DELETED`] carried
/// to its output, and how to write that output; `None` for other plans.
pub(crate) fn plan(plan: &LogicalPlan) -> Result<Option<(LogicalPlan, UpsertOutput)>> {
    if !plan.exists(|p| Ok(is_upsert_source(p)))? {
        return Ok(None);
    }
    let refuse = |what: &str| {
        SluiceError::plan(format!(
            "this query cannot run: it {what} an upsert stream (connector 'upsert-kafka'), \
             whose rows are each key's latest value; Sluice copies, filters, aggregates \
             (GROUP BY), ranks (a Top-N) and joins with another stream such a stream, and \
             does not join one with a static table yet. Read the topic with connector \
             'kafka' to take its messages as plain rows"
        ))
    };
    if plan.exists(|p| Ok(matches!(p, LogicalPlan::Join(_))))? {
        return Err(refuse("joins"));
    }
    let mut problem = None;
    plan.apply(|p| {
        if is_changes_as_upserts(p) {
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Jump);
        }
        let what = match p {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::TableScan(_) => None,
            _ => Some("transforms"),
        };
        if let Some(what) = what {
            problem = Some(refuse(what));
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    if let Some(problem) = problem {
        return Err(problem);
    }
    let carried = carry_marker(plan.clone())?;
    let output = carried.schema().as_arrow().clone();
    let marker = output.index_of(DELETED)?;
    let rest: Vec<usize> = (0..output.fields().len())
        .filter(|&i| i != marker && output.field(i).name() != SIGN)
        .collect();
    let schema = Arc::new(output.project(&rest)?);
    // The output columns that are the stream's key columns, passed through.
    let key_names = key_names(&carried);
    let keys: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| key_names.contains(f.name()))
        .map(|(i, _)| i)
        .collect();
    if keys.len() != key_names.len() {
        return Err(SluiceError::plan(format!(
            "this query cannot run: it leaves out key columns of an upsert stream ({}); \
             select every key column, unrenamed, so that each key's value and deletion \
             reach the same key downstream",
            key_names.join(", ")
        )));
    }
    let key_columns = keys
        .iter()
        .map(|&i| schema.field(i).name().clone())
        .collect();
    Ok(Some((
        carried,
        UpsertOutput {
            marker,
            columns: rest,
            keys,
            schema,
            key_columns,
        },
    )))
}

/// `plan` (projections and filters over upsert streams) with [`DELETED`]
/// carried to its output: each projection passes the marker on, and each
/// filter marks what it would drop as its key's deletion.
pub(crate) fn carry_marker(plan: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up(|p| {
            if let LogicalPlan::Filter(filter) = &p {
                return Ok(Transformed::yes(deleting(filter)?));
            }
            let LogicalPlan::Projection(projection) = &p else {
                return Ok(Transformed::no(p));
            };
            if projection
                .schema
                .field_with_unqualified_name(DELETED)
                .is_ok()
            {
                return Ok(Transformed::no(p));
            }
            let (qualifier, field) = projection
                .input
                .schema()
                .qualified_field_with_unqualified_name(DELETED)?;
            let mut exprs = projection.expr.clone();
            exprs.push(Expr::Column(Column::new(qualifier.cloned(), field.name())));
            let projection = Projection::try_new(exprs, Arc::clone(&projection.input))?;
            Ok(Transformed::yes(LogicalPlan::Projection(projection)))
        })?
        .data)
}

/// A filter over an upsert stream as the projection that passes every row
/// and marks those it would drop as their key's deletion.
fn deleting(filter: &Filter) -> datafusion::error::Result<LogicalPlan> {
    let input = filter.input.schema();
    let exprs = input
        .iter()
        .map(|(qualifier, field)| {
            let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
            if field.name() != DELETED {
                return column;
            }
            // A predicate that is null drops the row, as WHERE does.
            let fails = not(coalesce(vec![filter.predicate.clone(), lit(false)]));
            column
                .or(fails)
                .alias_qualified(qualifier.cloned(), DELETED)
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::clone(&filter.input),
    )?))
}

/// The names of the upsert streams' key columns in the plan's scans.
pub(crate) fn key_names(plan: &LogicalPlan) -> Vec<String> {
    let mut names = Vec::new();
    let _ = plan.apply(|p| {
        if let LogicalPlan::TableScan(s) = p {
            // An upsert stream, or a changelog read as one.
            if is_upsert_scan(p) || s.source.schema().field_with_name(SIGN).is_ok() {
                names.extend(
                    s.source
                        .schema()
                        .fields()
                        .iter()
                        .filter(|f| is_key_column(f))
                        .map(|f| f.name().clone()),
                );
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    names
}

/// An epoch's rows (with the marker) as the values to upsert and the keys
/// to delete: of each key's rows the last decides, so a key deleted and
/// given a value again in one epoch ends with the value, and one given a
/// value and then deleted ends deleted (an upsert sink writes the values
/// before the deletions).
pub(crate) fn split(batches: Vec<RecordBatch>, output: &UpsertOutput) -> Result<EpochOutput> {
    let Some(first) = batches.first() else {
        return Ok(EpochOutput::default());
    };
    let all = datafusion::arrow::compute::concat_batches(&first.schema(), &batches)?;
    let values = all.project(&output.columns)?;
    let keys = values.project(&output.keys)?;
    let encoded =
        crate::state::row_converter(keys.schema().fields().iter().map(|f| f.data_type()))?
            .convert_columns(keys.columns())?;
    let mut last: foldhash::HashMap<&[u8], usize> = foldhash::HashMap::default();
    for (i, key) in encoded.iter().enumerate() {
        last.insert(key.data(), i);
    }
    let marker = all.column(output.marker).as_boolean_opt().ok_or_else(|| {
        SluiceError::Internal("an upsert stream's deletion marker is not boolean".into())
    })?;
    let is_last = |i: usize| last.get(encoded.row(i).data()) == Some(&i);
    let deleted = |i: usize| marker.is_valid(i) && marker.value(i);
    let kept: BooleanArray = (0..all.num_rows())
        .map(|i| Some(is_last(i) && !deleted(i)))
        .collect();
    let gone: BooleanArray = (0..all.num_rows())
        .map(|i| Some(is_last(i) && deleted(i)))
        .collect();
    let kept = filter_record_batch(&values, &kept)?;
    let rows = match kept.num_rows() {
        0 => Vec::new(),
        _ => vec![RecordBatch::try_new(
            Arc::clone(&output.schema),
            kept.columns().to_vec(),
        )?],
    };
    let gone = filter_record_batch(&keys, &gone)?;
    let retracted = (gone.num_rows() > 0).then_some(gone);
    Ok(EpochOutput { rows, retracted })
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// Rows `(k, v, deleted)` in one batch each, as a plan over an upsert
    /// stream gives them, split for the sink.
    fn split_rows(rows: &[(&str, i64, bool)]) -> EpochOutput {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
            Field::new(DELETED, DataType::Boolean, false),
        ]));
        let batches = rows
            .iter()
            .map(|(k, v, deleted)| {
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(StringArray::from(vec![*k])),
                        Arc::new(Int64Array::from(vec![*v])),
                        Arc::new(BooleanArray::from(vec![*deleted])),
                    ],
                )
                .unwrap()
            })
            .collect();
        let output = UpsertOutput {
            marker: 2,
            columns: vec![0, 1],
            keys: vec![0],
            schema: Arc::new(schema.project(&[0, 1]).unwrap()),
            key_columns: vec!["k".into()],
        };
        split(batches, &output).unwrap()
    }

    fn keys(batch: Option<&RecordBatch>) -> Vec<String> {
        batch
            .map(|b| {
                b.column(0)
                    .as_string::<i32>()
                    .iter()
                    .map(|k| k.unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_last_row_of_a_key_in_an_epoch_decides() {
        // Deleted, then given a value again: the value stays.
        let out = split_rows(&[("a", 0, true), ("a", 2, false), ("b", 1, false)]);
        assert_eq!(keys(out.rows.first()), ["a", "b"]);
        assert!(out.retracted.is_none());
        let values = out.rows[0]
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(values.values().to_vec(), [2, 1]);
        // Given a value, then deleted: deleted, the value not written.
        let out = split_rows(&[("a", 2, false), ("b", 1, false), ("a", 0, true)]);
        assert_eq!(keys(out.rows.first()), ["b"]);
        assert_eq!(keys(out.retracted.as_ref()), ["a"]);
    }
}
