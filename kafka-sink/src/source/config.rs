//! The Kafka source's options, parsed once into a [`SourceConfig`]: each
//! key read and checked, the error naming it, unknown keys refused with
//! the valid ones listed; the columns they give are planned in
//! `columns.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{
    leave_out_other_use, ClientOptions, SINK_OPTIONS, SOURCE_OPTIONS, STREAM_OPTIONS,
};
use crate::format::avro::{AvroConfluentDecoder, AvroDecoder};
use crate::format::protobuf::ProtobufConfluentDecoder;
use crate::registry::{Part, RegistryOptions, REGISTRY_OPTIONS};
use datafusion::arrow::datatypes::SchemaRef;
use sluice_engine::{Options, Result, SluiceError, SourceFactory};

use super::columns::{ColumnOptions, Columns, KeyColumns, SourceFormat};
use super::KafkaSourceFactory;

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
    /// `connector = 'upsert-kafka'`: each record a key's new value, a
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
    o: Options,
    declared: Option<SchemaRef>,
    connect_timeout_default: Duration,
    upsert: bool,
) -> Result<Arc<dyn SourceFactory>> {
    let config = source_config(stream, o, declared, connect_timeout_default, upsert)?;
    Ok(Arc::new(KafkaSourceFactory(config)))
}

/// What [`factory`] builds its sources from.
pub(super) fn source_config(
    stream: &str,
    mut o: Options,
    declared: Option<SchemaRef>,
    connect_timeout_default: Duration,
    upsert: bool,
) -> Result<SourceConfig> {
    let options = SourceOptions::take(stream, &mut o, connect_timeout_default)?;
    leave_out_other_use(stream, &mut o, SINK_OPTIONS, &["sink.*"]);
    o.finish(
        "kafka",
        &[STREAM_OPTIONS, SOURCE_OPTIONS, REGISTRY_OPTIONS].concat(),
    )?;
    let columns = Columns::plan(stream, &options.columns, declared, upsert)?;
    Ok(SourceConfig {
        stream: stream.to_string(),
        topic: options.topic,
        client: options.client,
        format: options.columns.format,
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
    })
}

/// A Kafka stream's options, each taken and checked, before its columns
/// are planned.
struct SourceOptions {
    topic: String,
    client: ClientOptions,
    group: Option<String>,
    /// What the options say of the columns: format, key, registries.
    columns: ColumnOptions,
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
            columns: ColumnOptions {
                format,
                registry,
                key_format,
                key_registry,
                key_fields,
                except_key,
            },
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
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

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
