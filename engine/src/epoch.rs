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

mod commit;
mod compute;
mod read;
mod recover;

use commit::EpochTiming;
use read::{advance, EpochRead, Planned};
pub(crate) use recover::{check_clusters, check_fingerprint, check_inputs, clusters, Recovered};

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::checkpoint::{Checkpoint, OffsetRecord};
use crate::error::{Result, SluiceError};
use crate::progress::{
    millis, PhaseDurations, QueryProgress, QueryStartedEvent, QueryTerminatedEvent,
    StreamingQueryListener,
};
use crate::query::QueryShared;
use crate::settings::Pipelining;
use crate::sink::Sink;
use crate::source::{Handover, Offset};
use crate::state::chain::SnapshotPolicy;
use crate::statement::Statement;
use crate::task::TaskId;
use crate::trigger::Trigger;

/// With a zero trigger interval, how long to wait before looking at the
/// sources again when they had nothing new.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// With `available-now` through repartition channels, how long a task
/// that found nothing new waits before looking again, until the query has
/// drained.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// Whether `input` is a repartition channel read back: fed by the query's
/// own tasks.
fn reads_channel(input: &crate::planner::Input) -> bool {
    crate::task::repartition_step_of(&input.key).is_some()
}

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
    /// The outputs after the statements': each the rows a statement drops
    /// as late from one input, as (statement, input) (see `'late.sink'`).
    pub late: Vec<(usize, usize)>,
    pub sink: Arc<dyn Sink>,
    pub sink_description: String,
    pub checkpoint: Checkpoint,
    /// Keeps a temporary checkpoint directory alive for the query's life.
    pub temp_dir: Option<tempfile::TempDir>,
    pub trigger: Trigger,
    /// Whether a query that is behind reads its next epoch while the
    /// current one commits (`QuerySettings::read_ahead`).
    pub read_ahead: bool,
    /// Whether an epoch's reading, computing and writing overlap
    /// (`QuerySettings::pipelining`).
    pub pipelining: Pipelining,
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
                self.shared
                    .set_retrying(self.slot, &failure.to_string(), Some(backoff));
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

    /// Runs epochs from `recovered` on: each waits for its trigger, is
    /// planned (or was, read ahead during the last commit), runs through
    /// its phases ([`run_epoch`](Self::run_epoch)) and is reported.
    async fn run_epochs(&mut self, recovered: Recovered) -> Result<()> {
        let Recovered {
            mut epoch,
            mut positions,
            mut replay,
        } = recovered;
        if self.trigger == Trigger::AvailableNow {
            // A repartition channel holds what the query's own tasks write
            // into it: its end is when they have all drained (`no_data`).
            for input in self.inputs().filter(|i| !reads_channel(i)) {
                input.source.prepare_available_now().await?;
            }
        }
        let started_at = Instant::now();
        let (mut last_epoch_start, mut last_commit) = (started_at, started_at);
        let mut next_tick = started_at;
        let mut prefetched: Option<Planned> = None;
        loop {
            if self.shared.stop_requested(self.slot) || !self.wait_for_trigger(&mut next_tick).await
            {
                return Ok(());
            }
            let permit = self.epoch_permit().await?;
            let planned = match prefetched.take() {
                Some(ahead) => self.write_plan(&ahead.record).map(|()| Some(ahead))?,
                None => {
                    self.plan_or_replay(epoch, &positions, replay.take())
                        .await?
                }
            };
            let Some(Planned {
                record,
                read,
                started: epoch_start,
                plan_ms,
            }) = planned
            else {
                drop(permit);
                if self.no_data().await {
                    continue;
                }
                return Ok(());
            };
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
            self.report(progress);
            last_epoch_start = epoch_start;
            epoch += 1;
            // A failed look ahead fails the epoch after the committed one,
            // which recovery re-plans.
            prefetched = next.transpose()?.flatten();
        }
    }

    /// With a trigger interval, waits for the next tick (ticks stay on
    /// multiples of the interval; a long epoch skips the ticks it
    /// overran). False when a stop came meanwhile.
    async fn wait_for_trigger(&self, next_tick: &mut Instant) -> bool {
        let Trigger::ProcessingTime(interval) = self.trigger else {
            return true;
        };
        if interval.is_zero() {
            return true;
        }
        self.shared
            .set_status(self.slot, "Waiting for next trigger", false, false);
        if !self.sleep_until(*next_tick).await {
            return false;
        }
        let now = Instant::now();
        while *next_tick <= now {
            *next_tick += interval;
        }
        true
    }

    /// With tasks, the permit to run an epoch (`tasks.threads` at once),
    /// held from planning to commit.
    async fn epoch_permit(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        match &self.permits {
            Some(permits) => Arc::clone(permits)
                .acquire_owned()
                .await
                .map(Some)
                .map_err(|e| SluiceError::Internal(format!("the tasks' epoch permits: {e}"))),
            None => Ok(None),
        }
    }

    /// Tells the log, the listeners and the query's handle of a committed
    /// epoch.
    fn report(&self, progress: QueryProgress) {
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
    }

    /// No source had new data: says so, and waits before the next plan
    /// when epochs run back to back. False when the loop ends: an
    /// `available-now` query has read what there was, or a stop came.
    async fn no_data(&self) -> bool {
        let lag = self
            .inputs()
            .map(|i| (i.description.clone(), i.source.lag()))
            .collect();
        self.shared.record_no_data(self.slot, lag);
        self.shared
            .set_status(self.slot, "Waiting for data to arrive", false, false);
        match self.trigger {
            Trigger::AvailableNow if self.inputs().any(reads_channel) => {
                !self.shared.drained(self.slot)
                    && self.sleep_until(Instant::now() + DRAIN_POLL).await
            }
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

    /// Runs epoch `record` (its plan written) over `read`, or over what it
    /// reads now, and commits it: the phases in order, each timed. With
    /// `next` (the positions after this epoch), and when the query is
    /// behind (see the module's notes), plans and reads the next epoch
    /// while this one commits, and returns that too.
    async fn run_epoch(
        &mut self,
        record: &OffsetRecord,
        read: Option<EpochRead>,
        timing: EpochTiming,
        next: Option<&BTreeMap<String, Offset>>,
    ) -> Result<(QueryProgress, Option<Result<Option<Planned>>>)> {
        let epoch = record.epoch;
        let mut phases = PhaseDurations {
            plan: timing.plan_ms,
            ..PhaseDurations::default()
        };

        let mut read = match read {
            Some(read) => read,
            None => self.read_epoch(record).await?,
        };
        let t = Instant::now();
        let admitted = self.admit(&mut read, record.planned_at_ms)?;
        phases.read = read.ms + millis(t.elapsed());

        let t = Instant::now();
        let outputs = self.compute(epoch, admitted).await?;
        let dead_letters = self.settle(&mut read);
        phases.compute = millis(t.elapsed());

        let t = Instant::now();
        let staged = self.stage(epoch)?;
        phases.state = millis(t.elapsed());

        let t = Instant::now();
        let handover = Handover {
            dead_letters,
            group_offsets: std::mem::take(&mut read.group_offsets),
        };
        let next = self
            .commit(
                record,
                &staged,
                &outputs,
                handover,
                (&read.sources, read.rows),
                next,
            )
            .await?;
        let state_size = staged.size;
        self.after_commit(record, staged)?;
        phases.commit = millis(t.elapsed());

        let progress = self.progress(record, read, &outputs, state_size, phases, timing);
        Ok((progress, next))
    }
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
