//! `format = 'avro'`: one Avro record per Kafka message, in Avro's
//! single-object encoding, with the schema derived from the columns.
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

use std::sync::Arc;

use arrow_avro::reader::ReaderBuilder;
use arrow_avro::schema::{AvroSchema, FingerprintStrategy, SchemaStore};
use arrow_avro::writer::format::AvroSoeFormat;
use arrow_avro::writer::WriterBuilder;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{Result, SluiceError};

/// The Avro schema (JSON) for rows with `schema`, or an error naming the
/// column whose type Avro cannot carry.
pub(crate) fn schema_json(schema: &Schema) -> Result<String> {
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

/// One single-object-encoded message per row of `batch`.
pub(crate) fn encode(batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    let mut encoder = WriterBuilder::new(batch.schema().as_ref().clone())
        .with_fingerprint_strategy(FingerprintStrategy::Rabin)
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
        // Avro has fewer types than Arrow (a SMALLINT travels as `int`):
        // give the rows the declared types.
        let columns = batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(Arc::clone(c))
                } else {
                    cast(c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
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
        let messages = encode(&rows()).unwrap();
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
        let messages = encode(&batch).unwrap();
        let decoder = AvroDecoder::new(batch.schema()).unwrap();
        let back = decoder.decode(messages.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(back, batch);

        let truncated = &messages[0][..messages[0].len() - 3];
        assert!(decoder.decode([truncated].into_iter()).is_err());
        let not_avro: &[u8] = b"{\"id\": 1}";
        assert!(decoder.decode([not_avro].into_iter()).is_err());
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
