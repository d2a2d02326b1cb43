//! Planning an epoch's offset ranges: where each partition starts (the
//! startup mode, resolved once per run), where it ends (what has arrived
//! below the last stable offset, within the epoch's caps), and what to do
//! when the records a plan would start at are gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use sluice_engine::Result;

use super::config::StartupMode;
use super::{PlannedRanges, SourceInner};
use crate::client::Role;

/// Each partition of `marks` (low watermark, last stable offset) at the
/// offset Kafka `found` for it, moved into its range; `missing(partition,
/// low, high)` where Kafka has none.
fn found_positions(
    found: &TopicPartitionList,
    topic: &str,
    marks: &BTreeMap<i32, (i64, i64)>,
    missing: impl Fn(i32, i64, i64) -> i64,
) -> BTreeMap<i32, i64> {
    marks
        .iter()
        .map(|(&p, &(low, high))| {
            let pos = match found.find_partition(topic, p).map(|e| e.offset()) {
                Some(KafkaOffset::Offset(o)) => o.clamp(low, high),
                _ => missing(p, low, high),
            };
            (p, pos)
        })
        .collect()
}

impl SourceInner {
    /// Where each partition of `marks` (low watermark, last stable offset)
    /// starts under the startup mode, within the partition's range.
    pub(super) fn startup_positions(
        &self,
        marks: &BTreeMap<i32, (i64, i64)>,
    ) -> Result<BTreeMap<i32, i64>> {
        let topic = &self.config.topic;
        Ok(match &self.config.startup {
            StartupMode::Earliest => marks.iter().map(|(p, (low, _))| (*p, *low)).collect(),
            StartupMode::Latest => marks.iter().map(|(p, (_, high))| (*p, *high)).collect(),
            StartupMode::Offsets(given) => marks
                .iter()
                .map(|(p, (low, high))| {
                    (*p, given.get(p).map_or(*low, |o| (*o).clamp(*low, *high)))
                })
                .collect(),
            StartupMode::GroupOffsets(group) => {
                let mut config = self.config.client.config(Role::Consumer);
                config
                    .set("group.id", group)
                    .set("enable.auto.commit", "false");
                let consumer: BaseConsumer = self
                    .config
                    .client
                    .create(&config, &format!("consumer group '{group}'"))?;
                let mut query = TopicPartitionList::new();
                for p in marks.keys() {
                    query.add_partition(topic, *p);
                }
                let committed = consumer
                    .committed_offsets(query, self.config.client.timeout())
                    .map_err(|e| {
                        self.unreachable(&format!("reading the offsets of group '{group}'"), e)
                    })?;
                // Never committed by the group: from the beginning, so
                // nothing is skipped.
                found_positions(&committed, topic, marks, |p, low, _| {
                    tracing::info!(
                        topic = %topic, partition = p, group = %group,
                        "the group has no offset for this partition; reading it from the \
                         beginning"
                    );
                    low
                })
            }
            StartupMode::Timestamp(ms) => {
                let mut query = TopicPartitionList::new();
                for p in marks.keys() {
                    query
                        .add_partition_offset(topic, *p, KafkaOffset::Offset(*ms))
                        .map_err(|e| self.unreachable("looking up offsets by time", e))?;
                }
                let found = self
                    .consumer()?
                    .offsets_for_times(query, self.config.client.timeout())
                    .map_err(|e| self.unreachable("looking up offsets by time", e))?;
                // No record at or after the time: start at the end.
                found_positions(&found, topic, marks, |_, _, high| high)
            }
        })
    }

    /// The epoch's cap in records per partition: the smaller of the record
    /// cap and the byte cap at the average record size read so far, shared
    /// evenly by `partitions`.
    pub(super) fn share(&self, partitions: usize) -> i64 {
        let per_record = *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let by_bytes = per_record.map_or(u64::MAX, |b| (self.config.max_bytes as f64 / b) as u64);
        let with_data = partitions.max(1) as u64;
        (self.config.max_records.min(by_bytes) / with_data).max(1) as i64
    }

    pub(super) fn plan(
        self: &Arc<Self>,
        start: Option<PlannedRanges>,
    ) -> Result<Option<PlannedRanges>> {
        let positions: BTreeMap<i32, i64> = start
            .map(|s| s.ranges.into_iter().map(|(p, (_, to))| (p, to)).collect())
            .unwrap_or_default();
        if let Some(plan) = self.plan_fetched(&positions)? {
            return Ok(plan);
        }
        let marks = self.watermarks()?;
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut initial = self.initial.lock().unwrap_or_else(|p| p.into_inner());
        if positions.is_empty() && initial.is_empty() {
            // Fixed at first sight, so 'latest' is resolved once per run.
            *initial = self.startup_positions(&marks)?;
        }
        let share = Some(self.share(marks.len()));
        let mut ranges = BTreeMap::new();
        let mut lag = BTreeMap::new();
        let mut any = false;
        for (&p, &pos) in &positions {
            if !marks.contains_key(&p) {
                self.data_loss(
                    p,
                    pos,
                    pos,
                    "cannot be read: the partition is gone (the topic was deleted and \
                     recreated with fewer partitions)",
                )?;
            }
        }
        for (&p, &(low, high)) in &marks {
            let from = match positions.get(&p) {
                Some(&pos) if pos < low => {
                    self.data_loss(
                        p,
                        pos,
                        low,
                        "were deleted (retention or delete_records) before the query read them",
                    )?;
                    low
                }
                Some(&pos) if pos > high => {
                    // The log ends before where the query had read to.
                    self.data_loss(
                        p,
                        high,
                        pos,
                        &format!(
                            "are gone: the query had read up to {pos} but the partition now \
                             ends at {high} (the topic was deleted and recreated, or its log \
                             truncated); going on would skip whatever the new log holds below \
                             {pos}"
                        ),
                    )?;
                    // Skipped: start over at the new log's beginning.
                    low
                }
                Some(&pos) => pos,
                // A partition added after the start is read from its
                // beginning.
                None => *initial.entry(p).or_insert(low),
            };
            let mut to = high.max(from);
            if let Some(share) = share {
                to = to.min(from + share);
            }
            if let Some(c) = cap.as_ref().and_then(|c| c.get(&p)) {
                to = to.min(*c).max(from);
            }
            any |= to > from;
            ranges.insert(p, (from, to));
            lag.insert(p.to_string(), (high - to).max(0));
        }
        *self.lag.lock().unwrap_or_else(|p| p.into_inner()) = lag;
        drop(initial);
        // Fetching starts now, for this epoch and the next ones.
        let starts = ranges.iter().map(|(&p, &(from, _))| (p, from)).collect();
        self.lanes_at(&starts)?;
        Ok(any.then_some(PlannedRanges { ranges }))
    }

    /// The plan without a word to the broker, when the lanes stand where
    /// the epoch starts: up to each partition's share of what has arrived
    /// (or, for `available-now`, of what is below where it stops). `None`
    /// when the broker must be asked: nothing was planned yet, the
    /// partitions changed, the lanes are elsewhere (a replay) or failed.
    pub(super) fn plan_fetched(
        self: &Arc<Self>,
        positions: &BTreeMap<i32, i64>,
    ) -> Result<Option<Option<PlannedRanges>>> {
        let partitions = self.known_partitions()?;
        let starts: Option<BTreeMap<i32, i64>> = {
            let initial = self.initial.lock().unwrap_or_else(|p| p.into_inner());
            if initial.is_empty() && positions.is_empty() {
                return Ok(None);
            }
            partitions
                .iter()
                .map(|&p| Some((p, *positions.get(&p).or_else(|| initial.get(&p))?)))
                .collect()
        };
        // A partition read before but gone from the metadata is data loss,
        // which the broker's offsets tell.
        let Some(starts) = starts.filter(|s| positions.keys().all(|p| s.contains_key(p))) else {
            return Ok(None);
        };
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = lanes
            .as_mut()
            .filter(|l| l.at(&starts) && l.len() == starts.len())
        else {
            return Ok(None);
        };
        let share = self.share(starts.len());
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ends = match &cap {
            // Everything below the cap is there to be read.
            Some(cap) => starts
                .iter()
                .map(|(&p, &from)| {
                    (
                        p,
                        cap.get(&p).map_or(from, |&c| c.min(from + share).max(from)),
                    )
                })
                .collect(),
            None => match held.drain(share as usize) {
                Ok(ends) => ends,
                // What went wrong is found out by asking the broker.
                Err(_) => {
                    *lanes = None;
                    return Ok(None);
                }
            },
        };
        let ranges: BTreeMap<i32, (i64, i64)> = starts
            .iter()
            .map(|(&p, &from)| (p, (from, ends.get(&p).copied().unwrap_or(from))))
            .collect();
        let ends = ranges.iter().map(|(&p, &(_, to))| (p, to)).collect();
        *self.lag.lock().unwrap_or_else(|p| p.into_inner()) = held
            .lag(&ends)
            .into_iter()
            .map(|(p, lag)| (p.to_string(), lag))
            .collect();
        let any = ranges.values().any(|(from, to)| to > from);
        Ok(Some(any.then_some(PlannedRanges { ranges })))
    }
}
