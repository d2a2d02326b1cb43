//! The topic's partitions, as the broker last named them.
//!
//! A plan from what was fetched needs them (a partition added since is
//! read from its beginning; a task's topic that changed its partition
//! count stops the query), but must not wait on the broker for them: a
//! slow metadata answer would stall the epoch. So such a plan takes the
//! list the broker last gave and, once it is [`METADATA_MAX_AGE`] old,
//! asks again on a thread of its own; the next plan sees the answer. A
//! refresh that fails forgets the list, so that the next plan asks the
//! broker itself and reports what is wrong, as the first plan does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use sluice_engine::{Result, SluiceError};

use super::SourceInner;

/// How old the topic's partition list may grow before a refresh starts.
pub(super) const METADATA_MAX_AGE: Duration = Duration::from_secs(5);

/// What a source knows of its topic's partitions.
#[derive(Debug, Default)]
pub(super) struct KnownPartitions {
    /// The partitions and when the broker named them; none before the
    /// first answer and after a failed refresh.
    list: Option<(Instant, Vec<i32>)>,
    /// A refresh is under way.
    refreshing: bool,
}

impl SourceInner {
    /// The partitions this source reads, asked of the broker now (and
    /// remembered).
    pub(super) fn partitions(&self) -> Result<Vec<i32>> {
        let partitions = self.fetch_partitions()?;
        self.lock_partitions().list = Some((Instant::now(), partitions.clone()));
        Ok(partitions)
    }

    /// The partitions this source reads, as the broker last named them;
    /// asked now only when none are known. Starts a refresh in the
    /// background once they are [`METADATA_MAX_AGE`] old.
    pub(super) fn known_partitions(self: &Arc<Self>) -> Result<Vec<i32>> {
        let mut known = self.lock_partitions();
        let Some((at, partitions)) = &known.list else {
            drop(known);
            return self.partitions();
        };
        let partitions = partitions.clone();
        if at.elapsed() >= METADATA_MAX_AGE && !known.refreshing {
            known.refreshing = true;
            drop(known);
            self.refresh_in_background();
        }
        Ok(partitions)
    }

    fn refresh_in_background(self: &Arc<Self>) {
        let inner = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("sluice-kafka-metadata".into())
            .spawn(move || {
                let fetched = inner.fetch_partitions();
                let mut known = inner.lock_partitions();
                known.refreshing = false;
                known.list = match fetched {
                    Ok(partitions) => Some((Instant::now(), partitions)),
                    Err(e) => {
                        tracing::debug!(
                            stream = %inner.config.stream, error = %e,
                            "refreshing the topic's partitions failed; the next plan asks again"
                        );
                        None
                    }
                };
            });
        if let Err(e) = started {
            // The list stays as it is; the next plan tries again.
            tracing::debug!(error = %e, "no thread to refresh the topic's partitions");
            self.lock_partitions().refreshing = false;
        }
    }

    fn lock_partitions(&self) -> std::sync::MutexGuard<'_, KnownPartitions> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The partitions of the topic this source reads (its task's, or all),
    /// as the broker says now.
    fn fetch_partitions(&self) -> Result<Vec<i32>> {
        self.check_connection()?;
        let consumer = self.consumer()?;
        let timeout = self.config.client.timeout();
        let metadata = consumer
            .fetch_metadata(Some(&self.config.topic), timeout)
            .map_err(|e| self.unreachable("fetching metadata", e))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.config.topic)
            .ok_or_else(|| {
                self.unreachable("fetching metadata", "topic missing from the answer")
            })?;
        if let Some(e) = topic.error() {
            return Err(SluiceError::External {
                what: format!(
                    "kafka source '{}', topic '{}'",
                    self.config.stream, self.config.topic
                ),
                message: format!("{e:?}"),
                hint: Some("create the topic, or fix 'topic'".into()),
            });
        }
        if let Some(task) = self.task {
            let count = topic.partitions().len();
            if count != task.count as usize {
                return Err(SluiceError::External {
                    what: format!(
                        "kafka source '{}', topic '{}'",
                        self.config.stream, self.config.topic
                    ),
                    message: format!(
                        "the topic now has {count} partitions, but the query was divided into \
                         {} tasks, one per partition: records of the new partitions would be \
                         read by no task, or keys would move between tasks",
                        task.count
                    ),
                    hint: Some(
                        "restart the query: each start divides it by the partitions of the \
                         moment. A stateful one then starts as a new query (a new \
                         'pipeline.name' and checkpoint location), since its keys moved between \
                         partitions"
                            .into(),
                    ),
                });
            }
        }
        Ok(topic
            .partitions()
            .iter()
            .map(|p| p.id())
            .filter(|&p| self.task.is_none_or(|t| t.reads(p)))
            .collect())
    }
}
