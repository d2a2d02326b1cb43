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
//!
//! # Sliced chains: checkpoints that carry only what changed
//!
//! A snapshot writes the whole state, which past a memory limit may be
//! many times the memory. A store there never writes one: its keys fall in
//! [`SLICES`] fixed slices (by a hash of the key), and each epoch's delta
//! also holds a few slices whole, in turn (their *images*), about as many
//! rows as the epoch changed:
//!
//! ```text
//! 7.<run>.delta  8.<run>.slices-0-2.delta  9.<run>.slices-2-1.delta ...
//!                (changes, slices 0 and 1 whole)  (changes, slice 2 whole)
//! ```
//!
//! Once every slice has an image in a later file, a file says nothing the
//! later ones do not, and leaves the chain ([`Chain::write`]): an image of
//! slice s holds every key of s the files before it left, and a delta's
//! removals name every key that left, so applying the chain's files in
//! order, from any file on, gives each key its last value. An epoch then
//! writes its changes and about as many rows again, never the whole state,
//! and the chain spans about one turn of the slices.
//!
//! A store restores a sliced chain newest file first, each key from the
//! newest file that names it (`KeyedState::restore_chain`), which gives the
//! same state without reading back, from the store's local disk, rows a
//! newer file replaces.

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
    /// The changes since the last stage, and the slices `Images` names
    /// whole, as one delta: the next file of a sliced chain.
    Sliced(Vec<u8>, Images),
}

/// Slices of a sliced chain: each key falls in one, by a fixed hash of its
/// encoding, the same in every run and version (`state::keyed` computes
/// it; a test there pins it).
pub(crate) const SLICES: u16 = 64;

/// A run of slices a sliced chain's file holds whole: `first`, then the
/// next `count - 1`, wrapping past the last slice to the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Images {
    pub first: u16,
    pub count: u16,
}

impl Images {
    /// Whether slice `s` is among them.
    pub(crate) fn contains(&self, s: u16) -> bool {
        (s + SLICES - self.first) % SLICES < self.count
    }

    /// The slices, in turn.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u16> {
        let first = self.first;
        (0..self.count).map(move |i| (first + i) % SLICES)
    }

    /// As a file name says them: `slices-<first>-<count>`.
    fn name(&self) -> String {
        format!("slices-{}-{}", self.first, self.count)
    }

    /// Of a file name, the images it holds (none for a plain delta or a
    /// snapshot).
    fn of(file: &str) -> Option<Self> {
        let file = file.rsplit('/').next().unwrap_or(file);
        let tag = file.split('.').find_map(|p| p.strip_prefix("slices-"))?;
        let (first, count) = tag.split_once('-')?;
        let (first, count) = (first.parse().ok()?, count.parse().ok()?);
        (first < SLICES && count <= SLICES).then_some(Self { first, count })
    }

    /// As a set of slices, one bit each.
    fn bits(&self) -> u64 {
        self.iter().fold(0, |bits, s| bits | 1 << s)
    }
}

/// What a sliced chain tells its operator's next stage: the slice whose
/// turn it is, and how many files the chain holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slicing {
    pub next: u16,
    pub files: usize,
}

impl Slicing {
    /// Files past which a chain images at least one slice every epoch,
    /// however little changes: bounds what a restart reads and what a
    /// commit record names.
    pub(crate) const FILES: usize = 4 * SLICES as usize;
}

/// A committed chain's files, read one at a time as they are applied (a
/// snapshot, then the deltas after it; a sliced chain from its newest file
/// back), so that restoring holds one file's bytes at a time.
pub(crate) type ChainReader<'a> = &'a mut (dyn DoubleEndedIterator<Item = Result<Vec<u8>>> + Send);

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
    /// The changes of one epoch and the slices it images whole.
    Sliced(Images),
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

    /// For an operator that writes sliced deltas: whose turn it is next.
    pub(crate) fn slicing(&self) -> Slicing {
        let next = self
            .files
            .iter()
            .rev()
            .find_map(|f| Images::of(f))
            .map_or(0, |i| (i.first + i.count) % SLICES);
        Slicing {
            next,
            files: self.files.len(),
        }
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
            Staged::Sliced(bytes, images) => {
                files.push(self.write_file(
                    dir,
                    epoch,
                    run,
                    StateFile::Sliced(images),
                    &mut |w| w.write_all(&bytes),
                )?);
                files = superseded_dropped(files);
            }
        }
        Ok(files)
    }

    /// The committed files' bytes, read one at a time, in order.
    pub(crate) fn read<'a>(
        &'a self,
        dir: &'a Path,
    ) -> impl DoubleEndedIterator<Item = Result<Vec<u8>>> + Send + 'a {
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
        let previous = std::mem::replace(&mut self.files, files);
        let Some(start) = self.files.first() else {
            return Ok(());
        };
        let folder = dir.join("state").join(&self.folder);
        if start.ends_with(".snapshot") {
            return purge(&folder, start, retained);
        }
        // A sliced chain that left its snapshot behind: the files before
        // its start go, or before the previous commit's when two or more
        // commits are retained.
        let keep_from = match previous.first() {
            Some(p) if retained > 1 => epoch_of(p).min(epoch_of(start)),
            _ => epoch_of(start),
        };
        remove_older(&folder, keep_from)
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
            StateFile::Snapshot => "snapshot".to_string(),
            StateFile::Delta => "delta".to_string(),
            StateFile::Sliced(images) => format!("{}.delta", images.name()),
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

/// Of a sliced chain's `files`, those from the newest file on which
/// every slice has an image (a snapshot images them all): earlier files
/// say nothing these do not (see the module).
fn superseded_dropped(mut files: Vec<String>) -> Vec<String> {
    let all = u64::MAX >> (64 - SLICES);
    let mut seen = 0u64;
    for (i, f) in files.iter().enumerate().rev() {
        seen |= match Images::of(f) {
            Some(images) => images.bits(),
            None if f.ends_with(".snapshot") => all,
            None => 0,
        };
        if seen == all {
            files.drain(..i);
            break;
        }
    }
    files
}

/// The epoch a state file was written for (its name's first part).
fn epoch_of(name: &str) -> Option<u64> {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.split('.').next().and_then(|e| e.parse::<u64>().ok())
}

/// The state files in `folder`, with their epochs.
fn epochs_in(folder: &Path) -> Result<Vec<(String, u64)>> {
    Ok(list_dir(folder)?
        .into_iter()
        .filter_map(|name| {
            let epoch = epoch_of(&name)?;
            Some((name, epoch))
        })
        .collect())
}

/// Deletes the files in `folder` of epochs before `keep_from` (none
/// without one).
fn remove_older(folder: &Path, keep_from: Option<u64>) -> Result<()> {
    let Some(keep_from) = keep_from else {
        return Ok(());
    };
    for (name, epoch) in epochs_in(folder)? {
        if epoch < keep_from {
            remove_file(&folder.join(&name))?;
        }
    }
    Ok(())
}

/// Deletes the files in `folder` older than the chains of the `retain`
/// newest snapshots up to `chain_start` (the committed chain's first
/// file): those chains stay restorable, older ones go.
fn purge(folder: &Path, chain_start: &str, retain: usize) -> Result<()> {
    let Some(start) = epoch_of(chain_start) else {
        return Ok(());
    };
    let files = epochs_in(folder)?;
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
    remove_older(folder, Some(keep_from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_says_its_images_and_wraps_past_the_last_slice() {
        let images = Images {
            first: 62,
            count: 3,
        };
        let name = format!("state/0.agg/7.run-1.{}.delta", images.name());
        assert_eq!(Images::of(&name), Some(images));
        assert_eq!(images.iter().collect::<Vec<_>>(), vec![62, 63, 0]);
        assert!(images.contains(0) && images.contains(63) && !images.contains(1));
        assert_eq!(Images::of("state/0.agg/7.run-1.delta"), None);
        assert_eq!(Images::of("state/0.agg/7.run-1.slices-64-1.delta"), None);
    }

    #[test]
    fn a_sliced_chain_starts_at_the_newest_file_after_which_every_slice_has_an_image() {
        let sliced = |epoch: u64, first: u16, count: u16| {
            format!("state/a/{epoch}.r.{}.delta", Images { first, count }.name())
        };
        let mut files = vec![
            "state/a/1.r.snapshot".to_string(),
            "state/a/2.r.delta".into(),
        ];
        files.push(sliced(3, 0, 40));
        // Slices 40..63 have no image after the snapshot's: it stays.
        assert_eq!(superseded_dropped(files.clone()).len(), 3);
        files.push("state/a/4.r.delta".into());
        files.push(sliced(5, 40, 30)); // 40..63, then 0..5
        let kept = superseded_dropped(files.clone());
        assert_eq!(
            kept.first().map(String::as_str),
            Some(sliced(3, 0, 40).as_str())
        );
        assert_eq!(kept.len(), 3);
        // Without a snapshot, a chain whose slices are not all imaged
        // keeps every file.
        let unimaged = vec!["state/a/1.r.delta".to_string(), sliced(2, 0, 10)];
        assert_eq!(superseded_dropped(unimaged.clone()), unimaged);
    }

    #[test]
    fn the_next_slice_follows_the_newest_images() {
        let mut chain = Chain::new("a".into());
        assert_eq!(chain.slicing(), Slicing { next: 0, files: 0 });
        chain.set_committed(vec![
            format!(
                "state/a/3.r.{}.delta",
                Images {
                    first: 60,
                    count: 6
                }
                .name()
            ),
            "state/a/4.r.delta".into(),
        ]);
        assert_eq!(chain.slicing(), Slicing { next: 2, files: 2 });
    }
}
