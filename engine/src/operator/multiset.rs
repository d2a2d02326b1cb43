//! Aggregate functions that cannot take a value back (`min`, `max`,
//! `count(DISTINCT …)`, `first_value(… ORDER BY …)`, UDAFs), over rows that
//! change: each group keeps the multiset of its rows' arguments, argument
//! row → how many times it is in the group, and the function runs over
//! what the multiset holds whenever the group changes.
//!
//! [`over_changes`] wraps a function so: the wrapper takes the function's
//! arguments, its `ORDER BY` expressions and, last, the row's sign (+1 a
//! row added, −1 a row taken back, 0 a row its `FILTER` leaves out). Its
//! state is the multiset (arrow-row encoded argument rows and their
//! counts), which merges by adding counts, so the aggregation operator
//! keeps, checkpoints and restores it as it does any function's state.
//! Flink's retracting `min` and `max` keep the same: every value with its
//! count.
//!
//! A changed group's value is computed anew from its multiset, in time
//! linear in its distinct argument rows.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, Int64Array, ListArray, UInt32Array,
};
use datafusion::arrow::compute::{take, SortOptions};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::utils::SingleRowListArrayBuilder;
use datafusion::common::{exec_err, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::{AggregateFunction, NullTreatment};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Expr, Signature, Volatility,
};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr};
use foldhash::{HashMap, HashMapExt};

use super::sort_options;

/// `f` as a function over rows that change, called with `f`'s arguments,
/// its `ORDER BY` expressions, then `sign` (see the module's text). Its
/// value is `f` over the rows whose count is positive, each as many times.
///
/// ```text
/// min(x) FILTER (WHERE p)   ─►   over_changes(min)(x, CASE WHEN p THEN sign ELSE 0 END)
/// ```
pub(crate) fn over_changes(f: &AggregateFunction, sign: Expr) -> Expr {
    let p = &f.params;
    let order: Vec<SortOptions> = p.order_by.iter().map(sort_options).collect();
    let mut args = p.args.clone();
    args.extend(p.order_by.iter().map(|s| s.expr.clone()));
    args.push(sign);
    let wrapper = OverChanges {
        signature: Signature::any(args.len(), Volatility::Immutable),
        name: format!("{}_over_changes", f.func.name()),
        inner: Arc::clone(&f.func),
        args: p.args.len(),
        order,
        distinct: p.distinct,
        ignore_nulls: p.null_treatment == Some(NullTreatment::IgnoreNulls),
    };
    Expr::AggregateFunction(AggregateFunction::new_udf(
        Arc::new(AggregateUDF::new_from_impl(wrapper)),
        args,
        false,
        None,
        Vec::new(),
        None,
    ))
}

/// The wrapper [`over_changes`] writes.
#[derive(Debug, PartialEq, Eq)]
struct OverChanges {
    signature: Signature,
    name: String,
    inner: Arc<AggregateUDF>,
    /// How many of the arguments are `inner`'s own; the `ORDER BY`
    /// expressions follow them, then the sign.
    args: usize,
    order: Vec<SortOptions>,
    distinct: bool,
    ignore_nulls: bool,
}

impl Hash for OverChanges {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.inner.hash(state);
        self.args.hash(state);
        self.order.hash(state);
        self.distinct.hash(state);
        self.ignore_nulls.hash(state);
    }
}

impl AggregateUDFImpl for OverChanges {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(&arg_types[..self.args])
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> DfResult<FieldRef> {
        self.inner.return_field(&arg_fields[..self.args])
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let list = |name: &str, item: DataType| {
            Arc::new(Field::new(
                format_state_name(args.name, name),
                DataType::List(Arc::new(Field::new_list_field(item, true))),
                true,
            ))
        };
        Ok(vec![
            list("rows", DataType::Binary),
            list("counts", DataType::Int64),
        ])
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        // The inner function reads its arguments and ORDER BY columns from
        // a batch of its own, `c0, c1, ...`.
        let values = self.args + self.order.len();
        let fields: Vec<FieldRef> = acc_args.expr_fields[..values]
            .iter()
            .enumerate()
            .map(|(i, f)| Arc::new(f.as_ref().clone().with_name(format!("c{i}"))))
            .collect();
        let converter = RowConverter::new(
            fields
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        Ok(Box::new(Multiset {
            spec: Arc::new(Inner {
                function: Arc::clone(&self.inner),
                return_field: Arc::clone(&acc_args.return_field),
                schema: Schema::new(fields),
                args: self.args,
                order: self.order.clone(),
                distinct: self.distinct,
                ignore_nulls: self.ignore_nulls,
                name: acc_args.name.to_string(),
            }),
            converter,
            counts: HashMap::new(),
            bytes: 0,
        }))
    }
}

/// How to run the inner function over a multiset's rows.
#[derive(Debug)]
struct Inner {
    function: Arc<AggregateUDF>,
    return_field: FieldRef,
    schema: Schema,
    args: usize,
    order: Vec<SortOptions>,
    distinct: bool,
    ignore_nulls: bool,
    name: String,
}

impl Inner {
    /// The function's value over `columns` (its arguments, then its
    /// ORDER BY columns).
    fn evaluate(&self, columns: &[ArrayRef]) -> DfResult<ScalarValue> {
        let column = |i: usize| -> DfResult<Arc<dyn PhysicalExpr>> {
            Ok(Arc::new(Column::new(self.schema.field(i).name(), i)))
        };
        let exprs = (0..self.args).map(column).collect::<DfResult<Vec<_>>>()?;
        let order_bys = self
            .order
            .iter()
            .enumerate()
            .map(|(i, options)| {
                Ok(PhysicalSortExpr {
                    expr: column(self.args + i)?,
                    options: *options,
                })
            })
            .collect::<DfResult<Vec<_>>>()?;
        let expr_fields: Vec<FieldRef> = self.schema.fields()[..self.args].to_vec();
        let mut accumulator = self.function.accumulator(AccumulatorArgs {
            return_field: Arc::clone(&self.return_field),
            schema: &self.schema,
            ignore_nulls: self.ignore_nulls,
            order_bys: &order_bys,
            is_reversed: false,
            name: &self.name,
            is_distinct: self.distinct,
            exprs: &exprs,
            expr_fields: &expr_fields,
        })?;
        if columns.first().is_some_and(|c| !c.is_empty()) {
            accumulator.update_batch(columns)?;
        }
        accumulator.evaluate()
    }
}

/// One group's multiset: each argument row (arrow-row encoded) and how many
/// times it is in the group. A count can be negative for a while (a row
/// taken back in a partial state merged before the one that added it);
/// rows at zero are forgotten.
#[derive(Debug)]
struct Multiset {
    spec: Arc<Inner>,
    converter: RowConverter,
    counts: HashMap<Box<[u8]>, i64>,
    /// The encoded rows' bytes, for [`Accumulator::size`].
    bytes: usize,
}

impl Multiset {
    fn add(&mut self, row: &[u8], n: i64) {
        if n == 0 {
            return;
        }
        match self.counts.get_mut(row) {
            Some(count) => {
                *count += n;
                if *count == 0 {
                    self.counts.remove(row);
                    self.bytes -= row.len();
                }
            }
            None => {
                self.counts.insert(row.into(), n);
                self.bytes += row.len();
            }
        }
    }
}

impl Accumulator for Multiset {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let Some((signs, columns)) = values.split_last() else {
            return exec_err!("{}: no sign column", self.spec.name);
        };
        let signs = signs.as_primitive_opt::<Int64Type>().ok_or_else(|| {
            datafusion::error::DataFusionError::Internal(format!(
                "{}: the sign column is {}, not Int64",
                self.spec.name,
                signs.data_type()
            ))
        })?;
        let rows = self.converter.convert_columns(columns)?;
        for (i, row) in rows.iter().enumerate() {
            if signs.is_valid(i) {
                self.add(row.as_ref(), signs.value(i));
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let [rows, counts] = states else {
            return exec_err!("{}: expected two state columns", self.spec.name);
        };
        let (rows, counts): (&ListArray, &ListArray) = (rows.as_list(), counts.as_list());
        for state in 0..rows.len() {
            if rows.is_null(state) {
                continue;
            }
            let encoded = rows.value(state);
            let encoded: &BinaryArray = encoded.as_binary();
            let n = counts.value(state);
            let n: &Int64Array = n.as_primitive();
            for i in 0..encoded.len() {
                self.add(encoded.value(i), n.value(i));
            }
        }
        Ok(())
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        let rows = BinaryArray::from_iter_values(self.counts.keys());
        let counts = Int64Array::from_iter_values(self.counts.values().copied());
        Ok(vec![
            SingleRowListArrayBuilder::new(Arc::new(rows)).build_list_scalar(),
            SingleRowListArrayBuilder::new(Arc::new(counts)).build_list_scalar(),
        ])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        // Each row with a positive count, as many times.
        let live: Vec<(&[u8], i64)> = self
            .counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(row, n)| (row.as_ref(), *n))
            .collect();
        let parser = self.converter.parser();
        let distinct = self
            .converter
            .convert_rows(live.iter().map(|(row, _)| parser.parse(row)))?;
        let mut repeat = Vec::new();
        for (i, (_, n)) in live.iter().enumerate() {
            repeat.extend(std::iter::repeat_n(i as u32, *n as usize));
        }
        let repeat = UInt32Array::from(repeat);
        let columns = distinct
            .iter()
            .map(|c| take(c.as_ref(), &repeat, None))
            .collect::<Result<Vec<_>, _>>()?;
        self.spec.evaluate(&columns)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.bytes
            + self.counts.capacity() * std::mem::size_of::<(Box<[u8]>, i64)>()
            + self.converter.size()
    }
}
