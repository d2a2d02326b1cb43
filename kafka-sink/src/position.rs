//! Reading planned offset ranges to their end.
//!
//! Readers stop when their *position* reaches the end of a range, not
//! after a count of records: transaction markers and aborted records take
//! offsets without yielding messages (KAFKA.md).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_engine::{Result, SluiceError};

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

/// Reads `[from, to)` of every `(partition, from, to)` of `topic`, handing
/// each message in range to `each`, until the consumer's position reaches
/// every `to`. `fail` turns a Kafka problem (what failed, the error) into
/// the caller's error; no message for `stall` is such a problem. Errors
/// the consumer reports while polling (brokers down, a connection reset)
/// are waited out like silence: librdkafka reconnects by itself, and the
/// last of them is named if the stall lasts.
pub(crate) fn read_ranges(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    stall: Duration,
    fail: &dyn Fn(&str, String) -> SluiceError,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> Result<()>,
) -> Result<()> {
    let ranges: Vec<(i32, i64, i64)> = ranges.iter().copied().filter(|r| r.2 > r.1).collect();
    if ranges.is_empty() {
        return Ok(());
    }
    let mut assignment = TopicPartitionList::new();
    for (p, from, _) in &ranges {
        assignment
            .add_partition_offset(topic, *p, Offset::Offset(*from))
            .map_err(|e| fail("assigning partitions", e.to_string()))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| fail("assigning partitions", e.to_string()))?;
    let ends: Vec<(i32, i64)> = ranges.iter().map(|(p, _, to)| (*p, *to)).collect();
    let mut last_progress = Instant::now();
    let mut last_error = None;
    let read = loop {
        if reached(consumer, topic, &ends).unwrap_or(false) {
            break Ok(());
        }
        if last_progress.elapsed() > stall {
            let why = last_error.map_or(String::new(), |e| format!(" (last error: {e})"));
            break Err(fail("reading", format!("no progress for {stall:?}{why}")));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => last_error = Some(e.to_string()),
            Some(Ok(m)) => {
                last_progress = Instant::now();
                let in_range = ranges.iter().any(|(p, from, to)| {
                    *p == m.partition() && m.offset() >= *from && m.offset() < *to
                });
                if in_range {
                    if let Err(e) = each(&m) {
                        break Err(e);
                    }
                }
            }
        }
    };
    let _ = consumer.unassign();
    read
}
