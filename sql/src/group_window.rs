//! Flink's group-window syntax: `GROUP BY TUMBLE(ts, size)`, `HOP(ts,
//! slide, size)` or `SESSION(ts, gap)` beside the other keys, with
//! `TUMBLE_START(ts, size)`, `TUMBLE_END(...)` and `TUMBLE_ROWTIME(...)`
//! (and the `HOP_`, `SESSION_` ones) in the SELECT. Each such query is
//! rewritten into the window table functions' form, which the rest of the
//! planner knows: its stream becomes a windowed placeholder (see
//! `event_time`), the window call in GROUP BY becomes `window_start,
//! window_end`, and the `_START`/`_END` calls those columns. A SESSION's
//! other GROUP BY columns are its PARTITION BY, as Flink keeps a session
//! per key.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, Ident, ObjectName, Query, Select, SetExpr, TableAlias, TableFactor,
};
use sluice_engine::Window;

use crate::event_time::{interval_duration, Problem, WindowCall};
use crate::{normalize, Pos};

/// Rewrites every SELECT of `query` (subqueries in FROM included) that
/// groups by a window function; the windowed streams it now reads, by
/// placeholder name (numbered from `next_id`).
pub(crate) fn rewrite(
    query: &mut Query,
    next_id: &mut usize,
) -> Result<BTreeMap<String, WindowCall>, Problem> {
    let mut calls = BTreeMap::new();
    rewrite_set(query.body.as_mut(), next_id, &mut calls)?;
    Ok(calls)
}

fn rewrite_set(
    body: &mut SetExpr,
    next_id: &mut usize,
    calls: &mut BTreeMap<String, WindowCall>,
) -> Result<(), Problem> {
    match body {
        SetExpr::Select(select) => {
            for table in &mut select.from {
                if let TableFactor::Derived { subquery, .. } = &mut table.relation {
                    rewrite_set(subquery.body.as_mut(), next_id, calls)?;
                }
            }
            if let Some((placeholder, call)) = rewrite_select(select, *next_id)? {
                *next_id += 1;
                calls.insert(placeholder, call);
            }
            Ok(())
        }
        SetExpr::Query(q) => rewrite_set(q.body.as_mut(), next_id, calls),
        SetExpr::SetOperation { left, right, .. } => {
            rewrite_set(left, next_id, calls)?;
            rewrite_set(right, next_id, calls)
        }
        _ => Ok(()),
    }
}

/// The window function a GROUP BY item calls: its kind and arguments.
fn window_function(e: &Expr) -> Option<(String, &[FunctionArg])> {
    let Expr::Function(f) = e else {
        return None;
    };
    let name = f.name.to_string().to_ascii_uppercase();
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    ["TUMBLE", "HOP", "SESSION"]
        .contains(&name.as_str())
        .then_some((name, list.args.as_slice()))
}

fn pos(ident: &Ident) -> Pos {
    Pos {
        line: ident.span.start.line,
        column: ident.span.start.column,
    }
}

fn rewrite_select(select: &mut Select, id: usize) -> Result<Option<(String, WindowCall)>, Problem> {
    let GroupByExpr::Expressions(keys, _) = &mut select.group_by else {
        return Ok(None);
    };
    let Some(at) = keys.iter().position(|e| window_function(e).is_some()) else {
        return Ok(None);
    };
    let Some((kind, args)) = window_function(&keys[at]) else {
        return Ok(None);
    };
    let arg_exprs: Vec<&Expr> = args
        .iter()
        .filter_map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect();
    let (column_ident, intervals) = match arg_exprs.split_first() {
        Some((Expr::Identifier(id), rest)) => (id.clone(), rest),
        Some((Expr::CompoundIdentifier(ids), rest)) if !ids.is_empty() => {
            (ids[ids.len() - 1].clone(), rest)
        }
        _ => {
            return Err(Problem::Parser(
                datafusion::sql::sqlparser::parser::ParserError::ParserError(format!(
                    "{kind}(...) in GROUP BY takes the time column first, as {kind}(ts, \
                     INTERVAL '10' SECOND)"
                )),
            ))
        }
    };
    let column = normalize(&column_ident);
    let column_pos = pos(&column_ident);
    let durations = intervals
        .iter()
        .map(|e| interval_duration(e).map_err(|m| Problem::At(column_pos, m)))
        .collect::<Result<Vec<_>, _>>()?;
    let [from] = select.from.as_mut_slice() else {
        return Err(Problem::At(
            column_pos,
            format!(
                "GROUP BY {kind}(...) reads one stream; with joins or several streams in FROM, \
                 window with TABLE({kind}(TABLE s, DESCRIPTOR(ts), ...)) instead"
            ),
        ));
    };
    let TableFactor::Table { name, alias, .. } = &mut from.relation else {
        return Err(Problem::At(
            column_pos,
            format!("GROUP BY {kind}(...) reads a stream or a view named in FROM"),
        ));
    };
    if !from.joins.is_empty() {
        return Err(Problem::At(
            column_pos,
            format!(
                "GROUP BY {kind}(...) reads one stream; with a join, window with \
                 TABLE({kind}(TABLE s, DESCRIPTOR(ts), ...)) instead"
            ),
        ));
    }
    let stream_ident = name.0.last().and_then(|p| p.as_ident()).cloned();
    let Some(stream_ident) = stream_ident else {
        return Ok(None);
    };
    let stream = normalize(&stream_ident);
    let others: Vec<String> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .filter_map(|(_, e)| match e {
            Expr::Identifier(id) => Some(normalize(id)),
            Expr::CompoundIdentifier(ids) => ids.last().map(normalize),
            _ => None,
        })
        .collect();
    let window = match (kind.as_str(), durations.as_slice()) {
        ("TUMBLE", [size]) => Window::tumble(column, *size),
        ("HOP", [slide, size]) => Window::hop(column, *slide, *size),
        ("SESSION", [gap]) => Window::Session {
            column,
            partition_by: others,
            gap: *gap,
        },
        _ => {
            return Err(Problem::At(
                column_pos,
                format!(
                    "{kind} got {} interval argument(s): write TUMBLE(ts, size), HOP(ts, slide, \
                     size) or SESSION(ts, gap)",
                    durations.len()
                ),
            ))
        }
    };
    let placeholder = format!("__sluice_window_{id}");
    if alias.is_none() {
        *alias = Some(TableAlias {
            name: Ident::with_quote('"', stream.clone()),
            columns: Vec::new(),
            explicit: true,
            at: None,
        });
    }
    *name = ObjectName::from(vec![Ident::new(placeholder.clone())]);
    keys.splice(
        at..=at,
        [
            Expr::Identifier(Ident::new("window_start")),
            Expr::Identifier(Ident::new("window_end")),
        ],
    );
    let prefix = format!("{kind}_");
    let _ = visit_expressions_mut(&mut select.projection, |e| {
        replace_bound(e, &prefix);
        ControlFlow::<()>::Continue(())
    });
    if let Some(having) = &mut select.having {
        let _ = visit_expressions_mut(having, |e| {
            replace_bound(e, &prefix);
            ControlFlow::<()>::Continue(())
        });
    }
    let call = WindowCall {
        stream,
        stream_pos: pos(&stream_ident),
        column_pos,
        window,
    };
    Ok(Some((placeholder, call)))
}

/// `TUMBLE_START(...)` to `window_start`, `_END` to `window_end`, and
/// `_ROWTIME` to the last instant inside the window (`window_end` less a
/// millisecond, as Flink's rowtime).
fn replace_bound(e: &mut Expr, prefix: &str) {
    let Expr::Function(f) = e else {
        return;
    };
    let name = f.name.to_string().to_ascii_uppercase();
    let Some(bound) = name.strip_prefix(prefix) else {
        return;
    };
    let column = |n: &str| Expr::Identifier(Ident::new(n));
    *e = match bound {
        "START" => column("window_start"),
        "END" => column("window_end"),
        "ROWTIME" => Expr::BinaryOp {
            left: Box::new(column("window_end")),
            op: BinaryOperator::Minus,
            right: Box::new(Expr::Interval(datafusion::sql::sqlparser::ast::Interval {
                value: Box::new(Expr::value(
                    datafusion::sql::sqlparser::ast::Value::SingleQuotedString("1".into()),
                )),
                leading_field: Some(datafusion::sql::sqlparser::ast::DateTimeField::Millisecond),
                leading_precision: None,
                last_field: None,
                fractional_seconds_precision: None,
            })),
        },
        _ => return,
    };
}
