//! Recovery: where an epoch loop resumes after a restart or an outage.
//!
//! The sink's own record of its commits (the exactly-once Kafka sink's
//! progress topic) decides which epoch was committed last; the checkpoint's
//! `commits/` and `offsets/` follow it (a commit the sink made but
//! `commits/` lacks is promoted, a cached record an operating-system crash
//! damaged is rewritten), and every source gets the position the next
//! epoch starts at, or the planned-but-uncommitted epoch to re-run.

use std::collections::BTreeMap;

use super::commit::RETAIN_EPOCHS;
use super::read::advance;
use super::EpochLoop;
use crate::checkpoint::{EpochCommit, OffsetRecord};
use crate::error::{Result, SluiceError};
use crate::planner::Input;
use crate::sink::CommittedEpoch;
use crate::source::Offset;

/// Where a query resumes.
pub(crate) struct Recovered {
    pub(super) epoch: u64,
    pub(super) positions: BTreeMap<String, Offset>,
    pub(super) replay: Option<OffsetRecord>,
}

impl EpochLoop {
    /// Reads the checkpoint: the next epoch, each source's position, and the
    /// planned-but-uncommitted epoch to re-run, if any. Runs after the sink
    /// is open and before the loop is spawned, so a damaged checkpoint fails
    /// the query's start.
    pub(crate) async fn recover(&mut self) -> Result<Recovered> {
        let cp = &self.checkpoint;
        let local = cp.latest_commit_epoch()?;
        // The committed epoch's plan and state files: from the sink's own
        // record when it keeps one (a zombie may have rewritten offsets/ on
        // disk; the sink's record is what was committed), else from the
        // checkpoint.
        let committed_epoch = match self.sink.committed_epoch().await? {
            CommittedEpoch::NotRecorded => local.map(|c| cp.read_commit(c)).transpose()?,
            CommittedEpoch::Recorded(commit) => {
                self.reconcile(local, commit.as_ref())?;
                commit
            }
        };
        // A checkpoint of another query is refused before any of its state
        // is loaded into this one's operators.
        if let Some(c) = &committed_epoch {
            self.check_sources(&c.plan)?;
            check_fingerprint(c, &self.fingerprint, &self.sink_description)?;
            check_clusters(c, &self.clusters, &self.sink_description)?;
        }
        // Everything in memory goes back to the committed epoch (nothing,
        // before the first commit): recovery also runs in-process after a
        // failed epoch (see `run_with_retries`).
        let (files, watermarks, partition_watermarks) = committed_epoch
            .as_ref()
            .map(|c| {
                let c = c.clone();
                (c.state_files, c.watermarks, c.partition_watermarks)
            })
            .unwrap_or_default();
        for statement in &mut self.statements {
            statement
                .restore(
                    self.checkpoint.dir(),
                    &files,
                    &watermarks,
                    &partition_watermarks,
                )
                .await?;
        }
        let cp = &self.checkpoint;
        let committed_plan = committed_epoch.map(|c| c.plan);
        let committed = committed_plan.as_ref().map(|p| p.epoch);
        let planned = cp.latest_offsets_epoch()?;
        let mut positions = BTreeMap::new();
        if let Some(record) = committed_plan {
            advance(&mut positions, record);
        }
        let next = committed.unwrap_or(0) + 1;
        let replay = match planned {
            Some(p) if p == next => match cp.read_offsets(p) {
                Ok(record) => {
                    self.check_sources(&record)?;
                    tracing::info!(epoch = p, "re-running epoch planned before the restart");
                    Some(record)
                }
                // Not committed (the sink's record says so), so nothing of
                // it was seen: an operating-system crash damaged its cached
                // plan, and it is planned again.
                Err(e @ SluiceError::Checkpoint { .. }) if cp.epoch_log_is_cache() => {
                    tracing::warn!(
                        epoch = p,
                        error = %e,
                        "the plan of an epoch the sink never committed is damaged; planning it again"
                    );
                    cp.remove_offsets(p)?;
                    None
                }
                Err(e) => return Err(e),
            },
            Some(p) if p > next => {
                return Err(SluiceError::checkpoint(
                    cp.dir().join("offsets").join(p.to_string()),
                    format!(
                        "epoch {p} was planned but the last committed epoch is {}; the \
                         checkpoint's commits/ folder is missing files",
                        committed.unwrap_or(0)
                    ),
                ))
            }
            _ => None,
        };
        self.start_positions(&mut positions).await?;
        Ok(Recovered {
            epoch: next,
            positions,
            replay,
        })
    }

    /// Gives each input that has read nothing yet the position it starts
    /// at: the one recorded in the checkpoint's `starts` when a run before
    /// resolved it, else the one its source resolves now
    /// ([`Source::initial_position`](crate::Source::initial_position)),
    /// recorded before any epoch, so that a restart before the first
    /// commit starts where the first run would have (Kafka's `latest` is
    /// resolved once, as Spark records its initial offsets).
    async fn start_positions(&self, positions: &mut BTreeMap<String, Offset>) -> Result<()> {
        let mut starts = self.checkpoint.read_starts()?;
        let mut resolved = false;
        for input in self.inputs() {
            if positions.contains_key(&input.key) {
                continue;
            }
            if !starts.contains_key(&input.key) {
                let Some(start) = input.source.initial_position().await? else {
                    continue;
                };
                starts.insert(input.key.clone(), start);
                resolved = true;
            }
            if let Some(start) = starts.get(&input.key) {
                positions.insert(input.key.clone(), start.clone());
            }
        }
        if resolved {
            self.checkpoint.write_starts(&starts)?;
        }
        Ok(())
    }

    /// The sink's record decides which epochs are committed; `commits/` is a
    /// cache of it. An epoch the sink committed but `commits/` lacks (a
    /// crash right after the Kafka commit) is promoted; `commits/` ahead of
    /// the sink cannot happen unless the sink's record was lost, which is
    /// an error, never a silent reset.
    fn reconcile(&self, local: Option<u64>, commit: Option<&EpochCommit>) -> Result<()> {
        let cp = &self.checkpoint;
        let decided = commit.map(EpochCommit::epoch);
        if local > decided {
            return Err(SluiceError::checkpoint(
                cp.dir().join("commits"),
                format!(
                    "the checkpoint says epoch {} of query '{}' is committed but the sink's own \
                     record ({}) says {}: that record was lost (its topic deleted or recreated) \
                     or this checkpoint belongs to another query. Nothing was written. Restore \
                     the record, or run the query with its own checkpoint; a new checkpoint \
                     location would compute and write the whole output again",
                    local.unwrap_or(0),
                    self.shared.id,
                    self.sink_description,
                    decided.map_or("none".to_string(), |d| d.to_string())
                ),
            ));
        }
        if let Some(c) = commit {
            let d = c.epoch();
            // Kafka says what was committed, but the state it names is not
            // here: this is not the checkpoint the query ran with.
            let mut missing: Vec<&str> = Vec::new();
            for f in &c.state_files {
                if !cp.has_state_file(f)? {
                    missing.push(f);
                }
            }
            if !missing.is_empty() {
                return Err(SluiceError::checkpoint(
                    cp.dir(),
                    format!(
                        "the sink's record ({}) says epoch {d} of query '{}' is committed with \
                         state files this checkpoint location does not have ({}): it is not \
                         the checkpoint the query ran with (lost, moved or replaced). Nothing \
                         was written. Restore that checkpoint directory and start again; to \
                         start this stateful query over from nothing instead, give it a new \
                         'pipeline.name' (it then computes and writes its output again from the \
                         start of its input)",
                        self.sink_description,
                        self.shared.id,
                        missing.join(", ")
                    ),
                ));
            }
            // Only the epochs the checkpoint keeps: a lost checkpoint of a
            // long-running query would otherwise write (and fsync) a file
            // per epoch of its whole history, only for the purge to delete
            // them (10,000 epochs took 5 s: benches/recovery.rs).
            let mut first = local
                .map_or(1, |l| l + 1)
                .max(d.saturating_sub(RETAIN_EPOCHS - 1));
            // The cached record of the committed epoch itself may be
            // damaged (written without fsync, then an operating-system
            // crash): the sink's record replaces it.
            if local == Some(d) && cp.epoch_log_is_cache() {
                if let Err(e) = cp.read_commit(d) {
                    tracing::warn!(
                        epoch = d,
                        error = %e,
                        "rewriting the damaged record of the committed epoch from the sink's"
                    );
                    first = d;
                }
            }
            for epoch in first..=d {
                tracing::info!(
                    epoch,
                    "the sink committed this epoch before the last stop; recording it"
                );
                // Only the last one's record matters to a restart; the
                // others take their plans from `offsets/` if asked.
                let record = if epoch == d {
                    c.clone()
                } else {
                    EpochCommit {
                        plan: OffsetRecord {
                            epoch,
                            ..Default::default()
                        },
                        ..Default::default()
                    }
                };
                // Its plan too, when an operating-system crash damaged it
                // (records of earlier releases carry no plan to rewrite).
                if epoch == d && cp.epoch_log_is_cache() && !c.plan.sources.is_empty() {
                    if let Err(e) = cp.read_offsets(d) {
                        tracing::warn!(
                            epoch = d,
                            error = %e,
                            "rewriting the damaged plan of the committed epoch from the sink's"
                        );
                        cp.write_offsets(&c.plan)?;
                    }
                }
                cp.write_commit(&EpochCommit {
                    committed_at_ms: chrono::Utc::now().timestamp_millis(),
                    ..record
                })?;
            }
        }
        Ok(())
    }

    /// The checkpoint must belong to a query with the same inputs.
    fn check_sources(&self, record: &OffsetRecord) -> Result<()> {
        check_inputs(record, self.inputs(), self.checkpoint.dir())
    }
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
