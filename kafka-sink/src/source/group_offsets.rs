//! `'group.id'` with a sink that cannot record offsets in its transaction
//! (console, blackhole, a file): the source commits the offsets it read to
//! the consumer group itself, once each epoch is committed, as Flink's
//! Kafka source commits its offsets when a checkpoint completes. The
//! offsets are for lag tools only: recovery never reads them, so a commit
//! that fails is retried with the next epoch's.
//!
//! With the exactly-once Kafka sink the offsets go into the epoch's
//! transaction instead (`Source::group_offsets`), and nothing here runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use sluice_engine::{Result, SluiceError};

use super::config::SourceConfig;
use crate::client::{ClientOptions, Detached, Role};

/// One source's consumer-group offsets, committed apart from the sink.
pub(super) struct GroupCommitter {
    group: String,
    topic: String,
    stream: String,
    client: ClientOptions,
    /// Set when the query's sink cannot take the offsets with the epoch.
    apart: AtomicBool,
    /// The consumer of the group that commits them, made on first use.
    consumer: OnceLock<Arc<Detached<BaseConsumer>>>,
}

impl GroupCommitter {
    /// The committer of a source with `'group.id'`; `None` without it.
    pub(super) fn new(config: &SourceConfig) -> Option<Self> {
        Some(Self {
            group: config.group.clone()?,
            topic: config.topic.clone(),
            stream: config.stream.clone(),
            client: config.client.clone(),
            apart: AtomicBool::new(false),
            consumer: OnceLock::new(),
        })
    }

    /// From now on, the offsets are committed here, not by the sink.
    pub(super) fn commit_apart(&self) {
        self.apart.store(true, Ordering::Relaxed);
    }

    /// Whether the offsets are committed here.
    pub(super) fn is_apart(&self) -> bool {
        self.apart.load(Ordering::Relaxed)
    }

    /// The query committed everything before `positions` (partition,
    /// offset): commits them to the group, in the background.
    pub(super) fn committed(&self, positions: &BTreeMap<i32, i64>) -> Result<()> {
        if !self.is_apart() || positions.is_empty() {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        for (&p, &to) in positions {
            list.add_partition_offset(&self.topic, p, KafkaOffset::Offset(to))
                .map_err(|e| SluiceError::Internal(format!("group offsets: {e}")))?;
        }
        let consumer = match self.consumer.get() {
            Some(c) => Arc::clone(c),
            None => {
                let mut config = self.client.config(Role::Consumer);
                config
                    .set("group.id", &self.group)
                    .set("enable.auto.commit", "false");
                let what = format!("kafka source '{}' group offsets", self.stream);
                let consumer = Arc::new(Detached::new(self.client.create(&config, &what)?));
                Arc::clone(self.consumer.get_or_init(|| consumer))
            }
        };
        let (group, topic) = (self.group.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = consumer.commit(&list, CommitMode::Sync) {
                tracing::warn!(%group, %topic, error = %e, "committing the group's offsets failed; retried with the next epoch");
            }
        });
        Ok(())
    }
}
