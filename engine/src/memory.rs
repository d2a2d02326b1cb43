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
//! millisecond, with a large state's working set tens of milliseconds. Fixing the threshold instead (4 MiB: every large array
//! mapped and unmapped) held the same process at 0.49 GB but made its
//! epochs a quarter slower, as every epoch faulted its arrays in anew.
//!
//! Nothing changes on other platforms or C libraries (jemalloc and
//! mimalloc return memory on their own); `SLUICE_MALLOC_TRIM=0` in the
//! environment turns it off.

/// Tells the trimming thread an epoch ended and its working memory is
/// freed (starting the thread the first time). Never blocks.
pub(crate) fn epoch_done() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::epoch_done();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::OnceLock;
    use std::time::Duration;

    /// The shortest time between two trims: what a trim releases, the
    /// next epochs fault back in as they need it (at 100 ms, epochs over
    /// 10 M keys were a tenth slower).
    const MIN_INTERVAL: Duration = Duration::from_millis(300);

    extern "C" {
        /// glibc: returns the free memory of every arena to the system,
        /// keeping `pad` bytes at the top of the main heap.
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }

    pub(super) fn epoch_done() {
        static WAKE: OnceLock<Option<SyncSender<()>>> = OnceLock::new();
        let wake = WAKE.get_or_init(|| {
            if std::env::var("SLUICE_MALLOC_TRIM").is_ok_and(|v| v.trim() == "0") {
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
