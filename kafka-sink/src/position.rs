//! Whether a consumer has read up to planned end offsets.
//!
//! Readers stop when their *position* reaches the end of a range, not
//! after a count of records: transaction markers and aborted records take
//! offsets without yielding messages (KAFKA.md).

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::Offset;

/// True when, on every `(partition, end)` of `topic`, the consumer's
/// position is at or past `end`. A partition without a known position has
/// not reached it.
pub(crate) fn reached(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &[(i32, i64)],
) -> KafkaResult<bool> {
    let positions = consumer.position()?;
    Ok(ends.iter().all(|(partition, end)| {
        matches!(
            positions.find_partition(topic, *partition).map(|tp| tp.offset()),
            Some(Offset::Offset(o)) if o >= *end
        )
    }))
}
