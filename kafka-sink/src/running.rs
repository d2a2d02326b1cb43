//! What Kafka says of a running query, for `sluice checkpoint inspect`:
//! which process owns each task of a divided query (its task group), and
//! where its input partitions end (for the lag).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice_engine::{Result, SluiceError};

use crate::client::{ClientOptions, Role};

/// Each task of query `query_id` owned now by a member of its task group
/// (`sluice-tasks-<query id>`, see `'tasks.group'`), by task number: the
/// owner's client id (`sluice-<pid>@<host>`) and address as the broker
/// sees it. Tasks no member owns are absent; so is every task when no
/// process of the query runs.
pub fn task_owners(client: &ClientOptions, query_id: &str) -> Result<BTreeMap<u32, String>> {
    let group = crate::group::group_id(query_id);
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

/// The high watermark of each partition of `topic`: where a reader that
/// has read everything stands.
pub fn partition_ends(client: &ClientOptions, topic: &str) -> Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = client.create(&client.config(Role::Consumer), "lag")?;
    let unreachable = |e: &dyn std::fmt::Display| SluiceError::Unreachable {
        what: format!("kafka at {}, topic '{topic}'", client.bootstrap()),
        message: e.to_string(),
        hint: None,
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), client.timeout())
        .map_err(|e| unreachable(&e))?;
    let mut ends = BTreeMap::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (_, high) = consumer
                .fetch_watermarks(topic, p.id(), client.timeout().min(Duration::from_secs(10)))
                .map_err(|e| unreachable(&e))?;
            ends.insert(p.id(), high);
        }
    }
    Ok(ends)
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
