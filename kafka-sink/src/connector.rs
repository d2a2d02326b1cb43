//! `connector = 'kafka'`: options parsed once into a [`SinkConfig`], then the
//! sink for the chosen delivery guarantee.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use sluice_engine::{
    columns, Connector, FanOut, Options, OutputMode, RepartitionArgs, RepartitionChannel, Result,
    Sink, SinkArgs, SluiceError, SourceArgs, SourceFactory,
};

use crate::at_least_once::AtLeastOnceSink;
use crate::client::{ClientOptions, DEFAULT_CONNECT_TIMEOUT};
use crate::format::{key_indices, Format};
use crate::produce::SinkConfig;
use crate::registry::{Part, Registry, RegistryOptions, SchemaKind, REGISTRY_OPTIONS};
use crate::transactional_sink::{TransactionalSink, Transactions};

const SINK_OPTIONS: &[&str] = &[
    "topic",
    "bootstrap.servers",
    "properties.bootstrap.servers",
    "format",
    "key.format",
    "key.fields",
    "value.fields-include",
    "topic.partitions",
    "sink.delivery",
    "connect.timeout",
    "transaction.timeout",
    "progress.topic",
    "sink.transactional-id-prefix",
    "sink.epoch-headers",
    "dead-letter.topic",
    "kafka.*",
    "properties.*",
];

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
const DEFAULT_TRANSACTIONAL_ID_PREFIX: &str = "sluice-";

/// librdkafka's default; the broker aborts a transaction open longer.
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The `kafka` connector.
#[derive(Debug, Default)]
pub struct KafkaConnector;

impl Connector for KafkaConnector {
    fn name(&self) -> &str {
        "kafka"
    }

    fn is_source(&self) -> bool {
        true
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn source(&self, args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        crate::source::factory(
            &args.stream,
            args.options,
            args.schema,
            DEFAULT_CONNECT_TIMEOUT,
            false,
        )
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        self.sink_set(vec![args])
    }

    /// A repartition topic, `<prefix><query id>-repartition-<n>` (the
    /// prefix is the sink's 'sink.transactional-id-prefix', so that a
    /// cluster's prefixed ACLs cover it), on the statement's sink's
    /// cluster when it writes to Kafka (the rows travel in its
    /// transaction), else on the input's. It is written keyed by the
    /// group key in JSON, read from the beginning, and purged as the
    /// reading tasks commit.
    fn repartition(&self, args: RepartitionArgs) -> Result<Option<RepartitionChannel>> {
        let from = args.sink.as_ref().unwrap_or(&args.input);
        let mut client = Options::new();
        for (key, value) in from.iter() {
            let is_client = matches!(
                key,
                "bootstrap.servers" | "properties.bootstrap.servers" | "connect.timeout"
            ) || key.starts_with("kafka.")
                || key.starts_with("properties.");
            if is_client {
                client.set(key, value);
            }
        }
        let mut sink = client.clone();
        // One transaction for all the Kafka sinks of a set: the same
        // transaction settings as the statement's own sink.
        for key in [
            "sink.transactional-id-prefix",
            "progress.topic",
            "transaction.timeout",
        ] {
            if let Some(value) = args.sink.as_ref().and_then(|s| s.get(key)) {
                sink.set(key, value);
            }
        }
        let prefix = sink
            .get("sink.transactional-id-prefix")
            .unwrap_or(DEFAULT_TRANSACTIONAL_ID_PREFIX);
        let topic = format!("{prefix}{}-repartition-{}", args.query_id, args.index);
        sink.set("topic", &topic);
        sink.set("format", "json");
        sink.set("key.fields", args.key_fields.join(","));
        sink.set("topic.partitions", args.partitions.to_string());
        let mut source = client;
        source.set("topic", &topic);
        source.set("format", "json");
        source.set("scan.startup.mode", "earliest");
        source.set("purge-committed", "true");
        Ok(Some(RepartitionChannel {
            name: topic,
            sink,
            source,
        }))
    }

    /// The exactly-once sinks of a statement set share one transactional
    /// producer (one transaction per epoch for all their topics,
    /// docs/architecture.md §4); at-least-once ones produce on their own.
    fn sink_set(&self, args: Vec<SinkArgs>) -> Result<Arc<dyn Sink>> {
        let statements = args.len();
        let mut parts: Vec<(Arc<dyn Sink>, Vec<usize>)> = Vec::new();
        let mut shared: Option<(Transactions, Vec<SinkConfig>, Vec<usize>)> = None;
        for (i, a) in args.into_iter().enumerate() {
            let settings = sink_settings(a)?;
            match settings.delivery {
                Delivery::AtLeastOnce => {
                    parts.push((Arc::new(AtLeastOnceSink::new(settings.config)?), vec![i]));
                }
                Delivery::ExactlyOnce(transactions) => match &mut shared {
                    None => shared = Some((transactions, vec![settings.config], vec![i])),
                    Some((first, configs, indices)) => {
                        if *first != transactions {
                            return Err(SluiceError::config(format!(
                                "the Kafka sinks of one statement set share one transaction and \
                                 one progress topic: topic '{}' sets 'progress.topic', \
                                 'transaction.timeout' or 'sink.transactional-id-prefix' \
                                 differently from topic '{}'; set them alike or leave them out",
                                settings.config.topic, configs[0].topic
                            )));
                        }
                        configs.push(settings.config);
                        indices.push(i);
                    }
                },
            }
        }
        if let Some((transactions, configs, indices)) = shared {
            let sink = TransactionalSink::new(configs, transactions)?;
            parts.push((Arc::new(sink), indices));
        }
        FanOut::combine(parts, statements)
    }
}

/// The `upsert-kafka` connector (Flink's): a topic as a table, each
/// message key a row's identity. As a source, a message is its key's new
/// value and a tombstone deletes the key; a query copies that table (see
/// the engine's upsert streams). As a sink, the query's rows are written
/// keyed (`key.fields`, or the query's key columns) and the keys it
/// deletes get tombstones, so a compacted topic holds the latest value of
/// each key. Its options are the `kafka` connector's.
#[derive(Debug, Default)]
pub struct UpsertKafkaConnector;

impl Connector for UpsertKafkaConnector {
    fn name(&self) -> &str {
        "upsert-kafka"
    }

    fn is_source(&self) -> bool {
        true
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn source(&self, args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        crate::source::factory(
            &args.stream,
            args.options,
            args.schema,
            DEFAULT_CONNECT_TIMEOUT,
            true,
        )
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        let keyed = args.options.get("key.fields").is_some()
            || (args.output_mode != OutputMode::Append && !args.key_columns.is_empty());
        if !keyed {
            return Err(SluiceError::config(format!(
                "an 'upsert-kafka' sink writes each row under its key: set 'key.fields' (the \
                 output columns forming it), or write a query whose output has key columns \
                 (a GROUP BY's, an upsert stream's); the output columns are: {}",
                columns(&args.schema)
            )));
        }
        KafkaConnector.sink(args)
    }
}

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
    let exactly_once = o
        .take_choice("sink.delivery", &["exactly-once", "at-least-once"])?
        .is_none_or(|d| d == "exactly-once");
    let transaction_timeout = o
        .take_duration("transaction.timeout")?
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT);
    let progress_topic = o
        .take("progress.topic")
        .unwrap_or_else(|| crate::progress_topic::default_topic(&args.query_id));
    // Each task of a divided query commits alone: its own transactional id
    // and progress record, in the query's progress topic.
    let identity = match args.task {
        Some(task) => task_identity(&args.query_id, task.index),
        None => args.query_id,
    };
    // Clusters with prefixed ACLs grant transactional ids by prefix.
    let transactional_id = format!(
        "{}{identity}",
        o.take("sink.transactional-id-prefix")
            .as_deref()
            .unwrap_or(DEFAULT_TRANSACTIONAL_ID_PREFIX),
    );
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
    o.finish("kafka", &[SINK_OPTIONS, REGISTRY_OPTIONS].concat())?;
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
        },
        delivery: if exactly_once {
            Delivery::ExactlyOnce(Transactions {
                transactional_id,
                progress_topic,
                timeout: transaction_timeout,
            })
        } else {
            Delivery::AtLeastOnce
        },
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
