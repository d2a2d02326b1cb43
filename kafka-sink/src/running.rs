//! What Kafka says of a running query, for `sluice checkpoint inspect`:
//! where its input partitions end (for the lag). Who owns each task of a
//! divided query is the task group's to say (`group::task_owners`).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice_engine::{Result, SluiceError};

use crate::client::{ClientOptions, Role};

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
