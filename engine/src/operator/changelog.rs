//! Changelogs between stateful operators: how an aggregation whose rows
//! change every epoch (no event-time window closes its groups) feeds an
//! aggregation above it, as Flink's retract streams do.
//!
//! The aggregation below emits, per changed group, its previous row signed
//! −1 and its new row signed +1 in a last column [`SIGN`] ([`signed`]); a
//! group whose row did not change emits nothing. The aggregation above is
//! rewritten at planning ([`over_changelog`]): `count`, `sum` and `avg`
//! become sums of signed values, which take an old row back by adding its
//! negation, and every other function keeps each group's values as a
//! multiset (`multiset`). Nexmark q4 (the average per category of each
//! auction's highest bid) runs this way.

use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, Int64Array};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::Rows;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, ScalarValue};
use datafusion::functions_aggregate::expr_fn::sum;
use datafusion::logical_expr::expr_fn::{cast, when};
use datafusion::logical_expr::{
    lit, Aggregate, Expr, ExprSchemable, Filter, LogicalPlan, Projection,
};
use foldhash::{HashMap, HashMapExt, HashSet};

use super::multiset::over_changes;
use crate::error::{Result, SluiceError};
use crate::state::row_converter;

/// The column that signs a changelog's rows: 1 for a row added, −1 for a
/// row taken back. A source whose rows carry it (a Kafka stream in
/// `format = 'debezium-json'`) is a changelog: an aggregation over it
/// takes rows back (see [`read_changelogs`]).
pub const SIGN: &str = "__sluice_sign";

/// Rewrites each aggregation over a changelog source (a stream whose rows
/// carry [`SIGN`]) with [`over_changelog`], so that it counts, sums and
/// averages what the changes leave (a Top-N reads the signs as they are,
/// see `rank`); refuses a changelog read any other way (its rows would be
/// taken as inserts, and deletes as rows).
///
/// `stream_join` tells a join of two streams (which takes changes in)
/// from a stream's join with a static table (stateless: a change joined
/// is a row); `as_upserts` a changelog's changes read as an upsert
/// stream's rows (`upsert::changes_as_upserts`), which reads them too.
pub(crate) fn read_changelogs(
    plan: LogicalPlan,
    stream_join: &dyn Fn(&LogicalPlan) -> bool,
    as_upserts: &dyn Fn(&LogicalPlan) -> bool,
) -> Result<LogicalPlan> {
    use datafusion::common::tree_node::Transformed;
    let is_changelog = |p: &LogicalPlan| matches!(p, LogicalPlan::TableScan(s) if s.source.schema().field_with_name(SIGN).is_ok());
    if !plan.exists(|p| Ok(is_changelog(p)))? {
        return Ok(plan);
    }
    let plan = carry_signs_to_joins(plan, stream_join)?;
    let readers = Readers {
        is_changelog: &is_changelog,
        stream_join,
        as_upserts,
    };
    check_changelog_readers(&plan, false, &readers)?;
    Ok(plan
        .transform_up(|p| {
            let LogicalPlan::Aggregate(agg) = &p else {
                return Ok(Transformed::no(p));
            };
            if !agg.input.exists(|c| Ok(is_changelog(c)))? {
                return Ok(Transformed::no(p));
            }
            if agg
                .input
                .schema()
                .field_with_unqualified_name(SIGN)
                .is_err()
            {
                return Err(datafusion::error::DataFusionError::External(Box::new(
                    SluiceError::plan(
                        "this query cannot run: it aggregates a changelog stream (format \
                         'debezium-json') through a subquery that leaves out the changes' \
                         signs; aggregate the stream itself (SELECT k, count(*), sum(v) FROM \
                         stream WHERE ... GROUP BY k)",
                    ),
                )));
            }
            let rewritten = over_changelog(agg, (*agg.input).clone())
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            Ok(Transformed::yes(rewritten))
        })
        .map_err(SluiceError::from)?
        .data)
}

/// `plan` with each projection between a changelog scan and a join that
/// reads it passing the rows' sign on, so that the join takes the rows in
/// as changes (`changelog_join`).
fn carry_signs_to_joins(
    plan: LogicalPlan,
    stream_join: &dyn Fn(&LogicalPlan) -> bool,
) -> Result<LogicalPlan> {
    use datafusion::common::tree_node::Transformed;
    let carry = |side: &LogicalPlan| {
        side.clone().transform_up(|n| {
            let LogicalPlan::Projection(p) = &n else {
                return Ok(Transformed::yes(n.recompute_schema()?));
            };
            let input = p.input.schema();
            if p.schema.field_with_unqualified_name(SIGN).is_ok() {
                return Ok(Transformed::no(n));
            }
            let Ok((qualifier, field)) = input.qualified_field_with_unqualified_name(SIGN) else {
                return Ok(Transformed::no(n));
            };
            let mut exprs = p.expr.clone();
            exprs.push(Expr::Column(Column::new(qualifier.cloned(), field.name())));
            Ok(Transformed::yes(LogicalPlan::Projection(
                Projection::try_new(exprs, Arc::clone(&p.input))?,
            )))
        })
    };
    Ok(plan
        .transform_down(|p| {
            if !stream_join(&p) {
                return Ok(Transformed::no(p));
            }
            let inputs = p
                .inputs()
                .into_iter()
                .map(|side| Ok(carry(side)?.data))
                .collect::<datafusion::error::Result<Vec<_>>>()?;
            Ok(Transformed::yes(p.with_new_exprs(p.expressions(), inputs)?))
        })
        .map_err(SluiceError::from)?
        .data)
}

/// What tells the nodes of a plan that read a changelog (see
/// [`read_changelogs`]).
struct Readers<'a> {
    is_changelog: &'a dyn Fn(&LogicalPlan) -> bool,
    stream_join: &'a dyn Fn(&LogicalPlan) -> bool,
    as_upserts: &'a dyn Fn(&LogicalPlan) -> bool,
}

/// Refuses a changelog scan that no aggregation, Top-N or join reads, nor
/// reads as an upsert stream.
fn check_changelog_readers(plan: &LogicalPlan, aggregated: bool, r: &Readers) -> Result<()> {
    if (r.as_upserts)(plan) {
        return Ok(());
    }
    let is_changelog = r.is_changelog;
    if is_changelog(plan) && !aggregated {
        return Err(SluiceError::plan(
            "this query cannot run: it reads a changelog stream (format 'debezium-json') \
             without aggregating it, and a change's row is not a new row (an update takes \
             its old row back, a delete removes it). Aggregate it (GROUP BY), rank it \
             (a Top-N) or join it with another stream, which follow every change; or declare \
             its table's primary key ('key.fields' = 'id') to copy or filter it as a table \
             keyed by it",
        ));
    }
    match plan {
        // A join takes its inputs' rows in as changes (`changelog_join`).
        LogicalPlan::Join(_) if (r.stream_join)(plan) => plan
            .inputs()
            .into_iter()
            .try_for_each(|c| check_changelog_readers(c, true, r)),
        // A Top-N (the only window `check` lets through) takes its rows
        // back as an aggregation does, given their signs.
        LogicalPlan::Window(w) if plan.exists(|p| Ok(is_changelog(p))).unwrap_or(false) => {
            if w.input.schema().field_with_unqualified_name(SIGN).is_err() {
                return Err(SluiceError::plan(
                    "this query cannot run: it ranks a changelog stream (format \
                     'debezium-json') through a subquery that leaves out the changes' signs; \
                     rank the stream itself (SELECT ... FROM (SELECT *, ROW_NUMBER() OVER \
                     (...) AS rn FROM stream) WHERE rn <= 3)",
                ));
            }
            check_changelog_readers(&w.input, true, r)
        }
        LogicalPlan::Aggregate(_) => plan
            .inputs()
            .into_iter()
            .try_for_each(|c| check_changelog_readers(c, true, r)),
        _ => plan
            .inputs()
            .into_iter()
            .try_for_each(|c| check_changelog_readers(c, aggregated, r)),
    }
}

/// The function [`over_changelog`] adds last to the aggregation it
/// writes: the sum of a group's signs, its rows still live. A group at
/// zero had all its rows taken back.
pub(crate) const LIVE: &str = "__sluice_rows";

/// Whether `agg` is one [`over_changelog`] wrote (it counts its groups'
/// live rows, [`LIVE`]).
pub(crate) fn counts_live_rows(agg: &Aggregate) -> bool {
    agg.schema.fields().last().is_some_and(|f| f.name() == LIVE)
}

/// The rows `old` signed −1 and `new` signed +1 (see [`SIGN`]), less the
/// pairs that cancel: a group whose row did not change emits nothing.
pub(crate) fn signed(old: &[RecordBatch], new: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    let Some(schema) = old.iter().chain(new).next().map(|b| b.schema()) else {
        return Ok(Vec::new());
    };
    let converter = row_converter(schema.fields().iter().map(|f| f.data_type()))?;
    let encode = |batches: &[RecordBatch]| -> Result<Vec<Rows>> {
        batches
            .iter()
            .map(|b| Ok(converter.convert_columns(b.columns())?))
            .collect()
    };
    let (old_rows, new_rows) = (encode(old)?, encode(new)?);
    // Rows by their encoded bytes, borrowed from `old_rows`/`new_rows`.
    let mut unmatched: HashMap<&[u8], usize> = HashMap::new();
    for rows in &old_rows {
        for r in rows.iter() {
            *unmatched.entry(r.data()).or_default() += 1;
        }
    }
    // A new row equal to an old one cancels it: count the cancelled ones,
    // then drop as many of the old rows.
    let take = |pool: &mut HashMap<&[u8], usize>, r: &[u8]| match pool.get_mut(r) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    };
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(SIGN, DataType::Int64, false));
    let signed_schema = Arc::new(Schema::new(fields));
    let mut out = Vec::new();
    let mut signed = |b: &RecordBatch, mask: BooleanArray, sign: i64| -> Result<()> {
        let b = filter_record_batch(b, &mask)?;
        if b.num_rows() > 0 {
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(Int64Array::from(vec![sign; b.num_rows()])));
            out.push(RecordBatch::try_new(Arc::clone(&signed_schema), columns)?);
        }
        Ok(())
    };
    let mut cancelled: HashMap<&[u8], usize> = HashMap::new();
    for (b, rows) in new.iter().zip(&new_rows) {
        let mask: BooleanArray = rows
            .iter()
            .map(|r| {
                let r = r.data();
                let cancels = take(&mut unmatched, r);
                if cancels {
                    *cancelled.entry(r).or_default() += 1;
                }
                Some(!cancels)
            })
            .collect();
        signed(b, mask, 1)?;
    }
    for (b, rows) in old.iter().zip(&old_rows) {
        let mask: BooleanArray = rows
            .iter()
            .map(|r| Some(!take(&mut cancelled, r.data())))
            .collect();
        signed(b, mask, -1)?;
    }
    Ok(out)
}

/// The aggregation `agg` over a changelog (`input`, whose last column is
/// [`SIGN`]), with the same output. `count`, `sum` and `avg` of numbers
/// become sums of signed values, which take a row back by adding its
/// negation — `count(*)` is `sum(sign)`, `count(x)` sums the signs of
/// non-null `x`, `sum(x)` is `sum(x * sign)` (NULL when `count(x)` is 0),
/// and `avg(x)` is `sum(x * sign) / count(x)`. Every other function (and
/// these with DISTINCT, FILTER or ORDER BY) keeps each group's values as a
/// multiset ([`over_changes`]), as Flink's retracting min/max do. A group
/// whose rows were all taken back is dropped, so update mode retracts it
/// (and the operator drops its state, see [`LIVE`]).
pub(crate) fn over_changelog(agg: &Aggregate, input: LogicalPlan) -> Result<LogicalPlan> {
    let sign = || Expr::Column(Column::from_name(SIGN));
    let part = |name: &str| Expr::Column(Column::from_name(name));
    let null_when_empty = |count: &str, value: Expr| {
        when(part(count).eq(lit(0i64)), lit(ScalarValue::Null)).otherwise(value)
    };
    let mut sums = Vec::new();
    let mut values = Vec::new();
    for (i, e) in agg.aggr_expr.iter().enumerate() {
        let Expr::AggregateFunction(f) = e.clone().unalias_nested().data else {
            return Err(SluiceError::plan(format!(
                "this query cannot run on a stream: it aggregates {e} over rows that change \
                 (an aggregation without an event-time window, or a changelog stream such as \
                 format 'debezium-json'), which is not an aggregate function call"
            )));
        };
        let name = f.func.name().to_ascii_lowercase();
        let p = &f.params;
        let (_, field) = agg.schema.qualified_field(agg.group_expr.len() + i);
        let invertible = matches!(name.as_str(), "count" | "sum" | "avg" | "mean")
            && !p.distinct
            && p.filter.is_none()
            && p.order_by.is_empty()
            && p.args.len() == 1
            && (name == "count" || {
                let x_type = p.args[0].get_type(input.schema())?;
                x_type.is_integer() || x_type.is_floating()
            });
        if !invertible {
            // Every other function keeps each group's values (see `multiset`).
            let counted = match &p.filter {
                Some(filter) => when(*filter.clone(), sign()).otherwise(lit(0i64))?,
                None => sign(),
            };
            let part_name = format!("__sluice_multiset{i}");
            sums.push(over_changes(&f, counted).alias(&part_name));
            values.push(cast(part(&part_name), field.data_type().clone()));
            continue;
        }
        let x = p.args[0].clone();
        let count = format!("__sluice_count{i}");
        sums.push(sum(when(x.clone().is_null(), lit(0i64)).otherwise(sign())?).alias(&count));
        let value = if name == "count" {
            part(&count)
        } else {
            let signed = if x.get_type(input.schema())?.is_integer() {
                cast(x, DataType::Int64) * sign()
            } else {
                cast(x, DataType::Float64) * cast(sign(), DataType::Float64)
            };
            let total = format!("__sluice_sum{i}");
            sums.push(sum(signed).alias(&total));
            let value = if name == "sum" {
                part(&total)
            } else {
                cast(part(&total), DataType::Float64) / cast(part(&count), DataType::Float64)
            };
            null_when_empty(&count, value)?
        };
        values.push(cast(value, field.data_type().clone()));
    }
    sums.push(sum(sign()).alias(LIVE));
    let sums = Aggregate::try_new(Arc::new(input), agg.group_expr.clone(), sums)?;
    let mut exprs: Vec<Expr> = sums
        .schema
        .columns()
        .into_iter()
        .take(agg.group_expr.len())
        .map(Expr::Column)
        .collect();
    exprs.extend(values);
    let exprs = exprs
        .into_iter()
        .zip(agg.schema.iter())
        .map(|(e, (qualifier, field))| e.alias_qualified(qualifier.cloned(), field.name()))
        .collect();
    let live = Filter::try_new(
        part(LIVE).gt(lit(0i64)),
        Arc::new(LogicalPlan::Aggregate(sums)),
    )?;
    Ok(LogicalPlan::Projection(Projection::try_new_with_schema(
        exprs,
        Arc::new(LogicalPlan::Filter(live)),
        Arc::clone(&agg.schema),
    )?))
}

/// The keys (`keys`: the output's key columns) of rows `before` that are
/// not among `rows`.
pub(crate) fn retracted(
    before: &[RecordBatch],
    rows: &[RecordBatch],
    keys: &[String],
) -> Result<Option<RecordBatch>> {
    let Some(first) = before.first() else {
        return Ok(None);
    };
    let project = |b: &RecordBatch| -> Result<RecordBatch> {
        let columns = keys
            .iter()
            .map(|k| b.schema().index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(b.project(&columns)?)
    };
    let schema = project(first)?.schema();
    let converter = row_converter(schema.fields().iter().map(|f| f.data_type()))?;
    let encoded = rows
        .iter()
        .map(|b| Ok(converter.convert_columns(project(b)?.columns())?))
        .collect::<Result<Vec<_>>>()?;
    let emitted: HashSet<&[u8]> = encoded
        .iter()
        .flat_map(|r| r.iter().map(|r| r.data()))
        .collect();
    let mut gone = Vec::new();
    for b in before {
        let b = project(b)?;
        let mask: BooleanArray = converter
            .convert_columns(b.columns())?
            .iter()
            .map(|r| Some(!emitted.contains(r.data())))
            .collect();
        gone.push(filter_record_batch(&b, &mask)?);
    }
    let gone = concat_batches(&schema, &gone)?;
    Ok((gone.num_rows() > 0).then_some(gone))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, StringArray};
    use datafusion::arrow::datatypes::Int64Type;

    fn rows(keys: &[&str], values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    /// (key, value, sign) of every signed row.
    fn flat(batches: &[RecordBatch]) -> Vec<(String, i64, i64)> {
        let mut out = Vec::new();
        for b in batches {
            assert_eq!(b.schema().field(2).name(), SIGN);
            for i in 0..b.num_rows() {
                out.push((
                    b.column(0).as_string::<i32>().value(i).to_string(),
                    b.column(1).as_primitive::<Int64Type>().value(i),
                    b.column(2).as_primitive::<Int64Type>().value(i),
                ));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_changed_row_is_taken_back_and_added_and_an_unchanged_one_cancels() {
        let old = [rows(&["a", "b", "c"], &[1, 2, 7])];
        let new = [rows(&["a", "b", "d"], &[1, 3, 7])];
        assert_eq!(
            flat(&signed(&old, &new).unwrap()),
            vec![
                ("b".into(), 2, -1),
                ("b".into(), 3, 1),
                ("c".into(), 7, -1),
                ("d".into(), 7, 1),
            ]
        );
        // Equal rows cancel one for one, as a multiset.
        let old = [rows(&["x", "x"], &[5, 5])];
        let new = [rows(&["x"], &[5])];
        assert_eq!(
            flat(&signed(&old, &new).unwrap()),
            vec![("x".into(), 5, -1)]
        );
        assert!(signed(&[], &[]).unwrap().is_empty());
    }
}
