//! An epoch's input: its plan (each source's range, from the offsets the
//! sources report) and what is read over it.
//!
//! Reading ahead: with epochs back to back, while the sources' lag holds
//! two more epochs as large as N (the query is behind), and with
//! `available-now` while any of its backlog is left, epoch N+1 is planned
//! and read while N's output is being written and committed: the sink
//! waits on the broker then, and the sources' fetching and decoding fill
//! that wait, as a copy loop overlaps its reads and writes. Nothing of N+1
//! is written meanwhile; its plan goes to `offsets/N+1` once N is
//! committed, before N+1 computes, and if N fails the read is dropped.
//! Caught up, the next epoch is planned after the commit, so that it takes
//! what arrived during it. `SET 'epoch.read-ahead' = 'false'` turns this
//! off.
//!
//! Pipelining: an input without a watermark that one scan reads is read
//! lazily where its source can ([`crate::Source::read_lazily`]): the plan pulls
//! its batches as they are read and decoded, and an appending statement's
//! output goes to a sink that [sends ahead](crate::Sink::send_ahead) as it
//! is computed, so one epoch's reading, computing and writing overlap as
//! a copy loop's do. Such an input's rows, and what its source rejected,
//! are counted once the plan has run ([`EpochLoop::settle`]). Sources
//! and sinks decide whether they take part.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::EpochLoop;
use crate::checkpoint::{OffsetRecord, SourceRange};
use crate::error::{Result, SluiceError};
use crate::fail_point::fail_point;
use crate::planner::Input;
use crate::progress::{millis as ms, SourceProgress};
use crate::source::{DeadLetter, GroupOffsets, LazyPartition, Offset};
use crate::table::EpochInput;
use crate::trigger::Trigger;

use futures::{StreamExt, TryStreamExt};

impl EpochLoop {
    /// Every statement's inputs, in order.
    pub(super) fn inputs(&self) -> impl Iterator<Item = &Input> {
        self.statements.iter().flat_map(|s| &s.plan.inputs)
    }

    /// Epoch `epoch`'s plan: `replay`, the one recovery found written, or
    /// a new one from `positions`, written before it returns. `None` when
    /// no source has new data.
    pub(super) async fn plan_or_replay(
        &self,
        epoch: u64,
        positions: &BTreeMap<String, Offset>,
        replay: Option<OffsetRecord>,
    ) -> Result<Option<Planned>> {
        let started = Instant::now();
        let record = match replay {
            Some(record) => record,
            None => {
                let Some(record) = self.plan_epoch(epoch, positions).await? else {
                    return Ok(None);
                };
                self.write_plan(&record)?;
                record
            }
        };
        Ok(Some(Planned {
            record,
            read: None,
            started,
            plan_ms: ms(started.elapsed()),
        }))
    }

    /// Writes the epoch's plan, `offsets/N`: from here on a restart re-runs
    /// the epoch over exactly these ranges.
    pub(super) fn write_plan(&self, record: &OffsetRecord) -> Result<()> {
        self.checkpoint.write_offsets(record)?;
        fail_point("after-offsets", record.epoch);
        Ok(())
    }

    /// Asks every source for its latest offset; returns the epoch's plan,
    /// or `None` when no source has new data. The plan is not written:
    /// [`write_plan`](Self::write_plan) does that before the epoch computes.
    pub(super) async fn plan_epoch(
        &self,
        epoch: u64,
        positions: &BTreeMap<String, Offset>,
    ) -> Result<Option<OffsetRecord>> {
        let mut sources = BTreeMap::new();
        let mut any_new = false;
        for input in self.inputs() {
            let start = positions.get(&input.key).cloned();
            let end = match input.source.latest_offset(start.as_ref()).await? {
                Some(end) => {
                    any_new = true;
                    end
                }
                // No new rows: an empty range (`null` before the first data).
                None => start.clone().unwrap_or(Offset::Null),
            };
            sources.insert(input.key.clone(), SourceRange { start, end });
        }
        if !any_new {
            return Ok(None);
        }
        Ok(Some(OffsetRecord {
            epoch,
            planned_at_ms: chrono::Utc::now().timestamp_millis(),
            sources,
        }))
    }

    /// Whether the loop plans and reads the next epoch while the current
    /// one commits (see the module's notes): with epochs back to back or
    /// `available-now`, unless `'epoch.read-ahead' = 'false'`. With a
    /// trigger interval the next epoch is planned at its tick, not before.
    pub(super) fn prefetches(&self) -> bool {
        self.read_ahead
            && matches!(
                self.trigger,
                Trigger::AvailableNow | Trigger::ProcessingTime(Duration::ZERO)
            )
            && !self.shared.stop_requested(self.slot)
    }

    /// Whether to read the next epoch ahead, after an epoch of
    /// `input_rows` whose sources report `sources`' lag: only while
    /// behind, with at least two more epochs as large as this one waiting.
    /// Their records are there already, so planning the next one now
    /// delays none of them. Caught up, an epoch planned now would leave
    /// out what arrives during this commit (back to back, reading ahead on
    /// any lag added 14 ms to the p99 latency at 10 K records/s; with one
    /// epoch's lag, 6 ms at 100 K/s, where what a fetch has in flight is
    /// about an epoch). An `available-now` backlog is fixed, nothing
    /// arriving later joins it: any of it left is read ahead.
    pub(super) fn behind(&self, sources: &[SourceProgress], input_rows: u64) -> bool {
        let lag: i64 = sources.iter().flat_map(|s| s.lag.values()).sum();
        lag > 0 && (self.trigger == Trigger::AvailableNow || lag.unsigned_abs() >= 2 * input_rows)
    }

    /// Plans epoch `epoch` from `positions` and reads its input, while the
    /// epoch before it commits; nothing is written (see the module's notes).
    pub(super) async fn prefetch(
        &self,
        epoch: u64,
        positions: &BTreeMap<String, Offset>,
    ) -> Result<Option<Planned>> {
        let started = Instant::now();
        let Some(record) = self.plan_epoch(epoch, positions).await? else {
            return Ok(None);
        };
        let plan_ms = ms(started.elapsed());
        let read = self.read_epoch(&record).await?;
        Ok(Some(Planned {
            record,
            read: Some(read),
            started,
            plan_ms,
        }))
    }

    /// Reads every statement's inputs over the ranges of `record`.
    pub(super) async fn read_epoch(&self, record: &OffsetRecord) -> Result<EpochRead> {
        let epoch = record.epoch;
        let t = Instant::now();
        let mut read = EpochRead {
            inputs: Vec::with_capacity(self.statements.len()),
            sources: Vec::new(),
            rows: 0,
            late_rows: 0,
            lazy: Vec::new(),
            group_offsets: Vec::new(),
            ms: 0.0,
        };
        for statement in &self.statements {
            let mut inputs = Vec::with_capacity(statement.plan.inputs.len());
            for (index, input) in statement.plan.inputs.iter().enumerate() {
                let range = record.sources.get(&input.key).ok_or_else(|| {
                    SluiceError::Internal(format!("offsets/{epoch} has no range for {}", input.key))
                })?;
                let empty = range.end.is_null() || range.start.as_ref() == Some(&range.end);
                // An input without a watermark can be generated while the
                // plan runs; one with a watermark must be seen whole first,
                // and one that several scans read must be kept for all.
                let whole = statement.plan.watermarks.tracks(index)
                    || input.scans > 1
                    || input.table.computes();
                let lazy = match empty
                    || whole
                    || !self.pipelining.applies(input.source.pipelines_by_default())
                {
                    true => None,
                    false => input.source.read_lazily(range.start.as_ref(), &range.end)?,
                };
                let (rows, batches) = match lazy {
                    Some(partitions) => {
                        let counted = Arc::new(AtomicU64::new(0));
                        read.lazy.push((read.sources.len(), Arc::clone(&counted)));
                        (0, EpochInput::Lazy(counting(partitions, counted)))
                    }
                    None => {
                        let (partitions, ids) = if empty {
                            (Vec::new(), None)
                        } else {
                            let (start, end) = (range.start.as_ref(), &range.end);
                            let read = input.source.read(start, end).await?;
                            let ids = input.source.partition_ids(start, end)?;
                            (input.table.compute(read)?, ids)
                        };
                        let rows = partitions.iter().flatten().map(|b| b.num_rows() as u64);
                        (rows.sum(), EpochInput::Read(partitions, ids))
                    }
                };
                read.rows += rows;
                inputs.push(batches);
                read.sources.push(SourceProgress {
                    description: input.description.clone(),
                    start_offset: range.start.clone(),
                    end_offset: range.end.clone(),
                    num_input_rows: rows,
                    skipped_records: 0,
                    lost_records: 0,
                    dead_lettered_records: 0,
                    lag: input.source.lag(),
                });
                if let Some(offsets) = (!empty)
                    .then(|| input.source.group_offsets(&range.end))
                    .flatten()
                {
                    merge_group_offsets(&mut read.group_offsets, offsets);
                }
            }
            read.inputs.push(inputs);
        }
        read.ms = ms(t.elapsed());
        Ok(read)
    }

    /// Settles what `read` can tell only once the epoch's plans have run
    /// over its input: the rows of inputs read lazily, and what every
    /// source could not decode (counted in its progress). Returns the
    /// records to dead-letter, each once: statements of a set reading the
    /// same stream reject the same records.
    pub(super) fn settle(&self, read: &mut EpochRead) -> Vec<DeadLetter> {
        for (at, counted) in read.lazy.drain(..) {
            let rows = counted.load(Ordering::Relaxed);
            read.sources[at].num_input_rows = rows;
            read.rows += rows;
        }
        let mut dead_letters = Vec::new();
        let mut dead_lettered = std::collections::HashSet::new();
        for (input, progress) in self.inputs().zip(&mut read.sources) {
            let rejected = input.source.take_rejected();
            progress.skipped_records = rejected.skipped;
            progress.lost_records = rejected.lost;
            progress.dead_lettered_records = rejected.dead_letters.len() as u64;
            for letter in rejected.dead_letters {
                if dead_lettered.insert(letter.clone()) {
                    dead_letters.push(letter);
                }
            }
        }
        dead_letters
    }
}

/// `partitions`, adding the rows of each batch they yield to `counted`.
fn counting(partitions: Vec<LazyPartition>, counted: Arc<AtomicU64>) -> Vec<LazyPartition> {
    partitions
        .into_iter()
        .map(|p| {
            let counted = Arc::clone(&counted);
            p.inspect_ok(move |b| {
                counted.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            })
            .boxed()
        })
        .collect()
}

/// An epoch's input, read from its sources.
pub(super) struct EpochRead {
    /// Each statement's inputs, in order.
    pub(super) inputs: Vec<Vec<EpochInput>>,
    /// Each input's progress, in the same order; rows, rejected records
    /// and dead letters are known once [`EpochLoop::settle`] has run.
    pub(super) sources: Vec<SourceProgress>,
    pub(super) rows: u64,
    /// Rows behind the watermark, dropped when the input was admitted.
    pub(super) late_rows: u64,
    /// Inputs read lazily (their index in `sources`) and their rows so far.
    lazy: Vec<(usize, Arc<AtomicU64>)>,
    pub(super) group_offsets: Vec<GroupOffsets>,
    /// How long reading took.
    pub(super) ms: f64,
}

/// An epoch planned (or replayed) and not yet run. Read ahead, it holds
/// its input, read while the epoch before it committed, and its plan is
/// written only once that commit is done.
pub(super) struct Planned {
    pub(super) record: OffsetRecord,
    pub(super) read: Option<EpochRead>,
    /// When its planning began, and how long it took.
    pub(super) started: Instant,
    pub(super) plan_ms: f64,
}

/// Adds `new` to `all`: statements of a set reading the same topic for the
/// same consumer group report one position per partition, the lowest (the
/// group has consumed no further than every statement).
fn merge_group_offsets(all: &mut Vec<GroupOffsets>, new: GroupOffsets) {
    match all
        .iter_mut()
        .find(|g| g.group == new.group && g.topic == new.topic)
    {
        Some(g) => {
            for (partition, offset) in new.offsets {
                let at = g.offsets.entry(partition).or_insert(offset);
                *at = (*at).min(offset);
            }
        }
        None => all.push(new),
    }
}

/// Moves each source's position to the end of its range in `record`. A
/// source that has had no data yet (end `null`) keeps no position, so it is
/// next asked from its beginning.
pub(super) fn advance(positions: &mut BTreeMap<String, Offset>, record: OffsetRecord) {
    for (key, range) in record.sources {
        if !range.end.is_null() {
            positions.insert(key, range.end);
        }
    }
}
