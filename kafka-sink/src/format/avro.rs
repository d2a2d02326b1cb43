//! `format = 'avro'` and `format = 'avro-confluent'`: one Avro record per
//! Kafka message.
//!
//! **`avro`** is Avro's single-object encoding, with the schema derived
//! from the columns.
//!
//! Each message is `C3 01`, the 8-byte little-endian CRC-64-AVRO (Rabin)
//! fingerprint of the writer schema, then the record's Avro binary body
//! (Avro specification, "Single object encoding"). Any Avro library reads
//! it given the schema, and the fingerprint tells a reader which schema a
//! message was written with.
//!
//! The schema is derived from the Arrow columns by arrow-avro: a record
//! named `topLevelRecord` with one field per column, a nullable column as
//! the union `["null", T]`, BIGINT as `long`, DOUBLE as `double`, VARCHAR
//! as `string`, TIMESTAMP as `local-timestamp-*` (or `timestamp-*` with a
//! time zone), DATE as `date`, DECIMAL as `decimal` bytes. The sink logs it
//! when it starts; a Kafka source declaring the same columns with
//! `format = 'avro'` derives the same schema and reads the messages back.
//!
//! **`avro-confluent`** is the Confluent wire format: a zero byte, the
//! 4-byte big-endian id of the writer schema in a schema registry
//! ([`crate::registry`]), then the record's Avro binary body (see
//! [`AvroConfluentDecoder`]). A sink
//! registers the derived schema under its subject and writes with its id.
//! A source reads each record with the schema its id names (the *writer*
//! schema) and resolves it, by Avro's schema resolution rules, to one
//! *reader* schema: the subject's latest version when the stream starts
//! (so a field added with a default reads as that default from older
//! records, and a field the reader does not know is dropped), then keeps
//! the declared columns by name. With no columns declared, the reader
//! schema's fields are the columns.

use std::sync::Arc;

use arrow_avro::reader::ReaderBuilder;
use arrow_avro::schema::{
    AvroSchema, Fingerprint, FingerprintAlgorithm, FingerprintStrategy, SchemaStore,
};
use arrow_avro::writer::format::AvroSoeFormat;
use arrow_avro::writer::WriterBuilder;
use datafusion::arrow::compute::{can_cast_types, cast, concat_batches};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use serde_json::Value;
use sluice_engine::{columns, Result, SluiceError};

use crate::registry::{Registry, Writers};

/// The Avro schema (JSON) that `format = 'avro'` and `'avro-confluent'`
/// write rows with `schema` in, or an error naming the column whose type
/// Avro cannot carry.
///
/// ```
/// use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
/// let json = sluice_kafka::avro_schema(&schema)?;
/// assert!(json.contains(r#""name":"topLevelRecord""#), "{json}");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
pub fn schema_json(schema: &Schema) -> Result<String> {
    for field in schema.fields() {
        let one = Schema::new(vec![Arc::clone(field)]);
        if let Err(e) = AvroSchema::try_from(&one) {
            return Err(SluiceError::plan(format!(
                "format 'avro' cannot carry column '{}' of type {}: {e}; CAST it to a \
                 supported type (BIGINT, DOUBLE, VARCHAR, BOOLEAN, TIMESTAMP, DATE, DECIMAL, \
                 arrays and structs of these)",
                field.name(),
                field.data_type()
            )));
        }
    }
    Ok(AvroSchema::try_from(schema)?.json_string)
}

/// One message per row of `batch`: single-object encoded with
/// [`FingerprintStrategy::Rabin`], Confluent-framed with
/// [`FingerprintStrategy::Id`].
pub(crate) fn encode(batch: &RecordBatch, framing: FingerprintStrategy) -> Result<Vec<Vec<u8>>> {
    let mut encoder = WriterBuilder::new(batch.schema().as_ref().clone())
        .with_fingerprint_strategy(framing)
        .build_encoder::<AvroSoeFormat>()
        .map_err(avro_error)?;
    encoder.encode(batch).map_err(avro_error)?;
    Ok(encoder.flush().iter().map(|row| row.to_vec()).collect())
}

/// Decodes single-object-encoded messages written with the schema derived
/// from `schema` (the declared columns) into rows of `schema`.
#[derive(Debug, Clone)]
pub(crate) struct AvroDecoder {
    schema: SchemaRef,
    avro: AvroSchema,
}

impl AvroDecoder {
    pub(crate) fn new(schema: SchemaRef) -> Result<Self> {
        let avro = AvroSchema::new(schema_json(&schema)?);
        Ok(Self { schema, avro })
    }

    /// All of `messages` as rows; an error if any is not one whole record
    /// of the schema.
    pub(crate) fn decode<'a>(
        &self,
        messages: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch> {
        let mut store = SchemaStore::new();
        store.register(self.avro.clone())?;
        let mut decoder = ReaderBuilder::new()
            .with_writer_schema_store(store)
            .with_reader_schema(self.avro.clone())
            .with_batch_size(messages.len().max(1))
            .build_decoder()?;
        for message in messages {
            let used = decoder.decode(message).map_err(avro_error)?;
            if used != message.len() {
                return Err(SluiceError::plan(format!(
                    "not one Avro record of the declared columns: {used} of {} bytes form a \
                     record",
                    message.len()
                )));
            }
        }
        let Some(batch) = decoder.flush().map_err(avro_error)? else {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        };
        declared(&batch, &self.schema)
    }
}

/// The columns of `schema` taken from `batch` by name, with the declared
/// types: Avro has fewer types than Arrow (a SMALLINT travels as `int`).
fn declared(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = batch.column_by_name(f.name()).ok_or_else(|| {
                SluiceError::Internal(format!("decoded Avro has no field '{}'", f.name()))
            })?;
            Ok(if c.data_type() == f.data_type() {
                Arc::clone(c)
            } else {
                cast(c, f.data_type())?
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The writer schema id of a Confluent-framed message, or why it is not
/// one.
fn confluent_id(message: &[u8]) -> std::result::Result<u32, String> {
    match message {
        [0, a, b, c, d, ..] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        [magic, ..] if *magic != 0 => Err(format!(
            "magic byte 0x{magic:02x}, not 0x00: not in the Confluent wire format (a zero \
             byte, the 4-byte schema id, the Avro record)"
        )),
        _ => Err(format!(
            "{} bytes, too short for the Confluent wire format (a zero byte, the 4-byte \
             schema id, the Avro record)",
            message.len()
        )),
    }
}

/// Decodes Avro in the Confluent wire format (`format = 'avro-confluent'`)
/// into columns: each message with the writer schema its id names,
/// resolved to one reader schema.
///
/// A Kafka source builds it from a schema registry; given the schemas
/// themselves, it decodes without one:
///
/// ```
/// # use std::sync::Arc;
/// use sluice_kafka::AvroConfluentDecoder;
///
/// let v1 = r#"{"type": "record", "name": "Bid", "fields": [{"name": "id", "type": "long"}]}"#;
/// let v2 = r#"{"type": "record", "name": "Bid", "fields": [{"name": "id", "type": "long"},
///     {"name": "price", "type": "double", "default": 1.5}]}"#;
/// let decoder = AvroConfluentDecoder::with_schemas(v2, [(1, v1.to_string())], None)?;
/// // Schema id 1, then id 7 as an Avro long (zigzag: 14).
/// let batch = decoder.decode([&[0u8, 0, 0, 0, 1, 14][..]].into_iter())?;
/// assert_eq!(batch.num_rows(), 1);
/// assert_eq!(batch.schema().field(1).name(), "price");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug)]
pub struct AvroConfluentDecoder {
    /// The declared columns (or the reader schema's fields).
    schema: SchemaRef,
    /// The reader schema, as JSON.
    reader: Value,
    writers: Writers,
}

impl AvroConfluentDecoder {
    /// A decoder resolving to `reader` (Avro JSON) the messages written
    /// with `writers` (by schema id), into the `declared` columns, or
    /// into all of the reader's fields.
    pub fn with_schemas(
        reader: &str,
        writers: impl IntoIterator<Item = (u32, String)>,
        declared: Option<SchemaRef>,
    ) -> Result<Self> {
        let reader: Value = serde_json::from_str(reader)
            .map_err(|e| SluiceError::config(format!("the reader schema is not JSON: {e}")))?;
        let fields = reader_fields(&reader, "the reader schema")?;
        let schema = match declared {
            Some(declared) => {
                check_declared(&declared, &fields, "the reader schema")?;
                declared
            }
            None => fields,
        };
        let writers = writers
            .into_iter()
            .map(|(id, s)| (id, Arc::from(s)))
            .collect();
        Ok(Self {
            schema,
            reader,
            writers: Writers::Fixed(writers),
        })
    }

    /// Reads the subject's latest schema as the reader schema and checks
    /// the `declared` columns against it; with none declared, its fields
    /// become the columns. A subject with no schema yet reads with the
    /// schema derived from the declared columns.
    pub(crate) fn from_registry(registry: Registry, declared: Option<SchemaRef>) -> Result<Self> {
        let subject = registry.options().subject.clone();
        let url = registry.options().url.clone();
        let (reader, schema) = match (registry.latest(&subject)?, declared) {
            (Some(latest), declared) => {
                let reader: Value = serde_json::from_str(&latest.schema).map_err(|e| {
                    SluiceError::config(format!(
                        "subject '{subject}' version {} in registry '{url}' is not Avro JSON: {e}",
                        latest.version
                    ))
                })?;
                let what = format!(
                    "subject '{subject}' (version {}, id {}) in registry '{url}'",
                    latest.version, latest.id
                );
                let fields = reader_fields(&reader, &what)?;
                let schema = match declared {
                    Some(declared) => {
                        check_declared(&declared, &fields, &what)?;
                        declared
                    }
                    None => fields,
                };
                (reader, schema)
            }
            (None, Some(declared)) => {
                tracing::warn!(%subject, %url, "the subject has no schema yet: reading with the schema of the declared columns");
                let mut reader: Value = serde_json::from_str(&schema_json(&declared)?)
                    .map_err(|e| SluiceError::Internal(format!("derived Avro schema: {e}")))?;
                // A nullable column reads as null from a writer without it.
                if let Some(fields) = reader.get_mut("fields").and_then(Value::as_array_mut) {
                    for f in fields {
                        let nullable = f
                            .get("type")
                            .and_then(Value::as_array)
                            .is_some_and(|u| u.first() == Some(&Value::from("null")));
                        if nullable {
                            f["default"] = Value::Null;
                        }
                    }
                }
                (reader, declared)
            }
            (None, None) => {
                return Err(SluiceError::config(format!(
                    "subject '{subject}' has no schema in registry '{url}' yet, so the \
                     stream's columns are unknown: declare them (CREATE STREAM s (id BIGINT, \
                     ...)), or register the schema first"
                )))
            }
        };
        Ok(Self {
            schema,
            reader,
            writers: Writers::Registry(Box::new(registry)),
        })
    }

    /// The columns rows are decoded into.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Looks up the writer schemas of `messages` not seen yet. Fails only
    /// when the registry cannot be asked: an id it does not know, like a
    /// message that is not Confluent-framed, is that message's problem.
    pub(crate) fn resolve<'a>(&self, messages: impl Iterator<Item = &'a [u8]>) -> Result<()> {
        let mut last = None;
        for id in messages.filter_map(|m| confluent_id(m).ok()) {
            if last != Some(id) {
                self.writers.schema_by_id(id)?;
                last = Some(id);
            }
        }
        Ok(())
    }

    /// All of `messages` as rows; an error if any is not one whole record
    /// of a schema the registry has.
    pub fn decode<'a>(
        &self,
        messages: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch> {
        let mut batches = Vec::new();
        let mut run: Vec<&[u8]> = Vec::new();
        let mut run_id = None;
        for message in messages {
            let id = confluent_id(message).map_err(SluiceError::plan)?;
            if run_id != Some(id) && !run.is_empty() {
                batches.push(self.decode_run(run_id.unwrap_or(id), &run)?);
                run.clear();
            }
            run_id = Some(id);
            run.push(message);
        }
        if let Some(id) = run_id {
            batches.push(self.decode_run(id, &run)?);
        }
        Ok(concat_batches(&self.schema, &batches)?)
    }

    /// Messages all written with schema `id`.
    fn decode_run(&self, id: u32, messages: &[&[u8]]) -> Result<RecordBatch> {
        let writer = self.writers.schema_by_id(id)?.ok_or_else(|| {
            SluiceError::plan(format!("schema id {id} is not in {}", self.writers.name()))
        })?;
        let reader = self.reader_for(&writer)?;
        let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        store.set(Fingerprint::Id(id), AvroSchema::new(writer.to_string()))?;
        let mut decoder = ReaderBuilder::new()
            .with_writer_schema_store(store)
            .with_reader_schema(reader)
            .with_batch_size(messages.len().max(1))
            .build_decoder()
            .map_err(|e| {
                SluiceError::plan(format!(
                    "the record's schema (id {id}) cannot be resolved to the reader schema: {e}"
                ))
            })?;
        for message in messages {
            let used = decoder.decode(message).map_err(avro_error)?;
            if used != message.len() {
                return Err(SluiceError::plan(format!(
                    "not one Avro record of schema id {id}: {used} of {} bytes form a record",
                    message.len()
                )));
            }
        }
        match decoder.flush().map_err(avro_error)? {
            Some(batch) => declared(&batch, &self.schema),
            None => Ok(RecordBatch::new_empty(Arc::clone(&self.schema))),
        }
    }

    /// The reader schema under the writer's record name: Avro resolves
    /// two records only when their names match, and a topic's schemas are
    /// one record type however its producers named it.
    fn reader_for(&self, writer: &str) -> Result<AvroSchema> {
        let writer: Value = serde_json::from_str(writer)
            .map_err(|e| SluiceError::plan(format!("the registry's schema is not JSON: {e}")))?;
        let mut reader = self.reader.clone();
        for key in ["name", "namespace"] {
            match writer.get(key) {
                Some(v) => reader[key] = v.clone(),
                None => {
                    if let Some(o) = reader.as_object_mut() {
                        o.remove(key);
                    }
                }
            }
        }
        Ok(AvroSchema::new(reader.to_string()))
    }
}

/// Checks that each `declared` column is among the reader schema's
/// `fields` (of `what`), with a type it converts to.
fn check_declared(declared: &Schema, fields: &Schema, what: &str) -> Result<()> {
    for f in declared.fields() {
        let Ok(found) = fields.field_with_name(f.name()) else {
            return Err(SluiceError::config(format!(
                "column '{}' is not a field of {what}; its fields are: {}",
                f.name(),
                columns(fields)
            )));
        };
        if !can_cast_types(found.data_type(), f.data_type()) {
            return Err(SluiceError::config(format!(
                "column '{}' is declared {} but {what} has it as {}, which cannot be converted",
                f.name(),
                f.data_type(),
                found.data_type()
            )));
        }
    }
    Ok(())
}

/// The Arrow fields of a reader schema (JSON, of `what`) that is a record.
fn reader_fields(reader: &Value, what: &str) -> Result<SchemaRef> {
    if reader.get("type") != Some(&Value::from("record")) {
        return Err(SluiceError::config(format!(
            "{what} is not an Avro record; Sluice reads records into columns"
        )));
    }
    let json = reader.to_string();
    let mut store = SchemaStore::new();
    store.register(AvroSchema::new(json.clone()))?;
    let decoder = ReaderBuilder::new()
        .with_writer_schema_store(store)
        .with_reader_schema(AvroSchema::new(json))
        .build_decoder()
        .map_err(|e| SluiceError::config(format!("{what}: {e}")))?;
    let fields: Vec<Field> = decoder
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_metadata(Default::default()))
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

fn avro_error(e: arrow_avro::errors::AvroError) -> SluiceError {
    SluiceError::plan(format!("avro: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field};

    fn rows() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("score", DataType::Float64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, -300])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(Float64Array::from(vec![Some(0.5), Some(2.0)])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn messages_are_single_object_encoded_by_hand_too() {
        let messages = encode(&rows(), FingerprintStrategy::Rabin).unwrap();
        assert_eq!(messages.len(), 2);
        let fingerprint = AvroSchema::new(schema_json(&rows().schema()).unwrap())
            .fingerprint(arrow_avro::schema::FingerprintAlgorithm::Rabin)
            .unwrap();
        let arrow_avro::schema::Fingerprint::Rabin(fp) = fingerprint else {
            panic!("not a Rabin fingerprint")
        };
        let mut want = vec![0xC3, 0x01];
        want.extend(fp.to_le_bytes());
        // id 1: zigzag long 2; name "a": union branch 1, length 1 (zigzag
        // 2), 'a'; score 0.5: branch 1, IEEE little endian.
        want.extend([0x02, 0x02, 0x02, b'a', 0x02]);
        want.extend(0.5f64.to_le_bytes());
        assert_eq!(messages[0], want);
    }

    #[test]
    fn decoding_gives_back_the_rows_and_names_a_broken_message() {
        let batch = rows();
        let messages = encode(&batch, FingerprintStrategy::Rabin).unwrap();
        let decoder = AvroDecoder::new(batch.schema()).unwrap();
        let back = decoder.decode(messages.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(back, batch);

        let truncated = &messages[0][..messages[0].len() - 3];
        assert!(decoder.decode([truncated].into_iter()).is_err());
        let not_avro: &[u8] = b"{\"id\": 1}";
        assert!(decoder.decode([not_avro].into_iter()).is_err());
    }

    #[test]
    fn confluent_framing_is_a_zero_byte_and_the_big_endian_schema_id() {
        let messages = encode(&rows(), FingerprintStrategy::Id(0x0102_0304)).unwrap();
        let plain = encode(&rows(), FingerprintStrategy::Rabin).unwrap();
        for (framed, single) in messages.iter().zip(&plain) {
            assert_eq!(framed[..5], [0, 1, 2, 3, 4]);
            assert_eq!(framed[5..], single[10..], "the same Avro body");
            assert_eq!(confluent_id(framed), Ok(0x0102_0304));
        }
        let json = confluent_id(b"{\"id\": 1}").unwrap_err();
        assert!(json.contains("magic byte 0x7b, not 0x00"), "{json}");
        let short = confluent_id(&[0, 1, 2]).unwrap_err();
        assert!(short.contains("3 bytes, too short"), "{short}");
        assert!(confluent_id(&[]).is_err());
    }

    #[test]
    fn confluent_records_of_older_newer_and_renamed_schemas_read_into_the_reader_schema() {
        let v1 = r#"{"type": "record", "name": "Bid", "namespace": "a", "fields": [
            {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}"#;
        let v2 = r#"{"type": "record", "name": "Bid", "namespace": "a", "fields": [
            {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
            {"name": "price", "type": "double", "default": 1.5}]}"#;
        let v3 = r#"{"type": "record", "name": "Offer", "fields": [
            {"name": "id", "type": "long"}, {"name": "note", "type": "string"},
            {"name": "name", "type": "string"}, {"name": "price", "type": "double"}]}"#;
        let declared = Arc::new(Schema::new(vec![
            Field::new("price", DataType::Float64, true),
            Field::new("id", DataType::Int64, false),
        ]));
        let decoder = AvroConfluentDecoder::with_schemas(
            v2,
            [(1, v1.to_string()), (3, v3.to_string())],
            Some(Arc::clone(&declared)),
        )
        .unwrap();
        // id 7, name "x" under v1; id 8, note "n", name "y", price 2.0
        // under v3 (a field the reader lacks, another record name).
        let mut old = vec![0, 0, 0, 0, 1, 14, 2, b'x'];
        let mut newer = vec![0, 0, 0, 0, 3, 16, 2, b'n', 2, b'y'];
        newer.extend(2.0f64.to_le_bytes());
        let batch = decoder
            .decode([old.as_slice(), newer.as_slice(), old.as_slice()].into_iter())
            .unwrap();
        assert_eq!(batch.schema(), declared);
        let price = batch
            .column(0)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        let id = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(
            price.values(),
            &[1.5, 2.0, 1.5],
            "v1's rows take the default"
        );
        assert_eq!(id.values(), &[7, 8, 7]);

        // Each way a message is wrong is named.
        let unknown = [0, 0, 0, 0, 9, 14, 2, b'x'];
        let err = decoder.decode([&unknown[..]].into_iter()).unwrap_err();
        assert!(err.to_string().contains("schema id 9 is not in"), "{err}");
        old.truncate(7);
        let err = decoder.decode([old.as_slice()].into_iter()).unwrap_err();
        assert!(
            err.to_string()
                .contains("not one Avro record of schema id 1"),
            "{err}"
        );

        // A declared column the reader schema lacks is refused up front.
        let missing = Arc::new(Schema::new(vec![Field::new("qty", DataType::Int64, true)]));
        let err = AvroConfluentDecoder::with_schemas(v2, [], Some(missing)).unwrap_err();
        assert!(
            err.to_string().contains("column 'qty' is not a field"),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("id Int64, name Utf8, price Float64"),
            "{err}"
        );
    }

    #[test]
    fn the_derived_schema_is_the_documented_one() {
        use datafusion::arrow::datatypes::TimeUnit;
        let schema = Schema::new(vec![
            Field::new("b", DataType::Boolean, false),
            Field::new("i", DataType::Int32, false),
            Field::new("s", DataType::Int16, false),
            Field::new("l", DataType::Int64, false),
            Field::new("f", DataType::Float32, false),
            Field::new("d", DataType::Float64, false),
            Field::new("v", DataType::Utf8, false),
            Field::new("y", DataType::Binary, false),
            Field::new("day", DataType::Date32, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), false),
            Field::new(
                "tz",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
                false,
            ),
            Field::new("dec", DataType::Decimal128(10, 2), false),
            Field::new("maybe", DataType::Int64, true),
        ]);
        let json: serde_json::Value = serde_json::from_str(&schema_json(&schema).unwrap()).unwrap();
        assert_eq!(json["type"], "record");
        assert_eq!(json["name"], "topLevelRecord");
        let fields = json["fields"].as_array().unwrap();
        let types: Vec<String> = fields
            .iter()
            .map(|f| {
                let t = &f["type"];
                match (t.as_str(), t.get("logicalType")) {
                    (Some(name), _) => name.to_string(),
                    (None, Some(logical)) => {
                        format!(
                            "{}/{}",
                            t["type"].as_str().unwrap(),
                            logical.as_str().unwrap()
                        )
                    }
                    (None, None) => t.to_string(),
                }
            })
            .collect();
        assert_eq!(
            types,
            [
                "boolean",
                "int",
                "int",
                "long",
                "float",
                "double",
                "string",
                "bytes",
                "int/date",
                "long/local-timestamp-nanos",
                "long/timestamp-nanos",
                "bytes/decimal",
                r#"["null","long"]"#,
            ]
        );
    }
}
