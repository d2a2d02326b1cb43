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

mod error;
mod event_time;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::catalog::view::ViewTable;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use datafusion::sql::sqlparser::ast::visit_relations;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{ColumnOption, Statement};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use sluice_engine::{
    DataStreamWriter, Options, OutputMode, Session, SluiceError, StatementSet, StreamDefinition,
    StreamingQuery, Trigger,
};

pub use error::SqlError;
use error::{parser_location, strip_location};
use event_time::{extract_windows, parse_watermark, Problem, WindowCall};

/// Settings a `SET` may change, with what each means.
const SETTINGS: &[&str] = &[
    "checkpoint.location",
    "trigger.interval",
    "trigger",
    "output.mode",
    "state.snapshot.interval",
    "state.retained.snapshots",
];

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

/// A planned `INSERT INTO` or statement set, not yet started.
#[derive(Debug)]
pub struct PendingQuery {
    /// The query's name (its sink stream; for a statement set, its
    /// statements' sinks joined by `+`).
    pub name: String,
    file: String,
    text: String,
    line: u64,
    column: u64,
    run: Run,
}

/// What a [`PendingQuery`] starts.
#[derive(Debug)]
enum Run {
    Insert(Box<DataStreamWriter>),
    /// `EXECUTE STATEMENT SET`, with its INSERTs' sink names.
    Set(StatementSet, Vec<String>),
}

impl PendingQuery {
    /// The incremental plan (of each statement of a set).
    pub fn explain(&self) -> Result<String, SqlError> {
        match &self.run {
            Run::Insert(writer) => writer.explain(),
            Run::Set(set, _) => set.explain(),
        }
        .map_err(|e| self.error(e))
    }

    /// The query planned for its batch answer (`sluice verify`), opening
    /// nothing: one per statement of a set, with its sink's name.
    pub fn batch_queries(&self) -> Result<Vec<(String, sluice_engine::BatchQuery)>, SqlError> {
        let named = match &self.run {
            Run::Insert(writer) => writer.batch_query().map(|q| vec![(self.name.clone(), q)]),
            Run::Set(set, names) => set
                .batch_queries()
                .map(|qs| names.iter().cloned().zip(qs).collect()),
        };
        named.map_err(|e| self.error(e))
    }

    /// Starts the query (opens its checkpoint and sink).
    pub async fn start(self) -> Result<StreamingQuery, SqlError> {
        let (file, text, line, column) = (self.file, self.text, self.line, self.column);
        let started = match self.run {
            Run::Insert(writer) => (*writer).start().await,
            Run::Set(set, _) => set.start().await,
        };
        started.map_err(|e| {
            let user = e.is_user_error();
            let mut err = SqlError::at(&file, &text, line, column, e.to_string());
            err.user_error = user;
            err
        })
    }

    fn error(&self, e: SluiceError) -> SqlError {
        let user = e.is_user_error();
        let mut err = SqlError::at(
            &self.file,
            &self.text,
            self.line,
            self.column,
            e.to_string(),
        );
        err.user_error = user;
        err
    }
}

/// A statement after [`SqlRunner::prepare`].
#[derive(Debug)]
pub enum Prepared {
    /// Done already (declarations, settings, explains).
    Done(StatementOutcome),
    /// A query to start.
    Query(Box<PendingQuery>),
}

#[derive(Debug, Clone, Default)]
struct Settings {
    checkpoint: Option<String>,
    trigger: Option<Trigger>,
    output_mode: Option<OutputMode>,
    snapshot_every: Option<u64>,
    retained_snapshots: Option<usize>,
}

/// Runs SQL text against a session, statement by statement.
#[derive(Debug)]
pub struct SqlRunner<'a> {
    session: &'a Session,
    file: String,
    settings: Settings,
    checkpoints: BTreeSet<String>,
    /// Window table function calls of the text, by placeholder name.
    windows: BTreeMap<String, WindowCall>,
    next_window: usize,
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
            windows: BTreeMap::new(),
            next_window: 0,
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

    fn parser_error(&self, text: &str, e: &ParserError) -> SqlError {
        let message = e.to_string();
        let (line, column) = parser_location(&message).unwrap_or((1, 1));
        SqlError::at(&self.file, text, line, column, strip_location(&message))
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
                return self.create_table(p, text).await.map(Prepared::Done);
            }
            if !p.parse_keyword(Keyword::STREAM) {
                let t = p.peek_token();
                return Err(self.err(
                    text,
                    Pos::from(&t),
                    format!(
                        "expected STREAM or TABLE after CREATE, found '{}': declare sources and \
                         sinks with CREATE STREAM name (columns) WITH (connector = '...'), static \
                         tables with CREATE TABLE name WITH (path = '...', format = '...')",
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
                "expected CREATE STREAM, INSERT INTO, EXECUTE STATEMENT SET, SET, EXPLAIN, SHOW STREAMS or DROP STREAM, found '{}'",
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

    async fn create_stream(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let name_tok = p.peek_token();
        let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
        let mut columns = Vec::new();
        let mut watermark = None;
        let mut watermark_pos = Pos::from(&name_tok);
        if p.consume_token(&Token::LParen) {
            loop {
                let t = p.peek_token();
                if matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("WATERMARK")) {
                    p.next_token();
                    if watermark.is_some() {
                        return Err(self.err(
                            text,
                            Pos::from(&t),
                            "a stream has one WATERMARK; remove this one",
                        ));
                    }
                    watermark = Some(parse_watermark(p).map_err(|e| self.problem(text, e))?);
                    watermark_pos = Pos::from(&t);
                } else {
                    let col = p.parse_column_def().map_err(|e| pe(self, e))?;
                    columns.push((col, Pos::from(&t)));
                }
                if p.consume_token(&Token::Comma) {
                    continue;
                }
                p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
                break;
            }
        }
        let with_tok = p.peek_token();
        p.expect_keyword(Keyword::WITH).map_err(|e| pe(self, e))?;
        let (mut options, positions) = self.options(p, text)?;
        let connector = options.take("connector").ok_or_else(|| {
            self.err(
                text,
                Pos::from(&with_tok),
                format!(
                    "stream '{name}' needs a connector: WITH (connector = '...'), one of {}",
                    self.session.connectors().names().join(", ")
                ),
            )
        })?;
        let schema = if columns.is_empty() {
            None
        } else {
            Some(self.schema(text, &columns).await?)
        };
        let definition = StreamDefinition {
            name: name.clone(),
            connector,
            options,
            schema,
            watermark,
        };
        self.session.create_stream(definition).map_err(|e| {
            // Point at the option the message names, else at the stream.
            let at = positions
                .iter()
                .find(|(k, _)| e.to_string().contains(&format!("'{k}'")))
                .map(|(_, p)| *p)
                .unwrap_or(if e.to_string().contains("WATERMARK FOR") {
                    watermark_pos
                } else {
                    Pos::from(&name_tok)
                });
            self.engine_error(text, at, e)
        })?;
        Ok(StatementOutcome::Created { stream: name })
    }

    /// `CREATE TABLE name [(columns)] WITH (path = '...', format = '...')`:
    /// a static table (files read by DataFusion when a query runs) that
    /// streams can be joined with.
    async fn create_table(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let name_tok = p.peek_token();
        let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
        let mut columns = Vec::new();
        if p.consume_token(&Token::LParen) {
            loop {
                let t = p.peek_token();
                columns.push((
                    p.parse_column_def().map_err(|e| pe(self, e))?,
                    Pos::from(&t),
                ));
                if !p.consume_token(&Token::Comma) {
                    p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
                    break;
                }
            }
        }
        let with_tok = p.peek_token();
        p.expect_keyword(Keyword::WITH).map_err(|e| pe(self, e))?;
        let (mut options, positions) = self.options(p, text)?;
        let at = |key: &str| positions.get(key).copied().unwrap_or(Pos::from(&with_tok));
        // Point at the option the message names (a misspelling), else `key`.
        let config = |e: SluiceError, key: &str| {
            let message = e.to_string();
            let named = positions
                .iter()
                .find(|(k, _)| k.as_str() != key && message.contains(&format!("'{k}'")))
                .map(|(_, p)| *p);
            self.err(text, named.unwrap_or(at(key)), message)
        };
        let what = format!("table '{name}'");
        let path = match options.take("path") {
            Some(p) => p,
            None => {
                let e = options.missing(&what, "path", "'path' = './dimensions/names.csv'");
                return Err(config(e, "path"));
            }
        };
        let format = match options
            .take_choice("format", &["csv", "json", "parquet"])
            .map_err(|e| config(e, "format"))?
        {
            Some(f) => f,
            None => {
                let e = options.missing(&what, "format", "'format' = 'csv' (or 'json', 'parquet')");
                return Err(config(e, "format"));
            }
        };
        let header = options
            .take_parsed::<bool>("header", "true or false")
            .map_err(|e| config(e, "header"))?
            .unwrap_or(true);
        options
            .finish_for(&what, &["path", "format", "header"])
            .map_err(|e| {
                let key = options
                    .iter()
                    .next()
                    .map(|(k, _)| k.to_string())
                    .unwrap_or_default();
                config(e, &key)
            })?;
        let schema = if columns.is_empty() {
            None
        } else {
            Some(self.schema(text, &columns).await?)
        };
        if self.session.stream(&name).is_some()
            || self
                .session
                .context()
                .table_exist(name.as_str())
                .unwrap_or(false)
        {
            return Err(self.err(
                text,
                Pos::from(&name_tok),
                format!("'{name}' already exists; DROP it or pick another name"),
            ));
        }
        let ctx = self.session.context();
        let registered = match format.as_str() {
            "csv" => {
                let mut o = CsvReadOptions::new().has_header(header).file_extension("");
                if let Some(s) = &schema {
                    o = o.schema(s);
                }
                ctx.register_csv(name.as_str(), &path, o).await
            }
            "json" => {
                let mut o = JsonReadOptions::default().file_extension("");
                if let Some(s) = &schema {
                    o = o.schema(s);
                }
                ctx.register_json(name.as_str(), &path, o).await
            }
            _ => {
                let o = ParquetReadOptions::default().file_extension("");
                ctx.register_parquet(name.as_str(), &path, o).await
            }
        };
        registered.map_err(|e| {
            self.err(
                text,
                at("path"),
                format!("table '{name}' cannot be read from '{path}': {e}"),
            )
        })?;
        Ok(StatementOutcome::TableCreated { table: name })
    }

    /// `( key = value, ... )`; keys quoted or bare (dotted), values strings,
    /// numbers or bare words.
    fn options(
        &self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<(Options, BTreeMap<String, Pos>), SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        p.expect_token(&Token::LParen).map_err(|e| pe(self, e))?;
        let mut options = Options::new();
        let mut positions = BTreeMap::new();
        if p.consume_token(&Token::RParen) {
            return Ok((options, positions));
        }
        loop {
            let key_tok = p.next_token();
            let mut key = match &key_tok.token {
                Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
                Token::Word(w) => w.value.clone(),
                other => {
                    return Err(self.err(
                        text,
                        Pos::from(&key_tok),
                        format!("expected an option name such as 'topic', found '{other}'"),
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
            p.expect_token(&Token::Eq).map_err(|e| pe(self, e))?;
            let value_tok = p.next_token();
            let value = match &value_tok.token {
                Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
                Token::Number(n, _) => n.clone(),
                Token::Word(w) => w.value.clone(),
                other => {
                    return Err(self.err(
                        text,
                        Pos::from(&value_tok),
                        format!(
                            "expected a value such as 'json' for option '{key}', found '{other}'"
                        ),
                    ))
                }
            };
            let key = key.to_ascii_lowercase();
            if options.get(&key).is_some() {
                return Err(self.err(
                    text,
                    Pos::from(&key_tok),
                    format!("option '{key}' is given twice"),
                ));
            }
            positions.insert(key.clone(), Pos::from(&key_tok));
            options.set(&key, value);
            if p.consume_token(&Token::Comma) {
                continue;
            }
            p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
            return Ok((options, positions));
        }
    }

    /// Declared columns to Arrow, through DataFusion's own type mapping.
    async fn schema(
        &self,
        text: &str,
        columns: &[(datafusion::sql::sqlparser::ast::ColumnDef, Pos)],
    ) -> Result<Arc<Schema>, SqlError> {
        let mut fields = Vec::new();
        for (col, pos) in columns {
            let sql = format!("SELECT CAST(NULL AS {}) AS x", col.data_type);
            let plan = self
                .session
                .context()
                .state()
                .create_logical_plan(&sql)
                .await
                .map_err(|e| {
                    self.err(
                        text,
                        *pos,
                        format!(
                            "column '{}': type {} is not supported: {e}",
                            col.name.value, col.data_type
                        ),
                    )
                })?;
            let not_null = col
                .options
                .iter()
                .any(|o| matches!(o.option, ColumnOption::NotNull));
            let data_type = plan.schema().field(0).data_type().clone();
            fields.push(Field::new(normalize(&col.name), data_type, !not_null));
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    fn set(&mut self, p: &mut Parser<'_>, text: &str) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let key_tok = p.next_token();
        let mut key = match &key_tok.token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
            Token::Word(w) => w.value.clone(),
            other => {
                return Err(self.err(
                    text,
                    Pos::from(&key_tok),
                    format!("expected a setting name, found '{other}'"),
                ))
            }
        };
        while p.consume_token(&Token::Period) {
            key.push('.');
            key.push_str(&p.parse_identifier().map_err(|e| pe(self, e))?.value);
        }
        let key = key.to_ascii_lowercase();
        if !(p.consume_token(&Token::Eq) || p.parse_keyword(Keyword::TO)) {
            let t = p.peek_token();
            return Err(self.err(
                text,
                Pos::from(&t),
                format!("expected '=' after SET '{key}', found '{}'", t.token),
            ));
        }
        let value_tok = p.next_token();
        let value = match &value_tok.token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
            Token::Number(n, _) => n.clone(),
            Token::Word(w) => w.value.clone(),
            other => {
                return Err(self.err(
                    text,
                    Pos::from(&value_tok),
                    format!("expected a value for '{key}', found '{other}'"),
                ))
            }
        };
        let at_value = |e: SluiceError| self.err(text, Pos::from(&value_tok), e.to_string());
        match key.as_str() {
            "checkpoint.location" => self.settings.checkpoint = Some(value.clone()),
            "trigger.interval" | "trigger" => {
                self.settings.trigger = Some(value.parse::<Trigger>().map_err(at_value)?)
            }
            "output.mode" => {
                self.settings.output_mode = Some(value.parse::<OutputMode>().map_err(at_value)?)
            }
            "state.snapshot.interval" | "state.retained.snapshots" => {
                let n = value
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        self.err(
                            text,
                            Pos::from(&value_tok),
                            format!("'{key}' takes a whole number from 1, found '{value}'"),
                        )
                    })?;
                if key == "state.snapshot.interval" {
                    self.settings.snapshot_every = Some(n);
                } else {
                    self.settings.retained_snapshots = Some(n as usize);
                }
            }
            other => {
                let hint = sluice_engine::closest(other, SETTINGS.iter().copied())
                    .map(|c| format!(" (did you mean '{c}'?)"))
                    .unwrap_or_default();
                return Err(self.err(
                    text,
                    Pos::from(&key_tok),
                    format!(
                        "unknown setting '{other}'{hint}; valid settings: {}",
                        sluice_engine::quoted_list(SETTINGS)
                    ),
                ));
            }
        }
        Ok(StatementOutcome::Set { key, value })
    }

    /// "unknown stream", with the closest declared name and how to declare it.
    fn unknown_stream(&self, name: &str) -> String {
        let names: Vec<String> = self.session.streams().into_iter().map(|s| s.name).collect();
        let hint = sluice_engine::closest(name, names.iter().map(String::as_str))
            .map(|c| format!(" (did you mean '{c}'?)"))
            .unwrap_or_default();
        format!(
            "unknown stream '{name}'{hint}: declare it first with CREATE STREAM {name} WITH \
             (connector = '...')"
        )
    }

    /// Registers a view per window call `query` uses (see `event_time`);
    /// returns their names.
    async fn register_windows(
        &self,
        query: &datafusion::sql::sqlparser::ast::Query,
        text: &str,
    ) -> Result<Vec<String>, SqlError> {
        let mut used = Vec::new();
        let _ = visit_relations(query, |name| {
            let name = name.to_string();
            if self.windows.contains_key(&name) && !used.contains(&name) {
                used.push(name);
            }
            ControlFlow::<()>::Continue(())
        });
        for placeholder in &used {
            let call = &self.windows[placeholder];
            if self.session.stream(&call.stream).is_none() {
                return Err(self.err(text, call.stream_pos, self.unknown_stream(&call.stream)));
            }
            let frame = self
                .session
                .table(&call.stream)
                .await
                .map_err(|e| self.engine_error(text, call.stream_pos, e))?;
            let windowed = frame
                .window(call.window.clone())
                .map_err(|e| self.engine_error(text, call.column_pos, e))?;
            let view = ViewTable::new(windowed.logical_plan().clone(), None);
            self.session
                .context()
                .register_table(placeholder.as_str(), Arc::new(view))
                .map_err(|e| self.engine_error(text, call.stream_pos, e.into()))?;
        }
        Ok(used)
    }

    /// `EXECUTE STATEMENT SET BEGIN INSERT ...; INSERT ...; END` (after
    /// EXECUTE): one query running every INSERT, with the settings in force
    /// at EXECUTE.
    async fn statement_set(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
        pos: Pos,
    ) -> Result<PendingQuery, SqlError> {
        self.expect_word(p, text, "STATEMENT")?;
        self.expect_word(p, text, "SET")?;
        self.expect_word(p, text, "BEGIN")?;
        let mut members = Vec::new();
        loop {
            while p.consume_token(&Token::SemiColon) {}
            let t = p.peek_token();
            match &t.token {
                Token::Word(w) if w.value.eq_ignore_ascii_case("END") => {
                    p.next_token();
                    break;
                }
                Token::Word(w) if w.keyword == Keyword::INSERT => {
                    p.next_token();
                    members.push(self.insert(p, text, Pos::from(&t), true).await?);
                }
                other => {
                    return Err(self.err(
                        text,
                        Pos::from(&t),
                        format!(
                            "a statement set holds INSERT INTO statements and ends with END; \
                             found '{other}'"
                        ),
                    ))
                }
            }
            let next = p.peek_token();
            if !matches!(&next.token, Token::SemiColon)
                && !matches!(&next.token, Token::Word(w) if w.value.eq_ignore_ascii_case("END"))
            {
                return Err(self.err(
                    text,
                    Pos::from(&next),
                    format!("expected ';' after the INSERT, found '{}'", next.token),
                ));
            }
        }
        if members.is_empty() {
            return Err(self.err(
                text,
                pos,
                "the statement set is empty: put INSERT INTO statements between BEGIN and END",
            ));
        }
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        let name = names.join("+");
        let mut set = self.session.statement_set().query_name(&name);
        if let Some(dir) = self.checkpoint_for(text, pos)? {
            set = set.checkpoint_location(dir);
        }
        if let Some(t) = self.settings.trigger {
            set = set.trigger(t);
        }
        if let Some(n) = self.settings.snapshot_every {
            set = set.state_snapshot_interval(n);
        }
        if let Some(n) = self.settings.retained_snapshots {
            set = set.state_retained_snapshots(n);
        }
        let mut sinks = Vec::with_capacity(members.len());
        for m in members {
            if let Run::Insert(writer) = m.run {
                set = set.add_insert(*writer);
                sinks.push(m.name);
            }
        }
        Ok(PendingQuery {
            name,
            file: self.file.clone(),
            text: text.to_string(),
            line: pos.line,
            column: pos.column,
            run: Run::Set(set, sinks),
        })
    }

    /// The checkpoint location in force, once per query of the file.
    fn checkpoint_for(&mut self, text: &str, pos: Pos) -> Result<Option<String>, SqlError> {
        let Some(dir) = &self.settings.checkpoint else {
            return Ok(None);
        };
        if !self.checkpoints.insert(dir.clone()) {
            return Err(self.err(
                text,
                pos,
                format!(
                    "checkpoint location '{dir}' is already used by an earlier INSERT in this \
                     file; give each query its own: SET 'checkpoint.location' = '...' before it"
                ),
            ));
        }
        Ok(Some(dir.clone()))
    }

    /// `INSERT INTO` (after INSERT); `in_set`: a statement of a statement
    /// set, whose query-wide settings are the set's.
    async fn insert(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
        pos: Pos,
        in_set: bool,
    ) -> Result<PendingQuery, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        p.expect_keyword(Keyword::INTO).map_err(|e| pe(self, e))?;
        let sink_tok = p.peek_token();
        let sink = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
        let query_tok = p.peek_token();
        let query = p.parse_query().map_err(|e| pe(self, e))?;
        let definition = self
            .session
            .stream(&sink)
            .ok_or_else(|| self.err(text, Pos::from(&sink_tok), self.unknown_stream(&sink)))?;
        let views = self.register_windows(&query, text).await?;
        let state = self.session.context().state();
        let planned = state
            .statement_to_plan(DfStatement::Statement(Box::new(Statement::Query(query))))
            .await;
        for view in &views {
            // Planning inlined the view; it is no longer needed.
            let _ = self.session.context().deregister_table(view.as_str());
        }
        let plan = planned.map_err(|e| {
            let e = SluiceError::DataFusion(e);
            // A stream that exists but cannot be read says why.
            let msg = e.to_string();
            let unreadable = self
                .session
                .streams()
                .into_iter()
                .find(|s| {
                    msg.contains(&format!("'{}'", s.name))
                        || msg.contains(&format!("table '{}'", s.name))
                })
                .and_then(|s| self.session.unreadable_reason(&s.name));
            let missing = table_not_found(&msg).filter(|t| self.session.stream(t).is_none());
            match (unreadable, missing) {
                (Some(reason), _) => self.err(text, Pos::from(&query_tok), reason),
                (None, Some(table)) => {
                    let located = self.engine_error(text, Pos::from(&query_tok), e);
                    SqlError::at(
                        &self.file,
                        text,
                        located.line,
                        located.column,
                        self.unknown_stream(&table),
                    )
                }
                (None, None) => self.engine_error(text, Pos::from(&query_tok), e),
            }
        })?;
        if let Some(declared) = &definition.schema {
            check_sink_columns(&sink, declared, plan.schema().as_arrow())
                .map_err(|m| self.err(text, Pos::from(&query_tok), m))?;
        }
        let frame = self.session.frame(plan);
        let mut writer = frame
            .write_stream()
            .format(&definition.connector)
            .options(definition.options.iter())
            .query_name(&sink);
        if !in_set {
            if let Some(dir) = self.checkpoint_for(text, pos)? {
                writer = writer.checkpoint_location(dir);
            }
        }
        if let Some(t) = self.settings.trigger {
            writer = writer.trigger(t);
        }
        if let Some(m) = self.settings.output_mode {
            writer = writer.output_mode(m);
        }
        if let Some(n) = self.settings.snapshot_every {
            writer = writer.state_snapshot_interval(n);
        }
        if let Some(n) = self.settings.retained_snapshots {
            writer = writer.state_retained_snapshots(n);
        }
        let pending = PendingQuery {
            name: sink,
            file: self.file.clone(),
            text: text.to_string(),
            line: pos.line,
            column: pos.column,
            run: Run::Insert(Box::new(writer)),
        };
        // Plan now: a query that cannot run fails before anything starts.
        pending.explain()?;
        Ok(pending)
    }
}

/// A sink with declared columns takes a query whose output has exactly
/// those columns, by name, with the same types.
fn check_sink_columns(sink: &str, declared: &Schema, output: &Schema) -> Result<(), String> {
    for field in declared.fields() {
        let Some((_, got)) = output.column_with_name(field.name()) else {
            let names: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(format!(
                "stream '{sink}' declares column '{}' ({}), but the query has no column of that \
                 name; its columns are {} (name them with AS)",
                field.name(),
                field.data_type(),
                names.join(", ")
            ));
        };
        if got.data_type() != field.data_type() {
            return Err(format!(
                "column '{}': the query gives {}, but stream '{sink}' declares {}; convert it \
                 with CAST({} AS ...)",
                field.name(),
                got.data_type(),
                field.data_type(),
                field.name()
            ));
        }
    }
    if let Some(extra) = output
        .fields()
        .iter()
        .find(|f| declared.column_with_name(f.name()).is_none())
    {
        return Err(format!(
            "the query's column '{}' ({}) is not among the columns stream '{sink}' declares: {}",
            extra.name(),
            extra.data_type(),
            declared
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// The table of DataFusion's "table 'catalog.schema.name' not found".
fn table_not_found(message: &str) -> Option<String> {
    let rest = message.split("table '").nth(1)?;
    let (qualified, tail) = rest.split_once('\'')?;
    tail.starts_with(" not found").then(|| {
        qualified
            .rsplit('.')
            .next()
            .unwrap_or(qualified)
            .to_string()
    })
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

/// Unquoted identifiers are case-insensitive (lower-cased), as in DataFusion.
pub(crate) fn normalize(ident: &datafusion::sql::sqlparser::ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_ascii_lowercase()
    }
}
