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
//! All of that serves a query that keeps state, whose live memory is the
//! state. A process whose queries keep none (pass-throughs, filters,
//! projections) has no state to make room for: its memory is the epoch's
//! records, read, decoded and written again every epoch. Returning them
//! after each epoch only makes the next epoch fault them back in page by
//! page, zeroed by the kernel: half of a Kafka pass-through's own CPU with
//! epochs of a million records (`perf`, benches/README.md). glibc also
//! unmaps a thread arena's heap (64 MiB) as soon as it is empty unless
//! its *top pad* is larger, whatever the trim threshold. So while only
//! such queries run ([`query_running`]), freed memory stays with malloc:
//! no trims after epochs, and a top pad of 256 MiB that keeps emptied
//! heaps mapped. The process then holds its largest epoch's
//! working set, as a JVM keeps its heap; once a query that keeps state
//! runs, the pad is glibc's default again and trims resume.
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

/// A running query, for as long as it lives: whether it keeps state
/// decides what the process does with freed memory (see the module's
/// documentation).
#[must_use = "the query counts as running until this is dropped"]
#[derive(Debug)]
pub(crate) struct Running {
    #[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
    keeps_state: bool,
}

/// Counts a query as running until the returned guard drops.
pub(crate) fn query_running(keeps_state: bool) -> Running {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::running(keeps_state, 1);
    Running { keeps_state }
}

impl Drop for Running {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        glibc::running(self.keeps_state, -1);
    }
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
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::{Mutex, Once, OnceLock};
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
    /// The top pad while only queries without state run: above a thread
    /// arena's largest heap (64 MiB), so that no emptied heap is unmapped,
    /// with room for the main heap's growth by more than one heap at once.
    const RETAIN_PAD: c_int = 256 << 20;
    /// glibc's own top pad (`DEFAULT_TOP_PAD`).
    const DEFAULT_PAD: c_int = 128 << 10;
    /// `mallopt` parameters, from glibc's `malloc.h`.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_TOP_PAD: c_int = -2;
    const M_MMAP_THRESHOLD: c_int = -3;

    /// Whether freed memory stays with malloc: only queries without state
    /// run, and tuning is on.
    static RETAIN: AtomicBool = AtomicBool::new(false);

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

    /// Whether Sluice may set malloc's parameters: not with
    /// `SLUICE_MALLOC_TRIM=0`, nor when `GLIBC_TUNABLES` sets them.
    fn tuning() -> bool {
        static TUNING: OnceLock<bool> = OnceLock::new();
        *TUNING.get_or_init(|| {
            let users = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
            !trim_off() && !users
        })
    }

    /// Counts a query in (`change` 1) or out (-1), and sets what the
    /// process does with freed memory for the queries now running.
    pub(super) fn running(keeps_state: bool, change: isize) {
        // (queries keeping state, queries keeping none)
        static RUNNING: Mutex<(isize, isize)> = Mutex::new((0, 0));
        if !tuning() {
            return;
        }
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if keeps_state {
            running.0 += change;
        } else {
            running.1 += change;
        }
        let retain = retains(*running);
        if RETAIN.swap(retain, Ordering::Relaxed) != retain {
            // SAFETY: as in `tune`.
            let set = unsafe { mallopt(M_TOP_PAD, if retain { RETAIN_PAD } else { DEFAULT_PAD }) };
            if set != 1 {
                tracing::debug!("malloc refused the top pad; left as it was");
            }
        }
    }

    /// Whether freed memory stays with malloc while (queries keeping
    /// state, queries keeping none) run: only while some run and none of
    /// them keeps state.
    fn retains((stateful, stateless): (isize, isize)) -> bool {
        stateful <= 0 && stateless > 0
    }

    pub(super) fn tune() {
        static TUNED: Once = Once::new();
        TUNED.call_once(|| {
            if !tuning() {
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
        if RETAIN.load(Ordering::Relaxed) {
            return;
        }
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

    #[cfg(test)]
    mod tests {
        use super::retains;

        #[test]
        fn memory_is_retained_only_while_every_running_query_is_stateless() {
            assert!(!retains((0, 0)), "nothing runs");
            assert!(retains((0, 2)), "only stateless queries");
            assert!(!retains((1, 2)), "a query keeps state");
            assert!(!retains((1, 0)), "only a query that keeps state");
        }
    }
}
