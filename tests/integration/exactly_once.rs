//! Exactly-once to Kafka, proven the hard way: the pipeline runs as a
//! separate `sluice` process that is killed with SIGKILL at random moments
//! (and, through fail points, exactly inside the transaction), restarted
//! until its input is consumed; then the `read_committed` output must equal
//! the failure-free output exactly.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{Lcg, Run};
use sluice::broker::{create_topic, fresh_topic, read_topic, ReadRecord};
use sluice::Checkpoint;

mod identity;
mod memory_limit;
mod outage;

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
    /// More `SET` statements, each ending in `;`.
    settings: String,
    /// More options of the output stream, each starting with `, `.
    sink_options: String,
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
        Self::on(crate::util::broker().await, files, rows, query).await
    }

    /// [`with_query`](Self::with_query) writing to the broker at
    /// `bootstrap`.
    async fn on(bootstrap: String, files: usize, rows: usize, query: &str) -> Self {
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
            settings: String::new(),
            sink_options: String::new(),
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
                "{identity}{settings}SET 'checkpoint.location' = '{checkpoint}';\n\
                 SET 'trigger' = '{trigger}';\n\
                 CREATE STREAM rows (id BIGINT, name VARCHAR, ts TIMESTAMP, \
                   WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (connector = 'files', \
                   path = '{input}', format = 'json', 'max_files_per_epoch' = '1');\n\
                 CREATE STREAM out WITH (connector = 'kafka', topic = '{topic}', \
                   'bootstrap.servers' = '{bootstrap}', format = 'json'{sink_options});\n\
                 {inserts}",
                identity = self
                    .identity
                    .as_ref()
                    .map(|name| format!("SET 'pipeline.name' = '{name}';\n"))
                    .unwrap_or_default(),
                settings = self.settings,
                sink_options = self.sink_options,
                checkpoint = self.dir.join(checkpoint).display(),
                input = self.dir.join("input").display(),
                topic = self.topic,
                bootstrap = self.bootstrap,
                inserts = match &self.second {
                    None => format!("INSERT INTO out {};\n", self.query),
                    Some((topic, query)) => format!(
                        "CREATE STREAM second WITH (connector = 'kafka', topic = '{topic}', \
                           'bootstrap.servers' = '{bootstrap}'{sink_options});\n\
                         EXECUTE STATEMENT SET BEGIN\n\
                           INSERT INTO out {first};\n\
                           INSERT INTO second {query};\n\
                         END;\n",
                        bootstrap = self.bootstrap,
                        sink_options = self.sink_options,
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
        Run::new(self.command(checkpoint, trigger, failpoint))
    }

    /// `sluice run` of the pipeline.
    fn command(&self, checkpoint: &str, trigger: &str, failpoint: Option<&str>) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run")
            .arg(self.sql(checkpoint, trigger))
            .stdout(Stdio::null());
        if let Some(f) = failpoint {
            cmd.env("SLUICE_FAILPOINT", f);
        }
        cmd
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

/// Where a kill -9 landed, as the checkpoint and Kafka show it afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Landing {
    /// The run had planned and committed nothing (process start,
    /// `init_transactions`, recovery).
    Startup,
    /// Between epochs: every planned epoch committed in Kafka and in the
    /// checkpoint (planning the next, or waiting for input).
    BetweenEpochs,
    /// An epoch planned (`offsets/N` written), nothing of it in Kafka:
    /// reading and computing it.
    Compute,
    /// Records of the epoch's transaction on the broker, uncommitted.
    OpenTransaction,
    /// Kafka committed the epoch; the checkpoint's `commits/N` was not
    /// written yet.
    AfterKafkaCommit,
}

/// The checkpoint's last planned and last committed epochs.
fn checkpoint_epochs(p: &Pipeline) -> (Option<u64>, Option<u64>) {
    Checkpoint::open_existing(p.dir.join("checkpoint"))
        .ok()
        .map_or((None, None), |cp| {
            (
                cp.latest_offsets_epoch().ok().flatten(),
                cp.latest_commit_epoch().ok().flatten(),
            )
        })
}

/// True when a transaction is open on any of `topics`: a read_committed
/// client is given an end (the last stable offset) below the log's end.
fn open_transaction(bootstrap: &str, topics: &[String]) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let end = |isolation: &str, topic: &str| {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "sluice-test-landing")
            .set("isolation.level", isolation)
            .create()
            .unwrap();
        c.fetch_watermarks(topic, 0, Duration::from_secs(10))
            .unwrap()
            .1
    };
    topics
        .iter()
        .any(|t| end("read_committed", t) < end("read_uncommitted", t))
}

/// Classifies the kill that just ended a run, given the checkpoint's
/// epochs before the run started.
fn landing(p: &Pipeline, before: (Option<u64>, Option<u64>)) -> Landing {
    let (planned, committed) = checkpoint_epochs(p);
    let query_id = Checkpoint::open_existing(p.dir.join("checkpoint"))
        .map(|cp| cp.metadata().query_id.clone())
        .ok();
    let Some(query_id) = query_id else {
        return Landing::Startup;
    };
    let progress = format!("sluice-progress.{query_id}");
    let mut topics = vec![p.topic.clone(), progress];
    topics.extend(p.second.iter().map(|(t, _)| t.clone()));
    if open_transaction(&p.bootstrap, &topics) {
        return Landing::OpenTransaction;
    }
    let client = sluice_kafka::ClientOptions::new(p.bootstrap.as_str())
        .connect_timeout(Duration::from_secs(5));
    let kafka = match sluice_kafka::last_committed(&client, None, &query_id) {
        Ok(last) => last.map(|(epoch, _)| epoch),
        Err(_) => return Landing::OpenTransaction,
    };
    if kafka > committed {
        Landing::AfterKafkaCommit
    } else if planned > kafka {
        Landing::Compute
    } else if (planned, committed) == before {
        Landing::Startup
    } else {
        Landing::BetweenEpochs
    }
}

/// Kills per crash test: `SLUICE_CRASH_KILLS`, else 25 (four tests keep CI
/// above 100). The soak (`scripts/soak`) raises it.
fn kills_per_test() -> usize {
    std::env::var("SLUICE_CRASH_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(25)
}

/// Input files for a crash test of `files` files at 25 kills, grown with
/// the kill count so that the kills meet a running pipeline: a run between
/// two kills commits at most about two epochs (see [`kill_until_done`]),
/// so the input holds two files per kill beyond `files`.
fn files_for_kills(files: usize) -> usize {
    files + 2 * kills_per_test().max(25)
}

/// Sleeps `delay`, or less: until `child` has planned `epochs` epochs past
/// `before` (the checkpoint's latest offsets), or has ended. True when the
/// epochs cut the sleep short.
fn sleep_within_epochs(
    p: &Pipeline,
    child: &mut Run,
    before: (Option<u64>, Option<u64>),
    epochs: u64,
    delay: Duration,
) -> bool {
    let from = before.0.max(before.1).unwrap_or(0);
    let until = Instant::now() + delay;
    while Instant::now() < until && child.running() {
        if checkpoint_epochs(p).0.unwrap_or(0) >= from + epochs {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// Starts the pipeline and SIGKILLs it, `kills_per_test()` times, then lets
/// it run to the end of its input. Half the kills come at a random moment
/// after the start; the other half a random moment (0–25 ms) after the
/// pipeline plans a new epoch, aimed at the phases not hit yet (later and
/// later while aimed kills land too early). Either kill comes, at the
/// latest, in the second epoch the run plans: a fast pipeline must not
/// reach the end of its input between two kills. Each kill is classified by
/// what the checkpoint and Kafka show afterwards; the test fails unless
/// kills landed in compute. It kills on, up to twice the count, while no
/// kill has landed in an open transaction either — a window of a few
/// milliseconds that random timing on a loaded machine can miss, which is
/// why every crash test also kills there exactly, with the
/// `kafka-before-commit` fail point. Prints the landings, and the seed that
/// replays the schedule.
fn kill_until_done(p: &Pipeline, salt: u64) {
    use std::collections::BTreeMap;
    // A new seed each run, printed: a failure names the seed that replays
    // it (SLUICE_CRASH_SEED=<seed>).
    let seed = crate::util::crash_seed("kill -9", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut rng = Lcg(seed ^ salt);
    let wanted = kills_per_test();
    let mut landings: BTreeMap<Landing, usize> = BTreeMap::new();
    let hit = |l: &BTreeMap<Landing, usize>, at: Landing| l.get(&at).copied().unwrap_or(0) > 0;
    let mut kills = 0;
    // Kills aimed at an open transaction that landed in compute: on a slow
    // or loaded machine compute takes longer, so the aim moves later.
    let mut early = 0u32;
    loop {
        let done = kills >= wanted
            && hit(&landings, Landing::Compute)
            && hit(&landings, Landing::OpenTransaction);
        let before = checkpoint_epochs(p);
        let mut child = p.spawn("available-now", None);
        if !done && kills < 2 * wanted {
            if kills % 2 == 0 {
                let delay = Duration::from_millis(150 + rng.next(400));
                if sleep_within_epochs(p, &mut child, before, 2, delay) {
                    // Cut short at a plan: a random moment of that epoch.
                    std::thread::sleep(Duration::from_micros(rng.next(30_000)));
                }
            } else {
                // Aim: just after planning is compute; a few ms on, the
                // transaction is open.
                let aim_at_transaction =
                    hit(&landings, Landing::Compute) && !hit(&landings, Landing::OpenTransaction);
                let delay_us = if !hit(&landings, Landing::Compute) {
                    rng.next(2_000)
                } else if aim_at_transaction {
                    3_000 + rng.next(15_000 << early.min(3))
                } else {
                    rng.next(25_000)
                };
                let deadline = Instant::now() + Duration::from_secs(20);
                while checkpoint_epochs(p).0 <= before.0.max(before.1)
                    && child.running()
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_micros(200));
                }
                let delay = Duration::from_micros(delay_us);
                sleep_within_epochs(p, &mut child, before, 2, delay);
            }
            if child.running() {
                child.kill_9();
                kills += 1;
                let at = landing(p, before);
                if kills % 2 == 0
                    && at == Landing::Compute
                    && !hit(&landings, Landing::OpenTransaction)
                {
                    early += 1;
                }
                *landings.entry(at).or_default() += 1;
                continue;
            }
        }
        let status = child.wait(Duration::from_secs(120));
        assert!(status.success(), "the pipeline failed: {}", child.stderr());
        // The run ended by itself: the input is all committed.
        break;
    }
    eprintln!("kill -9 landings ({kills} kills): {landings:?}");
    assert!(
        hit(&landings, Landing::Compute),
        "after {kills} kills none landed in compute: {landings:?} (SLUICE_CRASH_SEED={seed})"
    );
}

/// Lost and duplicated records of `got` against `expected`, as multisets;
/// printed for the soak, which sums them.
fn lost_and_duplicated(got: &[String], expected: &[String]) -> (usize, usize) {
    use std::collections::BTreeMap;
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for e in expected {
        *count.entry(e).or_default() += 1;
    }
    for g in got {
        *count.entry(g).or_default() -= 1;
    }
    let lost = count
        .values()
        .filter(|c| **c > 0)
        .map(|c| *c as usize)
        .sum();
    let duplicated = count
        .values()
        .filter(|c| **c < 0)
        .map(|c| -*c as usize)
        .sum();
    eprintln!("exactly-once check: {lost} lost, {duplicated} duplicated");
    (lost, duplicated)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_output_is_exact_after_kill_9_at_random_moments() {
    let files = files_for_kills(60);
    const ROWS: usize = 50;
    let p = Pipeline::new(files, ROWS).await;

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
    let expected = Pipeline::expected(files, ROWS);
    assert_eq!(lost_and_duplicated(&committed, &expected), (0, 0));
    assert_eq!(committed, expected, "read_committed output differs");

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
    let files = files_for_kills(30);
    const ROWS: usize = 20;
    let mut p = Pipeline::new(files, ROWS).await;
    let counts = fresh_topic("eos-set");
    create_topic(&p.bootstrap, &counts, 1).await.unwrap();
    p.second = Some((
        counts.clone(),
        "SELECT id % 5 AS bucket, count(*) AS n FROM rows GROUP BY id % 5".into(),
    ));
    // The epoch headers show which transaction wrote each record.
    p.sink_options = ", 'sink.epoch-headers' = 'true'".into();
    for (point, epoch) in [("kafka-before-commit", 2), ("kafka-after-commit", 4)] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x5e7);

    // Each statement's output is exact, record by record: the filter's
    // rows once each, in order; and every update of the counts, not only
    // the last per bucket. Each epoch (one file of 20 ids) adds 4 to each
    // of the 5 buckets, so bucket b is updated to 4, 8, 12, ... once per
    // epoch, counted from the input directly.
    let committed = p.values(true).await;
    let expected = Pipeline::expected(files, ROWS);
    assert_eq!(lost_and_duplicated(&committed, &expected), (0, 0));
    assert_eq!(committed, expected);
    let committed_counts = p.read_topic(&counts, true).await;
    let updates: Vec<String> = committed_counts.iter().map(ReadRecord::value_str).collect();
    let per_bucket = |epochs: usize| -> Vec<(i64, i64)> {
        (0..5)
            .flat_map(|b| {
                (1..=epochs).map(move |f| {
                    let n = (0..f * ROWS).filter(|id| id % 5 == b as usize).count();
                    (b, n as i64)
                })
            })
            .collect()
    };
    let mut got: Vec<(i64, i64)> = updates
        .iter()
        .map(|u| {
            let v: serde_json::Value = serde_json::from_str(u).unwrap();
            (v["bucket"].as_i64().unwrap(), v["n"].as_i64().unwrap())
        })
        .collect();
    // Within an epoch the buckets come in any order; per bucket, in order.
    got.sort_by_key(|(b, _)| *b);
    let expected_updates = per_bucket(files);
    let as_text = |v: &[(i64, i64)]| v.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>();
    assert_eq!(
        lost_and_duplicated(&as_text(&got), &as_text(&expected_updates)),
        (0, 0)
    );
    assert_eq!(got, expected_updates);

    // One transaction per epoch for both topics: every committed epoch
    // wrote to both (each file has rows for both), and the transaction
    // killed at the fail point held records of both, hidden from
    // read_committed readers.
    let committed_out = p.read(true).await;
    assert_eq!(epochs(&committed_out), epochs(&committed_counts));
    assert_eq!(epochs(&committed_out).len(), files);
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
    let files = files_for_kills(40);
    const ROWS: usize = 30;
    const QUERY: &str =
        "SELECT id % 5 AS bucket, count(*) AS n, sum(id) AS total, max(name) AS top \
                         FROM rows GROUP BY id % 5";
    let reference = failure_free(files, ROWS, QUERY).await;
    assert_eq!(
        reference.len(),
        files * 5,
        "every epoch updates all five buckets"
    );

    let p = Pipeline::with_query(files, ROWS, QUERY).await;
    for (point, epoch) in [
        ("kafka-before-commit", 3),
        ("kafka-after-commit", 5),
        ("before-commit-record", 7),
    ] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0xa66);
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(lost_and_duplicated(&committed, &reference), (0, 0));
    assert_eq!(
        per_key(&committed, "bucket"),
        per_key(&reference, "bucket"),
        "per key, the values emitted are exactly those of the run without crashes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_window_append_output_is_exact_after_kill_9_at_random_moments() {
    let files = files_for_kills(40);
    const ROWS: usize = 30;
    const QUERY: &str = "SELECT window_start, window_end, count(*) AS n, sum(id) AS total \
         FROM TABLE(TUMBLE(TABLE rows, DESCRIPTOR(ts), INTERVAL '1' SECOND)) \
         GROUP BY window_start, window_end";
    let mut reference = failure_free(files, ROWS, QUERY).await;
    // 3 s of event time per file in 1 s windows; the watermark ends 2 s
    // behind the last row, so the last windows stay open.
    assert!(
        reference.len() >= files * 3 - 4,
        "{} windows emitted",
        reference.len()
    );
    let p = Pipeline::with_query(files, ROWS, QUERY).await;
    for (point, epoch) in [
        ("kafka-before-commit", 3),
        ("kafka-after-commit", 5),
        ("before-commit-record", 7),
    ] {
        crash_at(&p, point, epoch);
    }
    kill_until_done(&p, 0x717e);
    let mut committed: Vec<String> = p.values(true).await;
    assert_eq!(lost_and_duplicated(&committed, &reference), (0, 0));
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
        .args(["-TERM", &child.pid().to_string()])
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

/// A poison epoch stops at once with its reason: an output record over the
/// producer's `message.max.bytes` (then, with a dead-letter topic, set
/// aside there), and a transaction the broker aborted for outliving
/// `transaction.timeout` (not blamed on another instance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_epoch_stops_with_its_reason_and_an_oversized_row_can_go_to_the_dead_letter_topic()
{
    const FILES: usize = 6;
    const ROWS: usize = 20;
    // Row 25 (epoch 2) is about 2,500 bytes; the producer takes 2,000.
    let mut p = Pipeline::with_query(
        FILES,
        ROWS,
        "SELECT id, CASE WHEN id = 25 THEN repeat(name, 500) ELSE name END AS name FROM rows",
    )
    .await;
    p.sink_options = ", 'kafka.message.max.bytes' = '2000'".into();
    let mut run = p.spawn("available-now", None);
    let status = run.wait(Duration::from_secs(120));
    let err = run.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("epoch 2 cannot commit: an output record for topic")
            && err.contains("over the producer's message.max.bytes (2000)")
            && err.contains("dead-letter.topic"),
        "{err}"
    );
    assert!(!err.contains("failed 5 times"), "not retried: {err}");
    let row = |id: usize| format!("{{\"id\":{id},\"name\":\"row{id}\"}}");
    assert_eq!(p.values(true).await, (0..ROWS).map(row).collect::<Vec<_>>());

    // With a dead-letter topic the row is set aside and the rest is written.
    let dlq = fresh_topic("eos-dlq");
    create_topic(&p.bootstrap, &dlq, 1).await.unwrap();
    p.sink_options = format!("{}, 'dead-letter.topic' = '{dlq}'", p.sink_options);
    let mut run = p.spawn("available-now", None);
    let status = run.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", run.stderr());
    let expected: Vec<String> = (0..FILES * ROWS).filter(|&id| id != 25).map(row).collect();
    assert_eq!(p.values(true).await, expected);
    let letters = p.read_topic(&dlq, true).await;
    assert_eq!(letters.len(), 1);
    let header = |k: &str| {
        letters[0]
            .headers
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let full = format!("{{\"id\":25,\"name\":\"{}\"}}", "row25".repeat(500));
    assert_eq!(header("sluice.value.bytes"), full.len().to_string());
    assert_eq!(header("sluice.sink.topic"), p.topic);
    assert_eq!(header("sluice.epoch"), "2");
    assert!(header("sluice.error").contains("over the producer's message.max.bytes"));
    let kept = letters[0].value.as_deref().unwrap();
    assert_eq!(kept, &full.as_bytes()[..1000], "the first half-limit bytes");

    // A transaction held open past 'transaction.timeout' (2 s) is aborted
    // by the broker (which looks for such every second under scripts/kafka,
    // every 10 s by default), and the query says so.
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.sink_options = ", 'transaction.timeout' = '2 s'".into();
    let resume = p.dir.join("resume");
    let mut run = p.spawn(
        "available-now",
        Some(&format!("kafka-before-commit@3:pause={}", resume.display())),
    );
    run.wait_for_line("pausing until");
    std::thread::sleep(Duration::from_secs(13));
    std::fs::write(&resume, "").unwrap();
    let status = run.wait(Duration::from_secs(120));
    let err = run.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("epoch 3 cannot commit: its transaction was open for")
            && err.contains("so the broker aborted it"),
        "{err}"
    );
    assert!(!err.contains("another instance took over"), "{err}");
    let mut run = p.spawn("available-now", None);
    assert!(
        run.wait(Duration::from_secs(120)).success(),
        "{}",
        run.stderr()
    );
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
}

/// Another producer's transaction open on a shared progress topic hides
/// what the query committed after it began from `read_committed` readers:
/// the restart waits for it to end instead of resuming from an older epoch
/// (which would write those epochs again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_open_transaction_on_a_shared_progress_topic_is_waited_out() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    const FILES: usize = 30;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    let shared = fresh_topic("eos-shared-progress");
    p.sink_options = format!(", 'progress.topic' = '{shared}'");
    let mut run = p.spawn("250 ms", None);
    p.wait_for_commits(&mut run, 3);

    let foreign: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &p.bootstrap)
        .set("transactional.id", format!("foreign-{shared}"))
        .set("transaction.timeout.ms", "60000")
        .create()
        .unwrap();
    foreign.init_transactions(Duration::from_secs(30)).unwrap();
    foreign.begin_transaction().unwrap();
    foreign
        .send(
            BaseRecord::<str, str>::to(&shared)
                .key("another-query")
                .payload("{}"),
        )
        .unwrap();
    foreign.flush(Duration::from_secs(30)).unwrap();

    // Epochs committed while the foreign transaction is open, then a crash.
    let before = Checkpoint::open_existing(p.dir.join("checkpoint"))
        .unwrap()
        .latest_commit_epoch()
        .unwrap()
        .unwrap();
    p.wait_for_commits(&mut run, before + 3);
    run.kill_9();

    let mut again = p.spawn("available-now", None);
    again.wait_for_line("another producer's transaction is open on the progress topic");
    std::thread::sleep(Duration::from_secs(2));
    assert!(again.running(), "{}", again.stderr());
    foreign.abort_transaction(Duration::from_secs(30)).unwrap();
    let status = again.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", again.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));

    // A record under the query's key whose body names another query is not
    // trusted: the restart is refused, naming the topic and offset.
    let query_id = Checkpoint::open_existing(p.dir.join("checkpoint"))
        .unwrap()
        .metadata()
        .query_id
        .clone();
    let last = read_topic(&p.bootstrap, &shared, true, Duration::from_secs(30))
        .unwrap()
        .into_iter()
        .rev()
        .find(|r| r.key.as_deref() == Some(query_id.as_bytes()))
        .unwrap();
    let mut forged: serde_json::Value =
        serde_json::from_slice(last.value.as_deref().unwrap()).unwrap();
    forged["query_id"] = serde_json::json!("someone-else");
    forged["epoch"] = serde_json::json!(forged["epoch"].as_u64().unwrap() + 1);
    foreign.begin_transaction().unwrap();
    let body = forged.to_string();
    foreign
        .send(
            BaseRecord::<str, str>::to(&shared)
                .key(&query_id)
                .payload(&body),
        )
        .unwrap();
    foreign.commit_transaction(Duration::from_secs(30)).unwrap();
    let mut refused = p.spawn("available-now", None);
    let status = refused.wait(Duration::from_secs(120));
    let err = refused.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("kafka progress topic '{shared}', offset"))
            && err.contains("names query 'someone-else'"),
        "{err}"
    );
}
