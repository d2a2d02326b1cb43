#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Sluice's SQL surface: `CREATE STREAM`, `INSERT INTO`, `SET`, `EXPLAIN`,
//! `SHOW STREAMS`, `DROP STREAM`.
//!
//! [`SqlRunner`] parses a file with sqlparser's own `Parser` — its tokens
//! and sub-parsers (column definitions, queries), never string rewriting — so
//! every error points at the line and column of the user's text
//! ([`SqlError`]). Standard `SELECT`s go to DataFusion's SQL planner; the
//! streaming statements around them become engine calls.
//!
//! [`SqlRunner::prepare`] declares streams, applies settings and plans every
//! query without starting any, so a file with a mistake fails before
//! touching a checkpoint or a broker; [`PendingQuery::start`] then starts
//! them.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = sluice_engine::Session::new();
//! let mut runner = sluice_sql::SqlRunner::new(&session, "example.sql");
//! let err = runner
//!     .run("CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_secnd' = '5');")
//!     .await
//!     .unwrap_err();
//! assert_eq!((err.line, err.column), (1, 47));
//! assert!(err.message.contains("did you mean 'rows_per_second'"));
//! # Ok(()) }
//! ```

mod ddl;
mod error;
mod event_time;
mod group_window;
mod insert;
mod settings;
mod sink_columns;
mod substitute;
mod temporal;
mod time_units;
mod types;

use std::collections::{BTreeMap, BTreeSet};

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use sluice_engine::{ConnectorRegistry, Session, SluiceError, StreamDefinition, StreamingQuery};

pub use error::SqlError;
use error::{parser_location, strip_location};
use event_time::{extract_windows, Problem, WindowCall};
pub use insert::PendingQuery;
use settings::Settings;

/// What one statement did.
#[derive(Debug)]
pub enum StatementOutcome {
    /// `CREATE STREAM` declared a stream.
    Created {
        /// Its name.
        stream: String,
    },
    /// `CREATE TABLE` declared a static table.
    TableCreated {
        /// Its name.
        table: String,
    },
    /// `CREATE VIEW` named a query, which later statements read as a
    /// stream.
    ViewCreated {
        /// Its name.
        view: String,
    },
    /// `CREATE FUNCTION` named a function the program registered.
    FunctionCreated {
        /// Its name.
        function: String,
    },
    /// `DROP VIEW` removed one.
    ViewDropped {
        /// Its name.
        view: String,
    },
    /// `DROP STREAM` removed one.
    Dropped {
        /// Its name.
        stream: String,
    },
    /// `SET` changed a setting for the statements after it.
    Set {
        /// The setting.
        key: String,
        /// Its new value.
        value: String,
    },
    /// `EXPLAIN INSERT INTO ...`: the incremental plan.
    Explained {
        /// The sink stream.
        sink: String,
        /// The plan as text.
        plan: String,
    },
    /// `SHOW STREAMS`: one line per stream.
    Streams(Vec<String>),
    /// `INSERT INTO` started a continuous query.
    Started(StreamingQuery),
}

/// A statement after [`SqlRunner::prepare`].
#[derive(Debug)]
pub enum Prepared {
    /// Done already (declarations, settings, explains).
    Done(StatementOutcome),
    /// A query to start.
    Query(Box<PendingQuery>),
}

/// Runs SQL text against a session, statement by statement.
#[derive(Debug)]
pub struct SqlRunner<'a> {
    session: &'a Session,
    file: String,
    settings: Settings,
    checkpoints: BTreeSet<String>,
    /// The `pipeline.name`s of the queries so far.
    pipelines: BTreeSet<String>,
    /// Window table function calls of the text, by placeholder name.
    windows: BTreeMap<String, WindowCall>,
    next_window: usize,
    /// Where each `CREATE STREAM`'s options are written, by stream: a
    /// Kafka stream's source options are checked when a query reads it,
    /// and a mistake in one is shown at the option, not at the query. The
    /// text they are positions in comes with them.
    option_positions: BTreeMap<String, (String, BTreeMap<String, Pos>)>,
    /// Flink's filesystem tables (`CREATE TABLE ... WITH ('connector' =
    /// 'filesystem')`) as the `filesystem` sink an `INSERT INTO` them
    /// writes through.
    file_tables: BTreeMap<String, StreamDefinition>,
    /// The text's `FOR SYSTEM_TIME AS OF` clauses not yet checked by the
    /// `INSERT` they are in.
    as_of: Vec<temporal::AsOf>,
}

/// Where a statement or token starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pos {
    line: u64,
    column: u64,
}

impl From<&TokenWithSpan> for Pos {
    fn from(t: &TokenWithSpan) -> Self {
        Self {
            line: t.span.start.line,
            column: t.span.start.column,
        }
    }
}

impl<'a> SqlRunner<'a> {
    /// A runner over `session`; `file` names the text in errors.
    pub fn new(session: &'a Session, file: &str) -> Self {
        Self {
            session,
            file: file.to_string(),
            settings: Settings::default(),
            checkpoints: BTreeSet::new(),
            pipelines: BTreeSet::new(),
            windows: BTreeMap::new(),
            next_window: 0,
            option_positions: BTreeMap::new(),
            file_tables: BTreeMap::new(),
            as_of: Vec::new(),
        }
    }

    /// Prepares every statement of `text` and starts its queries.
    pub async fn run(&mut self, text: &str) -> Result<Vec<StatementOutcome>, SqlError> {
        let mut outcomes = Vec::new();
        for p in self.prepare(text).await? {
            outcomes.push(match p {
                Prepared::Done(o) => o,
                Prepared::Query(q) => StatementOutcome::Started(q.start().await?),
            });
        }
        Ok(outcomes)
    }

    /// Declares streams, applies settings and plans queries, starting none.
    pub async fn prepare(&mut self, text: &str) -> Result<Vec<Prepared>, SqlError> {
        let dialect = GenericDialect {};
        let tokens = Tokenizer::new(&dialect, text)
            .tokenize_with_location()
            .map_err(|e| self.parser_error(text, &ParserError::TokenizerError(e.to_string())))?;
        let (tokens, windows) =
            extract_windows(tokens, &mut self.next_window).map_err(|e| self.problem(text, e))?;
        self.windows.extend(windows);
        let (tokens, as_of) = temporal::extract(tokens);
        self.as_of.extend(as_of);
        let mut p = Parser::new(&dialect).with_tokens_with_locations(tokens);
        let mut out = Vec::new();
        loop {
            while p.consume_token(&Token::SemiColon) {}
            let start = p.peek_token();
            if start.token == Token::EOF {
                break;
            }
            out.push(self.statement(&mut p, text, Pos::from(&start)).await?);
            let next = p.peek_token();
            if !matches!(next.token, Token::SemiColon | Token::EOF) {
                return Err(self.err(
                    text,
                    Pos::from(&next),
                    format!("expected ';' after the statement, found '{}'", next.token),
                ));
            }
        }
        Ok(out)
    }

    fn err(&self, text: &str, pos: Pos, message: impl Into<String>) -> SqlError {
        SqlError::at(&self.file, text, pos.line, pos.column, message)
    }

    fn problem(&self, text: &str, problem: Problem) -> SqlError {
        match problem {
            Problem::At(pos, message) => self.err(text, pos, message),
            Problem::Parser(e) => self.parser_error(text, &e),
        }
    }

    /// An option's or setting's name (`what` in the error): quoted, or
    /// words joined by dots (`'format.on-error'`, `trigger.interval`),
    /// in lower case, with its first token.
    fn key(
        &self,
        p: &mut Parser<'_>,
        text: &str,
        what: &str,
    ) -> Result<(TokenWithSpan, String), SqlError> {
        let key_tok = p.next_token();
        let mut key = match &key_tok.token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
            Token::Word(w) => w.value.clone(),
            other => {
                return Err(self.err(
                    text,
                    Pos::from(&key_tok),
                    format!("expected {what}, found '{other}'"),
                ))
            }
        };
        while p.consume_token(&Token::Period) {
            let part = p.next_token();
            match &part.token {
                Token::Word(w) => {
                    key.push('.');
                    key.push_str(&w.value);
                }
                other => {
                    return Err(self.err(
                        text,
                        Pos::from(&part),
                        format!("expected a name after '.', found '{other}'"),
                    ))
                }
            }
        }
        Ok((key_tok, key.to_ascii_lowercase()))
    }

    fn parser_error(&self, text: &str, e: &ParserError) -> SqlError {
        let message = e.to_string();
        let (line, column) = parser_location(&message).unwrap_or((1, 1));
        SqlError::at(&self.file, text, line, column, strip_location(&message))
    }

    /// The option positions of the streams declared in `text`.
    fn options_in(&self, text: &str) -> BTreeMap<String, BTreeMap<String, Pos>> {
        self.option_positions
            .iter()
            .filter(|(_, (written, _))| written == text)
            .map(|(stream, (_, positions))| (stream.clone(), positions.clone()))
            .collect()
    }

    fn engine_error(&self, text: &str, pos: Pos, e: SluiceError) -> SqlError {
        // DataFusion knows where in the query its errors are.
        let mut at = pos;
        if let SluiceError::DataFusion(df) = &e {
            if let Some(span) = df.diagnostic().and_then(|d| d.span) {
                at = Pos {
                    line: span.start.line,
                    column: span.start.column,
                };
            }
        }
        let message = e.to_string();
        if let Some(word) = unknown_name(&message) {
            if let Some(found) = locate_word(text, pos, word) {
                at = found;
            }
        }
        let user = e.is_user_error();
        let mut err = self.err(text, at, message);
        err.user_error = user;
        err
    }

    async fn statement(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
        pos: Pos,
    ) -> Result<Prepared, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        if p.parse_keyword(Keyword::CREATE) {
            if p.parse_keyword(Keyword::TABLE) {
                // Flink declares a Kafka topic as a table with a connector:
                // that is a stream here. Files stay static tables.
                return if names_a_stream_connector(p, &self.session.connectors()) {
                    self.create_stream(p, text).await.map(Prepared::Done)
                } else {
                    self.create_table(p, text).await.map(Prepared::Done)
                };
            }
            let temporary = p.parse_keyword(Keyword::TEMPORARY);
            if p.parse_keyword(Keyword::VIEW) {
                return self.create_view(p, text).await.map(Prepared::Done);
            }
            let system = temporary && p.parse_keyword(Keyword::SYSTEM);
            if p.parse_keyword(Keyword::FUNCTION) {
                return self.create_function(p, text).map(Prepared::Done);
            }
            if system {
                let t = p.peek_token();
                return Err(self.err(
                    text,
                    Pos::from(&t),
                    format!(
                        "expected FUNCTION after CREATE TEMPORARY SYSTEM, found '{}'",
                        t.token
                    ),
                ));
            }
            if temporary {
                let t = p.peek_token();
                return Err(self.err(
                    text,
                    Pos::from(&t),
                    format!("expected VIEW after CREATE TEMPORARY, found '{}'", t.token),
                ));
            }
            if !p.parse_keyword(Keyword::STREAM) {
                let t = p.peek_token();
                return Err(self.err(
                    text,
                    Pos::from(&t),
                    format!(
                        "expected STREAM, TABLE, VIEW or FUNCTION after CREATE, found '{}': declare sources \
                         and sinks with CREATE STREAM name (columns) WITH (connector = '...'), \
                         static tables with CREATE TABLE name WITH (path = '...', format = \
                         '...'), named queries with CREATE VIEW name AS SELECT ...",
                        t.token
                    ),
                ));
            }
            return self.create_stream(p, text).await.map(Prepared::Done);
        }
        if p.parse_keyword(Keyword::SET) {
            return self.set(p, text).map(Prepared::Done);
        }
        if p.parse_keyword(Keyword::INSERT) {
            return self
                .insert(p, text, pos, false)
                .await
                .map(|q| Prepared::Query(Box::new(q)));
        }
        if p.parse_keyword(Keyword::EXECUTE) {
            return self
                .statement_set(p, text, pos)
                .await
                .map(|q| Prepared::Query(Box::new(q)));
        }
        if p.parse_keyword(Keyword::EXPLAIN) {
            if p.parse_keyword(Keyword::EXECUTE) {
                let q = self.statement_set(p, text, pos).await?;
                let plan = q.explain()?;
                return Ok(Prepared::Done(StatementOutcome::Explained {
                    sink: q.name,
                    plan,
                }));
            }
            p.expect_keyword(Keyword::INSERT).map_err(|e| pe(self, e))?;
            let q = self.insert(p, text, pos, false).await?;
            let plan = q.explain()?;
            return Ok(Prepared::Done(StatementOutcome::Explained {
                sink: q.name,
                plan,
            }));
        }
        if p.parse_keyword(Keyword::SHOW) {
            self.expect_word(p, text, "STREAMS")?;
            let lines = self
                .session
                .streams()
                .iter()
                .map(|s| format!("{} ({})", s.name, s.connector))
                .collect();
            return Ok(Prepared::Done(StatementOutcome::Streams(lines)));
        }
        if p.parse_keyword(Keyword::DROP) {
            if p.parse_keyword(Keyword::VIEW) {
                return self.drop_view(p, text).await.map(Prepared::Done);
            }
            p.expect_keyword(Keyword::STREAM).map_err(|e| pe(self, e))?;
            let name_tok = p.peek_token();
            let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
            self.session
                .drop_stream(&name)
                .map_err(|e| self.engine_error(text, Pos::from(&name_tok), e))?;
            return Ok(Prepared::Done(StatementOutcome::Dropped { stream: name }));
        }
        let t = p.peek_token();
        let message = if matches!(&t.token, Token::Word(w) if w.keyword == Keyword::SELECT || w.keyword == Keyword::WITH)
        {
            "a SELECT on its own has nowhere to write: use INSERT INTO <stream> SELECT ..."
                .to_string()
        } else {
            format!(
                "expected CREATE STREAM, CREATE VIEW, INSERT INTO, EXECUTE STATEMENT SET, SET, EXPLAIN, SHOW STREAMS, DROP STREAM or DROP VIEW, found '{}'",
                t.token
            )
        };
        Err(self.err(text, Pos::from(&t), message))
    }

    fn expect_word(&self, p: &mut Parser<'_>, text: &str, word: &str) -> Result<(), SqlError> {
        let t = p.next_token();
        match &t.token {
            Token::Word(w) if w.value.eq_ignore_ascii_case(word) => Ok(()),
            other => Err(self.err(
                text,
                Pos::from(&t),
                format!("expected {word}, found '{other}'"),
            )),
        }
    }
}

/// The name a DataFusion "unknown name" message is about.
fn unknown_name(message: &str) -> Option<&str> {
    let rest = message.split("No field named ").nth(1)?;
    let name = rest
        .split(|c: char| c.is_whitespace() || c == '.' && !rest.starts_with('"'))
        .next()?
        .trim_matches('"');
    (!name.is_empty()).then_some(name)
}

/// The first occurrence of `word` as a whole identifier at or after `from`.
fn locate_word(text: &str, from: Pos, word: &str) -> Option<Pos> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    for (i, line) in text
        .lines()
        .enumerate()
        .skip((from.line.max(1) - 1) as usize)
    {
        let line_no = i as u64 + 1;
        let skip = if line_no == from.line {
            (from.column.max(1) - 1) as usize
        } else {
            0
        };
        let chars: Vec<char> = line.chars().collect();
        let w: Vec<char> = word.chars().collect();
        let mut c = skip;
        while c + w.len() <= chars.len() {
            let matches = chars[c..c + w.len()]
                .iter()
                .zip(&w)
                .all(|(a, b)| a.eq_ignore_ascii_case(b));
            let before_ok = c == 0 || !is_ident(chars[c - 1]);
            let after_ok = c + w.len() == chars.len() || !is_ident(chars[c + w.len()]);
            if matches && before_ok && after_ok {
                return Some(Pos {
                    line: line_no,
                    column: c as u64 + 1,
                });
            }
            c += 1;
        }
    }
    None
}

/// True when the `CREATE TABLE` ahead declares `'connector' = '...'` other
/// than `'filesystem'` or one that answers lookups (`'jdbc'`): Flink's way
/// to declare a Kafka topic.
fn names_a_stream_connector(p: &Parser<'_>, connectors: &ConnectorRegistry) -> bool {
    let text = |t: &Token| match t {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Some(s.clone()),
        Token::Word(w) => Some(w.value.clone()),
        _ => None,
    };
    for n in 0.. {
        let t = p.peek_nth_token(n).token;
        if matches!(t, Token::SemiColon | Token::EOF) {
            return false;
        }
        let is_key = text(&t).is_some_and(|k| {
            k.eq_ignore_ascii_case("connector") || k.eq_ignore_ascii_case("connector.type")
        });
        if is_key && p.peek_nth_token(n + 1).token == Token::Eq {
            return text(&p.peek_nth_token(n + 2).token).is_some_and(|v| {
                let lookup = connectors.get(&v).is_ok_and(|c| c.is_lookup());
                !v.eq_ignore_ascii_case("filesystem") && !lookup
            });
        }
    }
    false
}

/// An identifier's name: as written, quoted or not, since Flink SQL's
/// identifiers keep their case (the session plans with DataFusion's
/// lower-casing turned off).
pub(crate) fn normalize(ident: &datafusion::sql::sqlparser::ast::Ident) -> String {
    ident.value.clone()
}
