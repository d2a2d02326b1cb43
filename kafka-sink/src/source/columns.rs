//! What a Kafka stream reads: its format, its columns and where each
//! comes from (the message value or its key), and the decoders that read
//! them, planned from the options `config.rs` took and the declared
//! columns.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_engine::{Result, SluiceError, CHANGELOG_SIGN, UPSERT_DELETED, UPSERT_KEY_METADATA};

use crate::format::avro::{AvroConfluentDecoder, AvroDecoder};
use crate::format::key_indices;
use crate::format::protobuf::ProtobufConfluentDecoder;
use crate::registry::{Registry, RegistryOptions};

/// The virtual columns every Kafka stream has after its own.
const VIRTUAL: &[&str] = &["_key", "_topic", "_partition", "_offset", "_timestamp"];

/// How a message value is read (`format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceFormat {
    Json,
    Raw,
    Avro,
    AvroConfluent,
    /// Debezium's change events: a changelog (see `debezium`).
    DebeziumJson,
    ProtobufConfluent,
}

/// What a stream's options say of its columns.
pub(super) struct ColumnOptions {
    pub(super) format: SourceFormat,
    /// The value's schema registry, for the `-confluent` formats.
    pub(super) registry: Option<RegistryOptions>,
    pub(super) key_format: String,
    /// The key's schema registry, for `'key.format' = 'avro-confluent'`.
    pub(super) key_registry: Option<RegistryOptions>,
    pub(super) key_fields: Option<String>,
    pub(super) except_key: bool,
}

/// The columns a Kafka stream reads, where each comes from (value or
/// key), and the decoders that read them.
pub(super) struct Columns {
    pub(super) declared: SchemaRef,
    pub(super) value_schema: SchemaRef,
    pub(super) value_part: SchemaRef,
    pub(super) key: Option<KeyColumns>,
    pub(super) avro: Option<AvroDecoder>,
    pub(super) confluent: Option<Arc<AvroConfluentDecoder>>,
    pub(super) protobuf: Option<Arc<ProtobufConfluentDecoder>>,
    pub(super) schema: SchemaRef,
}

impl Columns {
    /// Plans the columns of a stream with `options` and `declared`
    /// columns (none: the format's own), refusing what cannot be read.
    pub(super) fn plan(
        stream: &str,
        options: &ColumnOptions,
        declared: Option<SchemaRef>,
        upsert: bool,
    ) -> Result<Self> {
        let format = options.format;
        let declared = match (format, declared) {
            (SourceFormat::Raw, Some(d)) => Some(raw_columns(stream, &d)?),
            (_, declared) => declared,
        };
        let key_fields = key_fields(stream, options, declared.as_ref(), upsert)?;
        let declared = match (&key_fields, declared) {
            (Some(keys), Some(d)) if upsert => Some(upsert_columns(&d, keys)),
            // A change event's key is its table's primary key, which
            // identifies the rows a join over the changes emits.
            (None, Some(d)) if format == SourceFormat::DebeziumJson => match &options.key_fields {
                Some(list) => {
                    let keys =
                        key_indices(list, &d, "declared").map_err(|e| in_stream(stream, e))?;
                    let fields: Vec<Field> = d
                        .fields()
                        .iter()
                        .enumerate()
                        .map(|(i, f)| match keys.contains(&i) {
                            true => as_key(f),
                            false => f.as_ref().clone(),
                        })
                        .collect();
                    Some(Arc::new(Schema::new(fields)))
                }
                None => Some(d),
            },
            (_, declared) => declared,
        };
        let (key, value_declared) = match (key_fields, &declared) {
            (Some(fields), Some(declared)) => {
                let key = KeyColumns::new(
                    stream,
                    fields,
                    declared,
                    &options.key_format,
                    options.key_registry.clone(),
                )?;
                let count = declared.fields().len();
                let rest = if options.except_key {
                    crate::format::except_key(count, &key.fields)
                } else {
                    (0..count).collect()
                };
                (Some(key), Some(Arc::new(declared.project(&rest)?)))
            }
            _ => (None, declared.clone()),
        };
        let (confluent, protobuf) = registry_decoders(stream, options, &value_declared)?;
        let value_part = match (&confluent, &protobuf, &value_declared) {
            (Some(c), _, _) => c.schema(),
            (_, Some(p), _) => p.schema(),
            (None, None, Some(v)) => Arc::clone(v),
            (None, None, None) => {
                Arc::new(Schema::new(vec![Field::new("value", DataType::Utf8, true)]))
            }
        };
        let value_schema =
            value_schema(stream, format, declared, key.is_some(), &value_part, upsert)?;
        let schema = with_virtual_columns(stream, &value_schema)?;
        let avro = match format {
            SourceFormat::Avro => {
                Some(AvroDecoder::new(Arc::clone(&value_part)).map_err(|e| in_stream(stream, e))?)
            }
            SourceFormat::Json
            | SourceFormat::Raw
            | SourceFormat::AvroConfluent
            | SourceFormat::ProtobufConfluent
            | SourceFormat::DebeziumJson => None,
        };
        let declared = match format {
            SourceFormat::DebeziumJson => Arc::clone(&value_part),
            _ if upsert => Arc::new(
                value_schema.project(&(0..value_schema.fields().len() - 1).collect::<Vec<_>>())?,
            ),
            _ => Arc::clone(&value_schema),
        };
        Ok(Self {
            declared,
            value_schema,
            value_part,
            key,
            avro,
            confluent,
            protobuf,
            schema,
        })
    }
}

/// The positions of the declared columns the message key holds, when the
/// stream reads them from the key: with EXCEPT_KEY and on an upsert
/// stream; otherwise every column comes from the value (as in Flink, where
/// the value's fields win).
fn key_fields(
    stream: &str,
    options: &ColumnOptions,
    declared: Option<&SchemaRef>,
    upsert: bool,
) -> Result<Option<Vec<usize>>> {
    let format = options.format;
    if upsert && format == SourceFormat::DebeziumJson {
        return Err(SluiceError::config(format!(
            "stream '{stream}': connector 'upsert-kafka' reads each key's latest value; a \
             Debezium topic is read with connector 'kafka'"
        )));
    }
    if upsert && options.key_fields.is_none() {
        return Err(SluiceError::config(format!(
            "stream '{stream}': connector 'upsert-kafka' needs the columns its message keys \
             hold, which identify a row: 'key.fields' = 'id' (comma-separated declared columns)"
        )));
    }
    match (&options.key_fields, options.except_key || upsert) {
        (None, true) => Err(SluiceError::config(format!(
            "stream '{stream}': 'value.fields-include' = 'EXCEPT_KEY' needs the columns \
             the key holds: 'key.fields' = 'id' (comma-separated declared columns)"
        ))),
        (Some(_), true) if format == SourceFormat::DebeziumJson => {
            Err(SluiceError::config(format!(
                "stream '{stream}': a Debezium change event holds whole rows; \
                 'value.fields-include' = 'EXCEPT_KEY' does not apply"
            )))
        }
        (Some(_), true) if format == SourceFormat::Raw => Err(SluiceError::config(format!(
            "stream '{stream}': format 'raw' holds the whole value in one column; \
             'value.fields-include' = 'EXCEPT_KEY' does not apply"
        ))),
        (Some(list), true) => {
            let Some(declared) = declared else {
                return Err(SluiceError::config(format!(
                    "stream '{stream}': 'key.fields' names declared columns: declare them \
                     (CREATE STREAM {stream} (id BIGINT, ...) WITH (...))"
                )));
            };
            Ok(Some(
                key_indices(list, declared, "declared").map_err(|e| in_stream(stream, e))?,
            ))
        }
        (_, false) => Ok(None),
    }
}

/// `f` marked as a key column for the engine.
fn as_key(f: &Field) -> Field {
    f.clone()
        .with_metadata([(UPSERT_KEY_METADATA.to_string(), "true".to_string())].into())
}

/// An upsert stream's declared columns: its key columns marked for the
/// engine, its other columns nullable (they are null in a deletion).
fn upsert_columns(declared: &Schema, keys: &[usize]) -> SchemaRef {
    let fields: Vec<Field> = declared
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if keys.contains(&i) {
                as_key(f)
            } else {
                f.as_ref().clone().with_nullable(true)
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// A `-confluent` format's value decoder: Avro's or Protobuf's.
type RegistryDecoders = (
    Option<Arc<AvroConfluentDecoder>>,
    Option<Arc<ProtobufConfluentDecoder>>,
);

/// The value's decoder of a `-confluent` format, which reads each record
/// by its schema id from the registry: Avro's or Protobuf's.
fn registry_decoders(
    stream: &str,
    options: &ColumnOptions,
    value_declared: &Option<SchemaRef>,
) -> Result<RegistryDecoders> {
    let Some(registry) = options.registry.clone() else {
        return Ok((None, None));
    };
    let registry = Registry::new(registry)?;
    Ok(match options.format {
        SourceFormat::ProtobufConfluent => (
            None,
            Some(Arc::new(
                ProtobufConfluentDecoder::from_registry(registry, value_declared.clone())
                    .map_err(|e| in_stream(stream, e))?,
            )),
        ),
        _ => (
            Some(Arc::new(
                AvroConfluentDecoder::from_registry(registry, value_declared.clone())
                    .map_err(|e| in_stream(stream, e))?,
            )),
            None,
        ),
    })
}

/// The rows decoding gives: the declared columns (or the format's own),
/// and for a changelog its sign, for an upsert stream its deletion marker.
fn value_schema(
    stream: &str,
    format: SourceFormat,
    declared: Option<SchemaRef>,
    keyed: bool,
    value_part: &SchemaRef,
    upsert: bool,
) -> Result<SchemaRef> {
    Ok(match (format, declared) {
        (_, Some(declared)) if upsert => followed_by(
            &declared,
            [Field::new(UPSERT_DELETED, DataType::Boolean, false)],
        ),
        (_, Some(declared)) if keyed => declared,
        (SourceFormat::AvroConfluent | SourceFormat::ProtobufConfluent, _) => {
            Arc::clone(value_part)
        }
        (SourceFormat::Raw, None) => {
            Arc::new(Schema::new(vec![Field::new("value", DataType::Utf8, true)]))
        }
        (SourceFormat::Raw, Some(s)) => s,
        (SourceFormat::DebeziumJson, Some(s)) => {
            if s.field_with_name(CHANGELOG_SIGN).is_ok() {
                return Err(SluiceError::config(format!(
                    "stream '{stream}': column '{CHANGELOG_SIGN}' is Sluice's own; rename it"
                )));
            }
            followed_by(&s, [Field::new(CHANGELOG_SIGN, DataType::Int64, false)])
        }
        (SourceFormat::Json | SourceFormat::Avro, Some(s)) => s,
        (SourceFormat::Json | SourceFormat::Avro | SourceFormat::DebeziumJson, None) => {
            return Err(SluiceError::config(format!(
                "stream '{stream}': a Kafka stream in a format other than 'raw' needs its \
                 columns declared: CREATE STREAM {stream} (id BIGINT, ...) WITH (...)"
            )))
        }
    })
}

/// The declared columns of a `raw` stream: the one string column the
/// value is read into, as a plain string column (SQL's VARCHAR is planned
/// as a string view).
fn raw_columns(stream: &str, declared: &Schema) -> Result<SchemaRef> {
    let text = matches!(
        declared.fields().first().map(|f| f.data_type()),
        Some(DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
    );
    if declared.fields().len() != 1 || !text {
        return Err(SluiceError::config(format!(
            "stream '{stream}': format 'raw' gives one VARCHAR column; declare \
             (value VARCHAR) or leave the columns out"
        )));
    }
    let value = declared.field(0).clone().with_data_type(DataType::Utf8);
    Ok(Arc::new(Schema::new_with_metadata(
        vec![value],
        declared.metadata().clone(),
    )))
}

/// `value_schema` followed by the virtual columns of every Kafka stream,
/// which no declared column may be named as.
fn with_virtual_columns(stream: &str, value_schema: &SchemaRef) -> Result<SchemaRef> {
    if let Some(f) = value_schema
        .fields()
        .iter()
        .find(|f| VIRTUAL.contains(&f.name().as_str()))
    {
        return Err(SluiceError::config(format!(
            "stream '{stream}': column '{}' clashes with a virtual column of Kafka streams ({})",
            f.name(),
            VIRTUAL.join(", ")
        )));
    }
    Ok(followed_by(
        value_schema,
        [
            Field::new("_key", DataType::Utf8, true),
            Field::new("_topic", DataType::Utf8, false),
            Field::new("_partition", DataType::Int32, false),
            Field::new("_offset", DataType::Int64, false),
            Field::new(
                "_timestamp",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                true,
            ),
        ],
    ))
}

/// The declared columns a stream reads from the message key
/// (`'key.fields'` with `'value.fields-include' = 'EXCEPT_KEY'`), and how.
#[derive(Debug, Clone)]
pub(crate) struct KeyColumns {
    /// Their positions among the declared columns.
    pub fields: Vec<usize>,
    /// Their names and types.
    pub schema: SchemaRef,
    pub format: KeyFormat,
}

/// `'key.format'`.
#[derive(Debug, Clone)]
pub(crate) enum KeyFormat {
    /// A JSON object holding the key fields.
    Json,
    /// The key's bytes as the one key field: a VARCHAR, the key as UTF-8
    /// text, or BYTES, the key as it is.
    Raw,
    /// Avro in the Confluent wire format, schemas from the registry
    /// (subject `<topic>-key`).
    AvroConfluent(Arc<AvroConfluentDecoder>),
}

impl KeyColumns {
    fn new(
        stream: &str,
        fields: Vec<usize>,
        declared: &SchemaRef,
        format: &str,
        registry: Option<RegistryOptions>,
    ) -> Result<Self> {
        let schema = Arc::new(declared.project(&fields)?);
        let format = match (format, registry) {
            ("raw", _) => {
                let one = schema.fields().len() == 1
                    && matches!(
                        schema.field(0).data_type(),
                        DataType::Utf8
                            | DataType::Utf8View
                            | DataType::LargeUtf8
                            | DataType::Binary
                            | DataType::LargeBinary
                            | DataType::BinaryView
                    );
                if !one {
                    return Err(SluiceError::config(format!(
                        "stream '{stream}': 'key.format' = 'raw' reads the key's bytes as one \
                         VARCHAR column (UTF-8 text) or BYTES column (any bytes); 'key.fields' \
                         names {}",
                        sluice_engine::columns(&schema)
                    )));
                }
                KeyFormat::Raw
            }
            ("avro-confluent", Some(registry)) => KeyFormat::AvroConfluent(Arc::new(
                AvroConfluentDecoder::from_registry(
                    Registry::new(registry)?,
                    Some(Arc::clone(&schema)),
                )
                .map_err(|e| in_stream(stream, e))?,
            )),
            _ => KeyFormat::Json,
        };
        Ok(Self {
            fields,
            schema,
            format,
        })
    }
}

/// `schema`'s columns, then `more`.
fn followed_by(schema: &Schema, more: impl IntoIterator<Item = Field>) -> SchemaRef {
    let fields = schema.fields().iter().map(|f| f.as_ref().clone());
    Arc::new(Schema::new(fields.chain(more).collect::<Vec<_>>()))
}

/// `e` with the stream named in front, when it is about the stream's
/// options or columns (an unreachable registry names itself).
fn in_stream(stream: &str, e: SluiceError) -> SluiceError {
    match e {
        SluiceError::Config { message } => {
            SluiceError::config(format!("stream '{stream}': {message}"))
        }
        SluiceError::Plan(message) => SluiceError::config(format!("stream '{stream}': {message}")),
        other => other,
    }
}
