//! Giving an epoch's freed working memory back to the operating system.
//!
//! An epoch over a large state builds intermediate arrays of megabytes to
//! tens of megabytes (the epoch's partial states, the stored rows it
//! merges, its output, its state delta) and frees them when it ends.
//! glibc's malloc raises its mmap threshold (up to 32 MB) each time such a
//! chunk is freed, after which chunks of that size come from its arenas
//! and stay there, resident, once freed. A process holding 10 M keys kept
//! 40–80 MB beyond its live memory that way (peak RSS 0.56–0.64 GB instead
//! of 0.55–0.57 GB; `benches/README.md`).
//!
//! So after each epoch, [`epoch_done`] wakes a background thread that
//! returns what malloc holds free (`malloc_trim`), at most every 300 ms
//! (and after a trim of t ms, not for 4t ms). Once a second was too seldom
//! once epochs over 10 M keys took 0.3 s: peaks of 582–605 MB against
//! 540–551 MB, epochs as long (benches/README.md). The trim runs beside
//! the epochs, not in them: with little freed it takes a fraction of a
//! millisecond, with a large state's working set tens of milliseconds.
//! Fixing the threshold instead (4 MiB: every large array mapped and
//! unmapped) held the same process at 0.49 GB but made its epochs a
//! quarter slower, as every epoch faulted its arrays in anew.
//!
//! Since that thread returns the memory, glibc need not do it itself in the
//! middle of an epoch: before the first epoch, [`tune_allocator`] sets malloc's trim
//! threshold to 1 GiB (glibc's default trims its heap whenever 128 KiB to
//! 64 MiB lie free at its top) and fixes its mmap threshold at 32 MiB
//! (where it ends up anyway; fixed, it never starts below). Memory an
//! epoch frees is then reused by the next steps of the same epoch rather
//! than returned and faulted back in page by page: a Kafka pass-through
//! allocates and frees every record it reads and writes. Side by side
//! (benches/README.md), the pass-through with epochs of a million records
//! went from 0.71 to 0.94 of the raw copy, and the 10 M-key state's
//! peak RSS from 557 to 527 MB with epochs 14 % shorter.
//!
//! Nothing changes on other platforms or C libraries (jemalloc and
//! mimalloc return memory on their own); `SLUICE_MALLOC_TRIM=0` in the
//! environment turns both off, and malloc settings in `GLIBC_TUNABLES`
//! leave the thresholds to the user.

/// Sets glibc malloc's trim threshold (1 GiB) and mmap threshold (32 MiB)
/// for a process whose freed memory Sluice returns to the system itself,
/// once per process. Every query calls it before its first epoch; a
/// program may call it at its start, so that what runs before the first
/// query (or beside it, as a benchmark's baseline) runs with the same
/// allocator. Does nothing off glibc, with `SLUICE_MALLOC_TRIM=0`, or when
/// `GLIBC_TUNABLES` sets malloc parameters.
///
/// ```
/// sluice_engine::tune_allocator();
/// ```
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::tune();
}

/// Tells the trimming thread an epoch ended and its working memory is
/// freed (starting the thread the first time). Never blocks.
pub(crate) fn epoch_done() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::epoch_done();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::c_int;
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::{Once, OnceLock};
    use std::time::Duration;

    /// The shortest time between two trims: what a trim releases, the
    /// next epochs fault back in as they need it (at 100 ms, epochs over
    /// 10 M keys were a tenth slower).
    const MIN_INTERVAL: Duration = Duration::from_millis(300);

    /// How much free memory at the top of a heap makes glibc return it on
    /// its own; beyond any epoch's working set, so that only the trimming
    /// thread returns memory.
    const TRIM_THRESHOLD: c_int = 1 << 30;
    /// Chunks from this size up are mapped on their own, and unmapped when
    /// freed.
    const MMAP_THRESHOLD: c_int = 32 << 20;
    /// `mallopt` parameters, from glibc's `malloc.h`.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;

    extern "C" {
        /// glibc: returns the free memory of every arena to the system,
        /// keeping `pad` bytes at the top of the main heap.
        fn malloc_trim(pad: usize) -> c_int;
        /// glibc: sets one of malloc's parameters; 1 on success.
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }

    /// Whether `SLUICE_MALLOC_TRIM=0` turned trimming (and so tuning) off.
    fn trim_off() -> bool {
        std::env::var("SLUICE_MALLOC_TRIM").is_ok_and(|v| v.trim() == "0")
    }

    pub(super) fn tune() {
        static TUNED: Once = Once::new();
        TUNED.call_once(|| {
            let users = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
            if trim_off() || users {
                return;
            }
            // SAFETY: mallopt takes malloc's own lock; these parameters
            // only change when memory is returned to the system.
            let set = unsafe {
                mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                    && mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            };
            if !set {
                tracing::debug!("malloc refused the trim and mmap thresholds; left as they were");
            }
        });
    }

    pub(super) fn epoch_done() {
        static WAKE: OnceLock<Option<SyncSender<()>>> = OnceLock::new();
        let wake = WAKE.get_or_init(|| {
            if trim_off() {
                return None;
            }
            let (wake, woken) = sync_channel(1);
            let thread = std::thread::Builder::new()
                .name("sluice-malloc-trim".into())
                .spawn(move || {
                    while woken.recv().is_ok() {
                        let began = std::time::Instant::now();
                        // SAFETY: malloc_trim only releases free pages,
                        // under each arena's own lock.
                        unsafe { malloc_trim(0) };
                        // A long trim waits longer: at most a fifth of a
                        // core goes to trimming.
                        std::thread::sleep((began.elapsed() * 4).max(MIN_INTERVAL));
                    }
                });
            match thread {
                Ok(_) => Some(wake),
                Err(e) => {
                    tracing::warn!("freed memory stays with malloc: no thread to trim it ({e})");
                    None
                }
            }
        });
        if let Some(wake) = wake {
            // A full channel means a trim is already due.
            let _ = wake.try_send(());
        }
    }
}
