//! Message formats: record batches to Kafka message bytes,
//! column-at-a-time, and the decoders of each format (`json`, `avro`,
//! `protobuf`).
//!
//! JSON rows come from arrow-json's line-delimited writer over the whole
//! batch ([`json`]), and stay in that one buffer; `raw` rows are
//! the bytes of a single string or binary column, borrowed from it; CSV rows
//! come from arrow-csv per row; Avro rows from arrow-avro's row encoder
//! ([`avro`]), single-object encoded or in the Confluent wire format.
//! A JSON or raw batch thus costs the producer no allocation per row.

use arrow_avro::schema::FingerprintStrategy;
use datafusion::arrow::array::{
    Array, AsArray, BinaryArray, LargeStringArray, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{columns, Result, SluiceError};

pub(crate) mod avro;
pub(crate) mod json;
pub(crate) mod protobuf;

use json::JsonLines;

/// A message's key (if any) and value.
pub type Message = (Option<Vec<u8>>, Vec<u8>);

/// One batch's rows, each encoded in a format: row `i` is
/// [`Encoded::row`]`(i)`.
///
/// ```
/// # use std::sync::Arc;
/// # use sluice_engine::arrow::array::{RecordBatch, StringArray};
/// # use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// use sluice_kafka::Format;
///
/// let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
/// let column = StringArray::from(vec![Some("a"), None]);
/// let batch = RecordBatch::try_new(schema, vec![Arc::new(column)])?;
/// let raw = Format::Raw.encode(&batch)?;
/// assert_eq!((raw.len(), raw.row(0), raw.row(1)), (2, &b"a"[..], &b""[..]));
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug)]
pub struct Encoded(Rows);

#[derive(Debug)]
enum Rows {
    /// JSON rows back to back in one buffer.
    Json(JsonLines),
    /// The column's own bytes (a null is an empty message).
    Utf8(StringArray),
    LargeUtf8(LargeStringArray),
    Utf8View(StringViewArray),
    Binary(BinaryArray),
    /// One buffer per row.
    Each(Vec<Vec<u8>>),
}

impl Encoded {
    /// The number of rows.
    pub fn len(&self) -> usize {
        match &self.0 {
            Rows::Json(lines) => lines.len(),
            Rows::Utf8(a) => a.len(),
            Rows::LargeUtf8(a) => a.len(),
            Rows::Utf8View(a) => a.len(),
            Rows::Binary(a) => a.len(),
            Rows::Each(rows) => rows.len(),
        }
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i`'s bytes. Panics if `i` is not below [`Encoded::len`].
    pub fn row(&self, i: usize) -> &[u8] {
        fn or_empty<T: AsRef<[u8]> + ?Sized>(valid: bool, v: &T) -> &[u8] {
            if valid {
                v.as_ref()
            } else {
                &[]
            }
        }
        match &self.0 {
            Rows::Json(lines) => lines.row(i),
            Rows::Utf8(a) => or_empty(a.is_valid(i), a.value(i)),
            Rows::LargeUtf8(a) => or_empty(a.is_valid(i), a.value(i)),
            Rows::Utf8View(a) => or_empty(a.is_valid(i), a.value(i)),
            Rows::Binary(a) => or_empty(a.is_valid(i), a.value(i)),
            Rows::Each(rows) => &rows[i],
        }
    }

    /// Every row, in order.
    pub fn rows(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.row(i))
    }
}

/// One batch's messages: row `i`'s key (when the messages are keyed) and
/// value.
#[derive(Debug)]
pub struct Messages {
    keys: Option<Encoded>,
    values: Encoded,
}

impl Messages {
    /// The number of messages.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Message `i`'s key, `None` when the messages are not keyed.
    pub fn key(&self, i: usize) -> Option<&[u8]> {
        self.keys.as_ref().map(|k| k.row(i))
    }

    /// Message `i`'s value.
    pub fn value(&self, i: usize) -> &[u8] {
        self.values.row(i)
    }

    /// Every message as owned bytes.
    pub fn to_vec(&self) -> Vec<Message> {
        (0..self.len())
            .map(|i| (self.key(i).map(<[u8]>::to_vec), self.value(i).to_vec()))
            .collect()
    }
}

/// A message format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per message.
    Json,
    /// One CSV line (no header) per message.
    Csv,
    /// The bytes of the single column `value`.
    Raw,
    /// One Avro record per message, single-object encoded (see [`avro`]).
    Avro,
    /// One Avro record per message in the Confluent wire format, written
    /// with the schema the registry knows by `schema_id` (see
    /// [`avro`]).
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
            avro::schema_json(schema)?;
        }
        if matches!(self, Self::ProtobufConfluent { .. }) {
            protobuf::proto_schema(schema)?;
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
    /// assert_eq!(messages.key(0), Some(&br#"{"auction":7}"#[..]));
    /// assert_eq!(messages.value(0), br#"{"auction":7,"n":3}"#);
    /// # Ok::<(), sluice_engine::SluiceError>(())
    /// ```
    pub fn messages(&self, batch: &RecordBatch, key_fields: &[usize]) -> Result<Messages> {
        messages(batch, *self, Format::Json, key_fields, false)
    }

    /// One encoded message per row of `batch`.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Encoded> {
        Ok(Encoded(match self {
            Self::Json => Rows::Json(JsonLines::encode(batch)?),
            Self::Csv => Rows::Each(
                (0..batch.num_rows())
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
                    .collect::<Result<_>>()?,
            ),
            Self::Avro => Rows::Each(avro::encode(batch, FingerprintStrategy::Rabin)?),
            Self::AvroConfluent { schema_id } => {
                Rows::Each(avro::encode(batch, FingerprintStrategy::Id(*schema_id))?)
            }
            Self::ProtobufConfluent { schema_id } => {
                Rows::Each(protobuf::encode(batch, *schema_id)?)
            }
            Self::Raw => {
                let col = batch.column(0);
                match col.data_type() {
                    DataType::Utf8 => Rows::Utf8(col.as_string::<i32>().clone()),
                    DataType::LargeUtf8 => Rows::LargeUtf8(col.as_string::<i64>().clone()),
                    DataType::Utf8View => Rows::Utf8View(col.as_string_view().clone()),
                    DataType::Binary => Rows::Binary(col.as_binary::<i32>().clone()),
                    other => return Err(SluiceError::Internal(format!("raw format over {other}"))),
                }
            }
        }))
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
) -> Result<Messages> {
    let values = if except_key && !key_fields.is_empty() {
        value.encode(&batch.project(&self::except_key(batch.num_columns(), key_fields))?)?
    } else {
        value.encode(batch)?
    };
    let keys = match key_fields.is_empty() {
        true => None,
        false => Some(key.encode(&batch.project(key_fields)?)?),
    };
    Ok(Messages { keys, values })
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
        assert_eq!(
            String::from_utf8_lossy(rows.row(0)),
            r#"{"a":1,"s":"x\ny"}"#
        );
        assert_eq!(String::from_utf8_lossy(rows.row(1)), r#"{"a":2}"#);
        let csv = Format::Csv.encode(&batch).unwrap();
        assert_eq!(String::from_utf8_lossy(csv.row(1)), "2,");
    }
}
