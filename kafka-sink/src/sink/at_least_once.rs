//! The at-least-once Kafka sink (`'sink.delivery' = 'at-least-once'`).
//!
//! Each epoch's rows are produced with the idempotent producer and the
//! epoch returns only once every message is acknowledged (`acks=all`, then
//! `flush`); the engine records `commits/N` after that. A crash between the
//! acknowledgement and the commit record re-runs the epoch, so its messages
//! appear twice: at-least-once, as Spark's and Flink's non-transactional
//! Kafka sinks.

use std::sync::Arc;

use async_trait::async_trait;
use rdkafka::producer::Producer;
use sluice_engine::{EpochCommit, EpochOutput, Handover, Result, Sink, SluiceError};

use crate::sink::{create_producer, flush, Groups, SinkConfig, SinkProducer};

/// Cheap to move onto a blocking thread.
pub(crate) struct AtLeastOnceSink(Arc<Inner>);

struct Inner {
    config: SinkConfig,
    producer: SinkProducer,
    groups: Groups,
}

impl AtLeastOnceSink {
    pub(crate) fn new(config: SinkConfig) -> Result<Self> {
        let producer = create_producer(&config.client, &config.producer_config())?;
        Ok(Self(Arc::new(Inner {
            config,
            producer,
            groups: Groups::default(),
        })))
    }
}

impl std::fmt::Debug for AtLeastOnceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtLeastOnceSink")
            .field("topic", &self.0.config.topic)
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn write(&self, epoch: u64, output: &EpochOutput, handover: &Handover) -> Result<()> {
        self.config
            .send_epoch(&self.producer, epoch, output, &handover.dead_letters)?;
        flush(&self.producer, &self.config, epoch)?;
        if let Some(e) = self.producer.context().take_error() {
            return Err(SluiceError::External {
                what: format!("kafka sink, topic '{}'", self.config.topic),
                message: format!("epoch {epoch}: a message was not delivered: {e}"),
                hint: Some("the epoch is not committed and will be re-run on restart".into()),
            });
        }
        self.groups.commit(&self.config, &handover.group_offsets)
    }
}

#[async_trait]
impl Sink for AtLeastOnceSink {
    async fn open(&self) -> Result<()> {
        if let Some(partitions) = self.0.config.partitions {
            self.0.config.ensure_partitions(partitions).await?;
        }
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            inner
                .config
                .wait_for_topic(inner.producer.client(), &inner.config.topic)
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("metadata task: {e}")))?
    }

    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        handover: &Handover,
    ) -> Result<()> {
        if output.rows.is_empty() && output.retracted.is_none() && handover.is_empty() {
            return Ok(());
        }
        let inner = Arc::clone(&self.0);
        let (epoch, output, handover) = (epoch.epoch(), output.clone(), handover.clone());
        // Producing and flushing block; keep them off the async reactor.
        tokio::task::spawn_blocking(move || inner.write(epoch, &output, &handover))
            .await
            .map_err(|e| SluiceError::Internal(format!("produce task: {e}")))?
    }

    fn accepts_source_commits(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("kafka(topic={}, at-least-once)", self.0.config.topic)
    }
}
