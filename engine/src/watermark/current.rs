//! `CURRENT_WATERMARK(ts)`, as in Flink: the query's watermark that the
//! epoch's rows are judged by, in the type of `ts`, or NULL while there is
//! none. So a query routes late rows itself:
//! `INSERT INTO late SELECT * FROM s WHERE ts < CURRENT_WATERMARK(ts)`.
//!
//! The function a session registers ([`CurrentWatermark::unset`]) is
//! always NULL; planning a query gives it an instance of its own
//! ([`for_query`]), whose value the query sets before each epoch computes.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{plan_err, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

use crate::error::{Result, SluiceError};

/// The function's name, as SQL writes it (any case).
pub(crate) const NAME: &str = "current_watermark";

/// No watermark yet.
const NONE: i64 = i64::MIN;

/// The `CURRENT_WATERMARK` function (see the module's text).
///
/// ```
/// use sluice_engine::{CurrentWatermark, Session};
/// use sluice_engine::datafusion::prelude::col;
///
/// // Registered in every session; in the DataFrame API:
/// let late = col("ts").lt(CurrentWatermark::call(col("ts")));
/// # let _ = (late, Session::new());
/// ```
#[derive(Debug)]
pub struct CurrentWatermark {
    signature: Signature,
    /// Nanoseconds since the Unix epoch, or [`NONE`].
    value: Arc<AtomicI64>,
}

impl CurrentWatermark {
    /// The session's function, NULL until a query gives itself one.
    pub fn unset() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::with_value(Arc::new(AtomicI64::new(NONE))))
    }

    /// `CURRENT_WATERMARK(ts)`.
    pub fn call(ts: Expr) -> Expr {
        Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(Self::unset()), vec![ts]))
    }

    fn with_value(value: Arc<AtomicI64>) -> Self {
        Self {
            // Volatile: its value changes every epoch, so a plan must not
            // fold it.
            signature: Signature::any(1, Volatility::Volatile),
            value,
        }
    }
}

impl PartialEq for CurrentWatermark {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.value, &other.value)
    }
}

impl Eq for CurrentWatermark {}

impl Hash for CurrentWatermark {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.value).hash(state);
    }
}

impl ScalarUDFImpl for CurrentWatermark {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types {
            [t @ DataType::Timestamp(..)] => Ok(t.clone()),
            other => plan_err!(
                "CURRENT_WATERMARK takes the stream's event-time column (a TIMESTAMP), not {}",
                other
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let ns = self.value.load(Ordering::Acquire);
        let ns = (ns != NONE).then_some(ns);
        let DataType::Timestamp(unit, zone) = args.return_field.data_type() else {
            return plan_err!("CURRENT_WATERMARK returns a timestamp");
        };
        let per = |n: i64| ns.map(|ns| ns.div_euclid(n));
        Ok(ColumnarValue::Scalar(match unit {
            TimeUnit::Second => ScalarValue::TimestampSecond(per(1_000_000_000), zone.clone()),
            TimeUnit::Millisecond => {
                ScalarValue::TimestampMillisecond(per(1_000_000), zone.clone())
            }
            TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(per(1_000), zone.clone()),
            TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(ns, zone.clone()),
        }))
    }
}

/// `plan` with each `CURRENT_WATERMARK` call given the query's own value,
/// which [`set`] moves; `None` when the plan calls none.
pub(crate) fn for_query(plan: LogicalPlan) -> Result<(LogicalPlan, Option<Arc<AtomicI64>>)> {
    let value = Arc::new(AtomicI64::new(NONE));
    let own = ScalarUDF::new_from_impl(CurrentWatermark::with_value(Arc::clone(&value)));
    let (plan, calls) = give_own(plan, own)?;
    Ok((plan, (calls > 0).then_some(value)))
}

/// `plan` with each call of the function named as `own` calling `own`
/// instead, and how many calls there were: a function whose value is a
/// query's own (its watermark, its epoch's processing time) is registered
/// in the session as a placeholder and replaced in each query's plan.
pub(crate) fn give_own(plan: LogicalPlan, own: ScalarUDF) -> Result<(LogicalPlan, usize)> {
    let own = Arc::new(own);
    let mut calls = 0;
    let plan = plan
        .transform_up(|node| {
            node.map_expressions(|e| {
                e.transform_up(|e| match e {
                    Expr::ScalarFunction(f) if f.func.name() == own.name() => {
                        calls += 1;
                        Ok(Transformed::yes(Expr::ScalarFunction(
                            ScalarFunction::new_udf(Arc::clone(&own), f.args),
                        )))
                    }
                    other => Ok(Transformed::no(other)),
                })
            })
        })
        .map_err(SluiceError::from)?
        .data;
    Ok((plan, calls))
}

/// Moves a query's `CURRENT_WATERMARK` to `watermark` (ns since the Unix
/// epoch; `None`: no watermark yet).
pub(crate) fn set(value: &AtomicI64, watermark: Option<i64>) {
    value.store(watermark.unwrap_or(NONE), Ordering::Release);
}
