//! Top-N queries found in a plan: a `ROW_NUMBER()` (or `RANK()`,
//! `DENSE_RANK()`) `OVER (PARTITION BY … ORDER BY …)` whose rank a filter
//! bounds (`rn <= N`, `rn < N`, `rn = 1`), as Flink recognises them
//! (`split` cuts them out).

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};

use crate::error::{Result, SluiceError};
use crate::operator::rank::RankFunction;

/// Every Top-N of `plan`: its `Window` node and the highest rank kept.
/// Refuses a bound on the rank mixed with other conditions, and a bound
/// this operator cannot keep.
pub(super) fn top_ns(plan: &LogicalPlan) -> Result<Vec<(LogicalPlan, u64)>> {
    let mut found = Vec::new();
    let mut problem = None;
    plan.apply(|node| {
        let LogicalPlan::Filter(filter) = node else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let conjuncts = split_conjunction(&filter.predicate);
        let bounds: Vec<(LogicalPlan, u64)> = conjuncts
            .iter()
            .filter_map(|c| rank_bound(c, &filter.input))
            .collect();
        match bounds.as_slice() {
            [] => {}
            [(window, limit)] if conjuncts.len() == 1 => found.push((window.clone(), *limit)),
            _ => {
                problem = Some(SluiceError::plan(format!(
                    "this query cannot run on a stream: its WHERE {} bounds a row number \
                     together with other conditions; a Top-N's WHERE bounds the row number \
                     alone (WHERE rn <= 10): filter the rows before ranking them, in the \
                     subquery",
                    filter.predicate
                )));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match problem {
        Some(problem) => Err(problem),
        None => Ok(found),
    }
}

/// `rn <= N` (or `rn < N + 1`, `rn = 1`, `N >= rn`) over the rank of a
/// window under `input`: the window's node and `N`.
fn rank_bound(conjunct: &Expr, input: &LogicalPlan) -> Option<(LogicalPlan, u64)> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else {
        return None;
    };
    let (column, op, value) = match (uncast(left), uncast(right)) {
        (Expr::Column(c), Expr::Literal(v, _)) => (c, *op, v),
        (Expr::Literal(v, _), Expr::Column(c)) => (c, op.swap()?, v),
        _ => return None,
    };
    let (window, index) = trace(input, &column.name)?;
    let LogicalPlan::Window(w) = &window else {
        return None;
    };
    if index + 1 != w.schema.fields().len() {
        return None;
    }
    let n = match value.cast_to(&datafusion::arrow::datatypes::DataType::Int64) {
        Ok(ScalarValue::Int64(Some(n))) => n,
        _ => return None,
    };
    let limit = match op {
        Operator::LtEq => n,
        Operator::Lt => n - 1,
        Operator::Eq if n == 1 => 1,
        _ => return None,
    };
    (limit >= 1).then_some((window, limit as u64))
}

fn uncast(e: &Expr) -> &Expr {
    match e {
        Expr::Cast(c) => uncast(&c.expr),
        Expr::TryCast(c) => uncast(&c.expr),
        other => other,
    }
}

/// Where the column `name` of `plan`'s output comes from, followed down
/// through projections (a column passed on, maybe renamed), aliases and
/// filters: a `Window` node and the column's index in its output.
pub(super) fn trace(plan: &LogicalPlan, name: &str) -> Option<(LogicalPlan, usize)> {
    match plan {
        LogicalPlan::SubqueryAlias(s) => trace(&s.input, name),
        LogicalPlan::Filter(f) => trace(&f.input, name),
        LogicalPlan::Projection(p) => {
            let i = p.schema.fields().iter().position(|f| f.name() == name)?;
            match p.expr[i].clone().unalias_nested().data {
                Expr::Column(c) => trace(&p.input, &c.name),
                // An integer cast (a row number into the sink's BIGINT) keeps
                // every value apart, so the key is still the key.
                Expr::Cast(c) if c.field.data_type().is_integer() => match c.expr.as_ref() {
                    Expr::Column(col)
                        if p.input
                            .schema()
                            .qualified_field_from_column(col)
                            .is_ok_and(|(_, f)| f.data_type().is_integer()) =>
                    {
                        trace(&p.input, &col.name)
                    }
                    _ => None,
                },
                _ => None,
            }
        }
        LogicalPlan::Window(w) => {
            let i = w.schema.fields().iter().position(|f| f.name() == name)?;
            Some((plan.clone(), i))
        }
        _ => None,
    }
}

/// Why the window node of a Top-N cannot run, if it cannot.
pub(super) fn window_problem(window: &LogicalPlan) -> Option<String> {
    let LogicalPlan::Window(w) = window else {
        return Some("uses a window that is not one".into());
    };
    let [Expr::WindowFunction(f)] = w.window_expr.as_slice() else {
        return Some(
            "computes several OVER (...) functions in one Top-N; rank with one of ROW_NUMBER(), \
             RANK() or DENSE_RANK()"
                .into(),
        );
    };
    let WindowFunction { fun, params } = f.as_ref();
    let name = fun.name().to_ascii_lowercase();
    if rank_function(&name).is_none() {
        return Some(format!(
            "bounds {}() OVER (...), which Sluice does not keep yet; a Top-N ranks with \
             ROW_NUMBER(), RANK() or DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...)",
            fun.name()
        ));
    }
    if params.order_by.is_empty() {
        return Some(
            "ranks with an OVER (...) without an ORDER BY, which leaves the rows \
             kept to chance; add ORDER BY (e.g. ORDER BY ts DESC to keep the latest)"
                .into(),
        );
    }
    None
}

/// The Top-N ranking function named `name` (lower case), if it is one.
pub(super) fn rank_function(name: &str) -> Option<RankFunction> {
    match name {
        "row_number" => Some(RankFunction::RowNumber),
        "rank" => Some(RankFunction::Rank),
        "dense_rank" => Some(RankFunction::DenseRank),
        _ => None,
    }
}
