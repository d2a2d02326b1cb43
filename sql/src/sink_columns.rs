//! How a query's output fills the columns a sink declares, as Flink's
//! `INSERT` does: by position (or by the `INSERT`'s column list), casting
//! a value implicitly where Flink would.
//!
//! A query that names every declared column, in any order, fills them by
//! name, as Sluice always has: Flink would fill such columns by position,
//! which only matters when the names come in another order, and then the
//! names are what the author meant.

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::Column;
use datafusion::logical_expr::ExprSchemable;
use datafusion::logical_expr::{cast, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::scalar::ScalarValue;

/// `plan` with a projection that gives exactly `declared`'s columns, in its
/// order and types; `plan` itself when it already gives them by name.
/// `listed`: the `INSERT INTO sink (a, b)` column list.
pub(crate) fn fill(
    sink: &str,
    declared: &Schema,
    listed: Option<&[String]>,
    plan: LogicalPlan,
) -> Result<LogicalPlan, String> {
    let output = plan.schema().clone();
    let given: Vec<(Expr, String, DataType)> = (0..output.fields().len())
        .map(|i| {
            let (qualifier, field) = output.qualified_field(i);
            let column = Expr::Column(Column::from((qualifier, field)));
            (column, field.name().clone(), field.data_type().clone())
        })
        .collect();
    let names = |fields: &mut dyn Iterator<Item = &String>| {
        fields.map(String::as_str).collect::<Vec<_>>().join(", ")
    };
    let declared_names: Vec<&String> = declared.fields().iter().map(|f| f.name()).collect();
    // For each declared column, the index of the query's column filling it.
    let sources: Vec<Option<usize>> = match listed {
        Some(listed) => {
            if let Some(unknown) = listed.iter().find(|n| declared.index_of(n).is_err()) {
                return Err(format!(
                    "stream '{sink}' has no column '{unknown}'; its columns are {}",
                    names(&mut declared_names.iter().copied())
                ));
            }
            if listed.len() != given.len() {
                return Err(format!(
                    "the INSERT lists {} column(s) of stream '{sink}' ({}), but the query gives \
                     {} ({})",
                    listed.len(),
                    listed.join(", "),
                    given.len(),
                    names(&mut given.iter().map(|g| &g.1))
                ));
            }
            declared_names
                .iter()
                .map(|d| listed.iter().position(|l| l == *d))
                .collect()
        }
        None => {
            let by_name: Vec<Option<usize>> = declared_names
                .iter()
                .map(|d| given.iter().position(|g| &g.1 == *d))
                .collect();
            if given.len() == declared_names.len() && by_name.iter().all(Option::is_some) {
                by_name
            } else if given.len() == declared_names.len() {
                (0..given.len()).map(Some).collect()
            } else {
                return Err(format!(
                    "the query gives {} column(s) ({}), but stream '{sink}' declares {} ({}); \
                     its columns are filled in order, as in Flink, or name them: INSERT INTO \
                     {sink} (column, ...) SELECT ...",
                    given.len(),
                    names(&mut given.iter().map(|g| &g.1)),
                    declared_names.len(),
                    names(&mut declared_names.iter().copied())
                ));
            }
        }
    };
    let mut exprs = Vec::with_capacity(declared.fields().len());
    let mut unchanged = true;
    for (field, source) in declared.fields().iter().zip(&sources) {
        let Some(i) = *source else {
            if !field.is_nullable() {
                return Err(format!(
                    "stream '{sink}' declares column '{}' NOT NULL, but the INSERT's column list \
                     leaves it out",
                    field.name()
                ));
            }
            let null = ScalarValue::try_from(field.data_type()).map_err(|e| e.to_string())?;
            exprs.push(lit(null).alias(field.name()));
            unchanged = false;
            continue;
        };
        let (expr, name, from) = &given[i];
        let to = field.data_type();
        let filled = if from == to {
            expr.clone()
        } else if casts_implicitly(from, to)
            || constant_fits(&plan, i, to)
            || integer_avg(&plan, i, from, to)
        {
            cast(expr.clone(), to.clone())
        } else {
            let which = if name == field.name() {
                String::new()
            } else {
                format!(" (filled by the query's column {}, '{name}')", i + 1)
            };
            return Err(format!(
                "column '{}'{which}: the query gives {from}, but stream '{sink}' declares {to}, \
                 and that cast could lose data; convert it with CAST({name} AS ...)",
                field.name()
            ));
        };
        unchanged &= name == field.name() && from == to;
        exprs.push(filled.alias(field.name()));
    }
    if unchanged {
        return Ok(plan);
    }
    LogicalPlanBuilder::from(plan)
        .project(exprs)
        .and_then(LogicalPlanBuilder::build)
        .map_err(|e| e.to_string())
}

/// What gives the query's column `i`, aliases taken off, and the plan
/// under it, where the query ends in a projection (as SQL's SELECT does).
fn projected(plan: &LogicalPlan, i: usize) -> Option<(Expr, &LogicalPlan)> {
    let LogicalPlan::Projection(p) = plan else {
        return None;
    };
    let expr = p.expr.get(i)?.clone().unalias_nested().data;
    Some((expr, p.input.as_ref()))
}

/// Whether the query's column `i` is a constant whose value `to` holds
/// exactly: DataFusion types `0` as BIGINT where Flink types it INT.
fn constant_fits(plan: &LogicalPlan, i: usize, to: &DataType) -> bool {
    let Some((Expr::Literal(value, _), _)) = projected(plan, i) else {
        return false;
    };
    value
        .cast_to(to)
        .and_then(|v| v.cast_to(&value.data_type()))
        .is_ok_and(|back| back == value)
}

/// Whether the query's column `i` is an `AVG` of integers (grouped or
/// `OVER` a window) going into an integer column. Flink's `AVG` of
/// integers is an integer, the sum divided by the count and truncated;
/// DataFusion's is a DOUBLE, so it fills the column truncated, as Flink
/// computes it.
fn integer_avg(plan: &LogicalPlan, i: usize, from: &DataType, to: &DataType) -> bool {
    if *from != DataType::Float64 || !to.is_integer() {
        return false;
    }
    let Some((Expr::Column(column), input)) = projected(plan, i) else {
        return false;
    };
    let mut found = false;
    let _ = input.apply(|node| {
        let (exprs, input) = match node {
            LogicalPlan::Aggregate(a) => (&a.aggr_expr, &a.input),
            LogicalPlan::Window(w) => (&w.window_expr, &w.input),
            _ => return Ok(TreeNodeRecursion::Continue),
        };
        let named = exprs
            .iter()
            .find(|e| e.schema_name().to_string() == column.name);
        if let Some(e) = named {
            let args = match e {
                Expr::AggregateFunction(f) if f.func.name() == "avg" => &f.params.args,
                Expr::WindowFunction(w) if w.fun.name() == "avg" => &w.params.args,
                _ => return Ok(TreeNodeRecursion::Stop),
            };
            found = args
                .first()
                .and_then(|a| a.get_type(input.schema()).ok())
                .is_some_and(|t| t.is_integer());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Whether `from` goes into a column of type `to` without a `CAST`, as
/// Flink casts implicitly: to a wider number, between string types (one
/// type to a user, three to Arrow), between timestamp precisions, and a
/// ROW field by field. Two
/// differ from Flink because DataFusion types differently: an unsigned
/// integer (`ROW_NUMBER`, `count`) goes into a signed one of its width,
/// and a DOUBLE into a DECIMAL (DataFusion reads `0.908` as DOUBLE where
/// Flink reads DECIMAL). A value that does not fit fails the epoch with
/// the value named, never silently.
pub(crate) fn casts_implicitly(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let int_bits = |t: &DataType| match t {
        Int8 | UInt8 => Some(8),
        Int16 | UInt16 => Some(16),
        Int32 | UInt32 => Some(32),
        Int64 | UInt64 => Some(64),
        _ => None,
    };
    let signed = |t: &DataType| matches!(t, Int8 | Int16 | Int32 | Int64);
    let string = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let binary = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView);
    let decimal = |t: &DataType| match t {
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => Some((*p, *s)),
        _ => None,
    };
    match (from, to) {
        (Null, _) => true,
        // A ROW whose fields, by name and in order, each cast.
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(x, y)| {
                    x.name() == y.name()
                        && (x.data_type() == y.data_type()
                            || casts_implicitly(x.data_type(), y.data_type()))
                })
        }
        _ if string(from) && string(to) => true,
        _ if binary(from) && binary(to) => true,
        (Timestamp(..) | Date32 | Date64, Timestamp(..)) => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        _ => match (int_bits(from), int_bits(to), decimal(from), decimal(to)) {
            // Wider, or unsigned into signed of its width.
            (Some(a), Some(b), ..) => {
                if signed(to) {
                    a <= b
                } else {
                    !signed(from) && a <= b
                }
            }
            (Some(_), None, _, None) => matches!(to, Float32 | Float64),
            (Some(_), None, _, Some(_)) => true,
            // No digit after the point is dropped.
            (None, None, Some((_, s1)), Some((_, s2))) => s1 <= s2,
            (None, None, Some(_), None) => matches!(to, Float32 | Float64),
            (None, None, None, Some(_)) => matches!(from, Float32 | Float64),
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::casts_implicitly;
    use datafusion::arrow::datatypes::{DataType::*, Field, TimeUnit};

    #[test]
    fn widening_and_string_types_cast_narrowing_does_not() {
        assert!(casts_implicitly(&Int32, &Int64));
        assert!(casts_implicitly(&UInt64, &Int64));
        assert!(casts_implicitly(&Utf8, &Utf8View));
        assert!(casts_implicitly(&Float64, &Decimal128(23, 3)));
        assert!(casts_implicitly(&Decimal128(24, 3), &Decimal128(23, 3)));
        assert!(casts_implicitly(&Int64, &Float64));
        assert!(casts_implicitly(
            &Timestamp(TimeUnit::Nanosecond, None),
            &Timestamp(TimeUnit::Millisecond, None)
        ));
        assert!(!casts_implicitly(&Int64, &Int32));
        assert!(!casts_implicitly(&Int64, &UInt64));
        assert!(!casts_implicitly(&Float64, &Int64));
        assert!(!casts_implicitly(&Decimal128(10, 3), &Decimal128(10, 2)));
        assert!(!casts_implicitly(&Utf8, &Int64));
        let row = |t| Struct(vec![Field::new("id", Int64, true), Field::new("at", t, true)].into());
        assert!(casts_implicitly(
            &row(Timestamp(TimeUnit::Nanosecond, None)),
            &row(Timestamp(TimeUnit::Millisecond, None))
        ));
        assert!(!casts_implicitly(&row(Int64), &row(Int32)));
    }
}
