//! What both Kafka sinks share: their settings, the producer configuration,
//! waiting for the topic, and producing an epoch's rows.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use sluice_engine::{Result, SluiceError};

use crate::encode::{columns, Format};

/// A Kafka sink's settings, parsed from its options.
#[derive(Debug, Clone)]
pub(crate) struct SinkConfig {
    pub topic: String,
    pub bootstrap: String,
    pub format: Format,
    /// Output columns forming the message key; empty: no key.
    pub key_fields: Vec<usize>,
    pub schema: SchemaRef,
    pub query_id: String,
    pub connect_timeout: Duration,
    /// `kafka.*` options, prefix stripped.
    pub passthrough: Vec<(String, String)>,
}

impl SinkConfig {
    /// The producer settings both sinks use, and why:
    /// - `acks=all`, `enable.idempotence=true`: a retried produce never
    ///   duplicates or reorders within one producer session.
    /// - `partitioner=murmur2_random`: keyed messages land where the Java
    ///   client and Kafka Streams would put them.
    /// - `linger.ms=5`: batches an epoch's messages without delaying it much.
    pub(crate) fn producer_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set(
                "socket.connection.setup.timeout.ms",
                self.connect_timeout.as_millis().to_string(),
            );
        for (k, v) in &self.passthrough {
            config.set(k, v);
        }
        config
    }

    pub(crate) fn unreachable(&self, message: String) -> SluiceError {
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

    pub(crate) fn external(&self, message: impl Into<String>) -> SluiceError {
        SluiceError::External {
            what: format!("kafka sink, topic '{}'", self.topic),
            message: message.into(),
            hint: None,
        }
    }

    /// Waits (up to the connect timeout) until the brokers answer and the
    /// topic has leaders. A broker that creates topics on first use answers
    /// "unknown topic" while it creates it, so that is retried too.
    pub(crate) fn wait_for_topic<C: ClientContext>(
        &self,
        client: &rdkafka::client::Client<C>,
        topic: &str,
    ) -> Result<()> {
        let deadline = Instant::now() + self.connect_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let metadata = client
                .fetch_metadata(Some(topic), left.max(Duration::from_millis(100)))
                .map_err(|e| {
                    self.unreachable(format!("no answer within {:?}: {e}", self.connect_timeout))
                })?;
            let topic_error = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .and_then(|t| t.error());
            let Some(e) = topic_error else {
                tracing::debug!(topic, schema = %columns(&self.schema), "kafka topic ready");
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(SluiceError::External {
                    what: format!("kafka sink, topic '{topic}' on '{}'", self.bootstrap),
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

    /// Enqueues every row of `batches` (encoded, keyed, with the query id
    /// and epoch as headers). Returns once all are enqueued, not delivered.
    pub(crate) fn send_batches(
        &self,
        producer: &ThreadedProducer<DeliveryTracker>,
        epoch: u64,
        batches: &[RecordBatch],
    ) -> Result<()> {
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
                send(producer, record).map_err(|e| self.external(e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// Sends one record, waiting while librdkafka's queue is full.
pub(crate) fn send(
    producer: &ThreadedProducer<DeliveryTracker>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> std::result::Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Remembers the first failed delivery since it was last taken.
#[derive(Default)]
pub(crate) struct DeliveryTracker {
    first_error: Mutex<Option<String>>,
}

impl DeliveryTracker {
    /// The first delivery error since the last call, if any.
    pub(crate) fn take_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
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

/// Creates the producer for `config`.
pub(crate) fn create_producer(config: &ClientConfig) -> Result<ThreadedProducer<DeliveryTracker>> {
    config
        .create_with_context(DeliveryTracker::default())
        .map_err(|e| SluiceError::config(format!("kafka sink: invalid producer setting: {e}")))
}

/// Flushes `producer`, waiting as long as librdkafka keeps retrying.
pub(crate) fn flush(
    producer: &ThreadedProducer<DeliveryTracker>,
    config: &SinkConfig,
    epoch: u64,
) -> Result<()> {
    let mut waited = Duration::ZERO;
    while let Err(e) = producer.flush(Duration::from_secs(10)) {
        waited += Duration::from_secs(10);
        tracing::warn!(topic = %config.topic, error = %e, ?waited, "waiting for Kafka acknowledgements");
        if waited >= Duration::from_secs(600) {
            return Err(config.unreachable(format!(
                "epoch {epoch} not acknowledged after {waited:?}: {e}"
            )));
        }
    }
    Ok(())
}
