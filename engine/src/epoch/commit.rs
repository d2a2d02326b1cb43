//! An epoch's commit phase and what follows it: the epoch's record
//! (`EpochCommit`) built, the output and the record written by the sink in
//! one commit (the next epoch read meanwhile when the query is behind),
//! then `commits/N`, the state chains and the sources told, and the
//! epoch's progress.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::compute::Staged;
use super::read::{EpochRead, Planned};
use super::EpochLoop;
use crate::checkpoint::{EpochCommit, OffsetRecord};
use crate::error::Result;
use crate::fail_point::fail_point;
use crate::progress::{millis, PhaseDurations, QueryProgress, SourceProgress};
use crate::sink::EpochOutput;
use crate::source::{Handover, Offset};
use crate::state::StateSize;
use crate::watermark::format_nanos;

/// Offset and commit records kept in the checkpoint (Spark's default).
pub(super) const RETAIN_EPOCHS: u64 = 100;

/// When an epoch began (its planning), and the one before it.
pub(super) struct EpochTiming {
    pub(super) plan_ms: f64,
    pub(super) start: Instant,
    pub(super) last_start: Instant,
    /// Since when the loop has worked on this epoch alone: its start, or,
    /// for an epoch read ahead, when the epoch before it committed.
    pub(super) own_since: Instant,
}

impl EpochLoop {
    /// Writes epoch `record`'s `outputs` and its record, which names the
    /// `staged` state files, in one commit of the sink, with `handover`
    /// (dead letters, group offsets). With `next` (the positions after
    /// this epoch), and when the query is behind (its sources' progress and
    /// the rows it `read` tell), plans and reads the next
    /// epoch while the sink commits, and returns that too.
    pub(super) async fn commit(
        &self,
        record: &OffsetRecord,
        staged: &Staged,
        outputs: &[EpochOutput],
        handover: Handover,
        read: (&[SourceProgress], u64),
        next: Option<&BTreeMap<String, Offset>>,
    ) -> Result<Option<Result<Option<Planned>>>> {
        let epoch = record.epoch;
        let mut watermarks = BTreeMap::new();
        let mut partition_watermarks = BTreeMap::new();
        for statement in &self.statements {
            watermarks.extend(statement.plan.watermarks.to_record());
            partition_watermarks.extend(statement.plan.watermarks.partitions_to_record());
        }
        let commit = EpochCommit {
            plan: record.clone(),
            state_files: staged.chains.concat(),
            watermarks,
            partition_watermarks,
            committed_at_ms: chrono::Utc::now().timestamp_millis(),
            output_rows: output_rows(outputs),
            fingerprint: Some(self.fingerprint.clone()),
            clusters: self.clusters.clone(),
        };
        let write = self.sink.write_epoch_set(&commit, outputs, &handover);
        let (written, next) = match next.filter(|_| self.behind(read.0, read.1)) {
            Some(positions) => {
                let (written, next) = tokio::join!(write, self.prefetch(epoch + 1, positions));
                (written, Some(next))
            }
            None => (write.await, None),
        };
        written?;
        fail_point("before-commit-record", epoch);
        self.checkpoint.write_commit(&commit)?;
        Ok(next)
    }

    /// After epoch `record`'s commit: old checkpoint records purged, each
    /// statement's state chain moved on to the `staged` files, and every
    /// source told where the committed epoch ended.
    pub(super) fn after_commit(&mut self, record: &OffsetRecord, staged: Staged) -> Result<()> {
        self.checkpoint.purge(record.epoch, RETAIN_EPOCHS)?;
        for (statement, chain) in self.statements.iter_mut().zip(staged.chains) {
            statement.committed(self.checkpoint.dir(), chain, self.snapshots)?;
        }
        for input in self.inputs() {
            if let Some(range) = record.sources.get(&input.key) {
                if !range.end.is_null() {
                    input.source.committed(&range.end)?;
                }
            }
        }
        Ok(())
    }

    /// The progress of epoch `record`, committed: what it `read`, wrote and
    /// keeps, and how long each phase took.
    pub(super) fn progress(
        &self,
        record: &OffsetRecord,
        read: EpochRead,
        outputs: &[EpochOutput],
        staged: StateSize,
        mut duration_ms: PhaseDurations,
        timing: EpochTiming,
    ) -> QueryProgress {
        // The loop's own time on this epoch: what was read ahead during the
        // previous commit is not counted twice, so totals add up to the
        // loop's wall time and rows / total is the rate.
        let total = timing.own_since.elapsed();
        duration_ms.total = millis(total);
        let since_last = timing.start.saturating_duration_since(timing.last_start);
        let input_rows = read.rows;
        let per_second = |d: Duration| {
            if d.is_zero() {
                0.0
            } else {
                input_rows as f64 / d.as_secs_f64()
            }
        };
        QueryProgress {
            task: self.task.map(|t| t.index),
            id: self.shared.id.clone(),
            run_id: self.shared.run_id.clone(),
            name: self.shared.name.clone(),
            epoch: record.epoch,
            timestamp: chrono::DateTime::from_timestamp_millis(record.planned_at_ms)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default(),
            num_input_rows: input_rows,
            // The statements' rows; late rows sent to a sink count as late.
            num_output_rows: output_rows(&outputs[..outputs.len() - self.late.len()]),
            input_rows_per_second: per_second(since_last),
            processed_rows_per_second: per_second(total),
            duration_ms,
            state_rows: staged.rows,
            state_bytes: staged.memory_bytes,
            state_disk_bytes: staged.disk_bytes,
            watermark: self.watermark().map(format_nanos),
            late_rows: read.late_rows,
            recoveries: self.recoveries,
            sources: read.sources,
            sink: self.sink_description.clone(),
        }
    }

    /// The query's watermark: the minimum over its statements'.
    pub(super) fn watermark(&self) -> Option<i64> {
        self.statements
            .iter()
            .filter_map(|s| s.plan.watermarks.current())
            .min()
    }
}

/// The rows of every statement's output.
fn output_rows(outputs: &[EpochOutput]) -> u64 {
    outputs
        .iter()
        .flat_map(|o| &o.rows)
        .map(|b| b.num_rows() as u64)
        .sum()
}
