//! The epoch loop: one micro-batch after another, from sources to the sink.
//!
//! ```text
//! recover ─► loop { wait for trigger
//!                   plan: ask sources for offsets ─► offsets/N
//!                   read [start, end) of every source
//!                   compute: DataFusion over the epoch's batches
//!                   stage: each operator's state ─► state/<op>/N.*
//!                   commit: sink.write_epoch_set(N) ─► commits/N ─► progress }
//! ```
//!
//! A query has one statement, or several (a statement set): each is a
//! [`Statement`] with its own inputs, operator and state, and every phase
//! above runs over all of them before the next begins, so their outputs
//! reach the sink, and commit, together. Where a loop resumes (the
//! `recover` step above) is [`recover`]'s.
//!
//! A query that is behind plans and reads epoch N+1 while N commits
//! ([`read`]'s reading ahead); nothing of N+1 is written until N is
//! committed. Within an epoch, reading, computing and writing overlap
//! where sources and sink allow ([`read`]'s pipelining): the sink is sent
//! an appending statement's output while the rest is still read, in the
//! epoch's transaction, and commits it all at `sink.write_epoch_set(N)`.
//!
//! Rules for the next editor:
//! - `offsets/N` is written before epoch N computes or writes anything, and
//!   nothing about epoch N is decided after it is written: a restart re-runs
//!   N over exactly those offsets. (Its input may be read before: reading a
//!   range twice gives the same rows.)
//! - `offsets/N+1` is written only after `commits/N`.
//! - `commits/N` is written only after the sink has acknowledged N's output;
//!   sources hear of it ([`Source::committed`](crate::Source::committed))
//!   only after that.
//! - An epoch runs only when some source has new data.
//! - A stop request is honoured between epochs, never inside one.

mod read;
mod recover;

use read::{EpochRead, Planned};
pub(crate) use recover::Recovered;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::checkpoint::{Checkpoint, EpochCommit, OffsetRecord};
use crate::error::{Result, SluiceError};
use crate::fail_point::fail_point;
use crate::planner::Input;
use crate::progress::{
    PhaseDurations, QueryProgress, QueryStartedEvent, QueryTerminatedEvent, StreamingQueryListener,
};
use crate::query::QueryShared;
use crate::sink::Sink;
use crate::source::{Handover, Offset};
use crate::state::chain::SnapshotPolicy;
use crate::statement::Statement;
use crate::task::TaskId;
use crate::trigger::Trigger;
use crate::watermark::format_nanos;

/// Offset and commit records kept in the checkpoint (Spark's default).
const RETAIN_EPOCHS: u64 = 100;

/// With a zero trigger interval, how long to wait before looking at the
/// sources again when they had nothing new.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// The first wait before retrying after an external system failed; it
/// doubles with each failure, up to [`MAX_BACKOFF`].
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(500);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Everything one running query needs.
pub(crate) struct EpochLoop {
    pub shared: Arc<QueryShared>,
    /// Which task of the query this loop runs (`None`: the query is not
    /// divided), and its slot in `shared`.
    pub task: Option<TaskId>,
    pub slot: usize,
    /// With tasks, how many of them may run an epoch at once
    /// (`tasks.threads`): a permit is held from planning to commit.
    pub permits: Option<Arc<tokio::sync::Semaphore>>,
    /// The query's statements: one, or those of a statement set, which
    /// share the epochs, the checkpoint and the sink's commit.
    pub statements: Vec<Statement>,
    pub sink: Arc<dyn Sink>,
    pub sink_description: String,
    pub checkpoint: Checkpoint,
    /// Keeps a temporary checkpoint directory alive for the query's life.
    pub temp_dir: Option<tempfile::TempDir>,
    pub trigger: Trigger,
    /// How long the query retries without committing an epoch before it
    /// fails (`QuerySettings::outage_limit`).
    pub outage_limit: Duration,
    pub listeners: Vec<Arc<dyn StreamingQueryListener>>,
    /// When operators' state is written whole, and how much is kept.
    pub snapshots: SnapshotPolicy,
    /// What the query's state and offsets depend on: every statement's
    /// fingerprint, recorded in each commit and checked at recovery.
    pub fingerprint: String,
    /// The cluster each input reads (see [`Source::cluster`]), recorded in
    /// each commit and checked at recovery.
    pub clusters: BTreeMap<String, String>,
    /// In-process recoveries so far (see `run_with_retries`).
    pub recoveries: u64,
}

impl EpochLoop {
    /// Every statement's inputs, in order.
    fn inputs(&self) -> impl Iterator<Item = &Input> {
        self.statements.iter().flat_map(|s| &s.plan.inputs)
    }

    /// The query's watermark: the minimum over its statements'.
    fn watermark(&self) -> Option<i64> {
        self.statements
            .iter()
            .filter_map(|s| s.plan.watermarks.current())
            .min()
    }

    /// Runs this loop's task until the query is stopped, its input runs
    /// out under the available-now trigger, or it fails.
    pub(crate) async fn run(mut self, recovered: Recovered) -> Result<()> {
        crate::memory::tune_allocator();
        let _running =
            crate::memory::query_running(self.statements.iter().any(|s| s.is_stateful()));
        // A bug that panics must still end the query, or its waiters would
        // wait forever.
        let result = AssertUnwindSafe(self.run_with_retries(recovered))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(SluiceError::Internal(format!(
                    "the epoch loop panicked ({what}); this is a bug in Sluice, please report it \
                     with the log above. The checkpoint is intact: restarting resumes from the \
                     last committed epoch"
                )))
            });
        drop(self.temp_dir.take());
        match (self.task, result) {
            (Some(task), Err(e)) => Err(e.in_task(task)),
            (_, result) => result,
        }
    }

    /// Runs epochs; when one fails because an external system (a broker)
    /// is unreachable, waits with exponential backoff, recovers from the
    /// checkpoint in-process as a restart would (state and positions of the
    /// last committed epoch, the failed epoch re-run over the same
    /// offsets), and goes on. Gives up after the outage limit without a
    /// committed epoch, naming the limit and the last failure.
    async fn run_with_retries(&mut self, mut recovered: Recovered) -> Result<()> {
        let mut outage: Option<(Instant, Duration)> = None;
        loop {
            let committed_before = self.shared.last_epoch(self.slot);
            let failure = match self.run_epochs(recovered).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
            };
            // An epoch committed since the last failure: a new outage.
            if self.shared.last_epoch(self.slot) > committed_before {
                outage = None;
            }
            // Loop until recovery itself succeeds.
            loop {
                let (since, backoff) = match outage {
                    Some((since, backoff)) => (since, (backoff * 2).min(MAX_BACKOFF)),
                    None => (Instant::now(), MIN_BACKOFF),
                };
                outage = Some((since, backoff));
                if since.elapsed() > self.outage_limit {
                    return Err(SluiceError::External {
                        what: format!("query {}", self.shared.name),
                        message: format!(
                            "no epoch could commit for {:.0?} (the outage limit); the last \
                             failure: {failure}",
                            since.elapsed()
                        ),
                        hint: Some(
                            "bring the brokers back and start the query again: it resumes \
                             after its last committed epoch; 'outage.limit' sets how long a \
                             query waits"
                                .into(),
                        ),
                    });
                }
                tracing::warn!(query = %self.shared.name, error = %failure, ?backoff, "epoch failed; retrying after recovery");
                self.shared.set_status(
                    self.slot,
                    &format!("Waiting {backoff:?} to retry after: {failure}"),
                    false,
                    true,
                );
                // A stop during an outage ends the query without its open
                // epoch: a failure, named as such.
                if !self.sleep_until(Instant::now() + backoff).await {
                    return Err(SluiceError::External {
                        what: format!("query {}", self.shared.name),
                        message: format!(
                            "stopped during an outage, without committing the open epoch; \
                             the last failure: {failure}"
                        ),
                        hint: Some(
                            "start the query again when the brokers are back: it resumes after \
                             its last committed epoch"
                                .into(),
                        ),
                    });
                }
                match self.recover().await {
                    Ok(r) => {
                        self.recoveries += 1;
                        recovered = r;
                        break;
                    }
                    Err(e) if e.is_transient() => continue,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    async fn run_epochs(&mut self, recovered: Recovered) -> Result<()> {
        let Recovered {
            mut epoch,
            mut positions,
            mut replay,
        } = recovered;
        if self.trigger == Trigger::AvailableNow {
            for input in self.inputs() {
                input.source.prepare_available_now().await?;
            }
        }
        let started_at = Instant::now();
        let mut last_epoch_start = started_at;
        let mut next_tick = started_at;
        let mut prefetched: Option<Planned> = None;
        let mut last_commit = started_at;
        loop {
            if self.shared.stop_requested(self.slot) {
                return Ok(());
            }
            if let Trigger::ProcessingTime(interval) = self.trigger {
                if !interval.is_zero() {
                    self.shared
                        .set_status(self.slot, "Waiting for next trigger", false, false);
                    if !self.sleep_until(next_tick).await {
                        return Ok(());
                    }
                    // Ticks stay on multiples of the interval; a long epoch
                    // skips the ticks it overran.
                    let now = Instant::now();
                    while next_tick <= now {
                        next_tick += interval;
                    }
                }
            }
            let permit = match &self.permits {
                Some(permits) => Some(Arc::clone(permits).acquire_owned().await.map_err(|e| {
                    SluiceError::Internal(format!("the tasks' epoch permits: {e}"))
                })?),
                None => None,
            };
            let planned = match prefetched.take() {
                Some(ahead) => {
                    self.write_plan(&ahead.record)?;
                    ahead
                }
                None => match self
                    .plan_or_replay(epoch, &positions, replay.take())
                    .await?
                {
                    Some(planned) => planned,
                    None => {
                        drop(permit);
                        if self.no_data().await {
                            continue;
                        }
                        return Ok(());
                    }
                },
            };
            let Planned {
                record,
                read,
                started: epoch_start,
                plan_ms,
            } = planned;
            self.shared
                .set_status(self.slot, &format!("Processing epoch {epoch}"), true, true);
            let mut next_positions = positions.clone();
            advance(&mut next_positions, record.clone());
            let timing = EpochTiming {
                plan_ms,
                start: epoch_start,
                last_start: last_epoch_start,
                own_since: epoch_start.max(last_commit),
            };
            let prefetch = self.prefetches().then_some(&next_positions);
            let (progress, next) = self.run_epoch(&record, read, timing, prefetch).await?;
            last_commit = Instant::now();
            // The epoch's arrays are freed now, not while it ran.
            crate::memory::epoch_done();
            drop(permit);
            positions = next_positions;
            tracing::info!(
                target: "sluice::progress",
                query = %progress.name,
                task = ?progress.task,
                epoch = progress.epoch,
                input_rows = progress.num_input_rows,
                output_rows = progress.num_output_rows,
                total_ms = progress.duration_ms.total,
                "epoch committed"
            );
            for l in &self.listeners {
                l.on_query_progress(&progress);
            }
            self.shared.record_progress(self.slot, progress);
            last_epoch_start = epoch_start;
            epoch += 1;
            // A failed look ahead fails the epoch after the committed one,
            // which recovery re-plans.
            prefetched = next.transpose()?.flatten();
        }
    }

    /// Epoch `epoch`'s plan: `replay`, the one recovery found written, or
    /// a new one from `positions`, written before it returns. `None` when
    /// no source has new data.
    async fn plan_or_replay(
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

    /// No source had new data: says so, and waits before the next plan
    /// when epochs run back to back. False when the loop ends: an
    /// `available-now` query has read what there was, or a stop came.
    async fn no_data(&self) -> bool {
        self.shared.record_no_data(self.slot);
        self.shared
            .set_status(self.slot, "Waiting for data to arrive", false, false);
        match self.trigger {
            Trigger::AvailableNow => false,
            Trigger::ProcessingTime(interval) if interval.is_zero() => {
                self.sleep_until(Instant::now() + IDLE_POLL).await
            }
            Trigger::ProcessingTime(_) => true,
        }
    }

    /// Sleeps until `deadline`; false when a stop was requested meanwhile.
    async fn sleep_until(&self, deadline: Instant) -> bool {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.into()) => true,
            _ = self.shared.stopped(self.slot) => false,
        }
    }

    /// Writes the epoch's plan, `offsets/N`: from here on a restart re-runs
    /// the epoch over exactly these ranges.
    fn write_plan(&self, record: &OffsetRecord) -> Result<()> {
        self.checkpoint.write_offsets(record)?;
        fail_point("after-offsets", record.epoch);
        Ok(())
    }

    /// Runs epoch `record` (its plan written) over `read`, or over what it
    /// reads now, and commits it. With `next` (the positions after this
    /// epoch), and when the query is behind (see the module's notes), plans
    /// and reads the next epoch while this one commits, and returns that
    /// too.
    async fn run_epoch(
        &mut self,
        record: &OffsetRecord,
        read: Option<EpochRead>,
        timing: EpochTiming,
        next: Option<&BTreeMap<String, Offset>>,
    ) -> Result<(QueryProgress, Option<Result<Option<Planned>>>)> {
        let epoch = record.epoch;
        let read = match read {
            Some(read) => read,
            None => self.read_epoch(record).await?,
        };
        let mut read = read;
        let inputs = std::mem::take(&mut read.inputs);
        let mut read_ms = read.ms;

        let t = Instant::now();
        let mut late_rows = 0;
        let mut admitted = Vec::with_capacity(self.statements.len());
        for (statement, read) in self.statements.iter_mut().zip(inputs) {
            let (input, late) = statement.admit(read)?;
            late_rows += late;
            admitted.push(input);
        }
        read_ms += ms(t.elapsed());

        // With a sink that sends ahead, appended rows are written while the
        // rest of the epoch is still read and computed.
        let t = Instant::now();
        let mut outputs = Vec::with_capacity(self.statements.len());
        let sink = self.sink.sends_ahead().then_some(self.sink.as_ref());
        for (index, (statement, input)) in self.statements.iter_mut().zip(admitted).enumerate() {
            let ahead = sink.map(|sink| (sink, epoch, index));
            outputs.push(statement.compute(input, ahead).await?);
        }
        let dead_letters = self.settle(&mut read);
        let EpochRead {
            sources,
            rows: input_rows,
            group_offsets,
            ..
        } = read;
        let compute_ms = ms(t.elapsed());

        // Stage the state durably before the commit, so the commit can name
        // it (docs/architecture.md §2).
        let t = Instant::now();
        let mut chains = Vec::with_capacity(self.statements.len());
        let (mut state_rows, mut state_bytes) = (0, 0);
        for statement in &mut self.statements {
            let (files, rows, bytes) = statement.stage(
                self.checkpoint.dir(),
                epoch,
                &self.shared.run_id,
                self.snapshots,
            )?;
            chains.push(files);
            state_rows += rows;
            state_bytes += bytes;
        }
        let state_ms = ms(t.elapsed());

        let t = Instant::now();
        let output_rows: u64 = outputs
            .iter()
            .flat_map(|o| &o.rows)
            .map(|b| b.num_rows() as u64)
            .sum();
        let mut watermarks = BTreeMap::new();
        for statement in &self.statements {
            watermarks.extend(statement.plan.watermarks.to_record());
        }
        let commit = EpochCommit {
            plan: record.clone(),
            state_files: chains.concat(),
            watermarks,
            committed_at_ms: chrono::Utc::now().timestamp_millis(),
            output_rows,
            fingerprint: Some(self.fingerprint.clone()),
            clusters: self.clusters.clone(),
        };
        let handover = Handover {
            dead_letters,
            group_offsets,
        };
        let write = self.sink.write_epoch_set(&commit, &outputs, &handover);
        let (written, next) = match next.filter(|_| self.behind(&sources, input_rows)) {
            Some(positions) => {
                let (written, next) = tokio::join!(write, self.prefetch(epoch + 1, positions));
                (written, Some(next))
            }
            None => (write.await, None),
        };
        written?;
        fail_point("before-commit-record", epoch);
        self.checkpoint.write_commit(&commit)?;
        self.checkpoint.purge(epoch, RETAIN_EPOCHS)?;
        for (statement, chain) in self.statements.iter_mut().zip(chains) {
            statement.committed(self.checkpoint.dir(), chain, self.snapshots)?;
        }
        for input in self.inputs() {
            if let Some(range) = record.sources.get(&input.key) {
                if !range.end.is_null() {
                    input.source.committed(&range.end)?;
                }
            }
        }
        let commit_ms = ms(t.elapsed());

        // The loop's own time on this epoch: what was read ahead during the
        // previous commit is not counted twice, so totals add up to the
        // loop's wall time and rows / total is the rate.
        let total = timing.own_since.elapsed();
        let since_last = timing.start.saturating_duration_since(timing.last_start);
        let per_second = |d: Duration| {
            if d.is_zero() {
                0.0
            } else {
                input_rows as f64 / d.as_secs_f64()
            }
        };
        let progress = QueryProgress {
            task: self.task.map(|t| t.index),
            id: self.shared.id.clone(),
            run_id: self.shared.run_id.clone(),
            name: self.shared.name.clone(),
            epoch,
            timestamp: chrono::DateTime::from_timestamp_millis(record.planned_at_ms)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default(),
            num_input_rows: input_rows,
            num_output_rows: output_rows,
            input_rows_per_second: per_second(since_last),
            processed_rows_per_second: per_second(total),
            duration_ms: PhaseDurations {
                plan: timing.plan_ms,
                read: read_ms,
                compute: compute_ms,
                state: state_ms,
                commit: commit_ms,
                total: ms(total),
            },
            state_rows,
            state_bytes,
            watermark: self.watermark().map(format_nanos),
            late_rows,
            recoveries: self.recoveries,
            sources,
            sink: self.sink_description.clone(),
        };
        Ok((progress, next))
    }
}

/// When an epoch began (its planning), and the one before it.
struct EpochTiming {
    plan_ms: f64,
    start: Instant,
    last_start: Instant,
    /// Since when the loop has worked on this epoch alone: its start, or,
    /// for an epoch read ahead, when the epoch before it committed.
    own_since: Instant,
}

/// Runs a query's `body` (its tasks' epoch loops) to its end, telling
/// listeners of the query's start and end once, whatever its number of
/// tasks, and the handle of its result.
pub(crate) async fn run_query(
    shared: Arc<QueryShared>,
    body: impl std::future::Future<Output = Result<()>>,
    listeners: Vec<Arc<dyn StreamingQueryListener>>,
) {
    let started = QueryStartedEvent {
        id: shared.id.clone(),
        run_id: shared.run_id.clone(),
        name: shared.name.clone(),
    };
    tracing::info!(query = %shared.name, id = %shared.id, "query started");
    for l in &listeners {
        l.on_query_started(&started);
    }
    let result = body.await;
    if let Err(e) = &result {
        tracing::error!(query = %shared.name, error = %e, "query failed");
    }
    let terminated = QueryTerminatedEvent {
        id: shared.id.clone(),
        run_id: shared.run_id.clone(),
        name: shared.name.clone(),
        error: result.as_ref().err().map(ToString::to_string),
    };
    // Listeners hear the end before waiters on the handle wake up.
    for l in &listeners {
        l.on_query_terminated(&terminated);
    }
    shared.finish(result);
}

/// The checkpoint at `dir`, whose epoch `record` planned, must belong to a
/// query with the same `inputs`.
pub(crate) fn check_inputs<'a>(
    record: &OffsetRecord,
    inputs: impl Iterator<Item = &'a Input>,
    dir: &std::path::Path,
) -> Result<()> {
    let mut ours: Vec<&str> = inputs.map(|i| i.key.as_str()).collect();
    ours.sort_unstable();
    let theirs: Vec<&str> = record.sources.keys().map(String::as_str).collect();
    if ours != theirs {
        return Err(SluiceError::config(format!(
            "the checkpoint at {} belongs to a query reading [{}], but this query reads [{}]; \
             use a new checkpoint location for a changed query",
            dir.display(),
            theirs.join(", "),
            ours.join(", ")
        )));
    }
    Ok(())
}

/// A query whose fingerprint (see `statement::fingerprint`) differs from the
/// one that committed `commit` (in `whose`: the checkpoint, or the sink's
/// record) cannot restore its state and offsets: refused, showing both.
/// Commits of earlier releases carry none and are not checked.
pub(crate) fn check_fingerprint(commit: &EpochCommit, ours: &str, whose: &str) -> Result<()> {
    match &commit.fingerprint {
        Some(theirs) if theirs != ours => Err(SluiceError::config(format!(
            "this query differs from the one that committed epoch {} ({whose}) in what its \
             state and offsets depend on, so they cannot be restored into it:\n  committed:\n    \
             {}\n  now:\n    {}\nRevert the change, or run the changed query as a new one (a new \
             'pipeline.name' and checkpoint location: it then reads its input again from its \
             startup position). docs/operations.md lists which changes keep state",
            commit.epoch(),
            theirs.replace('\n', "\n    "),
            ours.replace('\n', "\n    ")
        ))),
        _ => Ok(()),
    }
}

/// The cluster each of `inputs` reads, by input key (inputs that name
/// none are left out).
pub(crate) async fn clusters<'a>(
    inputs: impl Iterator<Item = &'a Input>,
) -> Result<BTreeMap<String, String>> {
    let mut clusters = BTreeMap::new();
    for input in inputs {
        if let Some(cluster) = input.source.cluster().await? {
            clusters.insert(input.key.clone(), cluster);
        }
    }
    Ok(clusters)
}

/// An input that now reads another cluster than the one that committed
/// `commit` (in `whose`): its offsets belong to the other cluster's log,
/// so the start is refused, naming both. Inputs either side does not
/// know the cluster of are not compared.
pub(crate) fn check_clusters(
    commit: &EpochCommit,
    ours: &BTreeMap<String, String>,
    whose: &str,
) -> Result<()> {
    for (input, theirs) in &commit.clusters {
        if let Some(now) = ours.get(input).filter(|now| *now != theirs) {
            return Err(SluiceError::config(format!(
                "input {input} now reads Kafka cluster '{now}', but epoch {} ({whose}) was \
                 committed reading cluster '{theirs}': its offsets mean nothing on another \
                 cluster. Point the stream back at the cluster it read, or run the query as a \
                 new one (a new 'pipeline.name' and checkpoint location)",
                commit.epoch()
            )));
        }
    }
    Ok(())
}

/// Moves each source's position to the end of its range in `record`. A
/// source that has had no data yet (end `null`) keeps no position, so it is
/// next asked from its beginning.
fn advance(positions: &mut BTreeMap<String, Offset>, record: OffsetRecord) {
    for (key, range) in record.sources {
        if !range.end.is_null() {
            positions.insert(key, range.end);
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
