//! Exactly-once to Kafka, proven the hard way: the pipeline runs as a
//! separate `sluice` process that is killed with SIGKILL at random moments
//! (and, through fail points, exactly inside the transaction), restarted
//! until its input is consumed; then the `read_committed` output must equal
//! the failure-free output exactly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::Lcg;
use sluice::broker::{create_topic, fresh_topic, read_topic, ReadRecord};
use sluice::Checkpoint;

/// `files` JSON files of `rows` rows each: ids `file * rows ..`, event
/// time `ts` 100 ms per id, except that every id ending in 3 is 2.5 s
/// behind (later than the 2 s watermark delay allows when it is near the
/// start of its file).
fn write_input(dir: &Path, files: usize, rows: usize) {
    for f in 0..files {
        let mut text = String::new();
        for r in 0..rows {
            let id = f * rows + r;
            let ms = 10_000 + id * 100 - if id % 10 == 3 { 2_500 } else { 0 };
            let ts = format!(
                "2026-01-01T00:{:02}:{:02}.{:03}Z",
                ms / 60_000,
                ms / 1_000 % 60,
                ms % 1_000
            );
            text.push_str(&format!(
                "{{\"id\": {id}, \"name\": \"row{id}\", \"ts\": \"{ts}\"}}\n"
            ));
        }
        // Written aside and renamed, as the files source expects.
        let tmp = dir.join(format!(".{f:04}.json"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(format!("{f:04}.json"))).unwrap();
    }
}

struct Pipeline {
    dir: PathBuf,
    topic: String,
    query: String,
    /// A second statement (its topic and query): the pipeline is then a
    /// statement set writing both topics.
    second: Option<(String, String)>,
    /// `SET 'pipeline.name'`, when set.
    identity: Option<String>,
    bootstrap: String,
    _temp: tempfile::TempDir,
}

impl Pipeline {
    async fn new(files: usize, rows: usize) -> Self {
        Self::with_query(
            files,
            rows,
            "SELECT id, upper(name) AS name, id * 3 AS tripled FROM rows WHERE id % 7 <> 3",
        )
        .await
    }

    async fn with_query(files: usize, rows: usize, query: &str) -> Self {
        let bootstrap = crate::util::broker().await;
        let topic = fresh_topic("eos");
        create_topic(&bootstrap, &topic, 1).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input");
        std::fs::create_dir(&input).unwrap();
        write_input(&input, files, rows);
        Self {
            dir: dir.path().to_path_buf(),
            query: query.to_string(),
            second: None,
            identity: None,
            topic,
            bootstrap,
            _temp: dir,
        }
    }

    /// The pipeline's SQL file with the given trigger and checkpoint
    /// location (a folder of the pipeline's directory).
    fn sql(&self, checkpoint: &str, trigger: &str) -> PathBuf {
        let sql = self.dir.join(format!(
            "pipeline-{checkpoint}-{}.sql",
            trigger.replace(' ', "")
        ));
        std::fs::write(
            &sql,
            format!(
                "{identity}SET 'checkpoint.location' = '{checkpoint}';\n\
                 SET 'trigger' = '{trigger}';\n\
                 CREATE STREAM rows (id BIGINT, name VARCHAR, ts TIMESTAMP, \
                   WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (connector = 'files', \
                   path = '{input}', format = 'json', 'max_files_per_epoch' = '1');\n\
                 CREATE STREAM out WITH (connector = 'kafka', topic = '{topic}', \
                   'bootstrap.servers' = '{bootstrap}', format = 'json');\n\
                 {inserts}",
                identity = self
                    .identity
                    .as_ref()
                    .map(|name| format!("SET 'pipeline.name' = '{name}';\n"))
                    .unwrap_or_default(),
                checkpoint = self.dir.join(checkpoint).display(),
                input = self.dir.join("input").display(),
                topic = self.topic,
                bootstrap = self.bootstrap,
                inserts = match &self.second {
                    None => format!("INSERT INTO out {};\n", self.query),
                    Some((topic, query)) => format!(
                        "CREATE STREAM second WITH (connector = 'kafka', topic = '{topic}', \
                           'bootstrap.servers' = '{bootstrap}');\n\
                         EXECUTE STATEMENT SET BEGIN\n\
                           INSERT INTO out {first};\n\
                           INSERT INTO second {query};\n\
                         END;\n",
                        bootstrap = self.bootstrap,
                        first = self.query,
                    ),
                },
            ),
        )
        .unwrap();
        sql
    }

    fn spawn(&self, trigger: &str, failpoint: Option<&str>) -> Run {
        self.spawn_at("checkpoint", trigger, failpoint)
    }

    /// [`spawn`](Self::spawn) with the checkpoint in folder `checkpoint`.
    fn spawn_at(&self, checkpoint: &str, trigger: &str, failpoint: Option<&str>) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run")
            .arg(self.sql(checkpoint, trigger))
            .stdout(Stdio::null());
        if let Some(f) = failpoint {
            cmd.env("SLUICE_FAILPOINT", f);
        }
        Run::new(cmd)
    }

    /// Waits until `run` has committed `epochs` epochs to its checkpoint. A
    /// fixed sleep is not enough: on a loaded machine the first
    /// `init_transactions` after the broker starts takes seconds.
    fn wait_for_commits(&self, run: &mut Run, epochs: u64) {
        self.wait_for_commits_at("checkpoint", run, epochs)
    }

    /// [`wait_for_commits`](Self::wait_for_commits) in folder `checkpoint`.
    fn wait_for_commits_at(&self, checkpoint: &str, run: &mut Run, epochs: u64) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let committed = Checkpoint::open_existing(self.dir.join(checkpoint))
                .ok()
                .and_then(|cp| cp.latest_commit_epoch().ok().flatten());
            if committed >= Some(epochs) {
                return;
            }
            assert!(run.running(), "the pipeline ended early: {}", run.stderr());
            assert!(
                Instant::now() < deadline,
                "{epochs} epochs not committed within 90 s: {}",
                run.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The values the failure-free run writes, in order.
    fn expected(files: usize, rows: usize) -> Vec<String> {
        (0..files * rows)
            .filter(|id| id % 7 != 3)
            .map(|id| {
                format!(
                    "{{\"id\":{id},\"name\":\"ROW{id}\",\"tripled\":{}}}",
                    id * 3
                )
            })
            .collect()
    }

    /// `sluice checkpoint inspect` of the pipeline's checkpoint, against
    /// the broker.
    fn inspect(&self) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["checkpoint", "inspect"])
            .arg(self.dir.join("checkpoint"))
            .args(["--bootstrap", &self.bootstrap])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        report
    }

    /// The values in the output topic, in order.
    async fn values(&self, committed: bool) -> Vec<String> {
        self.read(committed)
            .await
            .iter()
            .map(ReadRecord::value_str)
            .collect()
    }

    async fn read(&self, committed: bool) -> Vec<ReadRecord> {
        self.read_topic(&self.topic, committed).await
    }

    async fn read_topic(&self, topic: &str, committed: bool) -> Vec<ReadRecord> {
        let (b, t) = (self.bootstrap.clone(), topic.to_string());
        tokio::task::spawn_blocking(move || read_topic(&b, &t, committed, Duration::from_secs(60)))
            .await
            .unwrap()
            .unwrap()
    }
}

/// Starts the pipeline and SIGKILLs it at a random moment, 25 times, then
/// lets it run to the end of its input.
fn kill_until_done(p: &Pipeline, salt: u64) {
    // A new seed each run, printed: a failure names the seed that replays
    // it (SLUICE_CRASH_SEED=<seed>).
    let seed = std::env::var("SLUICE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("kill -9 schedule: SLUICE_CRASH_SEED={seed}");
    let mut rng = Lcg(seed ^ salt);
    let mut kills = 0;
    loop {
        let mut child = p.spawn("available-now", None);
        if kills < 25 {
            std::thread::sleep(Duration::from_millis(150 + rng.next(400)));
            if child.running() {
                child.kill_9();
                kills += 1;
                continue;
            }
        }
        let status = child.wait(Duration::from_secs(120));
        assert!(status.success(), "the pipeline failed: {}", child.stderr());
        if kills >= 25 {
            return;
        }
    }
}

/// Runs the pipeline with fail point `point` at `epoch`: it must crash.
fn crash_at(p: &Pipeline, point: &str, epoch: u64) {
    let mut child = p.spawn("available-now", Some(&format!("{point}@{epoch}")));
    let status = child.wait(Duration::from_secs(120));
    assert!(
        !status.success(),
        "fail point {point} did not fire: {}",
        child.stderr()
    );
}

/// A `sluice` process whose stderr is drained as it is written: a process
/// blocked on a full pipe would look like a hang.
struct Run {
    child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Run {
    fn new(mut cmd: Command) -> Self {
        use std::io::BufRead;
        let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = std::sync::Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self { child, stderr }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn kill_9(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    /// Waits for the exit; past `limit` the process is killed and the test
    /// fails with what it wrote.
    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return status;
            }
            if Instant::now() >= deadline {
                self.kill_9();
                panic!(
                    "the pipeline did not finish within {limit:?}; it wrote:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_output_is_exact_after_kill_9_at_random_moments() {
    const FILES: usize = 60;
    const ROWS: usize = 50;
    let p = Pipeline::new(FILES, ROWS).await;

    // Crashes placed exactly: inside the open transaction, after the Kafka
    // commit but before the checkpoint heard of it, and between the
    // offsets record and reading.
    for (point, epoch) in [
        ("kafka-before-commit", 2),
        ("kafka-after-commit", 4),
        ("before-commit-record", 6),
        ("after-offsets", 8),
    ] {
        crash_at(&p, point, epoch);
        if point == "kafka-after-commit" {
            // Kafka has epoch 4, the checkpoint only 3: inspect says so.
            let report = p.inspect();
            assert!(
                report.contains("last committed epoch 4: is ahead of the checkpoint (3)"),
                "{report}"
            );
        }
    }

    // Then SIGKILL at random moments, restarting each time, until the run
    // ends by itself.
    kill_until_done(&p, 0x5eed);
    let report = p.inspect();
    assert!(report.contains("agrees with the checkpoint"), "{report}");
    assert!(report.contains("source offsets"), "{report}");

    let committed: Vec<String> = p.values(true).await;
    assert_eq!(
        committed,
        Pipeline::expected(FILES, ROWS),
        "read_committed output differs"
    );

    // Aborts really happened and were hidden: a read_uncommitted reader
    // sees the records of the transaction killed at the fail point.
    let uncommitted = p.read(false).await;
    assert!(
        uncommitted.len() > committed.len(),
        "read_uncommitted saw {} records, read_committed {}",
        uncommitted.len(),
        committed.len()
    );
}

/// The epochs (`sluice.epoch` header) of `records`.
fn epochs(records: &[ReadRecord]) -> std::collections::BTreeSet<String> {
    records
        .iter()
        .flat_map(|r| &r.headers)
        .filter(|(k, _)| k == "sluice.epoch")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_set_commits_both_topics_in_one_transaction_through_kill_9() {
    const FILES: usize = 30;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    let counts = fresh_topic("eos-set");
    create_topic(&p.bootstrap, &counts, 1).await.unwrap();
    p.second = Some((
        counts.clone(),
        "SELECT id % 5 AS bucket, count(*) AS n FROM rows GROUP BY id % 5".into(),
    ));
    for (point, epoch) in [("kafka-before-commit", 2), ("kafka-after-commit", 4)] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x5e7);

    // Each statement's output is exact: the filter's rows once each, and
    // the counts folded by bucket equal to counting the input directly.
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
    let committed_counts = p.read_topic(&counts, true).await;
    let mut folded = std::collections::BTreeMap::new();
    for r in &committed_counts {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        folded.insert(v["bucket"].as_i64().unwrap(), v["n"].as_i64().unwrap());
    }
    let direct: std::collections::BTreeMap<i64, i64> = (0..5)
        .map(|b| {
            (
                b,
                (0..FILES * ROWS).filter(|id| id % 5 == b as usize).count() as i64,
            )
        })
        .collect();
    assert_eq!(folded, direct);

    // One transaction per epoch for both topics: every committed epoch
    // wrote to both (each file has rows for both), and the transaction
    // killed at the fail point held records of both, hidden from
    // read_committed readers.
    let committed_out = p.read(true).await;
    assert_eq!(epochs(&committed_out), epochs(&committed_counts));
    assert_eq!(epochs(&committed_out).len(), FILES);
    for topic in [&p.topic, &counts] {
        let (all, committed) = (
            p.read_topic(topic, false).await.len(),
            p.read_topic(topic, true).await.len(),
        );
        assert!(
            all > committed,
            "{topic}: read_uncommitted {all}, read_committed {committed}"
        );
    }

    // The same checkpoint with the statements swapped is refused, naming
    // both queries' inputs, before any state is loaded into the wrong one.
    let sql = std::fs::read_to_string(p.sql("checkpoint", "available-now")).unwrap();
    let lines: Vec<&str> = sql.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("INSERT INTO out"))
        .unwrap();
    let mut swapped = lines.clone();
    swapped.swap(at, at + 1);
    let file = p.dir.join("swapped.sql");
    std::fs::write(&file, swapped.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("belongs to a query reading [0.out/0:rows, 1.second/0:rows]"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_is_fenced_and_says_another_instance_took_over() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let p = Pipeline::new(FILES, ROWS).await;
    let mut old = p.spawn("250 ms", None);
    // The first instance must own the transactional id before the second
    // starts: otherwise the second is the one fenced.
    p.wait_for_commits(&mut old, 3);

    let mut new = p.spawn("available-now", None);
    let old_status = old.wait(Duration::from_secs(60));
    let old_err = old.stderr();
    assert_eq!(old_status.code(), Some(1), "{old_err}");
    assert!(old_err.contains("another instance took over"), "{old_err}");

    let new_status = new.wait(Duration::from_secs(120));
    assert!(new_status.success(), "{}", new.stderr());
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(committed, Pipeline::expected(FILES, ROWS));
}

/// One `pipeline.name`, two checkpoint locations: the second instance
/// fences the first and resumes from what Kafka says the first committed,
/// so every row is written once (without the name, the second would be a
/// new query writing everything again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pipeline_name_in_two_checkpoint_locations_fences_and_writes_each_row_once() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.identity = Some(format!("eos-{}", p.topic));
    let mut first = p.spawn_at("checkpoint-a", "250 ms", None);
    p.wait_for_commits_at("checkpoint-a", &mut first, 3);

    let mut second = p.spawn_at("checkpoint-b", "available-now", None);
    let first_status = first.wait(Duration::from_secs(60));
    let first_err = first.stderr();
    assert_eq!(first_status.code(), Some(1), "{first_err}");
    assert!(
        first_err.contains("another instance took over"),
        "{first_err}"
    );
    let second_status = second.wait(Duration::from_secs(120));
    assert!(second_status.success(), "{}", second.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
}

/// A lost checkpoint directory: killed, its checkpoint deleted, the same
/// pipeline started from a new location resumes where Kafka says it was;
/// nothing is written twice. A stateful pipeline whose state is lost stops
/// instead, saying what is missing and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_checkpoint_location_resumes_from_kafka_or_stops_when_state_is_lost() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.identity = Some(format!("lost-{}", p.topic));
    let mut run = p.spawn_at("checkpoint-a", "250 ms", None);
    p.wait_for_commits_at("checkpoint-a", &mut run, 3);
    run.kill_9();
    std::fs::remove_dir_all(p.dir.join("checkpoint-a")).unwrap();
    let mut again = p.spawn_at("checkpoint-b", "available-now", None);
    let status = again.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", again.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));

    let mut p = Pipeline::with_query(
        4,
        ROWS,
        "SELECT id % 5 AS bucket, count(*) AS n FROM rows GROUP BY id % 5",
    )
    .await;
    p.identity = Some(format!("lost-state-{}", p.topic));
    let mut run = p.spawn_at("checkpoint-a", "available-now", None);
    assert!(
        run.wait(Duration::from_secs(120)).success(),
        "{}",
        run.stderr()
    );
    let written = p.values(true).await;
    std::fs::remove_dir_all(p.dir.join("checkpoint-a")).unwrap();
    let mut again = p.spawn_at("checkpoint-b", "available-now", None);
    let status = again.wait(Duration::from_secs(120));
    let err = again.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("state files this checkpoint location does not have")
            && err.contains("pipeline.name"),
        "{err}"
    );
    assert_eq!(p.values(true).await, written, "nothing was written again");
}

/// Runs `p` to the end without crashes into a fresh topic: the reference.
async fn failure_free(files: usize, rows: usize, query: &str) -> Vec<String> {
    let p = Pipeline::with_query(files, rows, query).await;
    let mut child = p.spawn("available-now", None);
    let status = child.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", child.stderr());
    p.values(true).await
}

/// Groups JSON rows by `key`, keeping each key's values in order.
fn per_key(values: &[String], key: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for v in values {
        let json: serde_json::Value = serde_json::from_str(v).unwrap();
        out.entry(json[key].to_string())
            .or_default()
            .push(v.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_by_update_output_is_exact_after_kill_9_at_random_moments() {
    const FILES: usize = 40;
    const ROWS: usize = 30;
    const QUERY: &str =
        "SELECT id % 5 AS bucket, count(*) AS n, sum(id) AS total, max(name) AS top \
                         FROM rows GROUP BY id % 5";
    let reference = failure_free(FILES, ROWS, QUERY).await;
    assert_eq!(
        reference.len(),
        FILES * 5,
        "every epoch updates all five buckets"
    );

    let p = Pipeline::with_query(FILES, ROWS, QUERY).await;
    for (point, epoch) in [
        ("kafka-before-commit", 3),
        ("kafka-after-commit", 5),
        ("before-commit-record", 7),
    ] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0xa66);
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(
        per_key(&committed, "bucket"),
        per_key(&reference, "bucket"),
        "per key, the values emitted are exactly those of the run without crashes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_window_append_output_is_exact_after_kill_9_at_random_moments() {
    const FILES: usize = 40;
    const ROWS: usize = 30;
    const QUERY: &str = "SELECT window_start, window_end, count(*) AS n, sum(id) AS total \
         FROM TABLE(TUMBLE(TABLE rows, DESCRIPTOR(ts), INTERVAL '1' SECOND)) \
         GROUP BY window_start, window_end";
    let mut reference = failure_free(FILES, ROWS, QUERY).await;
    // 120 s of event time in 1 s windows; the watermark ends 2 s behind
    // the last row, so the last windows stay open.
    assert!(
        reference.len() >= FILES * 3 - 4,
        "{} windows emitted",
        reference.len()
    );
    let p = Pipeline::with_query(FILES, ROWS, QUERY).await;
    for (point, epoch) in [
        ("kafka-before-commit", 3),
        ("kafka-after-commit", 5),
        ("before-commit-record", 7),
    ] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x717e);
    let mut committed: Vec<String> = p.values(true).await;
    let windows = per_key(&committed, "window_start");
    assert!(
        windows.values().all(|v| v.len() == 1),
        "append mode emits each window once"
    );
    committed.sort();
    reference.sort();
    assert_eq!(
        committed, reference,
        "the windows emitted are exactly those of the run without crashes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_the_open_epoch_leaves_no_transaction_and_the_restart_continues() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let p = Pipeline::new(FILES, ROWS).await;
    let mut child = p.spawn("250 ms", None);
    p.wait_for_commits(&mut child, 3);
    let signalled = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", child.stderr());
    assert!(signalled.elapsed() < Duration::from_secs(30));

    // No transaction left open or aborted: a read_uncommitted reader sees
    // exactly what a read_committed one sees.
    let committed: Vec<String> = p.values(true).await;
    let uncommitted: Vec<String> = p.values(false).await;
    assert!(!committed.is_empty());
    assert_eq!(uncommitted, committed);
    let stopped_at = Checkpoint::open_existing(p.dir.join("checkpoint"))
        .unwrap()
        .latest_commit_epoch()
        .unwrap()
        .unwrap();

    // The restart commits the next epoch first: nothing is re-run.
    let log = p.dir.join("progress.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run")
        .arg(p.sql("checkpoint", "available-now"))
        .arg("--progress-log")
        .arg(&log)
        .stdout(Stdio::null());
    let mut child = Run::new(cmd);
    let status = child.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", child.stderr());
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["epoch"], stopped_at + 1);
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(committed, Pipeline::expected(FILES, ROWS));
}

/// `scripts/kafka <command>` for a broker of its own on `port`, so that
/// stopping it disturbs no other test.
fn own_broker(command: &str, port: u16) -> String {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
        .arg(command)
        .env("SLUICE_KAFKA_PORT", port.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "scripts/kafka {command}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_second_broker_outage_stalls_the_query_which_then_resumes_exactly() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    const PORT: u16 = 9192;
    let bootstrap = tokio::task::spawn_blocking(|| own_broker("start", PORT))
        .await
        .unwrap();
    assert!(bootstrap.ends_with(&PORT.to_string()), "{bootstrap}");
    let (input, output) = (fresh_topic("outage-in"), fresh_topic("outage-out"));
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let produce = |ids: std::ops::Range<i64>| {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || {
            let p: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &b)
                .create()
                .unwrap();
            for i in ids {
                let v = format!("{{\"id\": {i}, \"name\": \"n{i}\"}}");
                p.send(BaseRecord::<(), _>::to(&t).payload(&v)).unwrap();
            }
            p.flush(Duration::from_secs(60)).unwrap();
        })
    };
    produce(0..100).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let session = sluice::Session::new();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger.interval' = '200 ms';\n\
         CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', topic = '{input}', \
           'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '10');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO dst SELECT id, name FROM src;\n",
        cp = dir.path().display()
    );
    let query = crate::util::start_sql(&session, &sql).await;
    while query.recent_progress().len() < 3 {
        assert!(query.is_active(), "{:?}", query.exception());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::task::spawn_blocking(|| own_broker("stop", PORT))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        query.is_active(),
        "the query waits for the broker: {:?}",
        query.exception()
    );
    tokio::task::spawn_blocking(|| own_broker("start", PORT))
        .await
        .unwrap();
    produce(100..200).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let ids = loop {
        assert!(query.is_active(), "{:?}", query.exception());
        let read = {
            let (b, t) = (bootstrap.clone(), output.clone());
            tokio::task::spawn_blocking(move || read_topic(&b, &t, true, Duration::from_secs(30)))
                .await
                .unwrap()
        };
        // Just after the restart the broker may still be electing the
        // partition's leader ("not leader for partition"): read again.
        let records = match read {
            Ok(records) => records,
            Err(e) => {
                assert!(Instant::now() < deadline, "reading the output: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut ids: Vec<i64> = records
            .iter()
            .map(|r| {
                serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()
                    ["id"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        ids.sort_unstable();
        if ids.len() >= 200 || Instant::now() > deadline {
            break ids;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let status = query.status();
    let epochs: Vec<(u64, u64, f64)> = query
        .recent_progress()
        .iter()
        .map(|p| (p.epoch, p.num_input_rows, p.duration_ms.total))
        .collect();
    query.stop().await.unwrap();
    assert_eq!(
        ids,
        (0..200).collect::<Vec<_>>(),
        "nothing lost, nothing repeated; status {status:?}, epochs {epochs:?}"
    );
    // Progress shows the stall: an epoch that waited through the outage,
    // or (when a wait ran out first) the in-process recoveries it took.
    let longest = query
        .recent_progress()
        .iter()
        .map(|p| p.duration_ms.total)
        .fold(0.0, f64::max);
    let recoveries = query.recent_progress().last().map_or(0, |p| p.recoveries);
    assert!(
        longest > 5_000.0 || recoveries >= 1,
        "longest epoch {longest} ms, {recoveries} recoveries"
    );
    tokio::task::spawn_blocking(|| own_broker("stop", PORT))
        .await
        .unwrap();
}
