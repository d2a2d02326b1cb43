//! The tables the plan above a stateful operator reads its output under
//! (the operator is cut out and replaced by a scan, see `split::cut_at`),
//! and how a column of that plan traces back to one of the output's.

use datafusion::logical_expr::{Expr, LogicalPlan};

/// The table name the query after an aggregate reads its output under.
pub(super) const AGGREGATE_OUTPUT: &str = "__sluice_aggregate";

/// The table name the query after a join reads its rows under.
pub(super) const JOIN_OUTPUT: &str = "__sluice_join";

/// The column of a stateful operator's output (read through the scan
/// named `scan`, see `split::cut_at`) that column `i` of `plan` passes on
/// unchanged, if any.
pub(super) fn origin(plan: &LogicalPlan, i: usize, scan: &str) -> Option<usize> {
    match plan {
        LogicalPlan::Projection(p) => {
            if let LogicalPlan::TableScan(s) = p.input.as_ref() {
                if s.table_name.table() == scan {
                    return Some(i);
                }
            }
            let Expr::Column(c) = p.expr.get(i)?.clone().unalias_nested().data else {
                return None;
            };
            let at = p.input.schema().index_of_column(&c).ok()?;
            origin(&p.input, at, scan)
        }
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_) => origin(plan.inputs()[0], i, scan),
        _ => None,
    }
}
