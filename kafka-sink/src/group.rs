//! Task groups: Kafka's consumer-group protocol hands a divided query's
//! tasks out among the processes that run it, and says who owns each
//! (`task_owners`, for `sluice checkpoint inspect` and the status page).
//!
//! Every process of the query joins the consumer group
//! `sluice-tasks-<query id>`, subscribed to the input topic that defines the
//! tasks (task *i* is partition *i*). The group's assignor gives each
//! process some partitions; those are the tasks it runs. The consumer never
//! reads a record: its partitions are paused as soon as they are assigned,
//! and it polls only to stay in the group and to hear of rebalances.
//!
//! The classic protocol with the cooperative-sticky assignor: a rebalance
//! moves only the tasks that change owner, the others keep running, and
//! the session timeout that decides how soon a dead process's tasks move is
//! the client's to set (KIP-848's is the broker's).
//!
//! Before a task leaves this process, the revoke callback waits (up to
//! [`RELEASE_WAIT`]) until the engine says the task stopped, so the next
//! owner usually starts after it. Correctness does not depend on that
//! wait: the next owner's `init_transactions` fences this process's
//! producer for the task, and state files are named by run and listed in
//! the committed progress record, so a late write is never read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use sluice_engine::{Result, SluiceError, TaskAssigner};
use tokio::sync::watch;

use crate::client::{ClientOptions, Role};

/// How long a revoke waits for the engine to stop the tasks it loses.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How often the group thread polls (and notices a stop).
const POLL: Duration = Duration::from_millis(100);

/// The group of the processes running query `query_id`, as seen from
/// this one.
#[derive(Debug)]
pub(crate) struct KafkaTaskGroup {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Who owns each task, as the group's coordinator last said.
    owners: Arc<Owners>,
}

/// How often the task owners are asked of the group's coordinator at most,
/// however often the status page looks.
const OWNERS_EVERY: Duration = Duration::from_secs(3);

/// The task owners last learned, and when they were last asked for.
#[derive(Debug)]
struct Owners {
    client: ClientOptions,
    query_id: String,
    known: Mutex<(BTreeMap<u32, String>, Option<std::time::Instant>)>,
}

impl Owners {
    /// What was last learned; asks again on a thread of its own when that
    /// is older than [`OWNERS_EVERY`] (one question at a time).
    fn get(self: &Arc<Self>) -> BTreeMap<u32, String> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.1.is_none_or(|at| at.elapsed() >= OWNERS_EVERY) {
            known.1 = Some(std::time::Instant::now());
            let owners = Arc::clone(self);
            let _ = std::thread::Builder::new()
                .name("sluice-task-owners".into())
                .spawn(move || {
                    let client = owners.client.clone().connect_timeout(OWNERS_EVERY);
                    match task_owners(&client, &owners.query_id) {
                        Ok(now) => {
                            owners.known.lock().unwrap_or_else(|p| p.into_inner()).0 = now;
                        }
                        Err(e) => tracing::debug!(error = %e, "asking the task group's owners"),
                    }
                });
        }
        known.0.clone()
    }
}

#[derive(Debug)]
struct Shared {
    topic: String,
    group: String,
    owned: watch::Sender<BTreeSet<u32>>,
    /// Tasks taken away whose stop the engine has not confirmed yet.
    releasing: Mutex<BTreeSet<u32>>,
    released: Condvar,
    leave: std::sync::atomic::AtomicBool,
}

struct GroupContext(Arc<Shared>);

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let revoked = tasks_of(list, &self.0.topic);
        if revoked.is_empty() {
            return;
        }
        tracing::info!(group = %self.0.group, tasks = ?revoked, "tasks leave this process");
        self.0
            .releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(&revoked);
        self.0.owned.send_modify(|owned| {
            for t in &revoked {
                owned.remove(t);
            }
        });
        // Wait until the engine stopped them, so the next owner starts
        // after this one ends (see the module docs for why it need not).
        // Leaving, the engine has stopped every task already.
        if self.0.leave.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let deadline = Instant::now() + RELEASE_WAIT;
        let mut releasing = self.0.releasing.lock().unwrap_or_else(|p| p.into_inner());
        while revoked.iter().any(|t| releasing.contains(t)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    group = %self.0.group, tasks = ?revoked,
                    "the tasks did not stop within {RELEASE_WAIT:?}; handing them over anyway \
                     (their next owner fences them)"
                );
                break;
            }
            releasing = self
                .0
                .released
                .wait_timeout(releasing, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                // Only the group is wanted of this consumer, never records.
                if let Err(e) = consumer.pause(list) {
                    tracing::warn!(group = %self.0.group, error = %e, "pausing assigned partitions");
                }
                let assigned = tasks_of(list, &self.0.topic);
                if assigned.is_empty() {
                    return;
                }
                tracing::info!(group = %self.0.group, tasks = ?assigned, "tasks come to this process");
                self.0.owned.send_modify(|owned| owned.extend(&assigned));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(group = %self.0.group, error = %e, "rebalance failed");
            }
        }
    }
}

/// The consumer group of the processes running query `query_id`.
pub(crate) fn group_id(query_id: &str) -> String {
    format!("sluice-tasks-{query_id}")
}

/// This process as a member of a task group: `sluice-<pid>@<host>`.
fn member_name() -> String {
    format!(
        "sluice-{}@{}",
        std::process::id(),
        sluice_engine::host_name()
    )
}

/// The partitions of `topic` in `list`, as task numbers.
fn tasks_of(list: &TopicPartitionList, topic: &str) -> BTreeSet<u32> {
    list.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .collect()
}

impl KafkaTaskGroup {
    /// Joins the group of query `query_id` over `topic`, its members
    /// declared dead after `session_timeout` without a heartbeat.
    pub(crate) fn join(
        client: &ClientOptions,
        topic: &str,
        query_id: &str,
        session_timeout: Duration,
    ) -> Result<Self> {
        let group = group_id(query_id);
        let mut config = client.config(Role::Consumer);
        if client.get("client.id").is_none() {
            // What `sluice checkpoint inspect` names a task's owner by.
            config.set("client.id", member_name());
        }
        config
            .set("group.id", &group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set(
                "session.timeout.ms",
                session_timeout.as_millis().to_string(),
            )
            .set(
                "heartbeat.interval.ms",
                (session_timeout.as_millis() / 4).max(100).to_string(),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let shared = Arc::new(Shared {
            topic: topic.to_string(),
            group: group.clone(),
            owned: watch::channel(BTreeSet::new()).0,
            releasing: Mutex::new(BTreeSet::new()),
            released: Condvar::new(),
            leave: std::sync::atomic::AtomicBool::new(false),
        });
        let consumer: BaseConsumer<GroupContext> = config
            .create_with_context(GroupContext(Arc::clone(&shared)))
            .map_err(|e| SluiceError::External {
                what: format!("task group '{group}'"),
                message: client.redact(&e.to_string()),
                hint: None,
            })?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| SluiceError::External {
                what: format!("task group '{group}'"),
                message: format!("subscribing to topic '{topic}': {e}"),
                hint: None,
            })?;
        let polled = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sluice-task-group".into())
            .spawn(move || {
                while !polled.leave.load(std::sync::atomic::Ordering::Relaxed) {
                    // Partitions are paused: a poll serves the protocol only.
                    if let Some(Err(e)) = consumer.poll(POLL) {
                        tracing::debug!(group = %polled.group, error = %e, "group poll");
                    }
                }
                // Leaving at once moves this process's tasks to the others
                // without waiting for the session timeout.
                consumer.unsubscribe();
                drop(consumer);
            })
            .map_err(|e| SluiceError::io("starting the task group thread", e))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
            owners: Arc::new(Owners {
                client: client.clone(),
                query_id: query_id.to_string(),
                known: Mutex::new((BTreeMap::new(), None)),
            }),
        })
    }
}

impl TaskAssigner for KafkaTaskGroup {
    fn owned(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.shared.owned.subscribe()
    }

    fn released(&self, tasks: &BTreeSet<u32>) {
        let mut releasing = self
            .shared
            .releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for t in tasks {
            releasing.remove(t);
        }
        self.shared.released.notify_all();
    }

    fn leave(&self) {
        self.shared
            .leave
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Tasks being revoked now have stopped or will not run again.
        self.shared
            .releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.shared.released.notify_all();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }

    fn owners(&self) -> BTreeMap<u32, String> {
        self.owners.get()
    }
}

impl Drop for KafkaTaskGroup {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Each task of query `query_id` owned now by a member of its task group
/// (`sluice-tasks-<query id>`, see `'tasks.group'`), by task number: the
/// owner's client id (`sluice-<pid>@<host>`) and address as the broker
/// sees it. Tasks no member owns are absent; so is every task when no
/// process of the query runs.
pub fn task_owners(client: &ClientOptions, query_id: &str) -> Result<BTreeMap<u32, String>> {
    let group = group_id(query_id);
    let consumer: BaseConsumer = client.create(&client.config(Role::Consumer), "task owners")?;
    let list = consumer
        .fetch_group_list(Some(&group), client.timeout())
        .map_err(|e| SluiceError::Unreachable {
            what: format!("kafka at {}", client.bootstrap()),
            message: format!("describing group '{group}': {e}"),
            hint: None,
        })?;
    let mut owners = BTreeMap::new();
    for g in list.groups().iter().filter(|g| g.name() == group) {
        for member in g.members() {
            let owner = format!("{} at {}", member.client_id(), member.client_host());
            let assigned = member
                .assignment()
                .and_then(assigned_partitions)
                .unwrap_or_default();
            for (_, partition) in assigned {
                if let Ok(task) = u32::try_from(partition) {
                    owners.insert(task, owner.clone());
                }
            }
        }
    }
    Ok(owners)
}

/// The (topic, partition) pairs of a consumer-protocol assignment
/// (Kafka's `ConsumerProtocolAssignment`, versions 0 to 3: an int16
/// version, then an array of topics, each a string and an array of int32
/// partitions; big-endian, arrays and strings prefixed by their length).
/// `None` if the bytes are not one.
fn assigned_partitions(bytes: &[u8]) -> Option<Vec<(String, i32)>> {
    let mut r = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = r.split_at_checked(n)?;
        r = rest;
        Some(head)
    };
    let _version = i16::from_be_bytes(take(2)?.try_into().ok()?);
    let topics = i32::from_be_bytes(take(4)?.try_into().ok()?);
    let mut out = Vec::new();
    for _ in 0..topics.max(0) {
        let len = i16::from_be_bytes(take(2)?.try_into().ok()?);
        let topic = String::from_utf8(take(usize::try_from(len).ok()?)?.to_vec()).ok()?;
        let partitions = i32::from_be_bytes(take(4)?.try_into().ok()?);
        for _ in 0..partitions.max(0) {
            out.push((topic.clone(), i32::from_be_bytes(take(4)?.try_into().ok()?)));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_decodes_and_garbage_does_not() {
        // Version 1, topic "in" with partitions 0 and 4, no user data.
        let mut bytes = vec![0, 1, 0, 0, 0, 1, 0, 2, b'i', b'n', 0, 0, 0, 2];
        bytes.extend([0, 0, 0, 0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            assigned_partitions(&bytes),
            Some(vec![("in".to_string(), 0), ("in".to_string(), 4)])
        );
        assert_eq!(assigned_partitions(&bytes[..9]), None);
        assert_eq!(assigned_partitions(&[]), None);
    }
}
