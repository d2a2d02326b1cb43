//! Read-modify-write of (count, sum) per BIGINT key, as a GROUP BY's state
//! would: KEYS distinct keys, UPDATES updates in epochs of EPOCH, each
//! epoch persisted (fsync) at its end. Prints updates/s, the directory's
//! size and the peak RSS.
use std::time::Instant;
fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (keys, updates, epoch, cache_mb) = (
        arg(1, 10_000_000),
        arg(2, 30_000_000),
        arg(3, 1_000_000),
        arg(4, 256),
    );
    let dir = std::env::temp_dir().join("fjall-probe-data");
    let _ = std::fs::remove_dir_all(&dir);
    let ks = fjall::Config::new(&dir)
        .cache_size(cache_mb * 1024 * 1024)
        .open()
        .unwrap();
    let p = ks
        .open_partition("state", fjall::PartitionCreateOptions::default())
        .unwrap();
    let began = Instant::now();
    let mut x: u64 = 0x9E3779B97F4A7C15;
    for i in 0..updates {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = (x % keys).to_be_bytes();
        let (count, sum) = match p.get(key).unwrap() {
            Some(v) => (
                u64::from_le_bytes(v[..8].try_into().unwrap()),
                u64::from_le_bytes(v[8..16].try_into().unwrap()),
            ),
            None => (0, 0),
        };
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&(count + 1).to_le_bytes());
        v[8..].copy_from_slice(&(sum + i).to_le_bytes());
        p.insert(key, v).unwrap();
        if (i + 1) % epoch == 0 {
            ks.persist(fjall::PersistMode::SyncAll).unwrap();
        }
    }
    ks.persist(fjall::PersistMode::SyncAll).unwrap();
    let secs = began.elapsed().as_secs_f64();
    report("fjall", updates, secs, &dir);
}
fn report(name: &str, updates: u64, secs: f64, dir: &std::path::Path) {
    let size: u64 = walk(dir);
    let rss = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap()
        .to_string();
    println!(
        "{name}: {updates} updates in {secs:.1} s = {:.0}/s; dir {:.0} MB; peak {rss}",
        updates as f64 / secs,
        size as f64 / 1e6
    );
}
fn walk(d: &std::path::Path) -> u64 {
    std::fs::read_dir(d)
        .map(|r| {
            r.flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        walk(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}
