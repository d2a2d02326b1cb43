//! Batch consumption: the partitions a source reads stay assigned to one
//! consumer from epoch to epoch, each with its own librdkafka queue
//! ("lane"), so librdkafka fetches the next epoch's records while this one
//! is computed and committed. Records are taken a batch at a time
//! (`rd_kafka_consume_batch_queue`, up to [`BATCH`] messages per call) and
//! copied into contiguous buffers: nothing allocates or reads the clock per
//! message (the clock only when a wait finds nothing).
//!
//! A lane keeps what it took in chunks of at most [`CHUNK_RECORDS`] records
//! or about [`CHUNK_BYTES`] bytes, each decoded into a record batch of its
//! own. One buffer per partition and epoch grew to hundreds of megabytes
//! with 1 s epochs; allocations that large are mapped fresh from the kernel
//! and zeroed page by page every epoch (a sixth of a pass-through's CPU),
//! where chunks are reused from malloc's free lists.
//!
//! An epoch takes its records with [`Lanes::stream`], which hands each
//! chunk over as soon as it is full (a lazy read decodes it while the rest
//! arrives) and a partition's last one when its range is complete.
//!
//! A lane holds the records taken from its queue but not yet handed to an
//! epoch: `[start, next)`, where `start` is the offset the next epoch of
//! the partition begins at. An epoch planned from what a lane holds reads
//! without a word to the broker. A lane opened at other offsets (the first
//! epoch, a replay, after an error) waits on its queue for what the plan
//! asked. Lanes are opened together on a consumer of their own and never
//! re-positioned: a different start means a new consumer (rare: start-up,
//! replays, errors), because re-assigning a partition would forward its
//! queue back to the consumer's.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::CString;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{new_consumer, SourceInner};

/// Messages taken from a queue per call.
pub(super) const BATCH: usize = 4096;

/// Records per chunk a lane holds: DataFusion's batch size.
const CHUNK_RECORDS: usize = 8192;

/// Payload bytes past which a lane starts a new chunk: with the buffer's
/// doubling, a chunk stays under glibc's largest mmap threshold (32 MiB)
/// unless one message alone is bigger.
const CHUNK_BYTES: usize = 8 << 20;

/// How long one wait on a queue lasts before the position is looked at:
/// a range that ends at a transaction marker is read when the consumer's
/// position passes the marker, which brings no message to wake a wait.
const WAIT_SLICE: Duration = Duration::from_millis(5);

/// Records of one partition as taken from Kafka: keys and values back to
/// back in one buffer, and per record where they are.
#[derive(Debug, Default)]
pub(super) struct Fetched {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Option<(usize, usize)>,
    value: Option<(usize, usize)>,
    offset: i64,
    timestamp_ms: Option<i64>,
}

impl Fetched {
    /// Records of `(offset, key, value)` as a fetch would hold them, each
    /// stamped at ten times its offset (tests).
    #[cfg(test)]
    pub(super) fn of<'a>(
        records: impl IntoIterator<Item = (i64, Option<&'a [u8]>, Option<&'a [u8]>)>,
    ) -> Self {
        let mut f = Fetched::default();
        for (offset, key, value) in records {
            let mut put = |bytes: &[u8]| {
                let at = f.bytes.len();
                f.bytes.extend_from_slice(bytes);
                (at, bytes.len())
            };
            let key = key.map(&mut put);
            let value = value.map(&mut put);
            f.slots.push(Slot {
                key,
                value,
                offset,
                timestamp_ms: Some(offset * 10),
            });
        }
        f
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of keys and values.
    pub(super) fn payload_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn last_offset(&self) -> Option<i64> {
        self.slots.last().map(|s| s.offset)
    }

    fn is_full(&self) -> bool {
        self.slots.len() >= CHUNK_RECORDS || self.bytes.len() >= CHUNK_BYTES
    }

    /// Each record; a tombstone is one without a value (an empty value is
    /// a value, which a format other than `raw` finds malformed).
    pub(super) fn records(&self) -> impl Iterator<Item = Record<'_>> + '_ {
        self.slots.iter().map(move |s| {
            let value = s.value.map(|(at, len)| &self.bytes[at..at + len]);
            Record {
                key: s.key.map(|(at, len)| &self.bytes[at..at + len]),
                value: value.unwrap_or_default(),
                tombstone: value.is_none(),
                offset: s.offset,
                timestamp_ms: s.timestamp_ms,
            }
        })
    }

    fn slice(&mut self, ptr: *const std::ffi::c_void, len: usize) -> Option<(usize, usize)> {
        if ptr.is_null() {
            return None;
        }
        let at = self.bytes.len();
        // SAFETY: librdkafka guarantees `len` readable bytes at a non-null
        // key or payload pointer while the message lives.
        self.bytes
            .extend_from_slice(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) });
        Some((at, len))
    }

    /// Copies a message in.
    fn push(&mut self, m: &rd::rd_kafka_message_t) {
        let key = self.slice(m.key, m.key_len);
        let value = self.slice(m.payload, m.len);
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: `m` is a live message from librdkafka.
        let ts = unsafe { rd::rd_kafka_message_timestamp(m, &mut kind) };
        self.slots.push(Slot {
            key,
            value,
            offset: m.offset,
            timestamp_ms: (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
                .then_some(ts),
        });
    }

    /// The records at or past `offset`, removed from these.
    fn split_off(&mut self, offset: i64) -> Fetched {
        let at = self.slots.partition_point(|s| s.offset < offset);
        let slots = self.slots.split_off(at);
        let Some(first) = slots
            .iter()
            .find_map(|s| s.key.or(s.value).map(|(at, _)| at))
        else {
            return Fetched {
                bytes: Vec::new(),
                slots,
            };
        };
        let bytes = self.bytes.split_off(first);
        let shift = |r: Option<(usize, usize)>| r.map(|(at, len)| (at - first, len));
        Fetched {
            bytes,
            slots: slots
                .into_iter()
                .map(|s| Slot {
                    key: shift(s.key),
                    value: shift(s.value),
                    ..s
                })
                .collect(),
        }
    }
}

/// What an epoch read: each partition's records, in chunks.
pub(super) type Taken = Vec<(i32, Vec<Fetched>)>;

/// What a lane took and has not handed over, oldest first, in chunks.
#[derive(Debug, Default)]
struct Held {
    chunks: VecDeque<Fetched>,
    /// (records, payload bytes) of the last chunk that filled: a new
    /// chunk is given that much (and an eighth more, the bytes at most
    /// [`CHUNK_BYTES`]'s worth) at once, instead of growing by doubling,
    /// which copied each chunk's bytes twice over on average and touched
    /// twice the memory.
    full: (usize, usize),
}

impl Held {
    /// Records held.
    fn len(&self) -> usize {
        self.chunks.iter().map(Fetched::len).sum()
    }

    /// Copies a message in, at the end.
    fn push(&mut self, m: &rd::rd_kafka_message_t) {
        if self.chunks.back().is_none_or(Fetched::is_full) {
            if let Some(full) = self.chunks.back() {
                self.full = (full.len(), full.payload_bytes());
            }
            let (records, bytes) = (self.full.0, self.full.1.min(CHUNK_BYTES));
            self.chunks.push_back(Fetched {
                bytes: Vec::with_capacity(bytes + bytes / 8),
                slots: Vec::with_capacity(records),
            });
        }
        if let Some(last) = self.chunks.back_mut() {
            last.push(m);
        }
    }

    /// The full chunks whose records are all below `offset`, removed from
    /// these: what can be handed over before the range is complete.
    fn take_full_below(&mut self, offset: i64) -> Vec<Fetched> {
        let mut taken = Vec::new();
        while self
            .chunks
            .front()
            .is_some_and(|c| c.is_full() && c.last_offset().is_some_and(|last| last < offset))
        {
            taken.extend(self.chunks.pop_front());
        }
        taken
    }

    /// The chunks of records below `offset`, removed from these; only the
    /// chunk that straddles `offset` is split (its records past it copied).
    fn take_below(&mut self, offset: i64) -> Vec<Fetched> {
        let mut taken = Vec::new();
        while let Some(mut chunk) = self.chunks.pop_front() {
            if chunk.last_offset().is_some_and(|last| last < offset) {
                taken.push(chunk);
                continue;
            }
            let rest = chunk.split_off(offset);
            if chunk.len() > 0 {
                taken.push(chunk);
            }
            if rest.len() > 0 {
                self.chunks.push_front(rest);
            }
            break;
        }
        taken
    }
}

/// What a lane could not read.
#[derive(Debug)]
pub(super) enum LaneError {
    /// The range starts where the partition has no records any more.
    OutOfRange,
    /// Nothing arrived for the stall time; the last error the queue
    /// reported, if any.
    Stalled(Option<String>),
}

/// One partition's queue and what was taken from it.
struct Lane {
    queue: NonNull<rd::rd_kafka_queue_t>,
    start: i64,
    next: i64,
    held: Held,
    /// The last error the queue reported.
    error: Option<KafkaError>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        // SAFETY: the queue came from `rd_kafka_queue_get_partition` and is
        // destroyed once, before the consumer (see `Lanes`' field order).
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// The partitions one source reads, each a [`Lane`], on a consumer of
/// their own.
pub(super) struct Lanes {
    // Dropped before the consumer their queues belong to.
    lanes: BTreeMap<i32, Lane>,
    consumer: BaseConsumer,
    topic: CString,
    topic_name: String,
    /// Messages taken per call, reused.
    batch: Vec<*mut rd::rd_kafka_message_t>,
}

// SAFETY: librdkafka's queues and messages are thread-safe; a `Lanes` is
// used by one thread at a time (behind the source's mutex).
unsafe impl Send for Lanes {}

impl Lanes {
    /// Assigns `starts` (partition → first offset) of `topic` to
    /// `consumer`, each partition on a queue of its own.
    pub(super) fn open(
        consumer: BaseConsumer,
        topic: &str,
        starts: &BTreeMap<i32, i64>,
    ) -> Result<Lanes, String> {
        let c_topic = CString::new(topic).map_err(|e| e.to_string())?;
        let mut lanes = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for (&p, &start) in starts {
            // SAFETY: a live consumer and a NUL-terminated topic name.
            let queue = unsafe {
                rd::rd_kafka_queue_get_partition(
                    consumer.client().native_ptr(),
                    c_topic.as_ptr(),
                    p,
                )
            };
            let queue = NonNull::new(queue)
                .ok_or_else(|| format!("no queue for partition {p} of topic '{topic}'"))?;
            // SAFETY: stop forwarding to the consumer's queue before the
            // partition is assigned, so that its records come here.
            unsafe { rd::rd_kafka_queue_forward(queue.as_ptr(), std::ptr::null_mut()) };
            lanes.insert(
                p,
                Lane {
                    queue,
                    start,
                    next: start,
                    held: Held::default(),
                    error: None,
                },
            );
            assignment
                .add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(|e| e.to_string())?;
        }
        consumer.assign(&assignment).map_err(|e| e.to_string())?;
        Ok(Lanes {
            lanes,
            consumer,
            topic: c_topic,
            topic_name: topic.to_string(),
            batch: vec![std::ptr::null_mut(); BATCH],
        })
    }

    /// True when each partition of `starts` has a lane holding from its
    /// start.
    pub(super) fn at(&self, starts: &BTreeMap<i32, i64>) -> bool {
        starts
            .iter()
            .all(|(p, s)| self.lanes.get(p).is_some_and(|l| l.start == *s))
    }

    /// How many partitions have a lane.
    pub(super) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Takes what has arrived for each partition, without waiting, until
    /// it holds `most` records; returns per partition where what it holds
    /// ends: after the last record, or past the transaction markers that
    /// followed it (so that an epoch ends where the log does).
    pub(super) fn drain(&mut self, most: usize) -> Result<BTreeMap<i32, i64>, LaneError> {
        self.serve_events();
        let partitions: Vec<i32> = self.lanes.keys().copied().collect();
        for &p in &partitions {
            loop {
                let lane = &self.lanes[&p];
                let want = most.saturating_sub(lane.held.len()).min(BATCH);
                if want == 0 || self.take_batch(p, want, Duration::ZERO)? < want {
                    break;
                }
            }
        }
        // Between the last record taken and the position there are only
        // markers and aborted records: nothing to hold.
        let positions = self.positions();
        Ok(self
            .lanes
            .iter_mut()
            .map(|(&p, lane)| {
                if let Some(&pos) = positions.get(&p) {
                    lane.next = lane.next.max(pos);
                }
                (p, lane.next)
            })
            .collect())
    }

    /// Hands over the records below `ends` (partition → end) chunk by
    /// chunk as they arrive, each to `hand`: a chunk as soon as it is
    /// full, a partition's last one when its range is complete. Waits for
    /// what has not arrived, and fails after `stall` without progress.
    /// Returns false when `hand` wanted no more (then the lanes stand
    /// mid-range: the caller drops them).
    pub(super) fn stream(
        &mut self,
        ends: &BTreeMap<i32, i64>,
        stall: Duration,
        mut hand: impl FnMut(i32, Fetched) -> bool,
    ) -> Result<bool, LaneError> {
        if let Some(p) = ends.keys().find(|p| !self.lanes.contains_key(p)) {
            return Err(LaneError::Stalled(Some(format!(
                "partition {p} is not assigned"
            ))));
        }
        let mut open: Vec<(i32, i64)> = ends.iter().map(|(&p, &to)| (p, to)).collect();
        let mut last_progress: Option<Instant> = None;
        while !open.is_empty() {
            let mut progressed = false;
            let mut positions = None;
            let mut i = 0;
            while i < open.len() {
                let (p, to) = open[i];
                while self.lanes[&p].next < to {
                    let want = usize::try_from(to - self.lanes[&p].next)
                        .unwrap_or(BATCH)
                        .min(BATCH);
                    let got = self.take_batch(p, want, Duration::ZERO)?;
                    progressed |= got > 0;
                    if got < want {
                        break;
                    }
                }
                // Transaction markers and aborted records move the position
                // without a message.
                let done = self.lanes[&p].next >= to
                    || positions
                        .get_or_insert_with(|| self.positions())
                        .get(&p)
                        .is_some_and(|&pos| pos >= to);
                let Some(lane) = self.lanes.get_mut(&p) else {
                    return Err(LaneError::Stalled(None));
                };
                let chunks = if done {
                    lane.start = to;
                    lane.next = lane.next.max(to);
                    open.swap_remove(i);
                    progressed = true;
                    lane.held.take_below(to)
                } else {
                    i += 1;
                    lane.held.take_full_below(to)
                };
                for chunk in chunks {
                    if !hand(p, chunk) {
                        return Ok(false);
                    }
                }
            }
            if progressed {
                last_progress = None;
                continue;
            }
            if let Some(&(p, _)) = open.first() {
                if self.take_batch(p, 1, WAIT_SLICE)? > 0 {
                    continue;
                }
            }
            self.serve_events();
            if last_progress.get_or_insert_with(Instant::now).elapsed() > stall {
                let error = open
                    .iter()
                    .find_map(|(p, _)| self.lanes[p].error.as_ref())
                    .map(|e| e.to_string());
                return Err(LaneError::Stalled(error));
            }
        }
        Ok(true)
    }

    /// Per partition, how many offsets are left past `ends`: from the end
    /// of the log as the last fetch response said (the high watermark:
    /// librdkafka keeps no other), without asking.
    pub(super) fn lag(&self, ends: &BTreeMap<i32, i64>) -> BTreeMap<i32, i64> {
        ends.iter()
            .filter_map(|(&p, &end)| {
                let (mut low, mut high) = (-1i64, -1i64);
                // SAFETY: a live consumer, a NUL-terminated topic name.
                let err = unsafe {
                    rd::rd_kafka_get_watermark_offsets(
                        self.consumer.client().native_ptr(),
                        self.topic.as_ptr(),
                        p,
                        &mut low,
                        &mut high,
                    )
                };
                (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
                    .then_some((p, (high - end).max(0)))
            })
            .collect()
    }

    /// Takes up to `want` messages of partition `p`, waiting at most
    /// `wait` for them; returns how many it took.
    fn take_batch(&mut self, p: i32, want: usize, wait: Duration) -> Result<usize, LaneError> {
        let Some(lane) = self.lanes.get_mut(&p) else {
            return Ok(0);
        };
        let want = want.min(self.batch.len());
        // SAFETY: `batch` has room for `want` pointers; the queue is live.
        let got = unsafe {
            rd::rd_kafka_consume_batch_queue(
                lane.queue.as_ptr(),
                wait.as_millis() as i32,
                self.batch.as_mut_ptr(),
                want,
            )
        };
        let got = usize::try_from(got).unwrap_or(0);
        let mut taken = 0;
        let mut out_of_range = false;
        for &m in &self.batch[..got] {
            // SAFETY: librdkafka returned `got` live messages, each
            // destroyed once, here, after it was copied.
            let message = unsafe { &*m };
            if message.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                if message.offset >= lane.next {
                    lane.held.push(message);
                    lane.next = message.offset + 1;
                    taken += 1;
                }
            } else {
                let code = RDKafkaErrorCode::from(message.err);
                out_of_range |= matches!(
                    code,
                    RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange
                );
                lane.error = Some(KafkaError::MessageConsumption(code));
            }
            unsafe { rd::rd_kafka_message_destroy(m) };
        }
        if out_of_range {
            return Err(LaneError::OutOfRange);
        }
        Ok(taken)
    }

    /// The consumer's position on each partition, past any markers.
    fn positions(&self) -> BTreeMap<i32, i64> {
        let Ok(positions) = self.consumer.position() else {
            return BTreeMap::new();
        };
        positions
            .elements_for_topic(&self.topic_name)
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect()
    }

    /// Errors and logs go to the consumer's own queue: serve them so they
    /// are reported and do not pile up.
    fn serve_events(&self) {
        while let Some(event) = self.consumer.poll(Duration::ZERO) {
            if let Err(e) = event {
                tracing::debug!(topic = %self.topic_name, error = %e, "kafka source consumer");
            }
        }
    }
}

/// A record as read, before decoding: borrowed from the buffer its
/// partition's records were copied into.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// No value (for formats other than `raw` also an empty one): a
    /// key's deletion; only an upsert stream keeps such records.
    pub tombstone: bool,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

impl SourceInner {
    /// Makes the lanes stand at `starts`: kept when they do, else opened
    /// there on a new consumer.
    pub(super) fn lanes_at(&self, starts: &BTreeMap<i32, i64>) -> sluice_engine::Result<()> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if lanes.as_ref().is_some_and(|l| l.at(starts)) {
            return Ok(());
        }
        // The old consumer goes first: two would fetch the same partitions.
        *lanes = None;
        let consumer = new_consumer(&self.config)?;
        *lanes = Some(
            Lanes::open(consumer, &self.config.topic, starts)
                .map_err(|e| self.unreachable("assigning partitions", e))?,
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of `(offset, value)`, a key on every other one.
    fn fetched(records: &[(i64, Option<&str>)]) -> Fetched {
        let keys: Vec<String> = records.iter().map(|(o, _)| format!("k{o}")).collect();
        Fetched::of(
            records
                .iter()
                .zip(&keys)
                .enumerate()
                .map(|(i, ((o, v), k))| {
                    let key = (i % 2 == 0).then_some(k.as_bytes());
                    (*o, key, v.map(str::as_bytes))
                }),
        )
    }

    fn seen(f: &Fetched) -> Vec<(i64, Option<String>, String, bool)> {
        f.records()
            .map(|r| {
                let key = r.key.map(|k| String::from_utf8_lossy(k).into_owned());
                let value = String::from_utf8_lossy(r.value).into_owned();
                (r.offset, key, value, r.tombstone)
            })
            .collect()
    }

    fn offsets(chunks: &[Fetched]) -> Vec<Vec<i64>> {
        chunks
            .iter()
            .map(|c| c.records().map(|r| r.offset).collect())
            .collect()
    }

    #[test]
    fn take_below_hands_over_whole_chunks_and_splits_only_the_straddling_one() {
        let mut held = Held {
            chunks: VecDeque::from([
                fetched(&[(0, Some("a")), (1, Some("b"))]),
                fetched(&[(2, Some("c")), (3, Some("d")), (5, Some("f"))]),
                fetched(&[(6, Some("g"))]),
            ]),
            ..Held::default()
        };
        // Offset 4 (a marker) falls inside the second chunk.
        let taken = held.take_below(4);
        assert_eq!(offsets(&taken), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(held.len(), 2);
        assert_eq!(
            offsets(held.chunks.make_contiguous()),
            vec![vec![5], vec![6]]
        );
        // The straddled chunk's rest kept its bytes.
        assert_eq!(
            seen(&held.chunks[0]),
            vec![(5, Some("k5".into()), "f".into(), false)]
        );
        // A boundary between chunks splits nothing; below everything takes nothing.
        assert_eq!(offsets(&held.take_below(6)), vec![vec![5]]);
        assert!(held.take_below(6).is_empty());
        assert_eq!(offsets(&held.take_below(100)), vec![vec![6]]);
        assert_eq!((held.len(), held.chunks.len()), (0, 0));
    }

    #[test]
    fn take_full_below_hands_over_only_full_chunks_wholly_inside_the_range() {
        let full = |first: i64| {
            let values: Vec<(i64, Option<&str>)> = (first..first + CHUNK_RECORDS as i64)
                .map(|o| (o, Some("v")))
                .collect();
            fetched(&values)
        };
        let n = CHUNK_RECORDS as i64;
        let mut held = Held {
            chunks: VecDeque::from([full(0), full(n), fetched(&[(2 * n, Some("x"))])]),
            ..Held::default()
        };
        // The range ends inside the second chunk: only the first goes.
        assert_eq!(held.take_full_below(n + 1).len(), 1);
        // The filling chunk stays until the range is complete.
        let taken = held.take_full_below(3 * n);
        assert_eq!(offsets(&taken).concat(), (n..2 * n).collect::<Vec<_>>());
        assert!(held.take_full_below(3 * n).is_empty());
        assert_eq!(offsets(&held.take_below(3 * n)), vec![vec![2 * n]]);
    }

    #[test]
    fn split_off_keeps_each_side_whole_across_gaps_and_tombstones() {
        // Offsets 13 and 14 are a transaction marker and an aborted record.
        let mut f = fetched(&[(10, Some("a")), (11, None), (12, Some("")), (15, Some("d"))]);
        assert_eq!(f.payload_bytes(), "k10ak12d".len());
        let rest = f.split_off(13);
        assert_eq!(
            seen(&f),
            vec![
                (10, Some("k10".into()), "a".into(), false),
                (11, None, "".into(), true),
                (12, Some("k12".into()), "".into(), false),
            ]
        );
        assert_eq!(seen(&rest), vec![(15, None, "d".into(), false)]);
        let first = rest.records().next().map(|r| r.timestamp_ms);
        assert_eq!(first, Some(Some(150)));
        // Nothing at or past the offset: an empty rest, the records intact.
        let mut g = fetched(&[(1, Some("x"))]);
        assert_eq!(g.split_off(2).len(), 0);
        assert_eq!(seen(&g), vec![(1, Some("k1".into()), "x".into(), false)]);
        // Everything past it: all of them move.
        let moved = g.split_off(0);
        assert_eq!((g.len(), g.payload_bytes()), (0, 0));
        assert_eq!(
            seen(&moved),
            vec![(1, Some("k1".into()), "x".into(), false)]
        );
    }
}
