//! Event time in SQL: `WATERMARK FOR` inside `CREATE STREAM`, and the
//! window table functions `TABLE(TUMBLE(TABLE s, DESCRIPTOR(ts), size))`,
//! `TABLE(HOP(TABLE s, DESCRIPTOR(ts), slide, size))`,
//! `TABLE(CUMULATE(TABLE s, DESCRIPTOR(ts), step, size))` and
//! `TABLE(SESSION(TABLE s PARTITION BY key, DESCRIPTOR(ts), gap))`.
//!
//! Stock sqlparser cannot parse the window functions' `TABLE s` and
//! `DESCRIPTOR(ts)` arguments, so before the statements are parsed each
//! call is parsed here with sqlparser's own sub-parsers over its tokens,
//! and its tokens are replaced by one placeholder table name that keeps the
//! call's position. When an `INSERT` uses a placeholder, the runner
//! registers it as a view over the windowed stream ([`WindowCall`]), so
//! DataFusion plans the rest of the query as usual. Every token keeps its
//! place in the user's text, so errors anywhere still point at the right
//! line and column.

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::sql::sqlparser::ast::{Expr, Value};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Whitespace};
use sluice_engine::{parse_duration, WatermarkSpec, Window};

use crate::{normalize, Pos};

/// What went wrong, and where.
#[derive(Debug)]
pub(crate) enum Problem {
    /// A message about the text at a position.
    At(Pos, String),
    /// sqlparser's own error (its message carries the position).
    Parser(ParserError),
}

impl From<ParserError> for Problem {
    fn from(e: ParserError) -> Self {
        Self::Parser(e)
    }
}

/// One window table function call of the text.
#[derive(Debug, Clone)]
pub(crate) struct WindowCall {
    /// The stream in `TABLE s`.
    pub stream: String,
    /// Where `s` is.
    pub stream_pos: Pos,
    /// Where the `DESCRIPTOR` column is.
    pub column_pos: Pos,
    /// The window.
    pub window: Window,
}

/// The rest of `WATERMARK FOR ts AS ts - INTERVAL '5' SECOND`, after the
/// word `WATERMARK`.
pub(crate) fn parse_watermark(p: &mut Parser<'_>) -> Result<WatermarkSpec, Problem> {
    p.expect_keyword(Keyword::FOR)?;
    let column = normalize(&p.parse_identifier()?);
    p.expect_keyword(Keyword::AS)?;
    let at = Pos::from(&p.peek_token());
    let expr = p.parse_expr()?;
    let shape = || {
        Problem::At(
            at,
            format!(
                "expected '{column}' or '{column} - INTERVAL ...' (how late rows may arrive), \
                 found '{expr}'"
            ),
        )
    };
    let delay = match &expr {
        Expr::Identifier(id) if normalize(id) == column => Duration::ZERO,
        Expr::BinaryOp { left, op, right } => match (left.as_ref(), right.as_ref()) {
            (Expr::Identifier(id), interval)
                if normalize(id) == column
                    && *op == datafusion::sql::sqlparser::ast::BinaryOperator::Minus =>
            {
                interval_duration(interval).map_err(|m| Problem::At(at, m))?
            }
            _ => return Err(shape()),
        },
        _ => return Err(shape()),
    };
    Ok(WatermarkSpec::new(column, delay))
}

/// Parses every window call in `tokens` and replaces it by a placeholder
/// table name (`__sluice_window_<n>`, aliased as the stream unless the
/// text gives an alias). Returns the new tokens and the calls by
/// placeholder.
pub(crate) fn extract_windows(
    mut tokens: Vec<TokenWithSpan>,
    next_id: &mut usize,
) -> Result<(Vec<TokenWithSpan>, BTreeMap<String, WindowCall>), Problem> {
    let mut calls = BTreeMap::new();
    let mut i = 0;
    while i < tokens.len() {
        if !starts_window_call(&tokens, i) {
            i += 1;
            continue;
        }
        let dialect = GenericDialect {};
        let mut p = Parser::new(&dialect).with_tokens_with_locations(tokens[i..].to_vec());
        let call = parse_window_call(&mut p)?;
        let consumed = p.index();
        let placeholder = format!("__sluice_window_{next_id}");
        *next_id += 1;
        let span = tokens[i].span;
        let at = |token: Token| TokenWithSpan { token, span };
        let mut replacement = vec![at(Token::make_word(&placeholder, None))];
        let aliased = next_significant(&tokens, i + consumed).is_some_and(|j| {
            matches!(&tokens[j].token, Token::Word(w)
                if w.keyword == Keyword::AS || w.keyword == Keyword::NoKeyword)
        });
        if !aliased {
            // Columns are then qualified by the stream's name, as if the
            // stream itself were in FROM.
            replacement.extend([
                at(Token::Whitespace(Whitespace::Space)),
                at(Token::make_keyword("AS")),
                at(Token::Whitespace(Whitespace::Space)),
                at(Token::make_word(&call.stream, Some('"'))),
            ]);
        }
        let added = replacement.len();
        tokens.splice(i..i + consumed, replacement);
        calls.insert(placeholder, call);
        i += added;
    }
    Ok((tokens, calls))
}

/// `TABLE ( TUMBLE|HOP|CUMULATE|SESSION (` at `i`.
fn starts_window_call(tokens: &[TokenWithSpan], i: usize) -> bool {
    let is_word =
        |t: &Token, w: &str| matches!(t, Token::Word(x) if x.value.eq_ignore_ascii_case(w));
    if !is_word(&tokens[i].token, "TABLE") {
        return false;
    }
    let Some(open) = next_significant(tokens, i + 1) else {
        return false;
    };
    let Some(name) = next_significant(tokens, open + 1) else {
        return false;
    };
    let Some(open2) = next_significant(tokens, name + 1) else {
        return false;
    };
    tokens[open].token == Token::LParen
        && ["TUMBLE", "HOP", "CUMULATE", "SESSION"]
            .iter()
            .any(|w| is_word(&tokens[name].token, w))
        && tokens[open2].token == Token::LParen
}

fn next_significant(tokens: &[TokenWithSpan], from: usize) -> Option<usize> {
    (from..tokens.len()).find(|&j| !matches!(tokens[j].token, Token::Whitespace(_)))
}

fn parse_window_call(p: &mut Parser<'_>) -> Result<WindowCall, Problem> {
    p.expect_keyword(Keyword::TABLE)?;
    p.expect_token(&Token::LParen)?;
    let function = p.next_token();
    let name = function.token.to_string().to_ascii_uppercase();
    p.expect_token(&Token::LParen)?;
    let t = p.peek_token();
    if !p.parse_keyword(Keyword::TABLE) {
        return Err(Problem::At(
            Pos::from(&t),
            format!(
                "expected 'TABLE <stream>' as the first argument of {name}, found '{}'",
                t.token
            ),
        ));
    }
    let stream_pos = Pos::from(&p.peek_token());
    let stream = normalize(&p.parse_identifier()?);
    let mut partition_by = Vec::new();
    // SESSION's PARTITION BY is optional: without it, one run of sessions.
    if name == "SESSION" && p.parse_keywords(&[Keyword::PARTITION, Keyword::BY]) {
        loop {
            partition_by.push(normalize(&p.parse_identifier()?));
            let descriptor_next = matches!(&p.peek_nth_token(1).token,
                Token::Word(w) if w.value.eq_ignore_ascii_case("DESCRIPTOR"));
            if descriptor_next || !p.consume_token(&Token::Comma) {
                break;
            }
        }
    }
    p.expect_token(&Token::Comma)?;
    let t = p.next_token();
    if !matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("DESCRIPTOR")) {
        return Err(Problem::At(
            Pos::from(&t),
            format!(
                "expected 'DESCRIPTOR(<time column>)' as the second argument of {name}, found '{}'",
                t.token
            ),
        ));
    }
    p.expect_token(&Token::LParen)?;
    let column_pos = Pos::from(&p.peek_token());
    let column = normalize(&p.parse_identifier()?);
    p.expect_token(&Token::RParen)?;
    let mut durations = Vec::new();
    while p.consume_token(&Token::Comma) {
        let at = Pos::from(&p.peek_token());
        let expr = p.parse_expr()?;
        durations.push(interval_duration(&expr).map_err(|m| Problem::At(at, m))?);
    }
    p.expect_token(&Token::RParen)?;
    p.expect_token(&Token::RParen)?;
    let window = match (name.as_str(), durations.as_slice()) {
        ("TUMBLE", [size]) => Window::tumble(column, *size),
        ("HOP", [slide, size]) => Window::hop(column, *slide, *size),
        ("CUMULATE", [step, size]) => Window::cumulate(column, *step, *size),
        ("SESSION", [gap]) => Window::Session {
            column,
            partition_by,
            gap: *gap,
        },
        _ => {
            let usage = match name.as_str() {
                "HOP" => "HOP(TABLE s, DESCRIPTOR(ts), slide, size)",
                "CUMULATE" => "CUMULATE(TABLE s, DESCRIPTOR(ts), step, size)",
                "SESSION" => "SESSION(TABLE s PARTITION BY key, DESCRIPTOR(ts), gap)",
                _ => "TUMBLE(TABLE s, DESCRIPTOR(ts), size)",
            };
            return Err(Problem::At(
                Pos::from(&function),
                format!(
                    "{name} got {} interval argument(s); write {usage} with INTERVAL values",
                    durations.len()
                ),
            ));
        }
    };
    Ok(WindowCall {
        stream,
        stream_pos,
        column_pos,
        window,
    })
}

/// `INTERVAL '5' SECOND` or `INTERVAL '5 seconds'` as a duration.
pub(crate) fn interval_duration(expr: &Expr) -> Result<Duration, String> {
    let Expr::Interval(interval) = expr else {
        return Err(format!(
            "expected an INTERVAL such as INTERVAL '10' SECOND, found '{expr}'"
        ));
    };
    let value = match interval.value.as_ref() {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::Number(s, _) => s.clone(),
            other => other.to_string(),
        },
        other => other.to_string(),
    };
    let text = match &interval.leading_field {
        Some(unit) => format!("{value} {unit}"),
        None => value,
    };
    parse_duration(&text).map_err(|e| format!("'{expr}': {e}"))
}
