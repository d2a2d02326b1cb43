//! Continuous queries: `INSERT INTO ... SELECT`, `EXECUTE STATEMENT SET`,
//! and the window table functions in their `FROM`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::catalog::view::ViewTable;
use datafusion::sql::sqlparser::ast::visit_relations;

use crate::{
    group_window, normalize, sink_columns, temporal, time_units, types, Pos, SqlError, SqlRunner,
};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use sluice_engine::{DataStreamWriter, SluiceError, StatementSet, StreamingQuery};

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
    /// Where the statement ends: the token after it (`;`, or the end).
    end: Pos,
    /// Where the options of the file's streams are written (see
    /// `SqlRunner::option_positions`): a connector checks some only when
    /// the query starts.
    options: BTreeMap<String, BTreeMap<String, Pos>>,
    run: Run,
}

/// What a [`PendingQuery`] starts.
#[derive(Debug)]
enum Run {
    Insert(Box<DataStreamWriter>),
    /// `EXECUTE STATEMENT SET`, with its INSERTs' sink names.
    Set(Box<StatementSet>, Vec<String>),
}

impl PendingQuery {
    /// The statement's text as the file writes it, from its first word to
    /// its end (what the status page shows).
    pub fn statement(&self) -> &str {
        let offset = |pos: &Pos| {
            let line_start: usize = self
                .text
                .split_inclusive('\n')
                .take(pos.line.saturating_sub(1) as usize)
                .map(str::len)
                .sum();
            let rest = &self.text[line_start.min(self.text.len())..];
            line_start
                + rest
                    .char_indices()
                    .nth(pos.column.saturating_sub(1) as usize)
                    .map_or(rest.len(), |(i, _)| i)
        };
        let start = offset(&Pos {
            line: self.line,
            column: self.column,
        });
        // The end of the text has no position (line 0).
        let end = match self.end.line {
            0 => self.text.len(),
            _ => offset(&self.end),
        };
        self.text
            .get(start..end.max(start))
            .unwrap_or("")
            .trim_end()
    }

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
        let options = self.options;
        started.map_err(|e| located(&file, &text, (line, column), &options, e))
    }

    fn error(&self, e: SluiceError) -> SqlError {
        let at = (self.line, self.column);
        located(&self.file, &self.text, at, &self.options, e)
    }
}

/// `e` as an error at the statement at `at` — or, when it is about an
/// option of a stream ("stream 'bids' cannot be read: option 'format'
/// ..."), at that option in the stream's `CREATE STREAM`.
fn located(
    file: &str,
    text: &str,
    at: (u64, u64),
    options: &BTreeMap<String, BTreeMap<String, Pos>>,
    e: SluiceError,
) -> SqlError {
    let message = e.to_string();
    let named = |positions: &BTreeMap<String, Pos>| {
        positions
            .iter()
            .find(|(key, _)| message.contains(&format!("'{key}'")))
            .map(|(_, pos)| (pos.line, pos.column))
    };
    // The stream the message names, else (a sink's message names its
    // topic) any stream of the file with the option it quotes.
    let option = message
        .strip_prefix("stream '")
        .and_then(|rest| rest.split_once('\''))
        .and_then(|(stream, _)| options.get(stream))
        .and_then(named)
        .or_else(|| options.values().find_map(named));
    let (line, column) = option.unwrap_or(at);
    let mut err = SqlError::at(file, text, line, column, message);
    err.user_error = e.is_user_error();
    err
}

impl SqlRunner<'_> {
    /// Registers a view per window call `query` uses (see `event_time`);
    /// returns their names.
    pub(crate) async fn register_windows(
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
            let frame = if self.session.stream(&call.stream).is_some() {
                self.session.table(&call.stream).await
            } else {
                // A view: its query, inlined, windowed like a stream.
                match self.session.context().table(call.stream.as_str()).await {
                    Ok(view) => Ok(self.session.frame(view.logical_plan().clone())),
                    Err(_) => {
                        let unknown = self.unknown_stream(&call.stream);
                        return Err(self.err(text, call.stream_pos, unknown));
                    }
                }
            };
            let frame = frame.map_err(|e| self.engine_error(text, call.stream_pos, e))?;
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
    pub(crate) async fn statement_set(
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
        let end = Pos::from(&p.peek_token());
        if members.is_empty() {
            return Err(self.err(
                text,
                pos,
                "the statement set is empty: put INSERT INTO statements between BEGIN and END",
            ));
        }
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        let name = names.join("+");
        let settings = self.query_settings(text, pos, &name)?;
        let mut set = self.session.statement_set().settings(settings);
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
            end,
            options: self.options_in(text),
            run: Run::Set(Box::new(set), sinks),
        })
    }

    /// `INSERT INTO` (after INSERT); `in_set`: a statement of a statement
    /// set, whose query-wide settings are the set's.
    pub(crate) async fn insert(
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
        let listed = self.column_list(p, text)?;
        let query_tok = p.peek_token();
        let query = p.parse_query().map_err(|e| pe(self, e))?;
        let end = Pos::from(&p.peek_token());
        let definition = self
            .session
            .stream(&sink)
            .or_else(|| self.file_tables.get(&sink).cloned())
            .ok_or_else(|| self.err(text, Pos::from(&sink_tok), self.unknown_stream(&sink)))?;
        let plan = self.plan_query(query, text, Pos::from(&query_tok)).await?;
        let plan = self.apply_as_of(text, plan, Pos::from(&p.peek_token()))?;
        let plan = match &definition.schema {
            Some(declared) => sink_columns::fill(&sink, declared, listed.as_deref(), plan)
                .map_err(|m| self.err(text, Pos::from(&query_tok), m))?,
            None if listed.is_some() => {
                return Err(self.err(
                    text,
                    Pos::from(&sink_tok),
                    format!(
                        "stream '{sink}' declares no columns, so an INSERT cannot list them; \
                         declare them: CREATE STREAM {sink} (column TYPE, ...)"
                    ),
                ))
            }
            None => plan,
        };
        let frame = self.session.frame(plan);
        let writer = frame
            .write_stream()
            .format(&definition.connector)
            .options(definition.options.iter());
        // In a statement set, the query-wide settings are the set's; the
        // statement keeps its name.
        let mut writer = if in_set {
            writer.query_name(&sink)
        } else {
            writer.settings(self.query_settings(text, pos, &sink)?)
        };
        if let Some(m) = self.settings.output_mode {
            writer = writer.output_mode(m);
        }
        let pending = PendingQuery {
            name: sink,
            file: self.file.clone(),
            text: text.to_string(),
            line: pos.line,
            column: pos.column,
            end,
            options: self.options_in(text),
            run: Run::Insert(Box::new(writer)),
        };
        // Plan now: a query that cannot run fails before anything starts.
        pending.explain()?;
        Ok(pending)
    }

    /// Plans `query` (its window calls included), an error pointing at
    /// `at`, or at the unknown or unreadable stream it names.
    pub(crate) async fn plan_query(
        &mut self,
        mut query: Box<datafusion::sql::sqlparser::ast::Query>,
        text: &str,
        at: Pos,
    ) -> Result<LogicalPlan, SqlError> {
        time_units::units_as_text(&mut query);
        let grouped = group_window::rewrite(&mut query, &mut self.next_window)
            .map_err(|e| self.problem(text, e))?;
        self.windows.extend(grouped);
        let views = self.register_windows(&query, text).await?;
        let state = self.session.context().state();
        let planned = state
            .statement_to_plan(DfStatement::Statement(Box::new(Statement::Query(query))))
            .await;
        for view in &views {
            // Planning inlined the view; it is no longer needed.
            let _ = self.session.context().deregister_table(view.as_str());
        }
        planned.and_then(types::name_fields_read).map_err(|e| {
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
                (Some(reason), _) => self.err(text, at, reason),
                (None, Some(table)) => {
                    let located = self.engine_error(text, at, e);
                    SqlError::at(
                        &self.file,
                        text,
                        located.line,
                        located.column,
                        self.unknown_stream(&table),
                    )
                }
                (None, None) => self.engine_error(text, at, e),
            }
        })
    }

    /// Applies the `FOR SYSTEM_TIME AS OF` clauses before `end` to the
    /// query planned as `plan`: a temporal join is marked, a lookup join
    /// checked (see `temporal`).
    fn apply_as_of(
        &mut self,
        text: &str,
        mut plan: LogicalPlan,
        end: Pos,
    ) -> Result<LogicalPlan, SqlError> {
        let before = |p: &Pos| (p.line, p.column) < (end.line, end.column);
        let (here, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.as_of)
            .into_iter()
            .partition(|a| before(&a.pos));
        self.as_of = later;
        for as_of in here {
            let problem = match self.session.stream(&as_of.table) {
                Some(stream) => {
                    let version = stream.watermark.as_ref().map(|w| w.column.as_str());
                    match temporal::mark(&as_of, plan.clone(), version) {
                        Ok(marked) => {
                            plan = marked;
                            None
                        }
                        Err(problem) => Some(problem),
                    }
                }
                None => temporal::static_problem(&as_of, &plan),
            };
            if let Some(problem) = problem {
                return Err(self.err(text, as_of.pos, problem));
            }
        }
        Ok(plan)
    }

    /// `(a, b)` after `INSERT INTO sink`: the sink columns the query fills,
    /// in order. A `(` that opens the query itself is left alone.
    fn column_list(&self, p: &mut Parser<'_>, text: &str) -> Result<Option<Vec<String>>, SqlError> {
        let opens_query = matches!(
            &p.peek_nth_token(1).token,
            Token::Word(w) if matches!(w.keyword, Keyword::SELECT | Keyword::WITH | Keyword::VALUES)
        ) || p.peek_nth_token(1).token == Token::LParen;
        if p.peek_token().token != Token::LParen || opens_query {
            return Ok(None);
        }
        p.next_token();
        let mut names = Vec::new();
        loop {
            let ident = p
                .parse_identifier()
                .map_err(|e| self.parser_error(text, &e))?;
            names.push(normalize(&ident));
            if p.consume_token(&Token::Comma) {
                continue;
            }
            p.expect_token(&Token::RParen)
                .map_err(|e| self.parser_error(text, &e))?;
            return Ok(Some(names));
        }
    }
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
