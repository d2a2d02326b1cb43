//! Snapshot-and-deltas chains: how one operator's state reaches the
//! checkpoint, and comes back.
//!
//! ```text
//! state/<folder>/5.<run>.snapshot  6.<run>.delta  7.<run>.delta ...
//!                └──────────── the chain epoch 7 commits ─────┘
//! ```
//!
//! Every epoch that changes an operator's state writes, *before* the epoch
//! commits, one file: a delta (what changed since the last file) or, when
//! the [`SnapshotPolicy`] says so, a snapshot (the whole state), which
//! starts a new chain. The epoch's commit record names its chain, and
//! recovery applies exactly those files, in order, one at a time
//! ([`Chain::read`]). Files carry the writing run's id, so a zombie and its
//! replacement never write the same file, and only what a committed record
//! names is ever read. Once a chain is committed, files older than the
//! retained snapshots' chains are deleted ([`Chain::committed`]).
//!
//! The policy that picks a snapshot or a delta lives here too: a snapshot
//! every [`SnapshotPolicy::every`] files, and one instead of a delta that
//! would be no smaller ([`delta_outgrows`]).

use std::io::Write;
use std::path::Path;

use super::codec::{create_dirs, list_dir, read_framed, remove_file, write_framed};
use crate::error::Result;

/// What an operator stages for one epoch's commit.
#[derive(Debug)]
pub(crate) enum Staged {
    /// No state exists yet.
    Nothing,
    /// Nothing changed since the last stage: the committed chain stands.
    Unchanged,
    /// The changes since the last stage, to append to the chain.
    Delta(Vec<u8>),
    /// The whole state is due: a new chain starts with the operator's
    /// snapshot.
    Snapshot,
}

/// A committed chain's files, read one at a time as they are applied (a
/// snapshot, then the deltas after it), so that restoring holds one file's
/// bytes at a time.
pub(crate) type ChainReader<'a> = &'a mut (dyn Iterator<Item = Result<Vec<u8>>> + Send);

/// When a chain starts anew, and how many chains the checkpoint keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SnapshotPolicy {
    /// State files per chain (a snapshot and its deltas) before a new
    /// snapshot; 1 writes a snapshot every epoch.
    pub every: u64,
    /// Snapshots, with their deltas, kept in the checkpoint.
    pub retained: usize,
}

impl SnapshotPolicy {
    /// Whether the next file of `chain` must be a snapshot: there is no
    /// chain yet, or it is full.
    pub(crate) fn snapshot_due(&self, chain: &Chain) -> bool {
        chain.files.is_empty() || chain.files.len() as u64 >= self.every
    }
}

/// Whether a delta of `appended` rows is no smaller than a snapshot of the
/// `kept` rows: an operator whose rows leave within an epoch (a join's
/// buffers under a short bound) appends more than it keeps, and writes a
/// snapshot instead.
pub(crate) fn delta_outgrows(appended: usize, kept: usize) -> bool {
    appended > 0 && appended >= kept
}

/// One operator's chain in the checkpoint: its folder under `state/` and
/// the files of the last committed epoch.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    folder: String,
    files: Vec<String>,
}

/// The two kinds of state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateFile {
    /// The whole state: starts a chain.
    Snapshot,
    /// The changes of one epoch, applied after the chain's earlier files.
    Delta,
}

impl Chain {
    /// An empty chain in `state/<folder>/`.
    pub(crate) fn new(folder: String) -> Self {
        Self {
            folder,
            files: Vec::new(),
        }
    }

    /// The committed files, relative to the checkpoint.
    pub(crate) fn files(&self) -> &[String] {
        &self.files
    }

    /// Of `files` (a commit's, every operator's), those of this chain.
    pub(crate) fn own(&self, files: &[String]) -> Vec<String> {
        let prefix = format!("state/{}/", self.folder);
        files
            .iter()
            .filter(|f| f.starts_with(&prefix))
            .cloned()
            .collect()
    }

    /// Becomes the chain a commit record names (recovery).
    pub(crate) fn set_committed(&mut self, files: Vec<String>) {
        self.files = files;
    }

    /// Writes what the operator `staged` for `epoch` into the checkpoint at
    /// `dir` (a snapshot through `snapshot`); returns the chain the epoch's
    /// commit names: this one with the new delta, or a new one.
    pub(crate) fn write(
        &self,
        dir: &Path,
        epoch: u64,
        run: &str,
        staged: Staged,
        snapshot: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<Vec<String>> {
        let mut files = self.files.clone();
        match staged {
            Staged::Nothing | Staged::Unchanged => {}
            Staged::Delta(bytes) => {
                files.push(
                    self.write_file(dir, epoch, run, StateFile::Delta, &mut |w| {
                        w.write_all(&bytes)
                    })?,
                )
            }
            Staged::Snapshot => {
                files = vec![
                    self.write_file(dir, epoch, run, StateFile::Snapshot, &mut |w| {
                        snapshot(w).map_err(std::io::Error::other)
                    })?,
                ]
            }
        }
        Ok(files)
    }

    /// The committed files' bytes, read one at a time, in order.
    pub(crate) fn read<'a>(
        &'a self,
        dir: &'a Path,
    ) -> impl Iterator<Item = Result<Vec<u8>>> + Send + 'a {
        self.files.iter().map(move |f| read_framed(&dir.join(f)))
    }

    /// `files` committed: they become the chain, and the files older than
    /// the chains of the `retained` newest snapshots are deleted.
    pub(crate) fn committed(
        &mut self,
        dir: &Path,
        files: Vec<String>,
        retained: usize,
    ) -> Result<()> {
        self.files = files;
        match self.files.first() {
            Some(start) => purge(&dir.join("state").join(&self.folder), start, retained),
            None => Ok(()),
        }
    }

    /// Writes `state/<folder>/<epoch>.<run>.<kind>` atomically; returns its
    /// path relative to the checkpoint.
    fn write_file(
        &self,
        dir: &Path,
        epoch: u64,
        run: &str,
        kind: StateFile,
        write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<String> {
        let suffix = match kind {
            StateFile::Snapshot => "snapshot",
            StateFile::Delta => "delta",
        };
        let relative = format!("state/{}/{epoch}.{run}.{suffix}", self.folder);
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            create_dirs(parent)?;
        }
        write_framed(&path, write)?;
        Ok(relative)
    }
}

/// Deletes the files in `folder` older than the chains of the `retain`
/// newest snapshots up to `chain_start` (the committed chain's first
/// file): those chains stay restorable, older ones go.
fn purge(folder: &Path, chain_start: &str, retain: usize) -> Result<()> {
    let epoch_of = |name: &str| {
        let file = name.rsplit('/').next().unwrap_or(name);
        file.split('.').next().and_then(|e| e.parse::<u64>().ok())
    };
    let Some(start) = epoch_of(chain_start) else {
        return Ok(());
    };
    let files: Vec<(String, u64)> = list_dir(folder)?
        .into_iter()
        .filter_map(|name| {
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
            remove_file(&folder.join(&name))?;
        }
    }
    Ok(())
}
