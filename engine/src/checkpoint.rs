//! The checkpoint directory: what a query has planned and committed.
//!
//! ```text
//! <location>/metadata     query id and format version; written once
//! <location>/offsets/N    source offset ranges of epoch N, written before it runs
//! <location>/commits/N    epoch N committed (its output reached the sink)
//! ```
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

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use datafusion::arrow::record_batch::RecordBatch;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Result, SluiceError};

/// Version of the checkpoint layout this engine writes and reads.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &str = "SLUICE-CHECKPOINT";

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffsetRecord {
    /// The epoch number, from 1.
    pub epoch: u64,
    /// Wall-clock time the epoch was planned (ms since the Unix epoch).
    pub planned_at_ms: i64,
    /// Per source (keyed by the source's position and name), its range.
    pub sources: BTreeMap<String, SourceRange>,
}

/// `commits/N`: epoch N's output reached the sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// The epoch number.
    pub epoch: u64,
    /// Wall-clock time of the commit (ms since the Unix epoch).
    pub committed_at_ms: i64,
    /// Rows the epoch wrote to the sink.
    pub output_rows: u64,
    /// Operator state files staged for the epoch (paths relative to the
    /// checkpoint); recovery loads exactly these.
    #[serde(default)]
    pub state_files: Vec<String>,
    /// Each input's event-time watermark after the epoch (ns since the Unix
    /// epoch), keyed like the offsets; empty without watermarks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub watermarks: BTreeMap<String, i64>,
}

/// An epoch as a sink commits it: its plan, the state files staged for it,
/// and what its sources hand over (dead letters, consumer-group offsets).
/// The transactional Kafka sink puts the plan, state files and watermarks
/// in its progress record, and the rest in the epoch's transaction too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochCommit {
    /// The epoch's number and source ranges.
    pub plan: OffsetRecord,
    /// Operator state files staged for the epoch.
    pub state_files: Vec<String>,
    /// Each input's event-time watermark after the epoch (ns since the Unix
    /// epoch), keyed like the offsets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub watermarks: BTreeMap<String, i64>,
    /// Records the sources could not decode, for their dead-letter topics.
    #[serde(skip)]
    pub dead_letters: Vec<crate::source::DeadLetter>,
    /// Consumer-group offsets the sources ask to record with the epoch.
    #[serde(skip)]
    pub group_offsets: Vec<crate::source::GroupOffsets>,
    /// Update mode: the keys of groups that left the output this epoch (a
    /// HAVING no longer true), as rows of the output's key columns. A
    /// keyed sink deletes them; Kafka writes a tombstone per key.
    #[serde(skip)]
    pub retracted: Option<RecordBatch>,
}

impl EpochCommit {
    /// The query's watermark after the epoch: the minimum over its inputs.
    pub fn watermark(&self) -> Option<i64> {
        self.watermarks.values().copied().min()
    }
}

/// The two kinds of operator state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateFile {
    /// The whole state: starts a chain.
    Snapshot,
    /// The changes of one epoch, applied after the chain's earlier files.
    Delta,
}

/// A query's checkpoint directory.
///
/// After [`Checkpoint::open`] returns, the directory and its `offsets/` and
/// `commits/` folders exist and `metadata` has been read or written.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    metadata: Metadata,
}

impl Checkpoint {
    /// Opens the checkpoint at `dir` without creating or changing anything
    /// (for inspection); fails if there is none.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        let meta_path = dir.join("metadata");
        if !meta_path.exists() {
            return Err(SluiceError::checkpoint(
                &dir,
                "no checkpoint here: it has no metadata file (a query writes one when it starts)",
            ));
        }
        Self::open(dir, "")
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
        fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| SluiceError::io(format!("reading {}", path.display()), e))
    }

    /// Opens (or creates) the checkpoint at `dir`. A new checkpoint gets
    /// `new_query_id` as its query id; an existing one keeps its own.
    pub fn open(dir: impl Into<PathBuf>, new_query_id: &str) -> Result<Self> {
        let dir = dir.into();
        for sub in ["offsets", "commits"] {
            let p = dir.join(sub);
            fs::create_dir_all(&p).map_err(|e| {
                SluiceError::io(format!("creating checkpoint directory {}", p.display()), e)
            })?;
        }
        let meta_path = dir.join("metadata");
        let metadata = if meta_path.exists() {
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
        Ok(Self { dir, metadata })
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata read or written by [`Checkpoint::open`].
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Writes `offsets/N` durably. MUST happen before epoch N reads anything.
    pub fn write_offsets(&self, record: &OffsetRecord) -> Result<()> {
        write_file(&self.epoch_path("offsets", record.epoch), record)
    }

    /// Reads `offsets/N`.
    pub fn read_offsets(&self, epoch: u64) -> Result<OffsetRecord> {
        read_file(&self.epoch_path("offsets", epoch))
    }

    /// Writes `commits/N` durably.
    pub fn write_commit(&self, record: &CommitRecord) -> Result<()> {
        write_file(&self.epoch_path("commits", record.epoch), record)
    }

    /// Reads `commits/N`.
    pub fn read_commit(&self, epoch: u64) -> Result<CommitRecord> {
        read_file(&self.epoch_path("commits", epoch))
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
                    let p = self.epoch_path(sub, epoch);
                    fs::remove_file(&p)
                        .map_err(|e| SluiceError::io(format!("removing {}", p.display()), e))?;
                }
            }
        }
        Ok(())
    }

    /// Stages operator `op`'s state after `epoch`, written by run `run`:
    /// `state/<op>/<epoch>.<run>.snapshot`. Returns the path relative to the
    /// checkpoint, for the commit record.
    pub(crate) fn write_state(
        &self,
        op: &str,
        epoch: u64,
        run: &str,
        kind: StateFile,
        write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<String> {
        let suffix = match kind {
            StateFile::Snapshot => "snapshot",
            StateFile::Delta => "delta",
        };
        let relative = format!("state/{op}/{epoch}.{run}.{suffix}");
        let path = self.dir.join(&relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| SluiceError::io(format!("creating {}", parent.display()), e))?;
        }
        write_streaming(&path, write)?;
        Ok(relative)
    }

    /// Reads a state file a commit record names.
    pub(crate) fn read_state(&self, relative: &str) -> Result<Vec<u8>> {
        read_bytes(&self.dir.join(relative))
    }

    /// Deletes operator `op`'s state files older than the chains of the
    /// `retain` newest snapshots up to `chain_start` (the committed chain's
    /// first file): those chains stay restorable, older ones go.
    pub(crate) fn purge_state(&self, op: &str, chain_start: &str, retain: usize) -> Result<()> {
        let epoch_of = |name: &str| {
            let file = name.rsplit('/').next().unwrap_or(name);
            file.split('.').next().and_then(|e| e.parse::<u64>().ok())
        };
        let Some(start) = epoch_of(chain_start) else {
            return Ok(());
        };
        let dir = self.dir.join("state").join(op);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(());
        };
        let files: Vec<(String, u64)> = entries
            .flatten()
            .filter_map(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                let epoch = epoch_of(&name)?;
                Some((name, epoch))
            })
            .collect();
        let mut snapshots: Vec<u64> = files
            .iter()
            .filter(|(n, e)| n.ends_with(".snapshot") && *e <= start)
            .map(|(_, e)| *e)
            .collect();
        snapshots.sort_unstable_by(|a, b| b.cmp(a));
        snapshots.dedup();
        let keep_from = snapshots
            .get(retain.max(1) - 1)
            .or(snapshots.last())
            .copied()
            .unwrap_or(start);
        for (name, epoch) in files {
            if epoch < keep_from {
                let p = dir.join(&name);
                fs::remove_file(&p)
                    .map_err(|e| SluiceError::io(format!("removing {}", p.display()), e))?;
            }
        }
        Ok(())
    }

    fn epoch_path(&self, sub: &str, epoch: u64) -> PathBuf {
        self.dir.join(sub).join(epoch.to_string())
    }
}

fn epochs_in(dir: &Path) -> Result<Vec<u64>> {
    let entries =
        fs::read_dir(dir).map_err(|e| SluiceError::io(format!("listing {}", dir.display()), e))?;
    let mut epochs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SluiceError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            // A temporary file of an interrupted write: never part of the log.
            continue;
        }
        let epoch = name.parse::<u64>().map_err(|_| {
            SluiceError::checkpoint(
                entry.path(),
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
    let payload = serde_json::to_vec_pretty(value)
        .map_err(|e| SluiceError::Internal(format!("serialising {}: {e}", path.display())))?;
    write_bytes(path, &payload)
}

/// Writes `payload` behind a checksummed header, atomically.
fn write_bytes(path: &Path, payload: &[u8]) -> Result<()> {
    write_streaming(path, &mut |w| w.write_all(payload))
}

/// The header line: magic, format version, CRC-32 and length of the
/// payload. Fixed width, so it can be written before the payload is known
/// and rewritten in place after it.
fn header(crc: u32, len: u64) -> String {
    format!("{MAGIC} {FORMAT_VERSION} {crc:08x} {len:020}\n")
}

/// Counts and checksums what passes through to the file.
struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `path` atomically (temporary file, fsync, rename, fsync of the
/// directory) with a payload `write` produces, streamed: a large state
/// snapshot never has to be held in memory whole.
fn write_streaming(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| SluiceError::Internal(format!("{} has no parent", path.display())))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{file_name}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let io = |e| SluiceError::io(format!("writing {}", tmp.display()), e);
    let mut f = fs::File::create(&tmp).map_err(io)?;
    f.write_all(header(0, 0).as_bytes()).map_err(io)?;
    let mut body = Checksummed {
        inner: std::io::BufWriter::with_capacity(1 << 20, f),
        crc: crc32fast::Hasher::new(),
        len: 0,
    };
    write(&mut body).map_err(io)?;
    body.flush().map_err(io)?;
    let Checksummed { inner, crc, len } = body;
    let mut f = inner.into_inner().map_err(|e| io(e.into_error()))?;
    let crc = crc.finalize();
    f.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
    f.write_all(header(crc, len).as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| {
        SluiceError::io(
            format!("renaming {} to {}", tmp.display(), path.display()),
            e,
        )
    })?;
    // The rename is durable only once the directory entry is.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads a file written by [`write_file`], verifying header and checksum.
pub(crate) fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let payload = read_bytes(path)?;
    serde_json::from_slice(&payload).map_err(|e| {
        SluiceError::checkpoint(
            path,
            format!("unreadable content: {e}; the checkpoint is damaged"),
        )
    })
}

/// Reads a file written by [`write_bytes`], verifying header and checksum.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let bytes =
        fs::read(path).map_err(|e| SluiceError::io(format!("reading {}", path.display()), e))?;
    let corrupt = |reason: String| {
        SluiceError::checkpoint(
            path,
            format!(
                "{reason}; the checkpoint is damaged. Restore the file from a backup, or \
                 start the query on a new checkpoint location (it will reprocess from the start)"
            ),
        )
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt("missing header line".into()))?;
    let header =
        std::str::from_utf8(&bytes[..newline]).map_err(|_| corrupt("header is not text".into()))?;
    let parts: Vec<&str> = header.split(' ').collect();
    let [magic, version, crc, len] = parts[..] else {
        return Err(corrupt(format!("malformed header '{header}'")));
    };
    if magic != MAGIC {
        return Err(corrupt(format!(
            "not a Sluice checkpoint file (header '{header}')"
        )));
    }
    if version != FORMAT_VERSION.to_string() {
        return Err(SluiceError::checkpoint(
            path,
            format!(
                "written by checkpoint format version {version}, this engine reads version \
                 {FORMAT_VERSION}; use the engine version that wrote it or a new checkpoint location"
            ),
        ));
    }
    let payload = &bytes[newline + 1..];
    let len: usize = len
        .parse()
        .map_err(|_| corrupt(format!("malformed length in header '{header}'")))?;
    if payload.len() != len {
        return Err(corrupt(format!(
            "truncated or extended: header says {len} bytes, file has {}",
            payload.len()
        )));
    }
    let crc = u32::from_str_radix(crc, 16)
        .map_err(|_| corrupt(format!("malformed checksum in header '{header}'")))?;
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(payload.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_latest() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path(), "q1").unwrap();
        assert_eq!(cp.latest_commit_epoch().unwrap(), None);
        for epoch in 1..=3 {
            cp.write_commit(&CommitRecord {
                epoch,
                committed_at_ms: 0,
                output_rows: epoch,
                state_files: Vec::new(),
                watermarks: BTreeMap::new(),
            })
            .unwrap();
        }
        assert_eq!(cp.latest_commit_epoch().unwrap(), Some(3));
        assert_eq!(cp.read_commit(2).unwrap().output_rows, 2);
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
        cp.write_commit(&CommitRecord {
            epoch: 1,
            committed_at_ms: 5,
            output_rows: 7,
            state_files: Vec::new(),
            watermarks: BTreeMap::new(),
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
}
