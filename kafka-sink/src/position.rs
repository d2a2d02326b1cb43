//! Reading planned offset ranges to their end, and where a committed
//! topic ends.
//!
//! Readers stop when their *position* reaches the end of a range, not
//! after a count of records: transaction markers and aborted records take
//! offsets without yielding messages (KAFKA.md).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
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

/// How [`read_ranges`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every range was read to its end.
    Reached,
    /// A range starts where the partition no longer has records (deleted by
    /// retention or `delete_records`, or the topic was recreated): a
    /// consumer created with `auto.offset.reset = error` says so instead of
    /// jumping elsewhere. Nothing is known of which partition; the caller
    /// compares the ranges with the partitions' offsets.
    OutOfRange,
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
) -> Result<Ended> {
    let ranges: Vec<(i32, i64, i64)> = ranges.iter().copied().filter(|r| r.2 > r.1).collect();
    if ranges.is_empty() {
        return Ok(Ended::Reached);
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
    // Asking for the positions costs far more than a message: ask when a
    // range may have ended (a message at its last offset, an idle poll, as
    // a transaction marker may close it) and now and then. A partition whose
    // range is read is paused, so that what was fetched beyond it does not
    // come back through `poll`.
    let mut look = true;
    let mut since_look = 0u32;
    let mut paused = TopicPartitionList::new();
    // The clock is read only after a poll that brought no message: a read
    // per message (for the stall check, and librdkafka's for a poll with a
    // timeout) cost several percent of a read.
    let (mut quiet, mut progressed) = (true, false);
    let read = loop {
        if look {
            if reached(consumer, topic, &ends).unwrap_or(false) {
                break Ok(Ended::Reached);
            }
            (look, since_look) = (false, 0);
        }
        if quiet {
            if std::mem::take(&mut progressed) {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall {
                let why = last_error.map_or(String::new(), |e| format!(" (last error: {e})"));
                break Err(fail("reading", format!("no progress for {stall:?}{why}")));
            }
        }
        let polled = match consumer.poll(Duration::ZERO) {
            None => consumer.poll(Duration::from_millis(10)),
            some => some,
        };
        quiet = !matches!(polled, Some(Ok(_)));
        match polled {
            None => look = true,
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
            ))) => break Ok(Ended::OutOfRange),
            Some(Err(e)) => {
                last_error = Some(e.to_string());
                look = true;
            }
            Some(Ok(m)) => {
                progressed = true;
                let range = ranges.iter().find(|(p, _, _)| *p == m.partition());
                if let Some((p, from, to)) = range {
                    if m.offset() >= *from && m.offset() < *to {
                        if let Err(e) = each(&m) {
                            break Err(e);
                        }
                    }
                    if m.offset() + 1 >= *to && paused.find_partition(topic, *p).is_none() {
                        let mut one = TopicPartitionList::new();
                        let _ = one.add_partition(topic, *p);
                        let _ = consumer.pause(&one);
                        let _ = paused.add_partition(topic, *p);
                        look = true;
                    }
                }
                since_look += 1;
                look |= since_look >= 4096;
            }
        }
    };
    if paused.count() > 0 {
        let _ = consumer.resume(&paused);
    }
    let _ = consumer.unassign();
    read
}

/// Moves each `(partition, last stable offset)` of `topic` up to where the
/// transactions committed by now end. A commit returns before the broker
/// writes its markers into the partitions, and until then the last stable
/// offset stays below the committed records: right after a producer
/// commits, a reader that stops at it would leave them out. So while a
/// partition's last stable offset (asked of `committed`, a read_committed
/// consumer) is below the log's end (asked of `uncommitted`), it is asked
/// again, for at most `wait`; a transaction still open holds it back no
/// longer than that.
pub(crate) fn settle_stable_offsets(
    committed: &BaseConsumer,
    uncommitted: &BaseConsumer,
    topic: &str,
    stable: &mut [(i32, i64)],
    wait: Duration,
    timeout: Duration,
) -> KafkaResult<()> {
    let deadline = Instant::now() + wait;
    for (partition, offset) in stable.iter_mut() {
        let (_, end) = uncommitted.fetch_watermarks(topic, *partition, timeout)?;
        while *offset < end && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            *offset = committed.fetch_watermarks(topic, *partition, timeout)?.1;
        }
    }
    Ok(())
}
