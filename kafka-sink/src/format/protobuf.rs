//! `format = 'protobuf-confluent'`: one Protobuf message per Kafka message,
//! in the Confluent wire format, schemas in a schema registry.
//!
//! Each message is a zero byte, the 4-byte big-endian id of the writer
//! schema (a `.proto` file), the *message indexes* saying which message of
//! that file it is (zigzag varints: a count, then an index per nesting
//! level; the file's first message is the single byte `0`), then the
//! Protobuf binary message.
//!
//! **Reading.** Each writer schema is compiled once (protox, in memory,
//! with Google's well-known types) and each record decoded by its
//! descriptor (prost-reflect). A message becomes a row through its
//! canonical JSON form (proto field names, 64-bit integers as numbers,
//! fields at their default written out, enums by name), read into the
//! declared columns as `json` reads: fields match columns by name, a
//! declared column the message lacks is null, a field not declared is
//! dropped. So records of older and newer schema versions read alike.
//!
//! **Writing.** The sink derives a proto3 schema from the columns (see
//! [`proto_schema`]), registers it, and writes each row as that message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};
use sluice_engine::{columns, Result, SluiceError};

use super::json::{decode_json, JsonLines};
use crate::registry::{Registry, Writers};

/// The name of the file a registry's schema text is compiled as.
const FILE: &str = "schema.proto";

/// Compiles a registry's Protobuf schema and returns the message `indexes`
/// point at (the first top-level message for `[0]`). The schema is `.proto`
/// text, or the base64 of a `FileDescriptorProto` (what Confluent's Python
/// serializer registers).
fn compile(proto: &str, indexes: &[usize]) -> Result<MessageDescriptor> {
    use base64::Engine;
    use prost_reflect::prost::Message;
    let bad = |e: &dyn std::fmt::Display| SluiceError::plan(format!("the .proto schema: {e}"));
    let descriptor = base64::engine::general_purpose::STANDARD
        .decode(proto.trim())
        .ok()
        .and_then(|bytes| {
            prost_reflect::prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
        })
        .filter(|d| !d.message_type.is_empty());
    let file = match descriptor {
        Some(d) => protox::file::File::from_file_descriptor_proto(d),
        None => protox::file::File::from_source(FILE, proto).map_err(|e| bad(&e))?,
    };
    let name = file.name().to_string();
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Source(file));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.open_file(&name).map_err(|e| bad(&e))?;
    let pool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(&name)
        .ok_or_else(|| bad(&"the compiled file is missing"))?;
    let mut at = indexes.iter();
    let first = at.next().copied().unwrap_or(0);
    let mut message = file
        .messages()
        .nth(first)
        .ok_or_else(|| bad(&format!("it has no message {first}")))?;
    for &i in at {
        let child = message.child_messages().nth(i);
        message = child.ok_or_else(|| {
            bad(&format!(
                "message {} has no nested message {i}",
                message.name()
            ))
        })?;
    }
    Ok(message)
}

/// Resolves the one in-memory file.
struct Source(protox::file::File);

impl protox::file::FileResolver for Source {
    fn open_file(&self, name: &str) -> std::result::Result<protox::file::File, protox::Error> {
        if name == self.0.name() {
            Ok(self.0.clone())
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

/// The writer schema id and message indexes of a Confluent-framed
/// Protobuf message, and where the Protobuf bytes start.
fn framing(message: &[u8]) -> std::result::Result<(u32, Vec<usize>, usize), String> {
    let [0, a, b, c, d, rest @ ..] = message else {
        return Err(match message.first() {
            Some(magic) if *magic != 0 => format!(
                "magic byte 0x{magic:02x}, not 0x00: not in the Confluent wire format (a zero \
                 byte, the 4-byte schema id, the message indexes, the Protobuf message)"
            ),
            _ => format!(
                "{} bytes, too short for the Confluent wire format",
                message.len()
            ),
        });
    };
    let id = u32::from_be_bytes([*a, *b, *c, *d]);
    let mut at = 0;
    let mut varint = || -> std::result::Result<i64, String> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = *rest
                .get(at)
                .ok_or_else(|| "the message indexes are cut short".to_string())?;
            at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err("a message index is not a varint".into())
    };
    let count = varint()?;
    let indexes = if count == 0 {
        vec![0]
    } else if (1..=64).contains(&count) {
        (0..count)
            .map(|_| {
                varint().and_then(|i| usize::try_from(i).map_err(|_| format!("message index {i}")))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?
    } else {
        return Err(format!("{count} message indexes"));
    };
    Ok((id, indexes, 5 + at))
}

/// Writer messages by schema id and message indexes; `None` for an id the
/// registry does not have.
/// By schema id and message indexes: the message's descriptor, none for
/// an id the registry does not have, or why it does not compile (a record
/// naming a message its schema lacks: the record's fault, not the
/// registry's).
type Compiled = HashMap<(u32, Vec<usize>), std::result::Result<Option<MessageDescriptor>, String>>;

/// Decodes Protobuf in the Confluent wire format
/// (`format = 'protobuf-confluent'`) into columns, compiling each writer
/// schema once.
///
/// A Kafka source builds it from a schema registry; given the schemas
/// themselves, it decodes without one:
///
/// ```
/// # use std::sync::Arc;
/// use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// use sluice_kafka::ProtobufConfluentDecoder;
///
/// let proto = "syntax = \"proto3\"; message Bid { int64 id = 1; }";
/// let columns = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
/// let decoder = ProtobufConfluentDecoder::with_schemas([(3, proto.to_string())], columns);
/// // Schema id 3, message index [0], then field 1 = 150.
/// let batch = decoder.decode([&[0u8, 0, 0, 0, 3, 0, 0x08, 0x96, 0x01][..]].into_iter())?;
/// assert_eq!(batch.num_rows(), 1);
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug)]
pub struct ProtobufConfluentDecoder {
    schema: SchemaRef,
    writers: Writers,
    /// Compiled writer messages by (schema id, message indexes); `None`
    /// for an id the registry does not have.
    messages: Mutex<Compiled>,
}

impl ProtobufConfluentDecoder {
    /// A decoder of messages written with `writers` (`.proto` text by
    /// schema id) into `columns`.
    pub fn with_schemas(
        writers: impl IntoIterator<Item = (u32, String)>,
        columns: SchemaRef,
    ) -> Self {
        Self {
            schema: columns,
            writers: Writers::Fixed(
                writers
                    .into_iter()
                    .map(|(id, s)| (id, Arc::from(s)))
                    .collect(),
            ),
            messages: Mutex::new(HashMap::new()),
        }
    }

    /// Reads into `declared`, or, with none, into the fields of the
    /// subject's latest schema's first message.
    pub(crate) fn from_registry(registry: Registry, declared: Option<SchemaRef>) -> Result<Self> {
        let schema = match declared {
            Some(declared) => declared,
            None => {
                let subject = registry.options().subject.clone();
                let latest = registry.latest(&subject)?.ok_or_else(|| {
                    SluiceError::config(format!(
                        "subject '{subject}' has no schema in registry '{}' yet, so the \
                         stream's columns are unknown: declare them",
                        registry.options().url
                    ))
                })?;
                columns_of(&compile(&latest.schema, &[0])?)?
            }
        };
        Ok(Self {
            schema,
            writers: Writers::Registry(Box::new(registry)),
            messages: Mutex::new(HashMap::new()),
        })
    }

    /// The columns rows are decoded into.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Looks up and compiles the writer schemas of `messages` not seen
    /// yet; fails only when the registry cannot be asked.
    pub(crate) fn resolve<'a>(&self, messages: impl Iterator<Item = &'a [u8]>) -> Result<()> {
        for m in messages {
            if let Ok((id, indexes, _)) = framing(m) {
                // A message the schema lacks is the record's fault: its
                // decoding says so.
                let _record_fault = self.descriptor(id, indexes)?;
            }
        }
        Ok(())
    }

    /// The descriptor of message `indexes` of schema `id`; an error only
    /// when the registry cannot be asked (the inner one: when the record's
    /// schema and indexes name no message).
    fn descriptor(
        &self,
        id: u32,
        indexes: Vec<usize>,
    ) -> Result<std::result::Result<Option<MessageDescriptor>, String>> {
        let key = (id, indexes);
        if let Some(known) = self.lock().get(&key) {
            return Ok(known.clone());
        }
        let found = match self.writers.schema_by_id(id)? {
            Some(text) => compile(&text, &key.1).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        };
        self.lock().insert(key, found.clone());
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Compiled> {
        self.messages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// All of `messages` as rows; an error if any is not a whole message
    /// of a schema the registry has.
    pub fn decode<'a>(
        &self,
        messages: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch> {
        let options = SerializeOptions::new()
            .stringify_64_bit_integers(false)
            .use_proto_field_name(true)
            .skip_default_fields(false);
        let mut rows = Vec::with_capacity(messages.len());
        for m in messages {
            let (id, indexes, start) = framing(m).map_err(SluiceError::plan)?;
            let descriptor = self
                .descriptor(id, indexes)?
                .map_err(SluiceError::plan)?
                .ok_or_else(|| {
                    SluiceError::plan(format!("schema id {id} is not in {}", self.writers.name()))
                })?;
            let message = DynamicMessage::decode(descriptor, &m[start..]).map_err(|e| {
                SluiceError::plan(format!("not a Protobuf message of schema id {id}: {e}"))
            })?;
            let mut row = Vec::new();
            message
                .serialize_with_options(&mut serde_json::Serializer::new(&mut row), &options)
                .map_err(|e| SluiceError::plan(format!("protobuf message to row: {e}")))?;
            rows.push(row);
        }
        decode_json(&self.schema, rows.iter().map(Vec::as_slice))
    }
}

/// The columns of a message's fields: scalars, enums (by name) and
/// strings; others are refused, naming the field.
fn columns_of(message: &MessageDescriptor) -> Result<SchemaRef> {
    use prost_reflect::{Cardinality, Kind};
    let fields = message
        .fields()
        .map(|f| {
            let refuse = || {
                SluiceError::config(format!(
                    "field '{}' of message {} is a {:?}, which Sluice cannot yet take as a \
                     column without declaring it; declare the stream's columns",
                    f.name(),
                    message.full_name(),
                    f.kind()
                ))
            };
            if f.cardinality() == Cardinality::Repeated {
                return Err(refuse());
            }
            let data_type = match f.kind() {
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => DataType::Int32,
                Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint32 | Kind::Fixed32 => {
                    DataType::Int64
                }
                Kind::Uint64 | Kind::Fixed64 => DataType::UInt64,
                Kind::Float => DataType::Float32,
                Kind::Double => DataType::Float64,
                Kind::Bool => DataType::Boolean,
                Kind::String | Kind::Enum(_) => DataType::Utf8,
                Kind::Bytes | Kind::Message(_) => return Err(refuse()),
            };
            Ok(Field::new(f.name(), data_type, true))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The proto3 schema the sink writes rows with `schema` in: message `Row`
/// with a field per column, numbered from 1 in column order; a column that
/// may be null is `optional`. `BIGINT` is `int64`, `INT`/`SMALLINT`/
/// `TINYINT` `int32`, unsigned integers `uint64`/`uint32`, `DOUBLE`
/// `double`, `REAL` `float`, `BOOLEAN` `bool`, `VARCHAR` `string`, `BYTEA`
/// `bytes`; `TIMESTAMP`, `DATE` and `DECIMAL` travel as their text
/// (`string`, RFC 3339 and the like).
///
/// ```
/// use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
/// let proto = sluice_kafka::proto_schema(&schema)?;
/// assert!(proto.contains("int64 id = 1;"), "{proto}");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
pub fn proto_schema(schema: &Schema) -> Result<String> {
    let mut text = String::from("syntax = \"proto3\";\n\nmessage Row {\n");
    for (i, f) in schema.fields().iter().enumerate() {
        let kind = match f.data_type() {
            DataType::Int8 | DataType::Int16 | DataType::Int32 => "int32",
            DataType::Int64 => "int64",
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => "uint32",
            DataType::UInt64 => "uint64",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Boolean => "bool",
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string",
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "bytes",
            DataType::Timestamp(..)
            | DataType::Date32
            | DataType::Date64
            | DataType::Decimal128(..)
            | DataType::Decimal256(..) => "string",
            other => {
                return Err(SluiceError::plan(format!(
                    "format 'protobuf-confluent' cannot carry column '{}' of type {other}; \
                     CAST it to a supported type (BIGINT, INT, DOUBLE, REAL, BOOLEAN, VARCHAR, \
                     BYTEA, TIMESTAMP, DATE, DECIMAL); the columns are: {}",
                    f.name(),
                    columns(schema)
                )))
            }
        };
        let valid = f
            .name()
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if !valid {
            return Err(SluiceError::plan(format!(
                "column '{}' is not a Protobuf field name (letters, digits, '_'); rename it \
                 with AS",
                f.name()
            )));
        }
        let optional = if f.is_nullable() { "optional " } else { "" };
        text.push_str(&format!("  {optional}{kind} {} = {};\n", f.name(), i + 1));
    }
    text.push_str("}\n");
    Ok(text)
}

/// One Confluent-framed Protobuf message per row of `batch`, of the
/// [`proto_schema`] of its columns that the registry knows by `id`. The
/// schema is compiled once per process.
pub(crate) fn encode(batch: &RecordBatch, id: u32) -> Result<Vec<Vec<u8>>> {
    static ENCODERS: std::sync::LazyLock<Mutex<HashMap<(SchemaRef, u32), ProtobufEncoder>>> =
        std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));
    let key = (batch.schema(), id);
    let known = ENCODERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned();
    let encoder = match known {
        Some(e) => e,
        None => {
            let e = ProtobufEncoder::new(&key.0, id)?;
            ENCODERS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, e.clone());
            e
        }
    };
    encoder.encode(batch)
}

/// Writes rows as Confluent-framed Protobuf messages of a registered
/// schema.
#[derive(Debug, Clone)]
pub(crate) struct ProtobufEncoder {
    id: u32,
    message: MessageDescriptor,
}

impl ProtobufEncoder {
    /// For rows with `schema`, whose [`proto_schema`] the registry knows
    /// by `id`.
    pub(crate) fn new(schema: &Schema, id: u32) -> Result<Self> {
        Ok(Self {
            id,
            message: compile(&proto_schema(schema)?, &[0])?,
        })
    }

    /// One message per row of `batch`.
    pub(crate) fn encode(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let options = DeserializeOptions::new().deny_unknown_fields(true);
        JsonLines::encode(batch)?
            .rows()
            .map(|json| {
                let mut de = serde_json::Deserializer::from_slice(json);
                let message = DynamicMessage::deserialize_with_options(
                    self.message.clone(),
                    &mut de,
                    &options,
                )
                .map_err(|e| SluiceError::plan(format!("row to protobuf: {e}")))?;
                let mut out = Vec::with_capacity(json.len());
                out.push(0);
                out.extend(self.id.to_be_bytes());
                out.push(0);
                prost_reflect::prost::Message::encode(&message, &mut out)
                    .map_err(|e| SluiceError::Internal(format!("protobuf encode: {e}")))?;
                Ok(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};

    #[test]
    fn rows_round_trip_through_the_derived_schema_and_the_framing() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Float64, true),
        ]));
        let text = proto_schema(&schema).unwrap();
        assert_eq!(
            text,
            "syntax = \"proto3\";\n\nmessage Row {\n  int64 id = 1;\n  optional string name = \
             2;\n  optional double price = 3;\n}\n"
        );
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![0, 300])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(Float64Array::from(vec![Some(0.5), None])),
            ],
        )
        .unwrap();
        let messages = ProtobufEncoder::new(&schema, 7)
            .unwrap()
            .encode(&batch)
            .unwrap();
        // id 0 is proto3's default: not on the wire; name "a" is field 2,
        // length-delimited; price 0.5 is field 3, 64-bit.
        let mut first = vec![0, 0, 0, 0, 7, 0, 0x12, 1, b'a', 0x19];
        first.extend(0.5f64.to_le_bytes());
        assert_eq!(messages[0], first);
        // id 300: field 1, varint 0xAC 0x02; the nulls are absent.
        assert_eq!(messages[1], [0, 0, 0, 0, 7, 0, 0x08, 0xAC, 0x02]);
        assert_eq!(framing(&messages[1]), Ok((7, vec![0], 6)));
        // Two message indexes, [1, 2]: count 2 (zigzag 4), 1 (2), 2 (4).
        assert_eq!(
            framing(&[0, 0, 0, 0, 9, 4, 2, 4, 0xff]),
            Ok((9, vec![1, 2], 8))
        );
        assert!(framing(b"{}").unwrap_err().contains("magic byte 0x7b"));

        let message = compile(&text, &[0]).unwrap();
        let decoded = DynamicMessage::decode(message, &messages[1][6..]).unwrap();
        assert_eq!(decoded.get_field_by_name("id").unwrap().as_i64(), Some(300));
        assert!(!decoded.has_field_by_name("name"));
    }
}
