//! `JOIN t FOR SYSTEM_TIME AS OF s.p_time AS alias ON ...`: Flink's lookup
//! and temporal joins.
//!
//! Stock sqlparser parses `FOR SYSTEM_TIME AS OF` only in some dialects, so
//! before the statements are parsed each one is cut out of the tokens here
//! and kept as an [`AsOf`], which the `INSERT` checks once its query is
//! planned:
//! - against a static table (`CREATE TABLE ... WITH ('connector' =
//!   'filesystem')`, files read when an epoch runs) as of a `PROCTIME()`
//!   column, it is Flink's lookup join: each row joins the table as it is
//!   when the row is processed, which is what a stream–static join does;
//! - against a stream with a watermark, as of an event-time column of the
//!   other side, it is Flink's event-time temporal join: the join is
//!   marked (`temporal_as_of(probe time, version time)` in its condition)
//!   for the engine's temporal join operator, each row joined with its
//!   key's version at its time;
//! - anything else is refused at the clause, saying what runs instead.

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{Expr, Join, LogicalPlan};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Whitespace};

use crate::Pos;

/// One `FOR SYSTEM_TIME AS OF` of the text.
#[derive(Debug, Clone)]
pub(crate) struct AsOf {
    /// The table joined (the name before `FOR`).
    pub table: String,
    /// The time column (the last part of `s.p_time`).
    pub time: String,
    /// Where `FOR` is.
    pub pos: Pos,
}

/// `tokens` without their `FOR SYSTEM_TIME AS OF column` clauses, and the
/// clauses.
pub(crate) fn extract(mut tokens: Vec<TokenWithSpan>) -> (Vec<TokenWithSpan>, Vec<AsOf>) {
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let Some((end, time)) = as_of_at(&tokens, i) else {
            i += 1;
            continue;
        };
        let table = (0..i)
            .rev()
            .find(|&j| !matches!(tokens[j].token, Token::Whitespace(_)))
            .and_then(|j| match &tokens[j].token {
                Token::Word(w) => Some(w.value.clone()),
                _ => None,
            })
            .unwrap_or_default();
        found.push(AsOf {
            table,
            time,
            pos: Pos::from(&tokens[i]),
        });
        let span = tokens[i].span;
        tokens.splice(
            i..end,
            [TokenWithSpan {
                token: Token::Whitespace(Whitespace::Space),
                span,
            }],
        );
        i += 1;
    }
    (tokens, found)
}

/// At `i`, `FOR SYSTEM_TIME AS OF a.b`: the index after it and `b`.
fn as_of_at(tokens: &[TokenWithSpan], i: usize) -> Option<(usize, String)> {
    let word = |t: &Token| match t {
        Token::Word(w) => Some(w.clone()),
        _ => None,
    };
    let next = |from: usize| {
        (from..tokens.len()).find(|&j| !matches!(tokens[j].token, Token::Whitespace(_)))
    };
    if word(&tokens[i].token)?.keyword != Keyword::FOR {
        return None;
    }
    let system_time = next(i + 1)?;
    if !word(&tokens[system_time].token)?
        .value
        .eq_ignore_ascii_case("SYSTEM_TIME")
    {
        return None;
    }
    let as_ = next(system_time + 1)?;
    let of = next(as_ + 1)?;
    if word(&tokens[as_].token)?.keyword != Keyword::AS
        || !word(&tokens[of].token)?.value.eq_ignore_ascii_case("OF")
    {
        return None;
    }
    let mut at = next(of + 1)?;
    let mut time = word(&tokens[at].token)?.value;
    while let Some(dot) = next(at + 1).filter(|&j| tokens[j].token == Token::Period) {
        at = next(dot + 1)?;
        time = word(&tokens[at].token)?.value;
    }
    Some((at + 1, time))
}

/// Why `as_of` cannot run in a query planned as `plan`, where it joins a
/// static table, if it cannot.
pub(crate) fn static_problem(as_of: &AsOf, plan: &LogicalPlan) -> Option<String> {
    let (table, time) = (&as_of.table, &as_of.time);
    if !sluice_engine::processing_time_columns(plan).contains(time) {
        return Some(format!(
            "FOR SYSTEM_TIME AS OF '{time}' looks up table '{table}' as of a time that is not \
             processing time: a lookup join is as of a PROCTIME() column, as in Flink \
             (SELECT *, PROCTIME() AS p_time FROM s)"
        ));
    }
    None
}

/// `plan` with its join of stream `as_of.table` marked as a temporal join
/// as of the probe side's `as_of.time`, versioned by the stream's
/// `version` column (its watermark's), or why it cannot be.
pub(crate) fn mark(
    as_of: &AsOf,
    plan: LogicalPlan,
    version: Option<&str>,
) -> Result<LogicalPlan, String> {
    let (table, time) = (&as_of.table, &as_of.time);
    if sluice_engine::processing_time_columns(&plan).contains(time) {
        return Err(format!(
            "FOR SYSTEM_TIME AS OF the processing time '{time}' joins '{table}', a stream: a \
             processing-time temporal join against a stream is not built yet; join it as of an \
             event time (a column with a WATERMARK), or look rows up in a static table \
             (CREATE TABLE ... WITH ('connector' = 'filesystem'))"
        ));
    }
    let Some(version) = version else {
        return Err(format!(
            "FOR SYSTEM_TIME AS OF joins '{table}', which declares no WATERMARK: a temporal join \
             takes each key's version at the probe row's time, by the versioned stream's event \
             time; declare WATERMARK FOR <its time column> AS ... on '{table}'"
        ));
    };
    let scans = |p: &LogicalPlan| {
        p.exists(|n| Ok(matches!(n, LogicalPlan::TableScan(s) if s.table_name.table() == table)))
            .unwrap_or(false)
    };
    let mut marked = 0;
    let mut missing = None;
    let plan = plan
        .transform_up(|node| match node {
            LogicalPlan::Join(join) if scans(&join.right) && !scans(&join.left) => {
                let column = |schema: &DFSchema, name: &str| {
                    schema
                        .qualified_field_with_unqualified_name(name)
                        .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
                };
                let (Ok(probe), Ok(versioned)) = (
                    column(join.left.schema(), time),
                    column(join.right.schema(), version),
                ) else {
                    missing = Some(join.left.schema().field_names().join(", "));
                    return Ok(Transformed::no(LogicalPlan::Join(join)));
                };
                marked += 1;
                let marker = sluice_engine::TemporalAsOf::call(probe, versioned);
                let filter = match join.filter.clone() {
                    Some(f) => f.and(marker),
                    None => marker,
                };
                Ok(Transformed::yes(LogicalPlan::Join(Join {
                    filter: Some(filter),
                    ..join
                })))
            }
            other => Ok(Transformed::no(other)),
        })
        .map_err(|e| e.to_string())?
        .data;
    match (marked, missing) {
        (1, _) => Ok(plan),
        (_, Some(columns)) => Err(format!(
            "FOR SYSTEM_TIME AS OF '{time}': the join's other side has no column '{time}' (it \
             has {columns})"
        )),
        _ => Err(format!(
            "FOR SYSTEM_TIME AS OF: the query joins '{table}' {marked} times where one join \
             was expected; join it once, on the right of its JOIN"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;

    #[test]
    fn the_clause_is_cut_out_and_kept_with_its_table_and_time_column() {
        let text = "SELECT * FROM b JOIN side FOR SYSTEM_TIME AS OF b.p_time AS s ON b.k = s.k";
        let tokens = Tokenizer::new(&GenericDialect {}, text)
            .tokenize_with_location()
            .unwrap();
        let (tokens, found) = extract(tokens);
        let rest: String = tokens.iter().map(|t| t.token.to_string()).collect();
        assert_eq!(rest, "SELECT * FROM b JOIN side   AS s ON b.k = s.k");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].table.as_str(), found[0].time.as_str()),
            ("side", "p_time")
        );
        assert_eq!((found[0].pos.line, found[0].pos.column), (1, 27));
    }
}
