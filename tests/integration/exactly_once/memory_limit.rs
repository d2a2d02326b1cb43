//! State past `state.memory.limit` through kill -9: a GROUP BY and a
//! window whose groups live on local disk emit exactly what they emit
//! with all their state in memory; a local directory that cannot be
//! written, a full disk and a missing state file stop the query naming
//! them.

use std::time::Duration;

use super::{
    crash_at, failure_free, files_for_kills, kill_until_done, lost_and_duplicated, per_key,
    Pipeline,
};
use crate::util::Run;

/// A GROUP BY of 400 keys under a memory limit of 8 KB: after each commit
/// all but the latest few keys go to local disk, and each epoch reads its
/// keys back. Killed at random moments and at the commit's failure points,
/// it emits exactly what the same query emits with all its state in
/// memory, and its last values are the groups' counts and sums.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_by_past_its_memory_limit_is_exact_after_kill_9_at_random_moments() {
    let files = files_for_kills(40);
    const ROWS: usize = 30;
    const KEYS: usize = 400;
    const QUERY: &str = "SELECT id % 400 AS bucket, count(*) AS n, sum(id) AS total, \
         max(name) AS top FROM rows GROUP BY id % 400";
    const LIMIT: &str = "SET 'state.memory.limit' = '8 KB';\n\
         SET 'state.snapshot.interval' = '4';\n";
    let reference = failure_free(files, ROWS, QUERY).await;

    // Run whole, it holds most of its keys on disk.
    let mut whole = Pipeline::with_query(files, ROWS, QUERY).await;
    whole.settings = LIMIT.to_string();
    let log = whole.dir.join("progress.jsonl");
    let mut cmd = whole.command("checkpoint", "available-now", None);
    cmd.arg("--progress-log").arg(&log);
    let mut run = Run::new(cmd);
    let status = run.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", run.stderr());
    let last: serde_json::Value = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .last()
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap();
    assert_eq!(last["state_rows"], KEYS, "{last}");
    assert!(last["state_disk_bytes"].as_u64() > Some(0), "{last}");
    assert!(
        last["state_bytes"].as_u64() < Some(16 << 10),
        "the memory limit is 8 KB: {last}"
    );
    let emitted = whole.values(true).await;
    assert_eq!(lost_and_duplicated(&emitted, &reference), (0, 0));
    assert_eq!(per_key(&emitted, "bucket"), per_key(&reference, "bucket"));

    let mut p = Pipeline::with_query(files, ROWS, QUERY).await;
    p.settings = LIMIT.to_string();
    for (point, epoch) in [
        ("kafka-before-commit", 3),
        ("kafka-after-commit", 5),
        ("before-commit-record", 9),
    ] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x5b11);
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(lost_and_duplicated(&committed, &reference), (0, 0));
    let per_bucket = per_key(&committed, "bucket");
    assert_eq!(
        per_bucket,
        per_key(&reference, "bucket"),
        "per key, the values emitted are exactly those of the run in memory"
    );
    // The last value of each group against a plain loop over the input.
    assert_eq!(per_bucket.len(), KEYS);
    for values in per_bucket.values() {
        let last: serde_json::Value = serde_json::from_str(values.last().unwrap()).unwrap();
        let bucket = last["bucket"].as_u64().unwrap() as usize;
        let ids: Vec<usize> = (bucket..files * ROWS).step_by(KEYS).collect();
        assert_eq!(last["n"].as_u64(), Some(ids.len() as u64), "{last}");
        assert_eq!(
            last["total"].as_u64(),
            Some(ids.iter().sum::<usize>() as u64),
            "{last}"
        );
    }
}

/// State past the limit with nowhere to go: a `state.local.dir` that
/// cannot be made stops the query with the directory and what to do, and
/// nothing of the epoch that could not shed is committed past what the
/// checkpoint holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_local_state_dir_stops_the_query_naming_it() {
    let mut p = Pipeline::with_query(
        4,
        30,
        "SELECT id % 400 AS bucket, count(*) AS n FROM rows GROUP BY id % 400",
    )
    .await;
    let blocker = p.dir.join("a-file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let dir = blocker.join("state");
    p.settings = format!(
        "SET 'state.memory.limit' = '1 KB';\nSET 'state.local.dir' = '{}';\n",
        dir.display()
    );
    let mut run = p.spawn("available-now", None);
    let status = run.wait(Duration::from_secs(120));
    assert!(!status.success(), "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(err.contains("'state.local.dir'"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A state file the last commit names, gone from the checkpoint: the
/// restart stops naming it and what to do, and leaves the checkpoint as it
/// was (no state rebuilt from empty, nothing committed past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_state_file_stops_the_restart_naming_it() {
    let mut p = Pipeline::with_query(
        4,
        30,
        "SELECT id % 400 AS bucket, count(*) AS n FROM rows GROUP BY id % 400",
    )
    .await;
    p.settings = "SET 'state.memory.limit' = '1 KB';\n".into();
    let mut run = p.spawn("available-now", None);
    assert!(
        run.wait(Duration::from_secs(120)).success(),
        "{}",
        run.stderr()
    );

    // The newest state file: the last commit names its own epoch's.
    let files = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut all = Vec::new();
        let mut dirs = vec![dir.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => dirs.push(path),
                    false => all.push(path),
                }
            }
        }
        all.sort();
        all
    };
    let checkpoint = p.dir.join("checkpoint");
    let newest = files(&checkpoint.join("state"))
        .into_iter()
        .max_by_key(|f| std::fs::metadata(f).unwrap().modified().unwrap())
        .expect("a state file");
    std::fs::remove_file(&newest).unwrap();
    let before: Vec<_> = files(&checkpoint)
        .into_iter()
        .map(|f| (std::fs::read(&f).unwrap(), f))
        .collect();

    let mut run = p.spawn("available-now", None);
    let status = run.wait(Duration::from_secs(120));
    let err = run.stderr();
    assert!(
        !status.success(),
        "restarted without {}: {err}",
        newest.display()
    );
    // Named within the checkpoint, with what to do.
    let name = newest.strip_prefix(&checkpoint).unwrap();
    assert!(err.contains(&checkpoint.display().to_string()), "{err}");
    assert!(err.contains(&name.display().to_string()), "{err}");
    assert!(err.contains("Restore"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let after: Vec<_> = files(&checkpoint)
        .into_iter()
        .map(|f| (std::fs::read(&f).unwrap(), f))
        .collect();
    assert!(before == after, "the checkpoint changed");
}

/// A tumbling-window count per window and bucket under a memory limit of
/// 4 KB: the open windows' groups go to local disk and closed ones are
/// found there. Killed at random moments, it emits each window's groups
/// once, exactly those of the run with its state in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_past_the_memory_limit_are_exact_after_kill_9_at_random_moments() {
    let files = files_for_kills(40);
    const ROWS: usize = 30;
    const QUERY: &str = "SELECT window_start, id % 50 AS bucket, count(*) AS n, sum(id) AS total \
         FROM TABLE(TUMBLE(TABLE rows, DESCRIPTOR(ts), INTERVAL '2' SECOND)) \
         GROUP BY window_start, window_end, id % 50";
    let mut reference = failure_free(files, ROWS, QUERY).await;
    let mut p = Pipeline::with_query(files, ROWS, QUERY).await;
    p.settings = "SET 'state.memory.limit' = '4 KB';\n".into();
    for (point, epoch) in [("kafka-before-commit", 4), ("before-commit-record", 8)] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x3d15);
    let mut committed: Vec<String> = p.values(true).await;
    assert_eq!(lost_and_duplicated(&committed, &reference), (0, 0));
    committed.sort();
    reference.sort();
    assert_eq!(
        committed, reference,
        "the groups emitted are exactly those of the run in memory"
    );
    // Every row of a closed window is counted once.
    let counted: u64 = committed
        .iter()
        .map(|v| {
            serde_json::from_str::<serde_json::Value>(v).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(
        counted as usize > files * ROWS * 9 / 10,
        "{counted} rows in closed windows"
    );
}

/// A small tmpfs mounted at `dir` for the life of the value (the tests run
/// as root, as CI does): a disk that fills.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "a full disk is made by mounting a small tmpfs, which needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A full disk, first under `state.local.dir`, then under the checkpoint
/// location: each stops the query with an error naming the directory or
/// file and the cause, without a panic, and loses nothing. The same query
/// with room again (the local directory elsewhere; the checkpoint copied
/// off the full disk) finishes with exactly the output of a run that never
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_query_naming_it_and_loses_nothing() {
    const FILES: usize = 12;
    const ROWS: usize = 60;
    const QUERY: &str = "SELECT id % 700 AS bucket, count(*) AS n, \
         max(concat(name, repeat('x', 200))) AS top FROM rows GROUP BY id % 700";
    let reference = failure_free(FILES, ROWS, QUERY).await;

    for full in ["local", "checkpoint"] {
        let mut p = Pipeline::with_query(FILES, ROWS, QUERY).await;
        // The checkpoint's folder is the small disk itself.
        let checkpoint = match full {
            "local" => "checkpoint",
            _ => "small",
        };
        let disk = p.dir.join("small");
        let _mounted = SmallDisk::mount(&disk, "96k");
        let local = match full {
            "local" => disk.join("state"),
            _ => p.dir.join("state"),
        };
        p.settings = format!(
            "SET 'state.memory.limit' = '1 KB';\nSET 'state.local.dir' = '{}';\n",
            local.display()
        );
        let mut run = p.spawn_at(checkpoint, "available-now", None);
        let status = run.wait(Duration::from_secs(120));
        let err = run.stderr();
        assert!(!status.success(), "the {full} disk never filled: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
        assert!(err.contains(&disk.display().to_string()), "{err}");

        // Room again: the local state elsewhere, the checkpoint copied off.
        p.settings = format!(
            "SET 'state.memory.limit' = '1 KB';\nSET 'state.local.dir' = '{}';\n",
            p.dir.join("roomy").display()
        );
        let resume = match full {
            "local" => "checkpoint",
            _ => {
                let status = std::process::Command::new("cp")
                    .arg("-a")
                    .arg(p.dir.join(checkpoint))
                    .arg(p.dir.join("copied"))
                    .status()
                    .unwrap();
                assert!(status.success());
                "copied"
            }
        };
        let mut run = p.spawn_at(resume, "available-now", None);
        let status = run.wait(Duration::from_secs(180));
        assert!(status.success(), "{}", run.stderr());
        let committed = p.values(true).await;
        assert_eq!(
            lost_and_duplicated(&committed, &reference),
            (0, 0),
            "after the {full} disk filled"
        );
        assert_eq!(per_key(&committed, "bucket"), per_key(&reference, "bucket"));
    }
}
