//! The query's progress topic: one record per committed epoch, produced in
//! the same Kafka transaction as the epoch's output.
//!
//! Its last record for the query, read `read_committed` after
//! `init_transactions`, is the last committed epoch: the decision point of
//! docs/architecture.md §4. The topic (default `sluice-progress.<query id>`) has one
//! partition and is compacted on the query id key, so it stays small. It is
//! the query's own by default; on a shared one, another producer's open
//! transaction holds back the last stable offset, and recovery waits for it
//! (see [`read_last`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::client::{ClientOptions, Detached, Role};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use serde::{Deserialize, Serialize};
use sluice_engine::{EpochCommit, Result, SluiceError, SourceRange};

use crate::sink::SinkConfig;

/// A progress topic record: the epoch's [`EpochCommit`], the same record
/// the checkpoint keeps as `commits/N`, under the query id the topic is
/// keyed and compacted by. Its JSON is one object: `query_id`, the commit's
/// fields, and `watermark`, the query's watermark in ms for people reading
/// the topic (recovery reads the commit's `watermarks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProgressRecord {
    pub query_id: String,
    #[serde(flatten)]
    pub commit: EpochCommit,
    /// The query's watermark after the epoch (ms since the Unix epoch).
    pub watermark: Option<i64>,
}

impl ProgressRecord {
    /// `commit` of query `query_id`.
    pub(crate) fn new(query_id: &str, commit: &EpochCommit) -> Self {
        Self {
            query_id: query_id.to_string(),
            commit: commit.clone(),
            watermark: commit.watermark().map(|ns| ns.div_euclid(1_000_000)),
        }
    }

    /// The record's bytes on the topic.
    pub(crate) fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| SluiceError::Internal(format!("progress record: {e}")))
    }
}

/// The default progress topic of a query.
pub fn default_topic(query_id: &str) -> String {
    format!("sluice-progress.{query_id}")
}

/// What the progress topic says a query committed last: its epoch and
/// source ranges (for `sluice checkpoint inspect`). `topic` defaults to
/// the query's own. Blocking; reads `read_committed`, so an open
/// transaction of a running query makes it wait up to the client's
/// connect timeout.
pub fn last_committed(
    client: &ClientOptions,
    topic: Option<&str>,
    query_id: &str,
) -> Result<Option<(u64, BTreeMap<String, SourceRange>)>> {
    let timeout = client.timeout();
    let topic = topic.map_or_else(|| default_topic(query_id), str::to_string);
    client.check_connection("progress topic reader")?;
    let config = SinkConfig {
        topic: topic.clone(),
        client: client.clone(),
        format: crate::Format::Json,
        key_fields: Vec::new(),
        key_format: crate::Format::Json,
        except_key: false,
        schema: std::sync::Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        query_id: query_id.to_string(),
        partitions: None,
        dead_letter: None,
        epoch_headers: false,
        partition_field: None,
    };
    Ok(read_last(&config, &topic, query_id, timeout)?
        .map(|r| (r.commit.epoch(), r.commit.plan.sources)))
}

/// Creates the progress topic unless it exists — one partition, compacted,
/// replicated min(3, brokers) times — and refuses one that exists in
/// another shape: with more partitions "the last record" has no meaning,
/// and without compaction retention would delete the query's progress.
pub(crate) async fn ensure_topic(config: &SinkConfig, topic: &str) -> Result<()> {
    let admin = config.client.admin("progress topic admin client")?;
    let brokers = admin
        .inner()
        .fetch_metadata(None, config.client.timeout())
        .map_err(|e| config.unreachable(format!("fetching metadata: {e}")))?
        .brokers()
        .len();
    let replicas = brokers.clamp(1, 3) as i32;
    let new =
        NewTopic::new(topic, 1, TopicReplication::Fixed(replicas)).set("cleanup.policy", "compact");
    config
        .create_if_missing(&admin, &new, |e| SluiceError::External {
            what: format!(
                "kafka progress topic '{topic}' on '{}'",
                config.client.bootstrap()
            ),
            message: format!("cannot create it: {e}"),
            hint: Some(
                "create it yourself (1 partition, cleanup.policy=compact) or name another with \
                 'progress.topic'"
                    .into(),
            ),
        })
        .await?;
    check_shape(config, &admin, topic).await
}

/// Refuses a progress topic of another shape than [`ensure_topic`] makes.
async fn check_shape(
    config: &SinkConfig,
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> Result<()> {
    let partitions = config.partition_count(admin, topic).await?;
    let options = AdminOptions::new().request_timeout(Some(config.client.timeout()));
    let policy = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(|e| config.unreachable(format!("describing '{topic}': {e}")))?
        .into_iter()
        .flatten()
        .find_map(|r| r.get("cleanup.policy").and_then(|e| e.value.clone()));
    let compacted = policy.as_deref().is_some_and(|p| p.contains("compact"));
    if partitions == 1 && compacted {
        return Ok(());
    }
    Err(SluiceError::config(format!(
        "the progress topic '{topic}' exists with {partitions} partition(s) and \
         cleanup.policy={}, but a progress topic needs 1 partition (its last record is the \
         query's last committed epoch) and cleanup.policy=compact (retention would delete the \
         query's progress). Nothing was written. Delete it if it is yours and empty, or name \
         another with 'progress.topic'",
        policy.as_deref().unwrap_or("unknown")
    )))
}

/// The last record for `query_id` in `topic`, read `read_committed`.
/// Blocking. MUST be called after `init_transactions`, so that no
/// transaction of this query is left open to hide it.
///
/// A `read_committed` reader stops at the last stable offset, so another
/// producer's transaction open on a shared progress topic would hide every
/// record committed after it began: reading up to there could return an
/// older epoch than the last committed, and the query would redo epochs.
/// So the read first waits, up to `wait`, until no transaction is open
/// below the end it reads to. Each record for the query is checked on the
/// way: its body names the query of its key, epochs only grow, and its
/// state files stay inside the checkpoint.
pub(crate) fn read_last(
    config: &SinkConfig,
    topic: &str,
    query_id: &str,
    wait: Duration,
) -> Result<Option<ProgressRecord>> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        config.unreachable(format!("reading progress topic '{topic}': {what}: {e}"))
    };
    let consumer = |isolation: &str| -> Result<Detached<BaseConsumer>> {
        let mut client = config.client.config(Role::Consumer);
        client
            .set("group.id", format!("sluice-recovery-{query_id}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            // The read ends at a transaction marker, which the broker hands
            // over only with the next fetch; by default it holds an empty
            // fetch 500 ms, and every recovery paid that once per step.
            .set("fetch.wait.max.ms", "10");
        config
            .client
            .create(&client, "progress topic reader")
            .map(Detached::new)
    };
    let committed = consumer("read_committed")?;
    // The end of the log as written (open transactions included) ...
    let (low, high) = consumer("read_uncommitted")?
        .fetch_watermarks(topic, 0, config.client.timeout())
        .map_err(|e| fail("fetching offsets", &e))?;
    if high <= low {
        return Ok(None);
    }
    // ... and the last stable offset, which a read_committed client is
    // given as the end: below `high` while a transaction is open.
    let deadline = std::time::Instant::now() + wait;
    let mut warned = false;
    loop {
        let (_, stable) = committed
            .fetch_watermarks(topic, 0, config.client.timeout())
            .map_err(|e| fail("fetching offsets", &e))?;
        if stable >= high {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(SluiceError::Unreachable {
                what: format!(
                    "kafka progress topic '{topic}' on '{}'",
                    config.client.bootstrap()
                ),
                message: format!(
                    "a transaction of another producer is open at offset {stable} (the topic \
                     ends at {high}) and did not end within {wait:?}; the query's last \
                     committed epoch may lie past it, and reading before it could redo \
                     committed epochs"
                ),
                hint: Some(
                    "it ends when its producer commits or aborts, or after that producer's \
                     transaction.timeout.ms; give each query a progress topic of its own \
                     ('progress.topic')"
                        .into(),
                ),
            });
        }
        if !std::mem::replace(&mut warned, true) {
            tracing::warn!(%topic, stable, high, "another producer's transaction is open on the progress topic; waiting for it to end before reading the last committed epoch");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Read backwards in growing steps: the last record is near the end, but
    // transaction markers and aborted records take offsets too.
    let mut back = 16;
    loop {
        let start = (high - back).max(low);
        let mut last: Option<ProgressRecord> = None;
        crate::position::read_ranges(
            &committed,
            topic,
            &[(0, start, high)],
            config.client.timeout(),
            &|what, e| fail(what, &e),
            |m| {
                if m.key() != Some(query_id.as_bytes()) {
                    return Ok(());
                }
                let payload = m.payload().unwrap_or_default();
                let record = checked_record(topic, query_id, m.offset(), payload, last.as_ref())?;
                last = Some(record);
                Ok(())
            },
        )?;
        if last.is_some() || start == low {
            return Ok(last);
        }
        back *= 4;
    }
}

/// The progress record `payload` at `offset` (keyed `query_id`), refused
/// unless it is one Sluice wrote for that query after `previous`.
fn checked_record(
    topic: &str,
    query_id: &str,
    offset: i64,
    payload: &[u8],
    previous: Option<&ProgressRecord>,
) -> Result<ProgressRecord> {
    let refuse = |message: String| SluiceError::External {
        what: format!("kafka progress topic '{topic}', offset {offset}"),
        message,
        hint: Some(
            "the topic holds records Sluice did not write for this query; give the query its \
             own 'progress.topic'"
                .into(),
        ),
    };
    let record: ProgressRecord = serde_json::from_slice(payload)
        .map_err(|e| refuse(format!("unreadable progress record: {e}")))?;
    if record.query_id != query_id {
        return Err(refuse(format!(
            "the record is keyed '{query_id}' but names query '{}'",
            record.query_id
        )));
    }
    if let Some(previous) = previous.filter(|p| p.commit.epoch() >= record.commit.epoch()) {
        return Err(refuse(format!(
            "epoch {} follows epoch {}: a query's epochs only grow",
            record.commit.epoch(),
            previous.commit.epoch()
        )));
    }
    record.commit.check_state_paths().map_err(refuse)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::OffsetRecord;

    fn record(query_id: &str, epoch: u64, state_files: &[&str]) -> Vec<u8> {
        let commit = EpochCommit {
            plan: OffsetRecord {
                epoch,
                ..Default::default()
            },
            state_files: state_files.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        };
        ProgressRecord::new(query_id, &commit).to_json().unwrap()
    }

    fn check(payload: &[u8], previous: Option<&ProgressRecord>) -> Result<ProgressRecord> {
        checked_record("progress", "q", 7, payload, previous)
    }

    #[test]
    fn a_record_sluice_wrote_for_the_query_passes() {
        let first = check(&record("q", 3, &["state/0.agg/3.a.snapshot"]), None).unwrap();
        assert_eq!(first.commit.epoch(), 3);
        let next = check(&record("q", 4, &[]), Some(&first)).unwrap();
        assert_eq!(next.commit.epoch(), 4);
    }

    #[test]
    fn records_that_are_not_the_querys_are_refused_naming_topic_and_offset() {
        let first = check(&record("q", 5, &[]), None).unwrap();
        for (payload, previous, says) in [
            (b"not json".to_vec(), None, "unreadable progress record"),
            (record("other", 6, &[]), None, "names query 'other'"),
            (record("q", 5, &[]), Some(&first), "epoch 5 follows epoch 5"),
            (record("q", 4, &[]), Some(&first), "epoch 4 follows epoch 5"),
            (record("q", 6, &["../../etc/x"]), None, "'../../etc/x'"),
        ] {
            let err = check(&payload, previous).unwrap_err().to_string();
            assert!(
                err.contains("kafka progress topic 'progress', offset 7") && err.contains(says),
                "{err}"
            );
        }
    }
}
