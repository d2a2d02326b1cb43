//! `SET`: the settings that apply to the statements after it.

use crate::{Pos, SqlError, SqlRunner, StatementOutcome};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use sluice_engine::{unknown_setting, Options, OutputMode, QuerySettings, Setting, SluiceError};

use crate::substitute::value_of;

/// What the `SET`s so far say: the engine's one [`QuerySettings`] for the
/// queries after them, and the output mode of each statement after them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub query: QuerySettings,
    pub output_mode: Option<OutputMode>,
    /// `SET 'kafka.<property>'` (or `'properties.<property>'`): client
    /// properties every Kafka stream declared after it gets unless it sets
    /// them itself, keyed `kafka.<property>`.
    pub kafka: Options,
}

impl Settings {
    /// Adds the session's Kafka properties a Kafka stream's `options` do
    /// not set in either spelling (`bootstrap.servers` counts for
    /// `kafka.bootstrap.servers`).
    pub(crate) fn add_kafka_defaults(&self, options: &mut Options) {
        for (key, value) in self.kafka.iter() {
            let property = &key["kafka.".len()..];
            let mut spellings = vec![key.to_string(), format!("properties.{property}")];
            if property == "bootstrap.servers" {
                spellings.push(property.to_string());
            }
            if spellings.iter().all(|k| options.get(k).is_none()) {
                options.set(key, value);
            }
        }
    }
}

impl SqlRunner<'_> {
    pub(crate) fn set(
        &mut self,
        p: &mut Parser<'_>,
        text: &str,
    ) -> Result<StatementOutcome, SqlError> {
        let (key_tok, key) = self.key(p, text, "a setting name")?;
        if !(p.consume_token(&Token::Eq) || p.parse_keyword(Keyword::TO)) {
            let t = p.peek_token();
            return Err(self.err(
                text,
                Pos::from(&t),
                format!("expected '=' after SET '{key}', found '{}'", t.token),
            ));
        }
        let value_tok = p.next_token();
        let value = value_of(&value_tok.token, &format!("setting '{key}'"))
            .map_err(|message| self.err(text, Pos::from(&value_tok), message))?;
        let at_value = |e: SluiceError| self.err(text, Pos::from(&value_tok), e.to_string());
        let property = key
            .strip_prefix("kafka.")
            .or_else(|| key.strip_prefix("properties."));
        if let Some(property) = property.filter(|p| !p.is_empty()) {
            let shown = if sluice_engine::is_sensitive(property) {
                sluice_engine::REDACTED.to_string()
            } else {
                value.clone()
            };
            self.settings.kafka.set(&format!("kafka.{property}"), value);
            return Ok(StatementOutcome::Set { key, value: shown });
        }
        let Some(setting) = Setting::find(&key) else {
            return Err(self.err(text, Pos::from(&key_tok), unknown_setting(&key).to_string()));
        };
        if setting.is_query_wide() {
            let mut query = self.settings.query.clone();
            query.set(&key, &value).map_err(at_value)?;
            self.settings.query = query;
        } else {
            // The one statement-wide setting: the output mode of the
            // INSERTs after it.
            self.settings.output_mode = Some(value.parse::<OutputMode>().map_err(at_value)?);
        }
        Ok(StatementOutcome::Set { key, value })
    }

    /// The settings of the query named `name` starting at `pos`: those in
    /// force, its checkpoint location used by no other query of the file.
    pub(crate) fn query_settings(
        &mut self,
        text: &str,
        pos: Pos,
        name: &str,
    ) -> Result<QuerySettings, SqlError> {
        let mut settings = self.settings.query.clone();
        settings.name = Some(name.to_string());
        if let Some(pipeline) = &settings.pipeline_name {
            if !self.pipelines.insert(pipeline.clone()) {
                return Err(self.err(
                    text,
                    pos,
                    format!(
                        "'pipeline.name' = '{pipeline}' already names an earlier query of this \
                         file, and two queries of one identity would fence each other; give \
                         each its own: SET 'pipeline.name' = '...' before it"
                    ),
                ));
            }
        }
        let Some(dir) = &settings.checkpoint else {
            return Ok(settings);
        };
        let dir = dir.display().to_string();
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
        Ok(settings)
    }
}
