//! A Kafka sink's options, parsed once into a [`SinkConfig`] and the
//! delivery it asks for: each key read and checked, the error naming it,
//! unknown keys refused with the valid ones listed (as the source's, in
//! `source/config.rs`).

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use sluice_engine::{Options, OutputMode, Result, SinkArgs, SluiceError};

use super::SinkConfig;
use crate::client::{
    leave_out_other_use, ClientOptions, DEFAULT_CONNECT_TIMEOUT, SINK_OPTIONS, SOURCE_OPTIONS,
    STREAM_OPTIONS,
};
use crate::format::{key_indices, Format};
use crate::registry::{Part, Registry, RegistryOptions, SchemaKind, REGISTRY_OPTIONS};

/// Producer properties the sinks set themselves, and why.
const REFUSED: &[(&str, &str)] = &[
    (
        "enable.idempotence",
        "the sink's guarantee needs an idempotent producer (a retried send is never written \
         twice)",
    ),
    (
        "acks",
        "the sink's guarantee needs acks=all (a record is committed once all in-sync replicas \
         have it)",
    ),
    (
        "request.required.acks",
        "the sink's guarantee needs acks=all (a record is committed once all in-sync replicas \
         have it)",
    ),
    (
        "transactional.id",
        "it is made of 'sink.transactional-id-prefix' and the query's identity, so that a \
         restarted query fences the one before it",
    ),
    (
        "transaction.timeout.ms",
        "set it with the sink option 'transaction.timeout', which the sink also checks against \
         the broker's limit",
    ),
];

/// What `transactional.id` starts with unless `sink.transactional-id-prefix`
/// says otherwise; the query's identity follows.
pub(crate) const DEFAULT_TRANSACTIONAL_ID_PREFIX: &str = "sluice-";

/// librdkafka's default; the broker aborts a transaction open longer.
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// A Kafka sink's options, parsed: what the sink is built from, and what
/// `sluice verify` reads the committed output with.
#[derive(Debug)]
pub(crate) struct SinkSettings {
    pub config: SinkConfig,
    pub delivery: Delivery,
}

/// `'sink.delivery'`.
#[derive(Debug)]
pub(crate) enum Delivery {
    ExactlyOnce(Transactions),
    AtLeastOnce,
}

/// Parses a sink's options; every option must be known.
pub(crate) fn sink_settings(args: SinkArgs) -> Result<SinkSettings> {
    let mut o = args.options;
    let topic = o.take_required("kafka", "topic", "updates")?;
    let client = ClientOptions::from_options(
        &mut o,
        &format!("sink topic '{topic}'"),
        DEFAULT_CONNECT_TIMEOUT,
        REFUSED,
    )?;
    let format = o
        .take_choice(
            "format",
            &[
                "json",
                "csv",
                "raw",
                "avro",
                "avro-confluent",
                "protobuf-confluent",
            ],
        )?
        .unwrap_or_else(|| "json".into());
    let key_format = o.take_choice("key.format", &["json", "raw", "avro-confluent"])?;
    let except_key = o
        .take_choice("value.fields-include", &["all", "except_key"])?
        .is_some_and(|v| v == "except_key");
    // Each task of a divided query commits alone: its own transactional id
    // and progress record, in the query's progress topic.
    let identity = match args.task {
        Some(task) => task_identity(&args.query_id, task.index),
        None => args.query_id.clone(),
    };
    let delivery = take_delivery(&mut o, &args.query_id, &identity)?;
    // An update stream is keyed by its group key unless told otherwise,
    // so the topic is a valid compacted upsert stream.
    let key_fields = match o.take("key.fields") {
        Some(list) => key_indices(&list, &args.schema, "output")?,
        None if args.output_mode != OutputMode::Append && !args.key_columns.is_empty() => {
            key_indices(&args.key_columns.join(","), &args.schema, "output")?
        }
        None => Vec::new(),
    };
    if key_fields.is_empty() && (except_key || key_format.is_some()) {
        return Err(SluiceError::config(format!(
            "sink topic '{topic}': 'key.format' and 'value.fields-include' need the key's \
             columns: 'key.fields' = 'id' (comma-separated output columns)"
        )));
    }
    let timeout = client.timeout();
    let what = format!("sink topic '{topic}'");
    let value_columns = if except_key {
        let rest = crate::format::except_key(args.schema.fields().len(), &key_fields);
        Arc::new(args.schema.project(&rest)?)
    } else {
        Arc::clone(&args.schema)
    };
    let format = part_format(
        &mut o,
        Part::Value,
        &format,
        &value_columns,
        &topic,
        &what,
        timeout,
    )?;
    let key_format = part_format(
        &mut o,
        Part::Key,
        key_format.as_deref().unwrap_or("json"),
        &Arc::new(args.schema.project(&key_fields)?),
        &topic,
        &what,
        timeout,
    )?;
    let dead_letter = o.take("dead-letter.topic");
    let partitions = o.take_parsed::<u32>("topic.partitions", "a number of partitions")?;
    let epoch_headers = o
        .take_choice("sink.epoch-headers", &["true", "false"])?
        .is_some_and(|v| v == "true");
    let partition_field = o
        .take("sink.partition-field")
        .map(|name| partition_field(&name, &args.schema, &topic))
        .transpose()?;
    leave_out_other_use(
        &topic,
        &mut o,
        SOURCE_OPTIONS,
        &["scan.*", "sink.partitioner"],
    );
    o.finish(
        "kafka",
        &[STREAM_OPTIONS, SINK_OPTIONS, REGISTRY_OPTIONS].concat(),
    )?;
    Ok(SinkSettings {
        config: SinkConfig {
            topic,
            client,
            format,
            key_fields,
            key_format,
            except_key,
            schema: args.schema,
            query_id: identity,
            partitions,
            dead_letter,
            epoch_headers,
            partition_field,
        },
        delivery,
    })
}

/// `'sink.partition-field'` = `name`: the index of the output column that
/// names each record's partition, which must be an integer.
fn partition_field(name: &str, schema: &SchemaRef, topic: &str) -> Result<usize> {
    let (index, field) = schema.column_with_name(name).ok_or_else(|| {
        SluiceError::config(format!(
            "sink topic '{topic}': 'sink.partition-field' = '{name}' is not an output column; \
             the output columns are: {}",
            sluice_engine::columns(schema)
        ))
    })?;
    if !field.data_type().is_integer() {
        return Err(SluiceError::config(format!(
            "sink topic '{topic}': 'sink.partition-field' column '{name}' is {}, but a \
             partition is a whole number; cast it to INT",
            field.data_type()
        )));
    }
    Ok(index)
}

/// `sink.delivery`, and for exactly-once its transactions: the timeout,
/// the progress topic (by default the query's, `query_id`'s) and the
/// transactional id of `identity` (the query's, or its task's).
fn take_delivery(o: &mut Options, query_id: &str, identity: &str) -> Result<Delivery> {
    let exactly_once = o
        .take_choice("sink.delivery", &["exactly-once", "at-least-once"])?
        .is_none_or(|d| d == "exactly-once");
    let timeout = o
        .take_duration("transaction.timeout")?
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT);
    let progress_topic = o
        .take("progress.topic")
        .unwrap_or_else(|| super::progress_topic::default_topic(query_id));
    // Clusters with prefixed ACLs grant transactional ids by prefix.
    let transactional_id = format!(
        "{}{identity}",
        o.take("sink.transactional-id-prefix")
            .as_deref()
            .unwrap_or(DEFAULT_TRANSACTIONAL_ID_PREFIX),
    );
    Ok(if exactly_once {
        Delivery::ExactlyOnce(Transactions {
            transactional_id,
            progress_topic,
            timeout,
        })
    } else {
        Delivery::AtLeastOnce
    })
}

/// The format one part of a sink's messages is written in, checked
/// against its `columns`; for `avro-confluent` and `protobuf-confluent`,
/// their schema is registered (or found) under the part's subject first.
fn part_format(
    o: &mut Options,
    part: Part,
    name: &str,
    columns: &SchemaRef,
    topic: &str,
    what: &str,
    timeout: Duration,
) -> Result<Format> {
    let (schema, kind) = match name {
        "avro-confluent" => (crate::format::avro::schema_json(columns)?, SchemaKind::Avro),
        "protobuf-confluent" => (
            crate::format::protobuf::proto_schema(columns)?,
            SchemaKind::Protobuf,
        ),
        _ => {
            RegistryOptions::refuse_unused(o, part, name, what)?;
            let format = Format::parse(name)?;
            format.check(columns)?;
            if format == Format::Avro {
                // There is no registry: the log is where a consumer finds
                // the schema.
                let schema = crate::format::avro::schema_json(columns)?;
                tracing::info!(%topic, %schema, "avro schema");
            }
            return Ok(format);
        }
    };
    let registry = RegistryOptions::take(o, name, part, topic, what, timeout)?;
    let subject = registry.subject.clone();
    let schema_id = Registry::new(registry)?.register(&subject, &schema, kind)?;
    tracing::info!(%topic, %subject, schema_id, %schema, "schema registered");
    Ok(match kind {
        SchemaKind::Avro => Format::AvroConfluent { schema_id },
        SchemaKind::Protobuf => Format::ProtobufConfluent { schema_id },
    })
}

/// How an exactly-once sink's transactions are made: what every Kafka sink
/// of one query shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transactions {
    /// `<sink.transactional-id-prefix><query id>`: stable across restarts,
    /// so a new instance fences the old one.
    pub transactional_id: String,
    pub progress_topic: String,
    pub timeout: Duration,
}

/// What task `index` of query `query_id` (see [`sluice_engine::TaskId`]) is known by in
/// Kafka: its transactional id (after the prefix) and its progress
/// record's key.
///
/// ```
/// assert_eq!(sluice_kafka::task_identity("orders", 3), "orders-3");
/// ```
pub fn task_identity(query_id: &str, index: u32) -> String {
    format!("{query_id}-{index}")
}
