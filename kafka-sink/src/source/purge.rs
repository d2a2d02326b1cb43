//! `'purge-committed'`: deleting what a query has committed past, for
//! topics only it reads (a repartition step's).
//!
//! Once an epoch is committed (`Source::committed`), the end of its range
//! is a position below which the query never reads again: the records
//! there are deleted (`delete_records`) in the background, at most every
//! [`PURGE_INTERVAL`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminOptions;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use sluice_engine::{Result, SluiceError};

use super::config::SourceConfig;
use crate::client::{Admin, ClientOptions};

/// How often committed records are deleted: each deletion is a request to
/// every partition leader, and the records may wait a little.
const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// One source's deletions.
pub(super) struct Purger {
    topic: String,
    stream: String,
    client: ClientOptions,
    /// When records were last deleted, and below which offset in each
    /// partition.
    done: Mutex<(Option<Instant>, BTreeMap<i32, i64>)>,
    /// The admin client that deletes them, made on first use.
    admin: OnceLock<Arc<Admin>>,
}

impl Purger {
    /// The purger of a source configured with 'purge-committed'; `None`
    /// without it.
    pub(super) fn new(config: &SourceConfig) -> Option<Self> {
        config.purge_committed.then(|| Self {
            topic: config.topic.clone(),
            stream: config.stream.clone(),
            client: config.client.clone(),
            done: Mutex::default(),
            admin: OnceLock::new(),
        })
    }

    /// The query committed everything before `positions` (partition,
    /// offset): deletes it, in the background, unless the last deletion
    /// was less than [`PURGE_INTERVAL`] ago. A failure only delays the
    /// deletion to a later call.
    pub(super) fn committed(&self, positions: &BTreeMap<i32, i64>) -> Result<()> {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (at, below) = &mut *done;
        if at.is_some_and(|at| at.elapsed() < PURGE_INTERVAL) {
            return Ok(());
        }
        *at = Some(Instant::now());
        let mut list = TopicPartitionList::new();
        for (&p, &to) in positions {
            if below.get(&p).is_none_or(|&purged| to > purged) {
                list.add_partition_offset(&self.topic, p, KafkaOffset::Offset(to))
                    .map_err(|e| SluiceError::Internal(format!("purge offsets: {e}")))?;
                below.insert(p, to);
            }
        }
        if list.count() == 0 {
            return Ok(());
        }
        let admin = match self.admin.get() {
            Some(admin) => Arc::clone(admin),
            None => {
                let admin = Arc::new(
                    self.client
                        .admin(&format!("kafka source '{}' purge", self.stream))?,
                );
                Arc::clone(self.admin.get_or_init(|| admin))
            }
        };
        let topic = self.topic.clone();
        tokio::spawn(async move {
            let deleted = admin
                .delete_records(&list, &AdminOptions::new())
                .await
                .map_err(|e| e.to_string())
                .and_then(|list| {
                    list.elements()
                        .iter()
                        .find_map(|e| e.error().err())
                        .map_or(Ok(()), |e| Err(e.to_string()))
                });
            if let Err(e) = deleted {
                tracing::warn!(%topic, error = %e, "deleting committed records failed; retried later");
            }
        });
        Ok(())
    }
}
