//! The checkpoint directory: what a query has planned and committed.
//!
//! ```text
//! <location>/metadata     query id and format version; written once
//! <location>/starts       where inputs start that had read nothing yet
//! <location>/offsets/N    source offset ranges of epoch N, written before it runs
//! <location>/commits/N    epoch N committed (its output reached the sink)
//! ```
//!
//! The location is a local directory, or a prefix on object storage
//! (`s3://`, `gs://`, `az://`; see `state::remote`) with the same layout.
//!
//! This is Spark's offsets log / commits log pair. On restart the engine
//! reads the highest `commits/C`; if `offsets/C+1` exists, epoch C+1 was
//! planned but not committed and is re-run over exactly the same offsets.
//!
//! Every file is written to a temporary name, fsynced and renamed, so a crash
//! leaves either the old state or the new one. Every file starts with a
//! header carrying a CRC32 and the payload length, so a corrupt or truncated
//! file is reported by name ([`SluiceError::Checkpoint`]) rather than
//! silently ignored or reset.
//!
//! One exception: when the sink keeps its own record of every commit in
//! the transaction that carries the epoch's output (the exactly-once Kafka
//! sink), `offsets/N` and `commits/N` are a cache of that record and are
//! renamed into place without fsync ([`Checkpoint::cache_epoch_log`]): a
//! busy disk held some epochs 50–100 ms in those two fsyncs. A process
//! crash cannot tell the difference; after an operating-system crash,
//! recovery takes the committed epoch from the sink, rewrites a damaged
//! record of it, and plans an epoch again whose `offsets/N` is damaged and
//! which the sink does not have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Result, SluiceError};
pub use crate::state::codec::FORMAT_VERSION;
use crate::state::codec::{
    create_dirs, file_len, list_dir, read_framed, remove_file, remove_leftovers, write_framed_as,
    Durability,
};
use crate::state::remote::local_or_remote;

/// What never changes for a query: written once, when its checkpoint is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Checkpoint layout version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// The query's id, stable across restarts.
    pub query_id: String,
    /// The engine version that created the checkpoint.
    pub engine_version: String,
}

/// The offset range one source reads in one epoch, as the source's own JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRange {
    /// Where the epoch starts; `None` for a source's first epoch.
    pub start: Option<serde_json::Value>,
    /// Where the epoch ends (exclusive).
    pub end: serde_json::Value,
}

/// `offsets/N`: the plan of epoch N, written before it runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OffsetRecord {
    /// The epoch number, from 1.
    pub epoch: u64,
    /// Wall-clock time the epoch was planned (ms since the Unix epoch).
    #[serde(default)]
    pub planned_at_ms: i64,
    /// Per source (keyed by the source's position and name), its range.
    #[serde(default)]
    pub sources: BTreeMap<String, SourceRange>,
}

/// Per input (keyed like the offsets), each partition's watermark as
/// `(partition, ns)`, for the commit record (pairs, not a map: the record
/// is read through `#[serde(flatten)]`, which keeps JSON keys strings).
pub type PartitionWatermarks = BTreeMap<String, Vec<(u32, i64)>>;

/// Epoch N committed: the one record of that fact.
///
/// The checkpoint keeps it as `commits/N`; a sink that records its own
/// commits (the transactional Kafka sink's progress topic) keeps the same
/// record in the epoch's transaction; recovery reads it from whichever
/// decides. Its JSON is the plan's fields (`epoch`, `planned_at_ms`,
/// `sources`) and the fields below, so that records of earlier releases —
/// a `commits/N` without the plan, a progress record without
/// `output_rows` — still read.
///
/// ```
/// use sluice_engine::{EpochCommit, OffsetRecord};
/// let commit = EpochCommit {
///     plan: OffsetRecord { epoch: 7, ..Default::default() },
///     watermarks: [("0:bids".to_string(), 3_000_000), ("1:ads".to_string(), 2_000_000)].into(),
///     ..Default::default()
/// };
/// assert_eq!(commit.watermark(), Some(2_000_000));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochCommit {
    /// The epoch's number and source ranges. Empty sources: a `commits/N`
    /// of an earlier release, whose plan is `offsets/N`.
    #[serde(flatten)]
    pub plan: OffsetRecord,
    /// Operator state files staged for the epoch (paths relative to the
    /// checkpoint); recovery loads exactly these.
    #[serde(default)]
    pub state_files: Vec<String>,
    /// Each input's event-time watermark after the epoch (ns since the Unix
    /// epoch), keyed like the offsets; empty without watermarks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub watermarks: BTreeMap<String, i64>,
    /// Per input whose source names its partitions (Kafka's), each
    /// partition's watermark; the input's own is in `watermarks`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partition_watermarks: PartitionWatermarks,
    /// Wall-clock time of the commit (ms since the Unix epoch).
    #[serde(default)]
    pub committed_at_ms: i64,
    /// Rows the epoch wrote to the sink.
    #[serde(default)]
    pub output_rows: u64,
    /// What the query's state and offsets depend on (its inputs' topics or
    /// directories, and each stateful operator's keys, functions and
    /// columns), so that a changed query is refused instead of restoring
    /// state that does not fit it; `None` in records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The cluster each input read (a Kafka cluster id), keyed like the
    /// offsets: offsets of one cluster mean nothing on another, whatever
    /// the topic's name. Empty in records of earlier releases and for
    /// inputs without one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clusters: BTreeMap<String, String>,
}

impl EpochCommit {
    /// Refuses state file paths that would lead outside the checkpoint:
    /// absolute ones and any with `..`. The paths come from files and
    /// Kafka records, which someone else may have written.
    pub fn check_state_paths(&self) -> std::result::Result<(), String> {
        use std::path::Component;
        match self.state_files.iter().find(|f| {
            f.is_empty()
                || !std::path::Path::new(f)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
        }) {
            None => Ok(()),
            Some(bad) => Err(format!(
                "epoch {} names the state file '{bad}', which is not a path inside the \
                 checkpoint; this record was not written by Sluice",
                self.epoch()
            )),
        }
    }

    /// The epoch's number.
    pub fn epoch(&self) -> u64 {
        self.plan.epoch
    }

    /// The query's watermark after the epoch: the minimum over its inputs.
    pub fn watermark(&self) -> Option<i64> {
        self.watermarks.values().copied().min()
    }
}

/// A query's checkpoint directory.
///
/// After [`Checkpoint::open`] returns, the directory and its `offsets/` and
/// `commits/` folders exist and `metadata` has been read or written.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    metadata: Metadata,
    /// How `offsets/N` and `commits/N` are written.
    epoch_log: Durability,
}

impl Checkpoint {
    /// Opens the checkpoint at `dir` without creating or changing anything
    /// (for inspection); fails if there is none.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = local_or_remote(dir.into());
        let meta_path = dir.join("metadata");
        if file_len(&meta_path)?.is_none() {
            return Err(SluiceError::checkpoint(
                &dir,
                "no checkpoint here: it has no metadata file (a query writes one when it starts)",
            ));
        }
        Self::open_dirs(dir, "")
    }

    /// The epochs with an `offsets/` record, oldest first.
    pub fn offset_epochs(&self) -> Result<Vec<u64>> {
        epochs_in(&self.dir.join("offsets"))
    }

    /// The epochs with a `commits/` record, oldest first.
    pub fn commit_epochs(&self) -> Result<Vec<u64>> {
        epochs_in(&self.dir.join("commits"))
    }

    /// The size in bytes of a state file a commit names.
    pub fn state_file_len(&self, relative: &str) -> Result<u64> {
        let path = self.dir.join(relative);
        file_len(&path)?.ok_or_else(|| {
            SluiceError::io(
                format!("reading {}", path.display()),
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            )
        })
    }

    /// Whether the state file a commit names is in the checkpoint.
    pub fn has_state_file(&self, relative: &str) -> Result<bool> {
        Ok(file_len(&self.dir.join(relative))?.is_some())
    }

    /// The task folders (`tasks/<i>`) of a query divided into tasks, by
    /// task number; empty for a query that is one task.
    pub fn tasks(&self) -> Result<Vec<u32>> {
        let mut tasks: Vec<u32> = list_dir(&self.dir.join("tasks"))?
            .iter()
            .filter_map(|name| name.parse().ok())
            .collect();
        tasks.sort_unstable();
        Ok(tasks)
    }

    /// Opens (or creates) the checkpoint at `dir`. A new checkpoint gets
    /// `new_query_id` as its query id; an existing one keeps its own.
    /// Temporary files of writes a crash interrupted are removed.
    pub fn open(dir: impl Into<PathBuf>, new_query_id: &str) -> Result<Self> {
        let checkpoint = Self::open_dirs(local_or_remote(dir.into()), new_query_id)?;
        let state = checkpoint.dir.join("state");
        let operators = list_dir(&state)?.into_iter().map(|name| state.join(name));
        for dir in ["", "offsets", "commits"]
            .iter()
            .map(|sub| checkpoint.dir.join(sub))
            .chain(operators)
        {
            remove_leftovers(&dir)?;
        }
        Ok(checkpoint)
    }

    /// [`open`](Self::open), removing nothing.
    fn open_dirs(dir: PathBuf, new_query_id: &str) -> Result<Self> {
        for sub in ["offsets", "commits"] {
            create_dirs(&dir.join(sub))?;
        }
        let meta_path = dir.join("metadata");
        let metadata = if file_len(&meta_path)?.is_some() {
            let m: Metadata = read_file(&meta_path)?;
            if m.format_version != FORMAT_VERSION {
                return Err(SluiceError::checkpoint(
                    &meta_path,
                    format!(
                        "written by checkpoint format version {}, this engine reads version {}; \
                         use a new checkpoint location or the engine version that wrote it",
                        m.format_version, FORMAT_VERSION
                    ),
                ));
            }
            m
        } else {
            let m = Metadata {
                format_version: FORMAT_VERSION,
                query_id: new_query_id.to_string(),
                engine_version: env!("CARGO_PKG_VERSION").to_string(),
            };
            write_file(&meta_path, &m)?;
            m
        };
        Ok(Self {
            dir,
            metadata,
            epoch_log: Durability::Synced,
        })
    }

    /// Writes `offsets/N` and `commits/N` without fsync from now on: for a
    /// sink whose own record of each commit decides recovery
    /// ([`Sink::records_commits`](crate::Sink::records_commits)), of which
    /// they are a cache (see the module's documentation).
    pub fn cache_epoch_log(&mut self) {
        self.epoch_log = Durability::PageCache;
    }

    /// Whether `offsets/N` and `commits/N` are written without fsync.
    pub fn epoch_log_is_cache(&self) -> bool {
        self.epoch_log == Durability::PageCache
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata read or written by [`Checkpoint::open`].
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Writes `offsets/N` (durably unless [`cache_epoch_log`](Self::cache_epoch_log)).
    /// MUST happen before epoch N reads anything.
    pub fn write_offsets(&self, record: &OffsetRecord) -> Result<()> {
        let path = self.epoch_path("offsets", record.epoch);
        write_file_as(&path, self.epoch_log, record)
    }

    /// Removes `offsets/N`: an epoch planned before an operating-system
    /// crash whose record did not survive it, planned again.
    pub fn remove_offsets(&self, epoch: u64) -> Result<()> {
        remove_file(&self.epoch_path("offsets", epoch))
    }

    /// Where inputs that had read nothing yet were resolved to start
    /// (`starts`; see [`write_starts`](Self::write_starts)), by input key.
    pub fn read_starts(&self) -> Result<BTreeMap<String, serde_json::Value>> {
        let path = self.dir.join("starts");
        if file_len(&path)?.is_none() {
            return Ok(BTreeMap::new());
        }
        read_file(&path)
    }

    /// Records where inputs start before they have read anything (a Kafka
    /// source's `latest` resolved to offsets), so that every run before the
    /// first commit of data starts there.
    pub fn write_starts(&self, starts: &BTreeMap<String, serde_json::Value>) -> Result<()> {
        write_file(&self.dir.join("starts"), starts)
    }

    /// Reads `offsets/N`.
    pub fn read_offsets(&self, epoch: u64) -> Result<OffsetRecord> {
        read_file(&self.epoch_path("offsets", epoch))
    }

    /// Writes `commits/N` (durably unless [`cache_epoch_log`](Self::cache_epoch_log)).
    pub fn write_commit(&self, record: &EpochCommit) -> Result<()> {
        let path = self.epoch_path("commits", record.epoch());
        write_file_as(&path, self.epoch_log, record)
    }

    /// Reads `commits/N` with its plan, `offsets/N`, which it must agree
    /// with (a `commits/N` of an earlier release carries no plan).
    pub fn read_commit(&self, epoch: u64) -> Result<EpochCommit> {
        let path = self.epoch_path("commits", epoch);
        let mut commit: EpochCommit = read_file(&path)?;
        commit
            .check_state_paths()
            .map_err(|reason| SluiceError::checkpoint(&path, reason))?;
        let plan = self.read_offsets(epoch)?;
        if !commit.plan.sources.is_empty() && commit.plan != plan {
            return Err(SluiceError::checkpoint(
                &path,
                format!(
                    "its plan differs from offsets/{epoch}: the checkpoint was changed by hand \
                     or by another query; restore both files, or use a new checkpoint location"
                ),
            ));
        }
        commit.plan = plan;
        Ok(commit)
    }

    /// The highest epoch with an `offsets/N` file.
    pub fn latest_offsets_epoch(&self) -> Result<Option<u64>> {
        latest_epoch(&self.dir.join("offsets"))
    }

    /// The highest epoch with a `commits/N` file.
    pub fn latest_commit_epoch(&self) -> Result<Option<u64>> {
        latest_epoch(&self.dir.join("commits"))
    }

    /// Deletes `offsets/` and `commits/` entries older than the newest
    /// `retain` epochs at or below `committed`.
    pub fn purge(&self, committed: u64, retain: u64) -> Result<()> {
        let Some(oldest_kept) = committed.checked_sub(retain.saturating_sub(1)) else {
            return Ok(());
        };
        for sub in ["offsets", "commits"] {
            for epoch in epochs_in(&self.dir.join(sub))? {
                if epoch < oldest_kept {
                    remove_file(&self.epoch_path(sub, epoch))?;
                }
            }
        }
        Ok(())
    }

    fn epoch_path(&self, sub: &str, epoch: u64) -> PathBuf {
        self.dir.join(sub).join(epoch.to_string())
    }
}

fn epochs_in(dir: &Path) -> Result<Vec<u64>> {
    let mut epochs = Vec::new();
    for name in list_dir(dir)? {
        if name.starts_with('.') {
            // A temporary file of an interrupted write: never part of the log.
            continue;
        }
        let epoch = name.parse::<u64>().map_err(|_| {
            SluiceError::checkpoint(
                dir.join(&name),
                "unexpected file in the checkpoint: names here are epoch numbers; \
                 remove the file if it was put there by hand",
            )
        })?;
        epochs.push(epoch);
    }
    epochs.sort_unstable();
    Ok(epochs)
}

fn latest_epoch(dir: &Path) -> Result<Option<u64>> {
    Ok(epochs_in(dir)?.last().copied())
}

/// Serialises `value` as JSON behind a checksummed header and writes it
/// atomically: temporary file, fsync, rename, fsync of the directory.
pub(crate) fn write_file<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    write_file_as(path, Durability::Synced, value)
}

/// [`write_file`] with a choice of [`Durability`].
fn write_file_as<T: Serialize>(path: &Path, durability: Durability, value: &T) -> Result<()> {
    let payload = serde_json::to_vec_pretty(value)
        .map_err(|e| SluiceError::Internal(format!("serialising {}: {e}", path.display())))?;
    write_framed_as(path, durability, &mut |w| w.write_all(&payload))
}

/// Reads a file written by [`write_file`], verifying header and checksum.
pub(crate) fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let payload = read_framed(path)?;
    serde_json::from_slice(&payload).map_err(|e| {
        SluiceError::checkpoint(
            path,
            format!("unreadable content: {e}; the checkpoint is damaged"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::codec::MAGIC;
    use std::fs;

    #[test]
    fn state_paths_outside_the_checkpoint_are_refused() {
        let with = |files: &[&str]| EpochCommit {
            state_files: files.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        };
        assert!(
            with(&["state/0.agg/3.ab.snapshot", "state/1.join/2.cd.delta"])
                .check_state_paths()
                .is_ok()
        );
        for bad in [
            "../elsewhere/3.snapshot",
            "state/../../x",
            "/etc/passwd",
            "",
        ] {
            let err = with(&["state/0.agg/1.a.snapshot", bad])
                .check_state_paths()
                .unwrap_err();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn round_trip_and_latest() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path(), "q1").unwrap();
        assert_eq!(cp.latest_commit_epoch().unwrap(), None);
        for epoch in 1..=3 {
            cp.write_offsets(&OffsetRecord {
                epoch,
                ..Default::default()
            })
            .unwrap();
            cp.write_commit(&EpochCommit {
                plan: OffsetRecord {
                    epoch,
                    ..Default::default()
                },
                output_rows: epoch,
                partition_watermarks: [("in".to_string(), vec![(0, 5), (3, epoch as i64)])].into(),
                ..Default::default()
            })
            .unwrap();
        }
        assert_eq!(cp.latest_commit_epoch().unwrap(), Some(3));
        let second = cp.read_commit(2).unwrap();
        assert_eq!(second.output_rows, 2);
        assert_eq!(second.partition_watermarks["in"], vec![(0, 5), (3, 2)]);
        // Reopening keeps the original query id.
        let again = Checkpoint::open(dir.path(), "q2").unwrap();
        assert_eq!(again.metadata().query_id, "q1");
        again.purge(3, 2).unwrap();
        assert!(again.read_commit(1).is_err());
        assert!(again.read_commit(2).is_ok());
    }

    #[test]
    fn another_format_version_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let newer = FORMAT_VERSION + 1;
        let meta = dir.path().join("metadata");
        write_file(
            &meta,
            &Metadata {
                format_version: newer,
                query_id: "q".into(),
                engine_version: "9.9.9".into(),
            },
        )
        .unwrap();
        let msg = Checkpoint::open(dir.path(), "q").unwrap_err().to_string();
        assert!(msg.contains(&meta.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!(
                "format version {newer}, this engine reads version {FORMAT_VERSION}"
            )),
            "{msg}"
        );
        // A file whose header carries another version is refused the same way.
        let bytes = fs::read(&meta).unwrap();
        let text = String::from_utf8_lossy(&bytes).replacen(
            &format!("{MAGIC} {FORMAT_VERSION} "),
            &format!("{MAGIC} {newer} "),
            1,
        );
        fs::write(&meta, text).unwrap();
        let msg = Checkpoint::open(dir.path(), "q").unwrap_err().to_string();
        assert!(
            msg.contains(&format!(
                "format version {newer}, this engine reads version {FORMAT_VERSION}"
            )),
            "{msg}"
        );
    }

    #[test]
    fn corruption_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path(), "q").unwrap();
        cp.write_commit(&EpochCommit {
            plan: OffsetRecord {
                epoch: 1,
                ..Default::default()
            },
            committed_at_ms: 5,
            output_rows: 7,
            ..Default::default()
        })
        .unwrap();
        let path = dir.path().join("commits/1");
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        let msg = cp.read_commit(1).unwrap_err().to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("checksum mismatch"), "{msg}");

        bytes.truncate(bytes.len() / 2);
        fs::write(&path, &bytes).unwrap();
        let msg = cp.read_commit(1).unwrap_err().to_string();
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn leftovers_of_interrupted_writes_go_at_open_and_a_purge_tolerates_gone_files() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path(), "q").unwrap();
        for epoch in 1..=3 {
            cp.write_offsets(&OffsetRecord {
                epoch,
                ..Default::default()
            })
            .unwrap();
        }
        let state = dir.path().join("state/aggregate");
        fs::create_dir_all(&state).unwrap();
        let leftovers = [
            dir.path().join("offsets/.4.0123.tmp"),
            dir.path().join(".metadata.4567.tmp"),
            state.join(".5.run.delta.89ab.tmp"),
        ];
        let interrupted = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        for f in &leftovers {
            fs::write(f, b"half written").unwrap();
            let file = fs::File::options().write(true).open(f).unwrap();
            file.set_modified(interrupted).unwrap();
        }
        // Another process's write in flight is young, and stays.
        let in_flight = dir.path().join(".metadata.cdef.tmp");
        fs::write(&in_flight, b"being written").unwrap();
        let cp = Checkpoint::open(dir.path(), "q").unwrap();
        for f in &leftovers {
            assert!(!f.exists(), "{} is still there", f.display());
        }
        assert!(in_flight.exists(), "a write in flight was removed");
        assert_eq!(cp.offset_epochs().unwrap(), vec![1, 2, 3]);
        // Inspecting changes nothing.
        fs::write(&leftovers[0], b"half written").unwrap();
        Checkpoint::open_existing(dir.path()).unwrap();
        assert!(leftovers[0].exists());

        // A file an earlier, interrupted purge removed is no error.
        fs::remove_file(dir.path().join("offsets/1")).unwrap();
        remove_file(&dir.path().join("offsets/1")).unwrap();
        cp.purge(3, 1).unwrap();
        assert_eq!(cp.offset_epochs().unwrap(), vec![3]);
    }
}
