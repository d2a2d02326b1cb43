//! The Kafka source's options, parsed once into a [`SourceConfig`]: each
//! key read and checked, the error naming it, unknown keys refused with
//! the valid ones listed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::client::ClientOptions;
use crate::format::avro::{AvroConfluentDecoder, AvroDecoder};
use crate::format::key_indices;
use crate::format::protobuf::ProtobufConfluentDecoder;
use crate::registry::{Part, Registry, RegistryOptions, REGISTRY_OPTIONS};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_engine::{
    Options, Result, SluiceError, SourceFactory, CHANGELOG_SIGN, UPSERT_DELETED,
    UPSERT_KEY_METADATA,
};

use super::KafkaSourceFactory;

/// Options of a Kafka source stream.
pub(crate) const SOURCE_OPTIONS: &[&str] = &[
    "topic",
    "bootstrap.servers",
    "properties.bootstrap.servers",
    "format",
    "key.format",
    "key.fields",
    "value.fields-include",
    "scan.startup.mode",
    "scan.startup.timestamp-millis",
    "scan.startup.specific-offsets",
    "max-records-per-epoch",
    "max-bytes-per-epoch",
    "format.on-error",
    "dead-letter.topic",
    "group.id",
    "fail-on-data-loss",
    "purge-committed",
    "connect.timeout",
    "kafka.*",
    "properties.*",
];

/// Consumer properties the source sets itself, and why.
const REFUSED: &[(&str, &str)] = &[
    (
        "isolation.level",
        "the source reads read_committed, so that it never sees records of aborted \
         transactions and its planned ranges end at the last stable offset",
    ),
    (
        "enable.auto.commit",
        "Sluice keeps the offsets it read in its checkpoint and progress topic; to record them \
         in a consumer group for lag tools, use the stream option 'group.id'",
    ),
    (
        "enable.auto.offset.store",
        "Sluice keeps the offsets it read in its checkpoint and progress topic",
    ),
    (
        "auto.offset.reset",
        "where a query starts is 'scan.startup.mode', and what happens to records deleted \
         before they were read is 'fail-on-data-loss'",
    ),
];

const VIRTUAL: &[&str] = &["_key", "_topic", "_partition", "_offset", "_timestamp"];

/// Where a query without a checkpoint starts reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartupMode {
    Earliest,
    Latest,
    /// The first record at or after this time (ms since the Unix epoch).
    Timestamp(i64),
    /// Per partition; partitions not listed start at their beginning.
    Offsets(BTreeMap<i32, i64>),
    /// Where this consumer group's committed offsets are; partitions it
    /// never committed start at their beginning.
    GroupOffsets(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnError {
    Fail,
    Skip,
    /// Written to this topic in the epoch's transaction.
    DeadLetter(String),
}

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

#[derive(Debug, Clone)]
pub(crate) struct SourceConfig {
    pub stream: String,
    pub topic: String,
    /// The brokers, connect timeout and `kafka.*` properties.
    pub client: ClientOptions,
    pub format: SourceFormat,
    pub startup: StartupMode,
    /// Cap on records an epoch plans (`max-records-per-epoch`).
    pub max_records: u64,
    /// Cap on bytes (keys and values) an epoch plans
    /// (`max-bytes-per-epoch`), turned into records by the average record
    /// size read so far.
    pub max_bytes: u64,
    pub on_error: OnError,
    /// A consumer group to record the query's offsets for (lag tools).
    pub group: Option<String>,
    /// Stop when records are gone before they were read (Spark's
    /// `failOnDataLoss`); else skip them and count them as lost.
    pub fail_on_data_loss: bool,
    /// Delete (`delete_records`) the records the query has committed past:
    /// for topics only this query reads, such as repartition topics.
    pub purge_committed: bool,
    /// The rows decoding gives: the declared columns, and for a
    /// changelog its sign, for an upsert stream its deletion marker.
    pub value_schema: SchemaRef,
    /// The declared columns.
    pub declared: SchemaRef,
    /// `connector = 'upsert-kafka'`: each key's last record per epoch, a
    /// tombstone deleting it.
    pub upsert: bool,
    /// The columns the message value holds: all declared ones, or those
    /// not read from the key.
    pub value_part: SchemaRef,
    /// The columns read from the message key, if any.
    pub key: Option<KeyColumns>,
    /// For `format = 'avro'`: reads the declared columns' Avro records.
    pub avro: Option<AvroDecoder>,
    /// For `format = 'avro-confluent'`: reads records by their schema ids.
    pub confluent: Option<Arc<AvroConfluentDecoder>>,
    /// For `format = 'protobuf-confluent'`: the same, for Protobuf.
    pub protobuf: Option<Arc<ProtobufConfluentDecoder>>,
    /// Declared columns followed by the virtual ones.
    pub schema: SchemaRef,
}

/// Builds the source factory from a stream's options: the options taken
/// one by one ([`SourceOptions::take`]), the unknown ones refused, then
/// the columns the stream reads and how ([`Columns::plan`]).
pub(crate) fn factory(
    stream: &str,
    mut o: Options,
    declared: Option<SchemaRef>,
    connect_timeout_default: Duration,
    upsert: bool,
) -> Result<Arc<dyn SourceFactory>> {
    let options = SourceOptions::take(stream, &mut o, connect_timeout_default)?;
    o.finish("kafka", &[SOURCE_OPTIONS, REGISTRY_OPTIONS].concat())?;
    let columns = Columns::plan(stream, &options, declared, upsert)?;
    Ok(Arc::new(KafkaSourceFactory(SourceConfig {
        stream: stream.to_string(),
        topic: options.topic,
        client: options.client,
        format: options.format,
        startup: options.startup,
        max_records: options.max_records,
        max_bytes: options.max_bytes,
        on_error: options.on_error,
        group: options.group,
        fail_on_data_loss: options.fail_on_data_loss,
        purge_committed: options.purge_committed,
        declared: columns.declared,
        upsert,
        value_schema: columns.value_schema,
        value_part: columns.value_part,
        key: columns.key,
        avro: columns.avro,
        confluent: columns.confluent,
        protobuf: columns.protobuf,
        schema: columns.schema,
    })))
}

/// A Kafka stream's options, each taken and checked, before its columns
/// are planned.
struct SourceOptions {
    topic: String,
    client: ClientOptions,
    group: Option<String>,
    format: SourceFormat,
    /// The value's schema registry, for the `-confluent` formats.
    registry: Option<RegistryOptions>,
    key_format: String,
    /// The key's schema registry, for `'key.format' = 'avro-confluent'`.
    key_registry: Option<RegistryOptions>,
    key_fields: Option<String>,
    except_key: bool,
    startup: StartupMode,
    max_records: u64,
    max_bytes: u64,
    on_error: OnError,
    fail_on_data_loss: bool,
    purge_committed: bool,
}

impl SourceOptions {
    /// Takes every option a Kafka stream knows from `o`, in the order a
    /// user's mistakes are reported; what is left is not an option.
    fn take(stream: &str, o: &mut Options, connect_timeout_default: Duration) -> Result<Self> {
        let topic = o.take_required("kafka", "topic", "bids")?;
        let mut client = ClientOptions::from_options(
            o,
            &format!("stream '{stream}'"),
            connect_timeout_default,
            REFUSED,
        )?;
        let group = take_group(stream, o, &mut client)?;
        let (format_name, format) = take_format(stream, o)?;
        let what = format!("stream '{stream}'");
        let registry = match format {
            SourceFormat::AvroConfluent | SourceFormat::ProtobufConfluent => {
                Some(RegistryOptions::take(
                    o,
                    &format_name,
                    Part::Value,
                    &topic,
                    &what,
                    client.timeout(),
                )?)
            }
            _ => {
                RegistryOptions::refuse_unused(o, Part::Value, &format_name, &what)?;
                None
            }
        };
        let key_format = o
            .take_choice("key.format", &["json", "raw", "avro-confluent"])?
            .unwrap_or_else(|| "json".into());
        let key_registry = if key_format == "avro-confluent" {
            Some(RegistryOptions::take(
                o,
                "avro-confluent",
                Part::Key,
                &topic,
                &what,
                client.timeout(),
            )?)
        } else {
            RegistryOptions::refuse_unused(o, Part::Key, &key_format, &what)?;
            None
        };
        let key_fields = o.take("key.fields");
        let except_key = o
            .take_choice("value.fields-include", &["all", "except_key"])?
            .is_some_and(|v| v == "except_key");
        let startup = take_startup(stream, o, group.as_deref())?;
        let (max_records, max_bytes) = take_epoch_limits(stream, o)?;
        let on_error = take_on_error(stream, o)?;
        let fail_on_data_loss = o
            .take_parsed::<bool>("fail-on-data-loss", "true or false")?
            .unwrap_or(true);
        let purge_committed = o
            .take_parsed::<bool>("purge-committed", "true or false")?
            .unwrap_or(false);
        Ok(Self {
            topic,
            client,
            group,
            format,
            registry,
            key_format,
            key_registry,
            key_fields,
            except_key,
            startup,
            max_records,
            max_bytes,
            on_error,
            fail_on_data_loss,
            purge_committed,
        })
    }
}

/// The consumer group offsets are recorded to: `group.id`, or Flink's
/// `properties.group.id` (`kafka.group.id`), given once.
fn take_group(stream: &str, o: &mut Options, client: &mut ClientOptions) -> Result<Option<String>> {
    match (o.take("group.id"), client.take("group.id")) {
        (Some(_), Some(_)) => Err(SluiceError::config(format!(
            "stream '{stream}': 'group.id' and 'kafka.group.id' (or 'properties.group.id') \
             name the same consumer group; give it once"
        ))),
        (Some(g), None) | (None, Some(g)) => Ok(Some(g)),
        (None, None) => Ok(None),
    }
}

/// `format`, as spelled and as read.
fn take_format(stream: &str, o: &mut Options) -> Result<(String, SourceFormat)> {
    let name = o
        .take_choice(
            "format",
            &[
                "json",
                "raw",
                "csv",
                "avro",
                "avro-confluent",
                "protobuf-confluent",
                "debezium-json",
            ],
        )?
        .unwrap_or_else(|| "json".into());
    let format = match name.as_str() {
        "json" => SourceFormat::Json,
        "raw" => SourceFormat::Raw,
        "avro" => SourceFormat::Avro,
        "avro-confluent" => SourceFormat::AvroConfluent,
        "debezium-json" => SourceFormat::DebeziumJson,
        "protobuf-confluent" => SourceFormat::ProtobufConfluent,
        other => {
            return Err(SluiceError::config(format!(
                "stream '{stream}': format '{other}' is not supported by the Kafka source yet; \
                 use 'json', 'avro', 'avro-confluent', 'protobuf-confluent', 'debezium-json' \
                 or 'raw'"
            )))
        }
    };
    Ok((name, format))
}

/// `scan.startup.mode` with what each mode needs (Sluice's short names
/// and Flink's); an option of another mode is refused.
fn take_startup(stream: &str, o: &mut Options, group: Option<&str>) -> Result<StartupMode> {
    let startup = match o
        .take_choice(
            "scan.startup.mode",
            &[
                "earliest",
                "earliest-offset",
                "latest",
                "latest-offset",
                "group-offsets",
                "timestamp",
                "offsets",
                "specific-offsets",
            ],
        )?
        .as_deref()
    {
        None | Some("earliest" | "earliest-offset") => StartupMode::Earliest,
        Some("latest" | "latest-offset") => StartupMode::Latest,
        Some("group-offsets") => StartupMode::GroupOffsets(
            group
                .ok_or_else(|| {
                    o.missing(
                        &format!("stream '{stream}' with 'scan.startup.mode' = 'group-offsets'"),
                        "group.id",
                        "'group.id' = 'orders-consumer' (or Flink's 'properties.group.id')",
                    )
                })?
                .to_string(),
        ),
        Some("timestamp") => {
            let what = format!("stream '{stream}' with 'scan.startup.mode' = 'timestamp'");
            let ms = o
                .take_parsed::<i64>(
                    "scan.startup.timestamp-millis",
                    "milliseconds since the Unix epoch",
                )?
                .ok_or_else(|| {
                    o.missing(
                        &what,
                        "scan.startup.timestamp-millis",
                        "'scan.startup.timestamp-millis' = '1767225600000'",
                    )
                })?;
            StartupMode::Timestamp(ms)
        }
        Some(_) => {
            let what = format!("stream '{stream}' with 'scan.startup.mode' = 'offsets'");
            let list = o.take("scan.startup.specific-offsets").ok_or_else(|| {
                o.missing(
                    &what,
                    "scan.startup.specific-offsets",
                    "'scan.startup.specific-offsets' = 'partition:0,offset:42;partition:1,offset:300'",
                )
            })?;
            StartupMode::Offsets(specific_offsets(stream, &list)?)
        }
    };
    for (key, mode) in [
        ("scan.startup.timestamp-millis", "timestamp"),
        ("scan.startup.specific-offsets", "offsets"),
    ] {
        if o.take(key).is_some() {
            return Err(SluiceError::config(format!(
                "stream '{stream}': '{key}' applies only with 'scan.startup.mode' = '{mode}'"
            )));
        }
    }
    Ok(startup)
}

/// `max-records-per-epoch` and `max-bytes-per-epoch`, each from 1 to
/// `i64::MAX`.
fn take_epoch_limits(stream: &str, o: &mut Options) -> Result<(u64, u64)> {
    let max_records = o
        .take_parsed::<u64>("max-records-per-epoch", "a whole number of records")?
        .unwrap_or(DEFAULT_MAX_RECORDS_PER_EPOCH);
    let max_bytes = match o.take("max-bytes-per-epoch") {
        None => DEFAULT_MAX_BYTES_PER_EPOCH,
        Some(text) => parse_bytes(&text).ok_or_else(|| {
            SluiceError::config(format!(
                "stream '{stream}': 'max-bytes-per-epoch' = '{text}' is not valid: expected a \
                 size such as '64 MiB', '1 GiB' or '500000' (bytes)"
            ))
        })?,
    };
    for (key, m) in [
        ("max-records-per-epoch", max_records),
        ("max-bytes-per-epoch", max_bytes),
    ] {
        if m == 0 || m > i64::MAX as u64 {
            return Err(SluiceError::config(format!(
                "stream '{stream}': '{key}' = '{m}' is out of range: use a whole number from 1 \
                 to {}",
                i64::MAX
            )));
        }
    }
    Ok((max_records, max_bytes))
}

/// `format.on-error`, with the dead-letter topic its `dead-letter` mode
/// needs (and no other mode takes).
fn take_on_error(stream: &str, o: &mut Options) -> Result<OnError> {
    let on_error = match o
        .take_choice("format.on-error", &["fail", "skip", "dead-letter"])?
        .as_deref()
    {
        Some("dead-letter") => {
            OnError::DeadLetter(o.take("dead-letter.topic").ok_or_else(|| {
                o.missing(
                    &format!("stream '{stream}' with 'format.on-error' = 'dead-letter'"),
                    "dead-letter.topic",
                    "'dead-letter.topic' = 'bids-dlq'",
                )
            })?)
        }
        Some("skip") => OnError::Skip,
        _ => OnError::Fail,
    };
    if o.take("dead-letter.topic").is_some() {
        return Err(SluiceError::config(format!(
            "stream '{stream}': 'dead-letter.topic' applies only with 'format.on-error' = \
             'dead-letter'"
        )));
    }
    Ok(on_error)
}

/// The columns a Kafka stream reads, where each comes from (value or
/// key), and the decoders that read them.
struct Columns {
    declared: SchemaRef,
    value_schema: SchemaRef,
    value_part: SchemaRef,
    key: Option<KeyColumns>,
    avro: Option<AvroDecoder>,
    confluent: Option<Arc<AvroConfluentDecoder>>,
    protobuf: Option<Arc<ProtobufConfluentDecoder>>,
    schema: SchemaRef,
}

impl Columns {
    /// Plans the columns of a stream with `options` and `declared`
    /// columns (none: the format's own), refusing what cannot be read.
    fn plan(
        stream: &str,
        options: &SourceOptions,
        declared: Option<SchemaRef>,
        upsert: bool,
    ) -> Result<Self> {
        let format = options.format;
        let key_fields = key_fields(stream, options, declared.as_ref(), upsert)?;
        let declared = match (&key_fields, declared) {
            (Some(keys), Some(d)) if upsert => Some(upsert_columns(&d, keys)),
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
    options: &SourceOptions,
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

/// An upsert stream's declared columns: its key columns marked for the
/// engine, its other columns nullable (they are null in a deletion).
fn upsert_columns(declared: &Schema, keys: &[usize]) -> SchemaRef {
    let fields: Vec<Field> = declared
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if keys.contains(&i) {
                f.as_ref()
                    .clone()
                    .with_metadata([(UPSERT_KEY_METADATA.to_string(), "true".to_string())].into())
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
    options: &SourceOptions,
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
        (SourceFormat::Raw, Some(s)) => {
            let ok = s.fields().len() == 1 && s.field(0).data_type() == &DataType::Utf8;
            if !ok {
                return Err(SluiceError::config(format!(
                    "stream '{stream}': format 'raw' gives one VARCHAR column; declare \
                     (value VARCHAR) or leave the columns out"
                )));
            }
            s
        }
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
    /// The key's bytes as the one key field, a VARCHAR.
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
                let text = schema.fields().len() == 1
                    && matches!(
                        schema.field(0).data_type(),
                        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
                    );
                if !text {
                    return Err(SluiceError::config(format!(
                        "stream '{stream}': 'key.format' = 'raw' reads the key's bytes as one \
                         VARCHAR column; 'key.fields' names {}",
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

/// `partition:0,offset:42;partition:1,offset:300` (Flink's syntax).
fn specific_offsets(stream: &str, list: &str) -> Result<BTreeMap<i32, i64>> {
    let bad = |part: &str| {
        SluiceError::config(format!(
            "stream '{stream}': 'scan.startup.specific-offsets' has '{part}', expected \
             'partition:<n>,offset:<n>' entries separated by ';', e.g. \
             'partition:0,offset:42;partition:1,offset:300'"
        ))
    };
    let mut out = BTreeMap::new();
    for part in list.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let mut partition = None;
        let mut offset = None;
        for field in part.split(',') {
            match field.trim().split_once(':') {
                Some(("partition", v)) => partition = v.trim().parse::<i32>().ok(),
                Some(("offset", v)) => offset = v.trim().parse::<i64>().ok(),
                _ => return Err(bad(part)),
            }
        }
        match (partition, offset) {
            (Some(p), Some(o)) if p >= 0 && o >= 0 => {
                out.insert(p, o);
            }
            _ => return Err(bad(part)),
        }
    }
    if out.is_empty() {
        return Err(bad(list));
    }
    Ok(out)
}

/// Records an epoch plans at most unless `max-records-per-epoch` says
/// otherwise: one epoch stays within memory and well within the
/// transaction timeout, whatever the backlog.
pub(crate) const DEFAULT_MAX_RECORDS_PER_EPOCH: u64 = 1_000_000;

/// Bytes an epoch plans at most unless `max-bytes-per-epoch` says
/// otherwise.
pub(crate) const DEFAULT_MAX_BYTES_PER_EPOCH: u64 = 256 << 20;

/// `'64 MiB'`, `'1 GB'`, `'500000'`: a size in bytes.
fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1,
        "kb" => 1_000,
        "kib" => 1 << 10,
        "mb" => 1_000_000,
        "mib" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Options {
        let mut o = Options::new();
        for (k, v) in pairs {
            o.set(k, *v);
        }
        o
    }

    #[test]
    fn a_cap_per_epoch_beyond_the_offsets_range_is_refused() {
        let declared = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let base = [("topic", "t"), ("bootstrap.servers", "127.0.0.1:9")];
        for bad in ["0", "9223372036854775808", "18446744073709551615"] {
            let mut pairs = base.to_vec();
            pairs.push(("max-records-per-epoch", bad));
            let err = factory(
                "s",
                options(&pairs),
                Some(Arc::clone(&declared)),
                Duration::ZERO,
                false,
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("'max-records-per-epoch'") && err.contains(bad),
                "{err}"
            );
        }
        let mut pairs = base.to_vec();
        pairs.push(("max-records-per-epoch", "9223372036854775807"));
        factory(
            "s",
            options(&pairs),
            Some(Arc::clone(&declared)),
            Duration::ZERO,
            false,
        )
        .unwrap();
        for (size, ok) in [
            ("64 MiB", true),
            ("1GB", true),
            ("0", false),
            ("lots", false),
        ] {
            let mut pairs = base.to_vec();
            pairs.push(("max-bytes-per-epoch", size));
            let made = factory(
                "s",
                options(&pairs),
                Some(Arc::clone(&declared)),
                Duration::ZERO,
                false,
            );
            assert_eq!(made.is_ok(), ok, "{size}");
        }
    }

    #[test]
    fn flink_names_of_startup_modes_and_properties_are_understood() {
        let declared = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let startup = |pairs: &[(&str, &str)]| {
            let mut all = vec![("topic", "t"), ("properties.bootstrap.servers", "b:1")];
            all.extend_from_slice(pairs);
            factory(
                "s",
                options(&all),
                Some(Arc::clone(&declared)),
                Duration::ZERO,
                false,
            )
            .map(|_| ())
        };
        for mode in ["earliest-offset", "latest-offset", "earliest", "latest"] {
            assert!(startup(&[("scan.startup.mode", mode)]).is_ok(), "{mode}");
        }
        assert!(startup(&[
            ("scan.startup.mode", "specific-offsets"),
            ("scan.startup.specific-offsets", "partition:0,offset:3"),
        ])
        .is_ok());
        assert!(startup(&[
            ("scan.startup.mode", "group-offsets"),
            ("properties.group.id", "g"),
        ])
        .is_ok());
        let err = startup(&[("scan.startup.mode", "group-offsets")])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("'group.id'"), "{err}");
        let err = startup(&[("group.id", "a"), ("kafka.group.id", "b")])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("give it once"), "{err}");
    }

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("500000"), Some(500_000));
        assert_eq!(parse_bytes("64 MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("2 kb"), Some(2_000));
        assert_eq!(parse_bytes("1.5 GB"), None);
        assert_eq!(parse_bytes("99999999999999999999 GiB"), None);
    }
}
