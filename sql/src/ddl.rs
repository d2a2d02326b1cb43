//! Declarations: `CREATE STREAM` (its columns, watermark and options),
//! `CREATE TABLE` (a static table) and `CREATE VIEW` (a named query).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::catalog::view::ViewTable;
use datafusion::common::Column;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder};
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};

use crate::event_time::parse_watermark;
use crate::substitute::value_of;
use crate::types;
use crate::{normalize, Pos, SqlError, SqlRunner, StatementOutcome};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::sql::sqlparser::ast::{ColumnDef, ColumnOption};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{IsOptional, Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use sluice_engine::{
    ComputedColumn, LookupArgs, LookupCacheConfig, LookupTable, Options, SluiceError,
    StreamDefinition, WatermarkSpec,
};

/// Flink's older option spellings and today's; an empty one is dropped
/// (it chose what is now the only choice).
const LEGACY_OPTIONS: &[(&str, &str)] = &[
    ("connector.type", "connector"),
    ("connector.path", "path"),
    ("format.type", "format"),
    ("connector.topic", "topic"),
    ("connector.startup-mode", "scan.startup.mode"),
    (
        "connector.properties.bootstrap.servers",
        "properties.bootstrap.servers",
    ),
    ("connector.properties.group.id", "properties.group.id"),
    ("connector.version", ""),
    ("update-mode", ""),
];

/// The options of a filesystem table that only writing it uses.
const SINK_OPTION_PREFIXES: &[&str] = &["sink.", "partition.", "auto-compaction", "compaction."];

/// What a `CREATE` declares before `WITH`.
struct Declared {
    name: String,
    name_pos: Pos,
    columns: Vec<(ColumnDef, Pos)>,
    /// `name AS expression`: computed as rows are read.
    computed: Vec<ComputedColumn>,
    /// `PRIMARY KEY (columns) NOT ENFORCED`.
    primary_key: Option<(Vec<String>, Pos)>,
    watermark: Option<(WatermarkSpec, Pos)>,
}

impl SqlRunner<'_> {
    pub(crate) async fn create_stream(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let Declared {
            name,
            name_pos,
            columns,
            computed,
            primary_key,
            watermark,
        } = self.declaration(p, text, true)?;
        let (watermark, watermark_pos) = match watermark {
            Some((w, at)) => (Some(w), at),
            None => (None, name_pos),
        };
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
        if connector.eq_ignore_ascii_case("kafka") {
            self.settings.add_kafka_defaults(&mut options);
        }
        if let Some((key, at)) = primary_key {
            if !connector.to_ascii_lowercase().contains("kafka") {
                return Err(self.err(
                    text,
                    at,
                    format!(
                        "a PRIMARY KEY is the key of a Kafka stream's messages (upsert-kafka, \
                         a Debezium table, a keyed sink); connector '{connector}' has none"
                    ),
                ));
            }
            self.key_from_primary_key(text, &mut options, &key, at)?;
        }
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
            late_sink: None,
            computed,
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
                    name_pos
                });
            self.engine_error(text, at, e)
        })?;
        self.option_positions
            .insert(name.clone(), (text.to_string(), positions));
        Ok(StatementOutcome::Created { stream: name })
    }

    /// `name [(column, ..., [WATERMARK FOR ...])]`: what a `CREATE` declares
    /// before its options. Only a stream declares a watermark: where
    /// `watermark_allowed` is false, `WATERMARK` is a column's name.
    fn declaration(
        &self,
        p: &mut Parser<'_>,
        text: &str,
        watermark_allowed: bool,
    ) -> Result<Declared, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let name_pos = Pos::from(&p.peek_token());
        let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
        let mut columns = Vec::new();
        let mut computed = Vec::new();
        let mut primary_key = None;
        let mut watermark = None;
        if p.consume_token(&Token::LParen) {
            loop {
                let t = p.peek_token();
                if p.parse_keyword(Keyword::CONSTRAINT) {
                    p.parse_identifier().map_err(|e| pe(self, e))?;
                }
                if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
                    let key = p
                        .parse_parenthesized_column_list(IsOptional::Mandatory, false)
                        .map_err(|e| pe(self, e))?;
                    if !p.parse_keywords(&[Keyword::NOT, Keyword::ENFORCED]) {
                        return Err(self.err(
                            text,
                            Pos::from(&p.peek_token()),
                            "Sluice, like Flink, does not check a primary key: write PRIMARY KEY \
                             (...) NOT ENFORCED",
                        ));
                    }
                    primary_key = Some((key.iter().map(normalize).collect(), Pos::from(&t)));
                    if p.consume_token(&Token::Comma) {
                        continue;
                    }
                    p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
                    break;
                }
                let is_watermark =
                    matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("WATERMARK"));
                if watermark_allowed && is_watermark {
                    p.next_token();
                    if watermark.is_some() {
                        return Err(self.err(
                            text,
                            Pos::from(&t),
                            "a stream has one WATERMARK; remove this one",
                        ));
                    }
                    let spec = parse_watermark(p).map_err(|e| self.problem(text, e))?;
                    watermark = Some((spec, Pos::from(&t)));
                } else if matches!(&p.peek_nth_token(1).token, Token::Word(w) if w.keyword == Keyword::AS)
                {
                    let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
                    p.next_token();
                    let expression = p.parse_expr().map_err(|e| pe(self, e))?.to_string();
                    computed.push(ComputedColumn { name, expression });
                } else if let Some((name, expression)) =
                    types::metadata_column(p).map_err(|e| pe(self, e))?
                {
                    computed.push(ComputedColumn {
                        name: normalize(&name),
                        expression,
                    });
                } else {
                    let col = types::column_def(p).map_err(|e| pe(self, e))?;
                    columns.push((col, Pos::from(&t)));
                }
                if p.consume_token(&Token::Comma) {
                    continue;
                }
                p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
                break;
            }
        }
        Ok(Declared {
            name,
            name_pos,
            columns,
            computed,
            primary_key,
            watermark,
        })
    }

    /// A declared `PRIMARY KEY` is the stream's `'key.fields'`: the key of
    /// an upsert stream or a Debezium table, or the message key written.
    fn key_from_primary_key(
        &self,
        text: &str,
        options: &mut Options,
        key: &[String],
        at: Pos,
    ) -> Result<(), SqlError> {
        let fields = key.join(",");
        match options.get("key.fields") {
            Some(given) if given.replace(' ', "") != fields => Err(self.err(
                text,
                at,
                format!(
                    "PRIMARY KEY ({}) differs from 'key.fields' = '{given}': they name the same \
                     key, so declare one of them",
                    key.join(", ")
                ),
            )),
            _ => {
                options.set("key.fields", fields);
                Ok(())
            }
        }
    }

    /// `CREATE TABLE name [(columns)] WITH (path = '...', format = '...')`:
    /// a static table (files read by DataFusion when a query runs) that
    /// streams can be joined with.
    pub(crate) async fn create_table(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let Declared {
            name,
            name_pos,
            columns,
            computed,
            ..
        } = self.declaration(p, text, false)?;
        if !computed.is_empty() {
            return Err(self.err(
                text,
                name_pos,
                "a static table cannot compute columns or read metadata; compute them in the \
                 query",
            ));
        }
        let partitioned_by = self.partitioned_by(p, text)?;
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
        // Flink's spelling of a file table, whose csv format reads no
        // header line.
        let flink = options.get("connector").is_some();
        if let Some(c) = options.take("connector") {
            let lookup = self.session.connectors().get(&c).ok();
            if let Some(connector) = lookup.filter(|c| c.is_lookup()) {
                let declared = (name, name_pos, columns);
                return self
                    .create_lookup_table(text, declared, options, connector, &config)
                    .await;
            }
            if !c.eq_ignore_ascii_case("filesystem") {
                return Err(self.err(
                    text,
                    at("connector"),
                    format!(
                        "a CREATE TABLE with connector '{c}' is a stream: write CREATE STREAM \
                         {name} ... WITH (connector = '{c}', ...)"
                    ),
                ));
            }
        }
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
            .map_err(|e| config(e, "header"))?;
        // What only writing the table uses: Flink's file-sink options.
        let mut written = options.clone();
        for prefix in SINK_OPTION_PREFIXES {
            options.take_prefixed(prefix);
        }
        options
            .finish_for(&what, &["path", "format", "header", "connector"])
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
        self.check_free(text, &name, name_pos)?;
        // Flink's filesystem table is read and written: an INSERT INTO it
        // runs the `filesystem` sink, and a query reading it reads the
        // files there when it is declared.
        written.set("path", path.clone());
        written.set("format", format.clone());
        if let Some(h) = header {
            written.set("header", h.to_string());
        }
        if !partitioned_by.is_empty() {
            written.set("partitioned-by", partitioned_by.join(","));
        }
        let written = StreamDefinition {
            name: name.clone(),
            connector: "filesystem".into(),
            options: written,
            schema: schema.clone(),
            watermark: None,
            late_sink: None,
            computed: Vec::new(),
        };
        if schema.is_some() && !Path::new(&path).exists() {
            self.file_tables.insert(name.clone(), written);
            return Ok(StatementOutcome::TableCreated { table: name });
        }
        let registered = self
            .register_files(&name, &path, &format, header.unwrap_or(!flink), &schema)
            .await;
        registered.map_err(|e| {
            self.err(
                text,
                at("path"),
                format!("table '{name}' cannot be read from '{path}': {e}"),
            )
        })?;
        if schema.is_some() {
            self.file_tables.insert(name.clone(), written);
        }
        Ok(StatementOutcome::TableCreated { table: name })
    }

    /// `CREATE TABLE` of a connector that answers lookups (`'jdbc'`): a
    /// table joined `FOR SYSTEM_TIME AS OF` a processing time, reached now
    /// so that one that cannot be fails here. `config` places an option's
    /// error in the statement.
    async fn create_lookup_table(
        &self,
        text: &str,
        (name, name_pos, columns): (String, Pos, Vec<(ColumnDef, Pos)>),
        mut options: Options,
        connector: Arc<dyn sluice_engine::Connector>,
        config: &dyn Fn(SluiceError, &str) -> SqlError,
    ) -> Result<StatementOutcome, SqlError> {
        if columns.is_empty() {
            return Err(self.err(
                text,
                name_pos,
                format!(
                    "table '{name}' of connector '{}' needs its columns declared",
                    connector.name()
                ),
            ));
        }
        self.check_free(text, &name, name_pos)?;
        let schema = self.schema(text, &columns).await?;
        let cache =
            LookupCacheConfig::from_options(&mut options).map_err(|e| config(e, "lookup.cache"))?;
        let args = LookupArgs {
            table: name.clone(),
            schema,
            options,
        };
        let source = connector.lookup(args).map_err(|e| config(e, "url"))?;
        source.check().await.map_err(|e| config(e, "url"))?;
        let table = LookupTable::new(&name, source, cache);
        self.session
            .context()
            .register_table(name.as_str(), Arc::new(table))
            .map_err(|e| self.err(text, name_pos, e.to_string()))?;
        Ok(StatementOutcome::TableCreated { table: name })
    }

    /// Refuses a table `name` that a stream or table already has.
    fn check_free(&self, text: &str, name: &str, name_pos: Pos) -> Result<(), SqlError> {
        let ctx = self.session.context();
        if self.session.stream(name).is_some() || ctx.table_exist(name).unwrap_or(false) {
            return Err(self.err(
                text,
                name_pos,
                format!("'{name}' already exists; DROP it or pick another name"),
            ));
        }
        Ok(())
    }

    /// `PARTITIONED BY (column, ...)`, if it comes next.
    fn partitioned_by(&self, p: &mut Parser<'_>, text: &str) -> Result<Vec<String>, SqlError> {
        if !p.parse_keyword(Keyword::PARTITIONED) {
            return Ok(Vec::new());
        }
        let pe = |e: ParserError| self.parser_error(text, &e);
        p.expect_keyword(Keyword::BY).map_err(pe)?;
        Ok(
            p.parse_parenthesized_column_list(IsOptional::Mandatory, false)
                .map_err(pe)?
                .iter()
                .map(normalize)
                .collect(),
        )
    }

    /// Registers the files at `path` as table `name` for DataFusion to read.
    async fn register_files(
        &self,
        name: &str,
        path: &str,
        format: &str,
        header: bool,
        schema: &Option<Arc<Schema>>,
    ) -> datafusion::error::Result<()> {
        let ctx = self.session.context();
        match format {
            "csv" => {
                let mut o = CsvReadOptions::new().has_header(header).file_extension("");
                if let Some(s) = schema {
                    o = o.schema(s);
                }
                ctx.register_csv(name, path, o).await
            }
            "json" => {
                let mut o = JsonReadOptions::default().file_extension("");
                if let Some(s) = schema {
                    o = o.schema(s);
                }
                ctx.register_json(name, path, o).await
            }
            _ => {
                let o = ParquetReadOptions::default().file_extension("");
                ctx.register_parquet(name, path, o).await
            }
        }
    }

    /// `CREATE [TEMPORARY] VIEW [IF NOT EXISTS] name [(column, ...)] AS
    /// query` (after VIEW): a named query that later statements read as a
    /// stream. Planning inlines it, so a view holds no state of its own and
    /// each query reading it runs it anew, as in Flink.
    pub(crate) async fn create_view(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name_pos = Pos::from(&p.peek_token());
        let name = normalize(&p.parse_identifier().map_err(|e| pe(self, e))?);
        let renamed = if p.consume_token(&Token::LParen) {
            let names = p
                .parse_comma_separated(|p| p.parse_identifier())
                .map_err(|e| pe(self, e))?;
            p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
            Some(names.iter().map(normalize).collect::<Vec<_>>())
        } else {
            None
        };
        p.expect_keyword(Keyword::AS).map_err(|e| pe(self, e))?;
        let query_tok = p.peek_token();
        let query = p.parse_query().map_err(|e| pe(self, e))?;
        let ctx = self.session.context();
        if self.session.stream(&name).is_some() || ctx.table_exist(name.as_str()).unwrap_or(false) {
            if if_not_exists {
                return Ok(StatementOutcome::ViewCreated { view: name });
            }
            return Err(self.err(
                text,
                name_pos,
                format!("'{name}' already exists; DROP it or pick another name"),
            ));
        }
        let mut plan = self.plan_query(query, text, Pos::from(&query_tok)).await?;
        if let Some(names) = renamed {
            let fields = plan.schema().fields().len();
            if names.len() != fields {
                return Err(self.err(
                    text,
                    name_pos,
                    format!(
                        "view '{name}' names {} column(s), but its query gives {fields}",
                        names.len()
                    ),
                ));
            }
            let exprs: Vec<Expr> = (0..fields)
                .zip(&names)
                .map(|(i, n)| Expr::Column(Column::from(plan.schema().qualified_field(i))).alias(n))
                .collect();
            plan = LogicalPlanBuilder::from(plan)
                .project(exprs)
                .and_then(LogicalPlanBuilder::build)
                .map_err(|e| self.engine_error(text, name_pos, e.into()))?;
        }
        let view = ViewTable::new(plan, None);
        ctx.register_table(name.as_str(), Arc::new(view))
            .map_err(|e| self.engine_error(text, name_pos, e.into()))?;
        Ok(StatementOutcome::ViewCreated { view: name })
    }

    /// `CREATE [TEMPORARY [SYSTEM]] FUNCTION [IF NOT EXISTS] name AS
    /// 'class' [LANGUAGE ...]` (after FUNCTION): Flink loads the class;
    /// Sluice runs no JVM, so the name must be a function the Rust program
    /// registered on the session (`context().register_udf(...)`, or an
    /// aggregate or window function), and the statement checks that it is.
    pub(crate) fn create_function(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let pe = |s: &Self, e: ParserError| s.parser_error(text, &e);
        // IF NOT EXISTS changes nothing: registering is the program's.
        let _ = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name_tok = p.peek_token();
        let name = p.parse_object_name(false).map_err(|e| pe(self, e))?;
        let function = name
            .0
            .last()
            .and_then(|part| part.as_ident())
            .map(|id| id.value.to_ascii_lowercase())
            .unwrap_or_default();
        p.expect_keyword(Keyword::AS).map_err(|e| pe(self, e))?;
        let class = p.parse_literal_string().map_err(|e| pe(self, e))?;
        if p.parse_keyword(Keyword::LANGUAGE) {
            p.parse_identifier().map_err(|e| pe(self, e))?;
        }
        let state = self.session.context().state();
        let registered = state.udf(&function).is_ok()
            || state.udaf(&function).is_ok()
            || state.udwf(&function).is_ok();
        if !registered {
            return Err(self.err(
                text,
                Pos::from(&name_tok),
                format!(
                    "function '{function}' is not registered: Sluice loads no Java class \
                     ('{class}'); register a function named '{function}' on the session from \
                     Rust (session.context().register_udf(...)) before this file runs"
                ),
            ));
        }
        Ok(StatementOutcome::FunctionCreated { function })
    }

    /// `DROP VIEW [IF EXISTS] name` (after VIEW).
    pub(crate) async fn drop_view(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let name_tok = p.peek_token();
        let name = normalize(
            &p.parse_identifier()
                .map_err(|e| self.parser_error(text, &e))?,
        );
        let ctx = self.session.context();
        let is_view = self.session.stream(&name).is_none()
            && ctx
                .table_provider(name.as_str())
                .await
                .is_ok_and(|t| t.get_logical_plan().is_some());
        if is_view {
            ctx.deregister_table(name.as_str())
                .map_err(|e| self.engine_error(text, Pos::from(&name_tok), e.into()))?;
        } else if !if_exists {
            return Err(self.err(
                text,
                Pos::from(&name_tok),
                format!("there is no view '{name}' (DROP STREAM drops a stream)"),
            ));
        }
        Ok(StatementOutcome::ViewDropped { view: name })
    }

    /// `( key = value, ... )`; keys quoted or bare (dotted), values strings,
    /// numbers or bare words.
    pub(crate) fn options(
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
            let (key_tok, key) = self.key(p, text, "an option name such as 'topic'")?;
            p.expect_token(&Token::Eq).map_err(|e| pe(self, e))?;
            let value_tok = p.next_token();
            let value = value_of(&value_tok.token, &format!("option '{key}'"))
                .map_err(|message| self.err(text, Pos::from(&value_tok), message))?;
            // Flink's older spellings ('connector.type', ...) mean today's.
            let key = match LEGACY_OPTIONS
                .iter()
                .find(|(old, _)| key.eq_ignore_ascii_case(old))
            {
                Some((_, "")) => {
                    if p.consume_token(&Token::Comma) {
                        continue;
                    }
                    p.expect_token(&Token::RParen).map_err(|e| pe(self, e))?;
                    return Ok((options, positions));
                }
                Some((_, new)) => new.to_string(),
                None => key,
            };
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
    pub(crate) async fn schema(
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

    /// "unknown stream", with the closest declared name and how to declare it.
    pub(crate) fn unknown_stream(&self, name: &str) -> String {
        if let Some(path) = self
            .file_tables
            .get(name)
            .and_then(|t| t.options.get("path"))
        {
            return format!(
                "table '{name}' is written by the filesystem sink, and its path '{path}' did not \
                 exist when it was declared, so there is nothing to read; declare it again once \
                 its files exist"
            );
        }
        let names: Vec<String> = self.session.streams().into_iter().map(|s| s.name).collect();
        let hint = sluice_engine::closest(name, names.iter().map(String::as_str))
            .map(|c| format!(" (did you mean '{c}'?)"))
            .unwrap_or_default();
        format!(
            "unknown stream '{name}'{hint}: declare it first with CREATE STREAM {name} WITH \
             (connector = '...')"
        )
    }
}
