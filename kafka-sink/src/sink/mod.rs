//! The Kafka sinks, and what they share: their settings, the producer
//! configuration, waiting for the topic, and producing an epoch's rows.
//!
//! - [`config`]: a sink's options, parsed into a [`SinkConfig`] and the
//!   delivery it asks for;
//! - [`transactional_sink`]: exactly-once, each epoch's output and its
//!   progress record ([`progress_topic`]) in one Kafka transaction;
//! - [`at_least_once`]: the idempotent producer alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int32Type, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use sluice_engine::{columns, DeadLetter, EpochOutput, GroupOffsets, Result, SluiceError};

use crate::client::{ClientOptions, Role};

pub(crate) mod at_least_once;
pub(crate) mod config;
pub(crate) mod progress_topic;
pub(crate) mod transactional_sink;

use crate::format::{Encoded, Format, Messages};

pub(crate) use crate::format::Message;

/// Header naming the query that wrote a record.
pub(crate) const QUERY_ID_HEADER: &str = "sluice.query.id";
/// Header naming the epoch whose transaction holds a record.
pub(crate) const EPOCH_HEADER: &str = "sluice.epoch";

/// How much of an oversized output record's value its dead letter keeps:
/// the whole would be as oversized there.
pub(crate) const OVERSIZED_PREFIX: usize = 16 * 1024;

/// A Kafka sink's settings, parsed from its options.
#[derive(Debug, Clone)]
pub(crate) struct SinkConfig {
    pub topic: String,
    /// The brokers, connect timeout and `kafka.*` properties.
    pub client: ClientOptions,
    pub format: Format,
    /// Output columns forming the message key; empty: no key.
    pub key_fields: Vec<usize>,
    /// `'key.format'`: how the key fields are written.
    pub key_format: Format,
    /// `'value.fields-include' = 'EXCEPT_KEY'`: the value leaves the key
    /// fields out.
    pub except_key: bool,
    pub schema: SchemaRef,
    pub query_id: String,
    /// `'topic.partitions'`: the topic is created with this many
    /// partitions if missing, and must have them.
    pub partitions: Option<u32>,
    /// `'dead-letter.topic'`: where output records Kafka can never accept
    /// (over `message.max.bytes`) are set aside; without one they stop the
    /// query.
    pub dead_letter: Option<String>,
    /// `'sink.epoch-headers'`: whether each output record carries the query
    /// id and epoch as headers. Off by default: they cost a third of a
    /// pass-through's rate, and `sluice verify` needs them only to check a
    /// query that commits while it reads.
    pub epoch_headers: bool,
    /// `'sink.partition-field'`: the output column naming each record's
    /// partition (a null: the record goes where its key sends it). A
    /// repartition step's watermark rows use it to reach every partition.
    pub partition_field: Option<usize>,
}

impl SinkConfig {
    /// The producer settings both sinks use, and why:
    /// - `acks=all`, `enable.idempotence=true`: a retried produce never
    ///   duplicates or reorders within one producer session.
    /// - `partitioner=murmur2_random`: keyed messages land where the Java
    ///   client and Kafka Streams would put them.
    /// - `linger.ms=5`: batches an epoch's messages without delaying it much.
    ///
    /// Delivery reports stay on for every message, although only failures
    /// matter ([`DeliveryTracker`]): with `delivery.report.only.error` the
    /// broker thread frees each delivered message itself, on the produce
    /// path's critical thread, and epochs were no faster (alternated, see
    /// benches/README.md).
    ///
    /// A user's `kafka.linger.ms` or `kafka.partitioner` wins; `acks` and
    /// `enable.idempotence` cannot be set ([`SINK_REFUSED`]).
    pub(crate) fn producer_config(&self) -> ClientConfig {
        let mut config = self.client.config(Role::Producer);
        config.set("acks", "all").set("enable.idempotence", "true");
        for (key, value) in [("partitioner", "murmur2_random"), ("linger.ms", "5")] {
            if self.client.get(key).is_none() {
                config.set(key, value);
            }
        }
        config
    }

    pub(crate) fn unreachable(&self, message: String) -> SluiceError {
        SluiceError::Unreachable {
            what: format!("kafka sink, brokers '{}'", self.client.bootstrap()),
            message: self.client.redact(&message),
            hint: Some(format!(
                "check that Kafka runs there (for a local one: scripts/kafka start) and that \
                 'bootstrap.servers' is right; the wait is set by 'connect.timeout' (now {:?})",
                self.client.timeout()
            )),
        }
    }

    pub(crate) fn external(&self, message: impl Into<String>) -> SluiceError {
        SluiceError::External {
            what: format!("kafka sink, topic '{}'", self.topic),
            message: self.client.redact(&message.into()),
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
        self.client
            .check_connection(&format!("kafka sink, topic '{topic}'"))?;
        let deadline = Instant::now() + self.client.timeout();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let metadata = client
                .fetch_metadata(Some(topic), left.max(Duration::from_millis(100)))
                .map_err(|e| {
                    self.unreachable(format!("no answer within {:?}: {e}", self.client.timeout()))
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
                    what: format!(
                        "kafka sink, topic '{topic}' on '{}'",
                        self.client.bootstrap()
                    ),
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

    /// Creates the topic with `partitions` partitions, replicated as the
    /// brokers' default, unless it exists ('topic.partitions', which
    /// repartition steps set); refuses one that has another count, since
    /// the query's tasks expect one partition each.
    pub(crate) async fn ensure_partitions(&self, partitions: u32) -> Result<()> {
        let topic = &self.topic;
        let admin = self.client.admin("admin client")?;
        let count = i32::try_from(partitions)
            .map_err(|_| self.external(format!("{partitions} partitions are too many")))?;
        let new = NewTopic::new(topic, count, TopicReplication::Fixed(-1));
        self.create_if_missing(&admin, &new, |e| {
            self.external(format!("cannot create it: {e}"))
        })
        .await?;
        let found = self.partition_count(&admin, topic).await?;
        if found != partitions as usize {
            return Err(SluiceError::config(format!(
                "topic '{topic}' has {found} partition(s), but {partitions} were asked for \
                 ('topic.partitions'): a repartition topic needs one partition per task of the \
                 query. Nothing was written. If the query's input gained partitions, run the \
                 query as a new one (a new 'pipeline.name'); else delete the topic"
            )));
        }
        Ok(())
    }

    /// Creates `new` through `admin`, unless a topic of its name exists;
    /// `refused` explains a broker's refusal.
    pub(crate) async fn create_if_missing(
        &self,
        admin: &AdminClient<DefaultClientContext>,
        new: &NewTopic<'_>,
        refused: impl FnOnce(RDKafkaErrorCode) -> SluiceError,
    ) -> Result<()> {
        let options = AdminOptions::new().request_timeout(Some(self.client.timeout()));
        let results = admin
            .create_topics([new], &options)
            .await
            .map_err(|e| self.unreachable(format!("creating topic '{}': {e}", new.name)))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, e)) => return Err(refused(e)),
            }
        }
        Ok(())
    }

    /// How many partitions `topic` has; a topic created a moment ago may
    /// not show them in the metadata yet, so this asks again up to
    /// 'connect.timeout' while it shows none.
    pub(crate) async fn partition_count(
        &self,
        admin: &AdminClient<DefaultClientContext>,
        topic: &str,
    ) -> Result<usize> {
        let deadline = Instant::now() + self.client.timeout();
        loop {
            let metadata = admin
                .inner()
                .fetch_metadata(Some(topic), self.client.timeout())
                .map_err(|e| self.unreachable(format!("fetching metadata of '{topic}': {e}")))?;
            let partitions = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .map_or(0, |t| t.partitions().len());
            if partitions > 0 || Instant::now() >= deadline {
                return Ok(partitions);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The headers every record of an epoch carries: the query id and the
    /// epoch (what `sluice verify` sorts records by).
    fn headers(&self, epoch: u64) -> OwnedHeaders {
        OwnedHeaders::new()
            .insert(Header {
                key: QUERY_ID_HEADER,
                value: Some(self.query_id.as_bytes()),
            })
            .insert(Header {
                key: EPOCH_HEADER,
                value: Some(epoch.to_string().as_bytes()),
            })
    }

    /// Each row of `batch` as a message: its key (the key fields in the
    /// key format, when there are key fields) and its value.
    pub(crate) fn encode(&self, batch: &RecordBatch) -> Result<Messages> {
        // Avro writes a batch under the schema the batch has, and a batch's
        // column may be non-null where the output's may hold nulls: each
        // message must carry the sink's one schema (its fingerprint, or
        // the registered one's union branches).
        let avro = |f: Format| matches!(f, Format::Avro | Format::AvroConfluent { .. });
        let conformed;
        let batch = match avro(self.format) || avro(self.key_format) {
            true => {
                conformed = conform(batch, &self.schema)?;
                &conformed
            }
            false => batch,
        };
        crate::format::messages(
            batch,
            self.format,
            self.key_format,
            &self.key_fields,
            self.except_key,
        )
    }

    /// Enqueues everything `epoch` writes: every row of `output` (encoded,
    /// keyed), a tombstone per retracted key, and the dead letters, all
    /// with the query id and epoch as headers. Returns once all are
    /// enqueued, not delivered.
    pub(crate) fn send_epoch(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        output: &EpochOutput,
        dead_letters: &[DeadLetter],
    ) -> Result<()> {
        self.send_output(producer, epoch, &output.rows, output.retracted.as_ref())?;
        self.send_dead_letters(producer, epoch, dead_letters)
    }

    /// Enqueues one statement's output of `epoch`: its rows, and a
    /// tombstone per retracted group.
    pub(crate) fn send_output(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        batches: &[RecordBatch],
        retracted: Option<&RecordBatch>,
    ) -> Result<()> {
        let headers = self.epoch_headers.then(|| self.headers(epoch));
        for batch in batches {
            let messages = self.encode(batch).map_err(|e| SluiceError::Poison {
                epoch,
                reason: format!(
                    "an output row for topic '{}' cannot be encoded: {e}",
                    self.topic
                ),
                way_out: "change the query so that its output fits the sink's format".into(),
            })?;
            let partitions = match self.partition_field {
                Some(column) => Some(cast(batch.column(column), &DataType::Int32)?),
                None => None,
            };
            let partitions = partitions.as_ref().map(|p| p.as_primitive::<Int32Type>());
            for i in 0..messages.len() {
                let (key, value) = (messages.key(i), messages.value(i));
                let mut record = BaseRecord::to(&self.topic).payload(value);
                if let Some(p) = partitions.filter(|p| p.is_valid(i)) {
                    record = record.partition(p.value(i));
                }
                if let Some(headers) = &headers {
                    record = record.headers(headers.clone());
                }
                if let Some(key) = key {
                    record = record.key(key);
                }
                match send(producer, record) {
                    Ok(()) => {}
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
                        self.set_aside_oversized(producer, epoch, key, value)?
                    }
                    Err(e) => return Err(self.external(e.to_string())),
                }
            }
        }
        if let Some(keys) = retracted {
            let Some(tombstones) = self.tombstone_keys(keys)? else {
                return Ok(());
            };
            for key in tombstones.rows() {
                let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic).key(key);
                if let Some(headers) = &headers {
                    record = record.headers(headers.clone());
                }
                send(producer, record).map_err(|e| self.external(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// An output record over the producer's `message.max.bytes`: Kafka will
    /// never take it, so retrying the epoch cannot help. With a
    /// `'dead-letter.topic'` it goes there in the epoch's transaction —
    /// its key, the first [`OVERSIZED_PREFIX`] bytes of its value (at most
    /// half the limit), and
    /// headers saying why, for which topic and how big it was; without
    /// one the epoch is poison and the query stops.
    fn set_aside_oversized(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        key: Option<&[u8]>,
        value: &[u8],
    ) -> Result<()> {
        let limit: Option<usize> = self
            .client
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok());
        let reason = format!(
            "an output record for topic '{}' is {} bytes, over the producer's \
             message.max.bytes ({})",
            self.topic,
            value.len() + key.map_or(0, <[u8]>::len),
            limit.map_or("1000000, librdkafka's default".to_string(), |l| l
                .to_string())
        );
        let Some(topic) = &self.dead_letter else {
            return Err(SluiceError::Poison {
                epoch,
                reason,
                way_out: "raise 'kafka.message.max.bytes' (and the topic's max.message.bytes), \
                          or set 'dead-letter.topic' on the sink to set such records aside"
                    .into(),
            });
        };
        let letter = DeadLetter {
            topic: topic.clone(),
            key: key.map(<[u8]>::to_vec),
            // Half the limit leaves room for the key and headers.
            value: value[..value
                .len()
                .min(OVERSIZED_PREFIX)
                .min(limit.unwrap_or(usize::MAX) / 2)]
                .to_vec(),
            headers: vec![
                ("sluice.error".into(), reason),
                ("sluice.sink.topic".into(), self.topic.clone()),
                ("sluice.value.bytes".into(), value.len().to_string()),
            ],
        };
        tracing::warn!(epoch, topic = %self.topic, dead_letter = %topic, bytes = value.len(), "an oversized output record went to the dead-letter topic");
        self.send_dead_letters(producer, epoch, std::slice::from_ref(&letter))
    }

    /// The message keys of retracted groups (`keys`: the output's key
    /// columns), encoded exactly as [`encode`](Self::encode) keys their
    /// rows. None when the messages are not keyed by the group key.
    fn tombstone_keys(&self, keys: &RecordBatch) -> Result<Option<Encoded>> {
        let columns: Option<Vec<usize>> = self
            .key_fields
            .iter()
            .map(|&i| keys.schema().index_of(self.schema.field(i).name()).ok())
            .collect();
        match columns {
            Some(columns) if !columns.is_empty() => {
                self.key_format.encode(&keys.project(&columns)?).map(Some)
            }
            _ => {
                tracing::warn!(
                    topic = %self.topic,
                    retracted = keys.num_rows(),
                    "groups left the output but the messages are not keyed by the group key \
                     (key.fields): no tombstones"
                );
                Ok(None)
            }
        }
    }

    /// Enqueues the dead letters of an epoch, each to its own topic with
    /// the original key and bytes, its headers, and the epoch's headers.
    pub(crate) fn send_dead_letters(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        letters: &[DeadLetter],
    ) -> Result<()> {
        for letter in letters {
            let mut headers = self.headers(epoch);
            for (k, v) in &letter.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let mut record = BaseRecord::to(&letter.topic)
                .payload(letter.value.as_slice())
                .headers(headers);
            if let Some(key) = &letter.key {
                record = record.key(key.as_slice());
            }
            send(producer, record).map_err(|e| SluiceError::External {
                what: format!("kafka dead-letter topic '{}'", letter.topic),
                message: e.to_string(),
                hint: Some("create the topic, or check the broker".into()),
            })?;
        }
        Ok(())
    }
}

/// `batch` under `schema`, the sink's columns: the same columns, each cast
/// where its type differs.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        return Err(SluiceError::Internal(format!(
            "an output batch of {} columns for a sink of {}",
            batch.num_columns(),
            schema.fields().len()
        )));
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (column, field) in batch.columns().iter().zip(schema.fields()) {
        columns.push(match column.data_type() == field.data_type() {
            true => Arc::clone(column),
            false => cast(column, field.data_type())?,
        });
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Consumer-group offsets recorded with epochs (`'group.id'` on a Kafka
/// source), so that `kafka-consumer-groups.sh --describe` shows a query's
/// lag. One idle consumer per group, never subscribed: the exactly-once
/// sink needs its group metadata to send the offsets in the epoch's
/// transaction; the at-least-once sink commits through it after the
/// epoch's output is acknowledged.
#[derive(Default)]
pub(crate) struct Groups {
    consumers: Mutex<BTreeMap<String, BaseConsumer>>,
}

impl Groups {
    fn list(offsets: &GroupOffsets) -> std::result::Result<TopicPartitionList, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &offsets.offsets {
            tpl.add_partition_offset(&offsets.topic, *p, Offset::Offset(*o))?;
        }
        Ok(tpl)
    }

    fn with_consumer<T>(
        &self,
        config: &SinkConfig,
        group: &str,
        f: impl FnOnce(&BaseConsumer) -> std::result::Result<T, KafkaError>,
    ) -> Result<T> {
        let mut consumers = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        if !consumers.contains_key(group) {
            let mut client = config.client.config(Role::Consumer);
            client
                .set("group.id", group)
                .set("enable.auto.commit", "false");
            let consumer: BaseConsumer = config
                .client
                .create(&client, &format!("consumer for group '{group}'"))?;
            consumers.insert(group.to_string(), consumer);
        }
        let consumer = &consumers[group];
        f(consumer).map_err(|e| {
            config.external(format!(
                "recording offsets of consumer group '{group}': {e}"
            ))
        })
    }

    /// Adds the offsets to `producer`'s open transaction.
    pub(crate) fn send_in_transaction(
        &self,
        producer: &SinkProducer,
        config: &SinkConfig,
        offsets: &[GroupOffsets],
        timeout: Duration,
    ) -> Result<()> {
        for o in offsets {
            self.with_consumer(config, &o.group, |consumer| {
                let metadata = consumer
                    .group_metadata()
                    .ok_or(KafkaError::MetadataFetch(RDKafkaErrorCode::InvalidGroupId))?;
                producer.send_offsets_to_transaction(&Self::list(o)?, &metadata, timeout)
            })?;
        }
        Ok(())
    }

    /// Commits the offsets (at-least-once).
    pub(crate) fn commit(&self, config: &SinkConfig, offsets: &[GroupOffsets]) -> Result<()> {
        for o in offsets {
            self.with_consumer(config, &o.group, |consumer| {
                consumer.commit(&Self::list(o)?, CommitMode::Sync)
            })?;
        }
        Ok(())
    }
}

/// Sends one record, waiting while librdkafka's queue is full.
pub(crate) fn send(
    producer: &SinkProducer,
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
    first_error: Mutex<Option<DeliveryError>>,
}

/// A message the broker did not take.
#[derive(Debug, Clone)]
pub(crate) struct DeliveryError {
    /// The broker's or librdkafka's error code.
    pub code: Option<RDKafkaErrorCode>,
    /// Its text.
    pub message: String,
    /// The message's topic.
    pub topic: String,
}

impl std::fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "topic '{}': {}", self.topic, self.message)
    }
}

impl DeliveryTracker {
    /// The first delivery error since the last call, if any.
    pub(crate) fn take_error(&self) -> Option<DeliveryError> {
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
        if let Err((e, message)) = result {
            let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| DeliveryError {
                code: e.rdkafka_error_code(),
                message: e.to_string(),
                topic: message.topic().to_string(),
            });
        }
    }
}

/// A sink's producer. Not [`Detached`](crate::client::Detached): dropping
/// it at the query's end takes up to 100 ms (its polling thread's last
/// poll), and that wait gives the transaction coordinator time to write the
/// last transaction's markers before `await_termination` returns; without
/// it a `read_committed` reader started right then could stop at a last
/// stable offset that had not moved yet (a test did).
pub(crate) type SinkProducer = ThreadedProducer<DeliveryTracker>;

/// Creates the producer for `config`.
pub(crate) fn create_producer(
    client: &ClientOptions,
    config: &ClientConfig,
) -> Result<SinkProducer> {
    config
        .create_with_context(DeliveryTracker::default())
        .map_err(|e| client.creation_error("kafka sink producer", &e))
}

/// Waits until every message sent so far is acknowledged or has failed,
/// at most `timeout`.
///
/// Not rdkafka's `flush` alone: between its checks it polls for up to
/// 100 ms for delivery events, which a `ThreadedProducer`'s own thread
/// takes first, so every flush lasted 100 ms — every 100 ms epoch twice as
/// long. Checking the count often costs microseconds.
pub(crate) fn flush_within(
    producer: &SinkProducer,
    timeout: Duration,
) -> std::result::Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        // A zero timeout checks once (and sends what lingers) without polling.
        match producer.flush(Duration::ZERO) {
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            other => return other,
        }
    }
}

/// Flushes `producer`, waiting as long as librdkafka keeps retrying.
pub(crate) fn flush(producer: &SinkProducer, config: &SinkConfig, epoch: u64) -> Result<()> {
    let mut waited = Duration::ZERO;
    while let Err(e) = flush_within(producer, Duration::from_secs(10)) {
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::client::ClientOptions;
    use crate::format::avro::AvroDecoder;

    /// An Avro sink writes every message under its own schema, whatever a
    /// batch's nullability: a batch whose columns hold no null (a plan's
    /// output said non-null there) reads back with the sink's columns, as
    /// a batch with nulls does (before, the first wrote another schema's
    /// fingerprint, and a reader of the sink's schema refused it).
    #[test]
    fn an_avro_sink_writes_one_schema_whatever_a_batch_says_of_nulls() {
        let nullable = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let config = SinkConfig {
            topic: "t".into(),
            client: ClientOptions::new("127.0.0.1:1"),
            format: Format::Avro,
            key_fields: Vec::new(),
            key_format: Format::Json,
            except_key: false,
            schema: Arc::clone(&nullable),
            query_id: "q".into(),
            partitions: None,
            dead_letter: None,
            epoch_headers: false,
            partition_field: None,
        };
        let not_null = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            not_null,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        let with_null = RecordBatch::try_new(
            Arc::clone(&nullable),
            vec![
                Arc::new(Int64Array::from(vec![None, Some(3)])),
                Arc::new(StringArray::from(vec![Some("c"), None])),
            ],
        )
        .unwrap();
        let decoder = AvroDecoder::new(Arc::clone(&nullable)).unwrap();
        for b in [&batch, &with_null] {
            let messages = config.encode(b).unwrap();
            let values: Vec<&[u8]> = (0..messages.len()).map(|i| messages.value(i)).collect();
            let back = decoder.decode(values.into_iter()).unwrap();
            assert_eq!(back.num_rows(), 2);
            assert_eq!(back.column(0).as_ref(), b.column(0).as_ref());
        }
    }
}
