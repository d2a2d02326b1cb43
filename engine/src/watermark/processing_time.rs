//! Processing time: `PROCTIME()`, and windows that close by the clock.
//!
//! Flink's `PROCTIME()` is the wall-clock time a row is processed. In
//! Sluice a row is processed by its epoch, so `PROCTIME()` is the time the
//! epoch was planned (`planned_at_ms` of `offsets/N`), the same for every
//! row of the epoch, as Spark's `current_timestamp()` is one value per
//! micro-batch. Since that time is written before the epoch computes, a
//! replayed epoch gives its rows the same processing time, and what its
//! windows emit does not change: exactly-once holds for processing-time
//! windows too.
//!
//! A query whose windows (TUMBLE, HOP, CUMULATE; a column of
//! `SELECT ..., PROCTIME() AS p FROM s` in `DESCRIPTOR(p)`) are over such
//! a column runs on processing time: its watermark is the planned time of
//! the epoch it is in, so a window closes in the first epoch planned at or
//! after its end, and no row is ever late (the event-time watermarks its
//! streams declare are not used by the query). As Flink does for a
//! processing-time window, a window closes only once the clock passes its
//! end; an epoch runs when a source has new rows, so a window's result
//! comes with the first epoch after its end.
//!
//! The function a session registers ([`Proctime::wall_clock`]) gives the
//! wall clock, for batch queries; planning a query gives it an instance of
//! its own ([`for_query`]), whose value the query sets before each epoch
//! computes.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{plan_err, Column, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, TableScan, Volatility,
};

use super::current::give_own;
use crate::error::Result;

/// The function's name, as SQL writes it (any case).
pub(crate) const NAME: &str = "proctime";

/// The key of the processing time in a commit record's watermarks.
pub(crate) const RECORD_KEY: &str = "processing-time";

/// No value set: the session's function, which reads the wall clock.
const WALL_CLOCK: i64 = i64::MIN;

/// The `PROCTIME()` function (see the module's text).
///
/// ```
/// use std::time::Duration;
/// use sluice_engine::{Proctime, Window};
///
/// // Registered in every session (SQL: `PROCTIME()`); in the DataFrame
/// // API, a column to window over:
/// # fn f(frame: sluice_engine::StreamFrame) -> sluice_engine::Result<sluice_engine::StreamFrame> {
/// frame
///     .with_column("p_time", Proctime::call())?
///     .window(Window::tumble("p_time", Duration::from_secs(10)))
/// # }
/// ```
#[derive(Debug)]
pub struct Proctime {
    signature: Signature,
    /// Milliseconds since the Unix epoch, or [`WALL_CLOCK`].
    value: Arc<AtomicI64>,
}

impl Proctime {
    /// The session's function: the wall clock when a batch query runs.
    pub fn wall_clock() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::with_value(Arc::new(AtomicI64::new(WALL_CLOCK))))
    }

    /// `PROCTIME()`.
    pub fn call() -> Expr {
        Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(Self::wall_clock()),
            vec![],
        ))
    }

    fn with_value(value: Arc<AtomicI64>) -> Self {
        Self {
            // Volatile: its value changes every epoch, so a plan must not
            // fold it.
            signature: Signature::exact(vec![], Volatility::Volatile),
            value,
        }
    }
}

impl PartialEq for Proctime {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.value, &other.value)
    }
}

impl Eq for Proctime {}

impl Hash for Proctime {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.value).hash(state);
    }
}

impl ScalarUDFImpl for Proctime {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        if !arg_types.is_empty() {
            return plan_err!("PROCTIME() takes no arguments");
        }
        Ok(DataType::Timestamp(TimeUnit::Millisecond, None))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let ms = match self.value.load(Ordering::Acquire) {
            WALL_CLOCK => chrono::Utc::now().timestamp_millis(),
            ms => ms,
        };
        Ok(ColumnarValue::Scalar(ScalarValue::TimestampMillisecond(
            Some(ms),
            None,
        )))
    }
}

/// `plan` with each `PROCTIME()` call given the query's own value, which
/// [`set`] moves; `None` when the plan calls none.
pub(crate) fn for_query(plan: LogicalPlan) -> Result<(LogicalPlan, Option<Arc<AtomicI64>>)> {
    let value = Arc::new(AtomicI64::new(WALL_CLOCK));
    let own = ScalarUDF::new_from_impl(Proctime::with_value(Arc::clone(&value)));
    let (plan, calls) = give_own(call_computed(plan)?, own)?;
    Ok((plan, (calls > 0).then_some(value)))
}

/// `plan` with each stream's computed `PROCTIME()` columns called above
/// its scan: read, they would hold the wall clock of the read, not the
/// epoch's planned time that [`for_query`] gives the calls.
fn call_computed(plan: LogicalPlan) -> Result<LogicalPlan> {
    let plan = plan.transform_up(|node| {
        let LogicalPlan::TableScan(scan) = &node else {
            return Ok(Transformed::no(node));
        };
        let names = computed(scan);
        if names.is_empty() {
            return Ok(Transformed::no(node));
        }
        let exprs: Vec<Expr> = scan
            .projected_schema
            .iter()
            .map(|(qualifier, field)| {
                let column = Column::new(qualifier.cloned(), field.name());
                match names.contains(field.name()) {
                    true => Proctime::call().alias_qualified(qualifier.cloned(), field.name()),
                    false => Expr::Column(column),
                }
            })
            .collect();
        let projected = LogicalPlanBuilder::from(node).project(exprs)?.build()?;
        Ok(Transformed::yes(projected))
    })?;
    Ok(plan.data)
}

/// The metadata that marks a stream's column computed as `PROCTIME()`.
const COMPUTED_METADATA: &str = "sluice.proctime";

/// `field`, a stream's column computed as `PROCTIME()`, marked so.
pub(crate) fn mark_computed(field: Field) -> Field {
    let mut metadata = field.metadata().clone();
    metadata.insert(COMPUTED_METADATA.into(), "true".into());
    field.with_metadata(metadata)
}

/// Whether `expr` is a `PROCTIME()` call.
pub(crate) fn is_call(expr: &Expr) -> bool {
    matches!(expr, Expr::ScalarFunction(f) if f.func.name() == NAME)
}

/// The computed `PROCTIME()` columns `scan` reads.
fn computed(scan: &TableScan) -> Vec<String> {
    scan.projected_schema
        .fields()
        .iter()
        .filter(|f| f.metadata().contains_key(COMPUTED_METADATA))
        .map(|f| f.name().clone())
        .collect()
}

/// Gives a query's `PROCTIME()` the time its epoch was planned (ms since
/// the Unix epoch).
pub(crate) fn set(value: &AtomicI64, planned_at_ms: i64) {
    value.store(planned_at_ms, Ordering::Release);
}

/// The columns of `plan` that are a `PROCTIME()` call under a name (`SELECT
/// *, PROCTIME() AS p_time FROM s`, or a stream's computed column `p_time
/// AS PROCTIME()`): the processing-time attributes a window may be over,
/// or a lookup join be as of.
///
/// ```
/// # use sluice_engine::datafusion::prelude::*;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> sluice_engine::datafusion::error::Result<()> {
/// let ctx = SessionContext::new();
/// ctx.register_udf(sluice_engine::Proctime::wall_clock());
/// let plan = ctx.sql("SELECT 1 AS a, PROCTIME() AS p_time").await?.into_unoptimized_plan();
/// assert_eq!(sluice_engine::processing_time_columns(&plan), ["p_time"]);
/// # Ok(())
/// # }
/// ```
pub fn columns(plan: &LogicalPlan) -> Vec<String> {
    let mut names = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            names.extend(computed(scan));
        }
        if let LogicalPlan::Projection(p) = node {
            for e in &p.expr {
                if let Expr::Alias(alias) = e {
                    if is_call(&alias.expr) {
                        names.push(alias.name.clone());
                    }
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::datasource::{provider_as_source, MemTable};

    #[test]
    fn a_streams_computed_proctime_column_is_called_with_the_querys_own_time() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            mark_computed(Field::new(
                "p",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                true,
            )),
        ]));
        let table = MemTable::try_new(schema, vec![vec![]]).unwrap();
        let scan = LogicalPlanBuilder::scan("orders", provider_as_source(Arc::new(table)), None)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(columns(&scan), ["p"]);
        let (plan, value) = for_query(scan).unwrap();
        let value = value.expect("the computed column is a call of the query's PROCTIME()");
        set(&value, 1_234);
        // The scan's column is replaced above it by the call, same name.
        let LogicalPlan::Projection(p) = &plan else {
            panic!("{plan}");
        };
        assert_eq!(p.schema.field(1).name(), "p");
        assert!(
            matches!(&p.expr[1], Expr::Alias(a) if is_call(&a.expr)),
            "{plan}"
        );
    }
}
