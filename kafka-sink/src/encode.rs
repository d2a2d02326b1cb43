//! Record batches to Kafka message bytes, column-at-a-time.
//!
//! JSON rows come from arrow-json's line-delimited writer over the whole
//! batch (JSON escapes newlines inside strings, so the line breaks are
//! exactly the row boundaries); CSV rows from arrow-csv per row; `raw` takes
//! the bytes of a single string or binary column; Avro rows from
//! arrow-avro's row encoder ([`crate::avro`]), single-object encoded or in
//! the Confluent wire format.

use arrow_avro::schema::FingerprintStrategy;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::json::LineDelimitedWriter;
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{columns, Result, SluiceError};

/// A message's key (if any) and value.
pub type Message = (Option<Vec<u8>>, Vec<u8>);

/// A message format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per message.
    Json,
    /// One CSV line (no header) per message.
    Csv,
    /// The bytes of the single column `value`.
    Raw,
    /// One Avro record per message, single-object encoded (see [`crate::avro`]).
    Avro,
    /// One Avro record per message in the Confluent wire format, written
    /// with the schema the registry knows by `schema_id` (see
    /// [`crate::avro`]).
    AvroConfluent {
        /// The registry's id of the schema derived from the columns.
        schema_id: u32,
    },
    /// One Protobuf message per message in the Confluent wire format, of
    /// the schema the registry knows by `schema_id` (see
    /// [`crate::protobuf`]).
    ProtobufConfluent {
        /// The registry's id of the `.proto` schema derived from the
        /// columns.
        schema_id: u32,
    },
}

impl Format {
    /// Parses `json`, `csv`, `raw` or `avro`.
    pub fn parse(value: &str) -> Result<Self> {
        match value {
            "json" => Ok(Self::Json),
            "csv" => Ok(Self::Csv),
            "raw" => Ok(Self::Raw),
            "avro" => Ok(Self::Avro),
            other => Err(SluiceError::config(format!(
                "option 'format' = '{other}' is not valid: expected one of 'json', 'csv', \
                 'raw', 'avro'"
            ))),
        }
    }

    /// Checks that rows with `schema` can be written in this format.
    pub fn check(&self, schema: &SchemaRef) -> Result<()> {
        if matches!(self, Self::Avro | Self::AvroConfluent { .. }) {
            crate::avro::schema_json(schema)?;
        }
        if matches!(self, Self::ProtobufConfluent { .. }) {
            crate::protobuf::proto_schema(schema)?;
        }
        if *self == Self::Raw {
            let ok = schema.fields().len() == 1
                && matches!(
                    schema.field(0).data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Binary
                );
            if !ok {
                return Err(SluiceError::plan(format!(
                    "format 'raw' writes one string or binary column, but the query outputs {}; \
                     select a single column or use format 'json'",
                    columns(schema)
                )));
            }
        }
        Ok(())
    }

    /// One message per row of `batch`: the row in this format, keyed by
    /// the columns `key_fields` as a JSON object (no key when empty): what
    /// a Kafka sink with the default `key.format` sends, public so that
    /// `benches/micro.rs` can measure it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use sluice_engine::arrow::array::{Int64Array, RecordBatch};
    /// # use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
    /// use sluice_kafka::Format;
    ///
    /// let schema = Arc::new(Schema::new(vec![
    ///     Field::new("auction", DataType::Int64, false),
    ///     Field::new("n", DataType::Int64, false),
    /// ]));
    /// let batch = RecordBatch::try_new(schema, vec![
    ///     Arc::new(Int64Array::from(vec![7])), Arc::new(Int64Array::from(vec![3])),
    /// ])?;
    /// let messages = Format::Json.messages(&batch, &[0])?;
    /// assert_eq!(messages[0].0.as_deref(), Some(&br#"{"auction":7}"#[..]));
    /// assert_eq!(messages[0].1, br#"{"auction":7,"n":3}"#);
    /// # Ok::<(), sluice_engine::SluiceError>(())
    /// ```
    pub fn messages(&self, batch: &RecordBatch, key_fields: &[usize]) -> Result<Vec<Message>> {
        messages(batch, *self, Format::Json, key_fields, false)
    }

    /// One encoded message per row of `batch`.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        match self {
            Self::Json => encode_json(batch),
            Self::Csv => (0..batch.num_rows())
                .map(|i| {
                    let mut buf = Vec::new();
                    let mut w = datafusion::arrow::csv::WriterBuilder::new()
                        .with_header(false)
                        .build(&mut buf);
                    w.write(&batch.slice(i, 1))?;
                    drop(w);
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                    }
                    Ok(buf)
                })
                .collect(),
            Self::Avro => crate::avro::encode(batch, FingerprintStrategy::Rabin),
            Self::AvroConfluent { schema_id } => {
                crate::avro::encode(batch, FingerprintStrategy::Id(*schema_id))
            }
            Self::ProtobufConfluent { schema_id } => crate::protobuf::encode(batch, *schema_id),
            Self::Raw => {
                let col = batch.column(0);
                Ok(match col.data_type() {
                    DataType::Utf8 => col.as_string::<i32>().iter().map(bytes).collect(),
                    DataType::LargeUtf8 => col.as_string::<i64>().iter().map(bytes).collect(),
                    DataType::Utf8View => col.as_string_view().iter().map(bytes).collect(),
                    DataType::Binary => col
                        .as_binary::<i32>()
                        .iter()
                        .map(|v| v.unwrap_or_default().to_vec())
                        .collect(),
                    other => return Err(SluiceError::Internal(format!("raw format over {other}"))),
                })
            }
        }
    }
}

/// One message per row of `batch`: the row in `value` format (without the
/// `key_fields` when `except_key`), keyed by the `key_fields` in `key`
/// format (no key when there are none).
pub(crate) fn messages(
    batch: &RecordBatch,
    value: Format,
    key: Format,
    key_fields: &[usize],
    except_key: bool,
) -> Result<Vec<Message>> {
    let values = if except_key && !key_fields.is_empty() {
        value.encode(&batch.project(&self::except_key(batch.num_columns(), key_fields))?)?
    } else {
        value.encode(batch)?
    };
    if key_fields.is_empty() {
        return Ok(values.into_iter().map(|v| (None, v)).collect());
    }
    let keys = key.encode(&batch.project(key_fields)?)?;
    Ok(keys.into_iter().map(Some).zip(values).collect())
}

/// The positions in `schema` of the columns `'key.fields'` names (`list`,
/// comma-separated); an unknown name is an error naming the `kind` of
/// columns (`output`, `declared`) and listing them.
pub(crate) fn key_indices(list: &str, schema: &SchemaRef, kind: &str) -> Result<Vec<usize>> {
    list.split(',')
        .map(|name| {
            let name = name.trim();
            schema.index_of(name).map_err(|_| {
                let names = schema.fields().iter().map(|f| f.name().as_str());
                let hint = sluice_engine::closest(name, names)
                    .map(|c| format!(" (did you mean '{c}'?)"))
                    .unwrap_or_default();
                let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
                    "an"
                } else {
                    "a"
                };
                SluiceError::config(format!(
                    "'key.fields' names '{name}', which is not {article} {kind} column{hint}; the \
                     {kind} columns are: {}",
                    columns(schema)
                ))
            })
        })
        .collect()
}

/// The columns of a row with `count` columns that are not `key_fields`:
/// what a value holds with `'value.fields-include' = 'EXCEPT_KEY'`.
pub(crate) fn except_key(count: usize, key_fields: &[usize]) -> Vec<usize> {
    (0..count).filter(|i| !key_fields.contains(i)).collect()
}

fn bytes(v: Option<&str>) -> Vec<u8> {
    v.unwrap_or_default().as_bytes().to_vec()
}

fn encode_json(batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    let mut buf = Vec::with_capacity(batch.num_rows() * 32);
    {
        let mut w = LineDelimitedWriter::new(&mut buf);
        w.write(batch)?;
        w.finish()?;
    }
    let rows: Vec<Vec<u8>> = buf
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if rows.len() != batch.num_rows() {
        return Err(SluiceError::Internal(format!(
            "JSON encoder produced {} lines for {} rows",
            rows.len(),
            batch.num_rows()
        )));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    #[test]
    fn json_rows_split_exactly_even_with_newlines_in_strings() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("x\ny"), None])),
            ],
        )
        .unwrap();
        let rows = Format::Json.encode(&batch).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(String::from_utf8_lossy(&rows[0]), r#"{"a":1,"s":"x\ny"}"#);
        assert_eq!(String::from_utf8_lossy(&rows[1]), r#"{"a":2}"#);
        let csv = Format::Csv.encode(&batch).unwrap();
        assert_eq!(String::from_utf8_lossy(&csv[1]), "2,");
    }
}
