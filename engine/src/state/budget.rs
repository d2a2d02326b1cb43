//! State beyond memory: the memory limit of a process's keyed state
//! (`state.memory.limit`) and the local disk its coldest keys go to past
//! it (`state.local.dir`).
//!
//! A [`StateBudget`] is the process's, as its memory is: every store that
//! spills (`KeyedState::within`) reports the bytes it holds after each of
//! its commits, and is told how many to shed when all of them together
//! hold more than the limit. A store sheds its least recently touched keys
//! into an embedded LSM of its own on local disk (fjall, chosen over
//! RocksDB by measurement: `benches/README.md`), and reads them back when
//! an epoch meets them again. Its own, not a partition of one the process
//! shares: fjall 2.11 can race a flush against a partition being dropped
//! and panic in its flush thread, where a whole store closes by its
//! designed shutdown. The disk holds no more than a cache of the committed
//! state: the checkpoint stays the state's durable copy, so the disk is
//! written without a sync and a restart starts it afresh.
//!
//! Shedding brings the stores down to [`TARGET`] of the limit at once, not
//! just under it, so that an epoch's new keys do not make every commit
//! shed a few.
//!
//! What a store's disk keeps in memory as it grows is state held too, and
//! counts: its bloom filters (about 10 bits per key on disk: 125 MB at
//! 100 M keys; [`Disk::memory_bytes`]). Its cache and write buffer are
//! bounded instead, by a 64th of the limit each, and its compactions'
//! buffers by the size of the segments they write.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use datafusion::execution::SessionState;

use crate::error::{Result, SluiceError};

/// The share of the limit the stores are brought down to when they pass
/// it.
pub(crate) const TARGET: f64 = 0.75;

/// The memory limit of a process's keyed state and its disk past it.
///
/// ```
/// use sluice_engine::StateBudget;
/// let budget = StateBudget::new(512 << 20, None); // 512 MiB, a temporary directory
/// assert_eq!(budget.limit(), 512 << 20);
/// ```
#[derive(Debug)]
pub struct StateBudget {
    limit: u64,
    /// `state.local.dir`; `None`: a temporary directory.
    dir: Option<PathBuf>,
    /// Per store: the bytes it holds in memory, as last reported.
    held: Mutex<HashMap<u64, u64>>,
    next_store: AtomicU64,
}

/// The embedded LSM holding what one store shed: key → row.
pub(crate) struct Disk {
    /// Declared before the directory, so closed before it goes.
    keyspace: fjall::Keyspace,
    rows: fjall::PartitionHandle,
    /// Where it is, for errors.
    dir: PathBuf,
    /// A directory made for it: removed with it.
    _temp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("dir", &self.dir).finish()
    }
}

impl StateBudget {
    /// A budget of `limit` bytes, shedding into `dir` (a temporary
    /// directory when `None`).
    pub fn new(limit: u64, dir: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            dir,
            held: Mutex::new(HashMap::new()),
            next_store: AtomicU64::new(0),
        })
    }

    /// The process's budget: the one its running queries share, made by
    /// the first that sets a limit. A query setting a lower limit than the
    /// one in force gets a budget of its own with its limit, as a user
    /// lowering it would expect; a higher one shares the one in force.
    pub(crate) fn for_process(limit: u64, dir: Option<PathBuf>) -> Arc<Self> {
        static PROCESS: Mutex<Weak<StateBudget>> = Mutex::new(Weak::new());
        let mut process = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(budget) = process.upgrade() {
            if budget.limit <= limit && budget.dir == dir {
                return budget;
            }
        }
        let budget = Self::new(limit, dir);
        *process = Arc::downgrade(&budget);
        budget
    }

    /// The budget a query's operators run within, if its settings set one
    /// (see `Statement::within_budget`).
    pub(crate) fn of(ctx: &SessionState) -> Option<Arc<Self>> {
        ctx.config().get_extension::<Self>()
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A number for a new store: how the budget tells the stores apart.
    pub(crate) fn register(&self) -> u64 {
        self.next_store.fetch_add(1, Ordering::Relaxed)
    }

    fn held(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Store `store` holds `bytes` in memory: how many it should shed, its
    /// share (by size) of what all the stores hold beyond [`TARGET`] of
    /// the limit, once they hold more than the limit; else 0.
    pub(crate) fn report(&self, store: u64, bytes: u64) -> u64 {
        let mut held = self.held();
        held.insert(store, bytes);
        let total: u64 = held.values().sum();
        if total <= self.limit || total == 0 {
            return 0;
        }
        let over = total as f64 - TARGET * self.limit as f64;
        (over * bytes as f64 / total as f64).ceil() as u64
    }

    /// Store `store` is gone.
    pub(crate) fn forget(&self, store: u64) {
        self.held().remove(&store);
    }

    /// Bytes all stores hold in memory, as last reported.
    pub fn held_bytes(&self) -> u64 {
        self.held().values().sum()
    }

    /// A new, empty disk for a store, in a directory of its own.
    pub(crate) fn disk(&self) -> Result<Disk> {
        Disk::open(self.dir.as_deref(), self.limit)
    }
}

impl Disk {
    fn open(dir: Option<&Path>, limit: u64) -> Result<Self> {
        let (dir, temp) = match dir {
            Some(dir) => {
                // One directory per store: two processes (or two stores)
                // given one 'state.local.dir' never share files.
                let parent = dir.to_path_buf();
                std::fs::create_dir_all(&parent)
                    .map_err(|e| local_error(&parent, &e.to_string()))?;
                let temp = tempfile::Builder::new()
                    .prefix("sluice-state-")
                    .tempdir_in(&parent)
                    .map_err(|e| local_error(&parent, &e.to_string()))?;
                (temp.path().to_path_buf(), Some(temp))
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("sluice-state-")
                    .tempdir()
                    .map_err(|e| local_error(&std::env::temp_dir(), &e.to_string()))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        // Its caches count against the limit: a sixty-fourth each,
        // within 2 to 32 MiB.
        let share = (limit / 64).clamp(2 << 20, 32 << 20);
        let failed = |e: fjall::Error| local_error(&dir, &e.to_string());
        // One flush and one compaction thread per store (fjall's default
        // is one per core, up to 4, each): a process holds a store per
        // task and spilling operator.
        let keyspace = fjall::Config::new(&dir)
            .cache_size(share)
            .max_write_buffer_size(share)
            .flush_workers(1)
            .compaction_workers(1)
            .manual_journal_persist(true)
            .fsync_ms(None)
            .open()
            .map_err(failed)?;
        // A compaction holds 16 bytes per key of the segment it writes
        // (the keys' hashes, for the segment's bloom filter) until the
        // segment is done: 128 MiB for fjall's default 64 MiB segments of
        // small rows. A quarter of that size bounds it to 32 MiB.
        let compaction = fjall::compaction::Leveled {
            target_size: 16 << 20,
            ..Default::default()
        };
        let options = fjall::PartitionCreateOptions::default()
            .max_memtable_size(8 << 20)
            .compaction_strategy(fjall::compaction::Strategy::Leveled(compaction));
        let rows = keyspace.open_partition("rows", options).map_err(failed)?;
        Ok(Self {
            keyspace,
            rows,
            dir,
            _temp: temp,
        })
    }

    /// The rows, key → row.
    pub(crate) fn rows(&self) -> &fjall::PartitionHandle {
        &self.rows
    }

    /// Bytes it holds in memory that grow with what it holds: its bloom
    /// filters (about 10 bits per key on disk, loaded with each segment).
    /// Its cache and write buffer are bounded instead, by a 64th of the
    /// limit each.
    pub(crate) fn memory_bytes(&self) -> u64 {
        use fjall::AbstractTree;
        self.rows.tree.bloom_filter_size() as u64
    }

    /// A batch of writes.
    pub(crate) fn batch(&self) -> fjall::Batch {
        self.keyspace.batch()
    }

    /// Writes `batch`, and hands the journal's buffer to the file system
    /// (no sync: the disk is a cache of the checkpoint), so that a disk
    /// that is full fails the write now, naming the directory, rather than
    /// a later flush that only logs it.
    pub(crate) fn commit(&self, batch: fjall::Batch) -> Result<()> {
        batch.commit().map_err(|e| self.error(e))?;
        self.keyspace
            .persist(fjall::PersistMode::Buffer)
            .map_err(|e| self.error(e))
    }

    /// `e`, a failure of the disk, as an error naming its directory.
    pub(crate) fn error(&self, e: impl std::fmt::Display) -> SluiceError {
        local_error(&self.dir, &e.to_string())
    }
}

/// A failure of the local state directory `dir`: what to do names the
/// setting.
fn local_error(dir: &Path, message: &str) -> SluiceError {
    SluiceError::External {
        what: format!("state on local disk at {}", dir.display()),
        message: message.to_string(),
        hint: Some(
            "state past 'state.memory.limit' lives there: give 'state.local.dir' a writable \
             directory with room, or raise 'state.memory.limit'"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_past_the_limit_shed_their_share_down_to_the_target() {
        let budget = StateBudget::new(1000, None);
        let (a, b) = (budget.register(), budget.register());
        assert_eq!(budget.report(a, 600), 0);
        // 1200 held: 450 over the target (750), a third of it b's.
        assert_eq!(budget.report(b, 600), 225);
        assert_eq!(budget.report(a, 600), 225);
        budget.forget(b);
        assert_eq!(budget.held_bytes(), 600);
    }

    #[test]
    fn an_unwritable_local_dir_is_named_with_what_to_do() {
        let file = tempfile::NamedTempFile::new().unwrap();
        // A directory under a file cannot be made.
        let dir = file.path().join("state");
        let budget = StateBudget::new(1 << 20, Some(dir.clone()));
        let err = budget.disk().unwrap_err().to_string();
        assert!(err.contains(&dir.display().to_string()), "{err}");
        assert!(err.contains("'state.local.dir'"), "{err}");
    }
}
