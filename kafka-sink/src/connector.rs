//! `connector = 'kafka'` and `connector = 'upsert-kafka'`: a stream's
//! source, and the sink for the delivery its options choose
//! (`sink/config.rs` parses them).

use std::sync::Arc;

use sluice_engine::{
    columns, Connector, FanOut, Options, OutputMode, RepartitionArgs, RepartitionChannel, Result,
    Sink, SinkArgs, SluiceError, SourceArgs, SourceFactory,
};

use crate::client::DEFAULT_CONNECT_TIMEOUT;
use crate::sink::at_least_once::AtLeastOnceSink;
use crate::sink::config::{sink_settings, Delivery, Transactions, DEFAULT_TRANSACTIONAL_ID_PREFIX};
use crate::sink::transactional_sink::TransactionalSink;
use crate::sink::SinkConfig;

/// What both Kafka connectors are, written once: their name, a source and
/// a sink each, the source reading a topic as a stream (`upsert`: each
/// key's latest value).
macro_rules! kafka_streams {
    ($name:literal, $upsert:literal) => {
        fn name(&self) -> &str {
            $name
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
                $upsert,
            )
        }
    };
}

/// The name of query `query_id`'s repartition topic `index`, its
/// transactional ids starting with `prefix`.
pub(crate) fn repartition_topic(prefix: &str, query_id: &str, index: usize) -> String {
    format!("{prefix}{query_id}-repartition-{index}")
}

/// How a repartition topic's values are written (see
/// [`KafkaConnector::repartition`]).
const CHANNEL_FORMAT: &str = "avro";

/// The `kafka` connector.
#[derive(Debug, Default)]
pub struct KafkaConnector;

impl Connector for KafkaConnector {
    kafka_streams!("kafka", false);

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        self.sink_set(vec![args])
    }

    /// A repartition topic, `<prefix><query id>-repartition-<n>` (the
    /// prefix is the sink's 'sink.transactional-id-prefix', so that a
    /// cluster's prefixed ACLs cover it), on the statement's sink's
    /// cluster when it writes to Kafka (the rows travel in its
    /// transaction), else on the input's. Its values are Avro, the schema
    /// derived from the channel's columns on both sides (exact for every
    /// type, NaN, nanoseconds and decimals included, and each message's
    /// schema fingerprint checked); it is keyed by the group key (JSON),
    /// read from the beginning, and purged as the reading tasks commit.
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
        let topic = repartition_topic(prefix, &args.query_id, args.index);
        sink.set("topic", &topic);
        sink.set("format", CHANNEL_FORMAT);
        sink.set("key.fields", args.key_fields.join(","));
        sink.set("topic.partitions", args.partitions.to_string());
        if let Some(field) = &args.partition_field {
            sink.set("sink.partition-field", field);
        }
        let mut source = client;
        source.set("topic", &topic);
        source.set("format", CHANNEL_FORMAT);
        source.set("scan.startup.mode", "earliest");
        source.set("purge-committed", "true");
        Ok(Some(RepartitionChannel {
            name: topic,
            format: CHANNEL_FORMAT.into(),
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
    kafka_streams!("upsert-kafka", true);

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
