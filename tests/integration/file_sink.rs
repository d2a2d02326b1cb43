//! The `filesystem` sink (Flink's file sink) exactly-once through crashes:
//! a file of an epoch becomes visible only once the epoch commits, a
//! visible file never changes or vanishes, and every row ends in exactly
//! one visible file. (Nexmark q10's partitioned CSV files are checked in
//! `nexmark`.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sluice::broker::{create_topic, fresh_topic};

use crate::util::{broker, crash_seed, kill_9_five_times_then_finish, Lcg};

/// Every visible file under `root` (no part of its path starting with `.`
/// or `_`, as readers of Hive-style tables skip them) and its content.
fn visible(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(content) = std::fs::read(&path) {
                out.insert(path, content);
            }
        }
    }
    out
}

/// The epoch in a file's name (`part-<writer>-<epoch>.json`).
fn epoch_of(path: &Path) -> u64 {
    let name = path.file_stem().unwrap().to_str().unwrap();
    name.rsplit('-').next().unwrap().parse().unwrap()
}

/// The newest epoch with a visible file.
fn epochs_run(root: &Path) -> u64 {
    visible(root).keys().map(|p| epoch_of(p)).max().unwrap_or(0)
}

/// What the visible files hold: how many distinct ids, and how many rows
/// (each id once: both are the input's row count). A row outside its
/// partition fails here.
fn rows(root: &Path) -> (usize, usize) {
    let mut ids = std::collections::BTreeSet::new();
    let mut total = 0;
    for (path, content) in visible(root) {
        let dir = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let grp: i64 = dir.strip_prefix("grp=").unwrap().parse().unwrap();
        for line in String::from_utf8(content).unwrap().lines() {
            let row: Value = serde_json::from_str(line).unwrap();
            let id = row["id"].as_i64().unwrap();
            assert_eq!(id % 7, grp, "{row} in {dir}");
            assert_eq!(row["tag"], format!("g{grp}"), "{row} in {dir}");
            ids.insert(id);
            total += 1;
        }
    }
    (ids.len(), total)
}

/// Watches `root` until stopped: every visible file, with the content it
/// was first seen with; a file that later changes or vanishes is a
/// violation (it was visible before its epoch was final).
struct Watcher {
    stop: Arc<AtomicBool>,
    violations: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    fn start(root: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (Arc::clone(&stop), Arc::clone(&violations));
        let thread = std::thread::spawn(move || {
            let mut seen: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
            while !s.load(Ordering::Acquire) {
                let now = visible(&root);
                for (path, content) in &seen {
                    match now.get(path) {
                        None => v
                            .lock()
                            .unwrap()
                            .push(format!("{} vanished", path.display())),
                        Some(c) if c != content => v
                            .lock()
                            .unwrap()
                            .push(format!("{} changed", path.display())),
                        Some(_) => {}
                    }
                }
                for (path, content) in now {
                    seen.entry(path).or_insert(content);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self {
            stop,
            violations,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.violations.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_becomes_visible_only_once_its_epoch_commits_through_kill_9() {
    let bootstrap = broker().await;
    let input = fresh_topic("files-kill");
    create_topic(&bootstrap, &input, 2).await.unwrap();
    const ROWS: i64 = 20_000;
    let records: Vec<(String, Option<String>)> = (0..ROWS)
        .map(|id| {
            let row = serde_json::json!({"id": id, "grp": id % 7});
            (id.to_string(), Some(row.to_string()))
        })
        .collect();
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &records))
            .await
            .unwrap();
    }
    let want = (ROWS as usize, ROWS as usize);

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sql = dir.path().join("files.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '50 ms';\n\
             CREATE STREAM src (id BIGINT, grp BIGINT) WITH (connector = 'kafka', \
               topic = '{input}', 'bootstrap.servers' = '{bootstrap}', format = 'json', \
               'max-records-per-epoch' = '50');\n\
             CREATE TABLE out_rows (id BIGINT, tag VARCHAR, grp BIGINT) PARTITIONED BY (grp) \
               WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'json');\n\
             INSERT INTO out_rows SELECT id, 'g' || CAST(grp AS VARCHAR), grp FROM src;\n",
            cp = dir.path().join("cp").display(),
            out = out.display(),
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };
    let watcher = Watcher::start(out.clone());
    let staged = |epoch: u64| {
        let mut found = Vec::new();
        let mut dirs = vec![out.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if e.path().is_dir() && !name.starts_with('_') {
                    dirs.push(e.path());
                } else if name.starts_with(".part-")
                    && name.ends_with(&format!("-{epoch}.json.inprogress"))
                {
                    found.push(e.path());
                }
            }
        }
        found
    };

    // Crash with epoch 3's files written and its commit record not: they
    // stay hidden, and the next run writes them again.
    let crashed = command()
        .env("SLUICE_FAILPOINT", "files-before-commit-record@3")
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    assert!(!staged(3).is_empty(), "epoch 3's files were staged");
    assert!(
        visible(&out).keys().all(|p| epoch_of(p) < 3),
        "{:?}",
        visible(&out).keys()
    );
    // Crash with epoch 5's commit record written and its files not yet in
    // place: recovery puts them there, and the query goes on after 5.
    let crashed = command()
        .env("SLUICE_FAILPOINT", "files-after-commit-record@5")
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    assert!(!staged(5).is_empty(), "epoch 5's files were staged");
    assert!(visible(&out).keys().all(|p| epoch_of(p) < 5));

    // Then killed at random moments, and run to the end.
    let mut rng = Lcg(crash_seed("kill -9", || 0xf11e));
    kill_9_five_times_then_finish(command, &mut rng, &want, || {
        let out = out.clone();
        async move { rows(&out) }
    })
    .await;
    let violations = watcher.finish();
    assert!(violations.is_empty(), "{violations:?}");
    let in_progress: Vec<PathBuf> = (1..=epochs_run(&out)).flat_map(staged).collect();
    assert!(in_progress.is_empty(), "staged files left: {in_progress:?}");
    let epochs: Vec<u64> = visible(&out).keys().map(|p| epoch_of(p)).collect();
    assert!(epochs.contains(&5), "epoch 5's files were published");
}
