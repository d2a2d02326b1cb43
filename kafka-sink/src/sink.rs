//! The Kafka sink, at-least-once: a plain idempotent producer.
//!
//! Each epoch's rows are produced to the topic and the epoch returns only
//! once every message is acknowledged by all in-sync replicas (`acks=all`,
//! then `flush`). The engine records `commits/N` after that, so a crash
//! between the acknowledgement and the commit record re-runs the epoch and
//! its messages appear twice: at-least-once. The transactional sink (output
//! and progress record in one Kafka transaction) will close that gap.
//!
//! Settings and why:
//! - `acks=all`, `enable.idempotence=true`: a retried produce never
//!   duplicates or reorders within the run.
//! - `partitioner=murmur2_random`: keyed messages land where the Java client
//!   and Kafka Streams would put them.
//! - `linger.ms=5`: batches messages of one epoch without delaying it much.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use sluice_engine::{Connector, Result, Sink, SinkArgs, SluiceError, SourceArgs, SourceFactory};

use crate::encode::{columns, Format};

const SINK_OPTIONS: &[&str] = &[
    "topic",
    "bootstrap.servers",
    "format",
    "key.fields",
    "sink.delivery",
    "connect.timeout",
    "kafka.*",
];

/// How long to wait for the broker by default.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

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
        Err(SluiceError::config(format!(
            "stream '{}': reading from Kafka is not available in this version yet (the Kafka \
             source is being built); Kafka can be written to with INSERT INTO",
            args.stream
        )))
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        let mut o = args.options;
        let topic = o.take_required("kafka", "topic", "updates")?;
        let bootstrap = o.take_required("kafka", "bootstrap.servers", "localhost:9092")?;
        let format = Format::parse(
            &o.take_choice("format", &["json", "csv", "raw", "avro"])?
                .unwrap_or_else(|| "json".into()),
        )?;
        format.check(&args.schema)?;
        match o.take_choice("sink.delivery", &["exactly-once", "at-least-once"])? {
            Some(d) if d == "exactly-once" => {
                return Err(SluiceError::config(
                    "'sink.delivery' = 'exactly-once' is not available in this version yet (the \
                     transactional sink is being built); use 'at-least-once' — this version's \
                     default — for now",
                ))
            }
            _ => {}
        }
        let connect_timeout = o
            .take_duration("connect.timeout")?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let key_fields = match o.take("key.fields") {
            None => Vec::new(),
            Some(list) => key_indices(&list, &args.schema)?,
        };
        let passthrough = o.take_prefixed("kafka.");
        o.finish("kafka", SINK_OPTIONS)?;

        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set(
                "socket.connection.setup.timeout.ms",
                connect_timeout.as_millis().to_string(),
            );
        for (k, v) in passthrough {
            config.set(k, v);
        }
        let context = DeliveryTracker::default();
        let producer: ThreadedProducer<DeliveryTracker> =
            config.create_with_context(context).map_err(|e| {
                SluiceError::config(format!("kafka sink: invalid producer setting: {e}"))
            })?;
        Ok(Arc::new(KafkaSink(Arc::new(SinkInner {
            topic,
            bootstrap,
            format,
            key_fields,
            schema: args.schema,
            query_id: args.query_id,
            connect_timeout,
            producer,
        }))))
    }
}

fn key_indices(list: &str, schema: &SchemaRef) -> Result<Vec<usize>> {
    list.split(',')
        .map(|name| {
            let name = name.trim();
            schema.index_of(name).map_err(|_| {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                let hint = sluice_engine::closest(name, names.iter().copied())
                    .map(|c| format!(" (did you mean '{c}'?)"))
                    .unwrap_or_default();
                SluiceError::config(format!(
                    "'key.fields' names '{name}', which is not an output column{hint}; the \
                     output columns are: {}",
                    columns(schema)
                ))
            })
        })
        .collect()
}

/// Remembers the first failed delivery of the current epoch.
#[derive(Default)]
struct DeliveryTracker {
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

/// Cheap to move onto a blocking thread.
struct KafkaSink(Arc<SinkInner>);

struct SinkInner {
    topic: String,
    bootstrap: String,
    format: Format,
    key_fields: Vec<usize>,
    schema: SchemaRef,
    query_id: String,
    connect_timeout: Duration,
    producer: ThreadedProducer<DeliveryTracker>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.0.topic)
            .field("bootstrap", &self.0.bootstrap)
            .finish_non_exhaustive()
    }
}

impl SinkInner {
    fn unreachable(&self, message: String) -> SluiceError {
        SluiceError::External {
            what: format!("kafka sink, brokers '{}'", self.bootstrap),
            message,
            hint: Some(format!(
                "check that Kafka runs there (for a local one: scripts/kafka start) and that \
                 'bootstrap.servers' is right; the wait is set by 'connect.timeout' (now {:?})",
                self.connect_timeout
            )),
        }
    }

    /// Waits (up to the connect timeout) until the brokers answer and the
    /// topic has leaders. A broker that creates topics on first use answers
    /// "unknown topic" while it creates it, so that is retried too.
    fn check_topic(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + self.connect_timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let metadata = self
                .producer
                .client()
                .fetch_metadata(Some(&self.topic), left.max(Duration::from_millis(100)))
                .map_err(|e| {
                    self.unreachable(format!("no answer within {:?}: {e}", self.connect_timeout))
                })?;
            let topic_error = metadata
                .topics()
                .iter()
                .find(|t| t.name() == self.topic)
                .and_then(|t| t.error());
            let Some(e) = topic_error else {
                tracing::debug!(topic = %self.topic, schema = %columns(&self.schema), "kafka sink ready");
                return Ok(());
            };
            if std::time::Instant::now() >= deadline {
                return Err(SluiceError::External {
                    what: format!("kafka sink, topic '{}' on '{}'", self.topic, self.bootstrap),
                    message: format!("the topic is not available: {e:?}"),
                    hint: Some(
                        "create the topic (or enable auto.create.topics.enable on the broker)"
                            .into(),
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Produces every row of `batches`, then waits for all acknowledgements.
    fn produce_blocking(&self, epoch: u64, batches: &[RecordBatch]) -> Result<()> {
        let epoch_text = epoch.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "sluice.query.id",
                value: Some(self.query_id.as_bytes()),
            })
            .insert(Header {
                key: "sluice.epoch",
                value: Some(epoch_text.as_bytes()),
            });
        for batch in batches {
            let values = self.format.encode(batch)?;
            let keys = if self.key_fields.is_empty() {
                None
            } else {
                Some(Format::Json.encode(&batch.project(&self.key_fields)?)?)
            };
            for (i, value) in values.iter().enumerate() {
                let mut record = BaseRecord::to(&self.topic)
                    .payload(value.as_slice())
                    .headers(headers.clone());
                if let Some(keys) = &keys {
                    record = record.key(keys[i].as_slice());
                }
                loop {
                    match self.producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            record = r;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err((e, _)) => {
                            return Err(SluiceError::External {
                                what: format!("kafka sink, topic '{}'", self.topic),
                                message: e.to_string(),
                                hint: None,
                            })
                        }
                    }
                }
            }
        }
        // librdkafka retries internally until `message.timeout.ms`; flush
        // returns when every message is acknowledged or has failed.
        let mut waited = Duration::ZERO;
        while let Err(e) = self.producer.flush(Duration::from_secs(10)) {
            waited += Duration::from_secs(10);
            tracing::warn!(topic = %self.topic, error = %e, ?waited, "waiting for Kafka acknowledgements");
            if waited >= Duration::from_secs(600) {
                return Err(self.unreachable(format!(
                    "epoch {epoch} not acknowledged after {waited:?}: {e}"
                )));
            }
        }
        let failed = self
            .producer
            .context()
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failed {
            Some(e) => Err(SluiceError::External {
                what: format!("kafka sink, topic '{}'", self.topic),
                message: format!("epoch {epoch}: a message was not delivered: {e}"),
                hint: Some("the epoch is not committed and will be re-run on restart".into()),
            }),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn open(&self) -> Result<()> {
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || inner.check_topic())
            .await
            .map_err(|e| SluiceError::Internal(format!("metadata task: {e}")))?
    }

    async fn write_epoch(&self, epoch: u64, batches: &[RecordBatch]) -> Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        let inner = Arc::clone(&self.0);
        let batches = batches.to_vec();
        // Producing and flushing block; keep them off the async reactor.
        tokio::task::spawn_blocking(move || inner.produce_blocking(epoch, &batches))
            .await
            .map_err(|e| SluiceError::Internal(format!("produce task: {e}")))?
    }

    fn describe(&self) -> String {
        format!("kafka(topic={}, at-least-once)", self.0.topic)
    }
}
