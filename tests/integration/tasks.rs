//! Queries divided into tasks, one per Kafka partition
//! (`'tasks' = 'per-partition'`), against the real broker: every task
//! commits alone (its own checkpoint folder, transactional id and progress
//! record), a `sluice run` killed with SIGKILL at random moments loses and
//! repeats nothing, and what tasks cannot divide is refused. Processes
//! sharing the tasks through the query's Kafka group are `group`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice::broker::{create_topic, fresh_topic, read_topic, ReadRecord};

use crate::util::{broker, crash_seed, Lcg, Run};

mod group;

const PARTITIONS: i32 = 6;
const RECORDS: i64 = 6_000;
const KEYS: i64 = 40;

/// Produces `ids` keyed `k<id % KEYS>` (librdkafka's partitioner sends a
/// key to one partition), each value `{"id": <id>, "ts": <event time>}`,
/// the event time [`event_ms`]`(id)` after 2026-01-01T00:00:00Z.
fn produce_keyed(bootstrap: &str, topic: &str, ids: std::ops::Range<i64>) {
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for id in ids {
        let key = format!("k{}", id % KEYS);
        let ms = event_ms(id);
        let value = format!(
            "{{\"id\":{id},\"ts\":\"2026-01-01T00:{:02}:{:02}.{:03}Z\"}}",
            ms / 60_000,
            ms / 1_000 % 60,
            ms % 1_000
        );
        crate::util::send_keyed(&producer, topic, &key, &value);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Record `id`'s event time, in ms after the first record's: 10 ms apart.
fn event_ms(id: i64) -> i64 {
    id * 10
}

/// The join query's key is `id % JOIN_STRIDE`, and its time bound the
/// event time of `JOIN_STRIDE` records.
const JOIN_STRIDE: i64 = 50;
/// The q5 query's groups: `id % HOT_GROUPS`.
const HOT_GROUPS: i64 = 7;

/// The record key `k<id % KEYS>`, computed from the value: a GROUP BY on
/// it is not on `_key`, so a divided query repartitions its rows.
fn key_from_value() -> String {
    format!("concat('k', CAST(id % {KEYS} AS VARCHAR))")
}

/// The windowed query's HOP window (its slide and size) and watermark
/// delay, in ms.
const SLIDE_MS: i64 = 1_000;
const WINDOW_MS: i64 = 2_000;
const DELAY_MS: i64 = 1_000;

struct Divided {
    dir: tempfile::TempDir,
    /// Where the queries' checkpoints go: a local folder, or a prefix on
    /// the S3-compatible server.
    checkpoints: String,
    /// The environment of every `sluice run` (the object store's).
    env: Vec<(String, String)>,
    bootstrap: String,
    input: String,
    copy: String,
    counts: String,
    windows: String,
    pipeline: String,
    /// With `stacked`, a second input (the same records), an interval join
    /// of it with the first and a Nexmark q5 query run too.
    stacked: Option<Stacked>,
    /// Whether the last SQL file's GROUP BYs go through a repartition
    /// step (not on `_key`): its windows then close by the watermark of
    /// every partition, not their own partition's.
    through_hop: std::sync::atomic::AtomicBool,
}

/// The topics of [`Divided`]'s join and q5 queries.
struct Stacked {
    /// The second input: the records of the first, as they are produced.
    others: String,
    joined: String,
    hot: String,
}

impl Divided {
    async fn new() -> Self {
        let bootstrap = broker().await;
        let input = fresh_topic("tasks-in");
        let copy = fresh_topic("tasks-copy");
        let counts = fresh_topic("tasks-counts");
        let windows = fresh_topic("tasks-windows");
        create_topic(bootstrap.as_str(), &input, PARTITIONS)
            .await
            .unwrap();
        for topic in [&copy, &counts, &windows] {
            create_topic(bootstrap.as_str(), topic, 1).await.unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        Self {
            checkpoints: dir.path().display().to_string(),
            env: Vec::new(),
            dir,
            pipeline: fresh_topic("tasks"),
            bootstrap,
            input,
            copy,
            counts,
            windows,
            stacked: None,
            through_hop: false.into(),
        }
    }

    /// Adds the second input and the join and q5 queries.
    async fn with_stacked(mut self) -> Self {
        let stacked = Stacked {
            others: fresh_topic("tasks-others"),
            joined: fresh_topic("tasks-joined"),
            hot: fresh_topic("tasks-hot"),
        };
        create_topic(self.bootstrap.as_str(), &stacked.others, PARTITIONS)
            .await
            .unwrap();
        for topic in [&stacked.joined, &stacked.hot] {
            create_topic(self.bootstrap.as_str(), topic, 1)
                .await
                .unwrap();
        }
        self.stacked = Some(stacked);
        self
    }

    /// The queries whose checkpoints the file names.
    fn queries(&self) -> Vec<&'static str> {
        let mut queries = vec!["copy", "counts", "windows"];
        if self.stacked.is_some() {
            queries.extend(["joined", "hot"]);
        }
        queries
    }

    /// Produces `ids` to the input (and the second input, with stacked
    /// queries).
    fn produce(&self, ids: std::ops::Range<i64>) {
        produce_keyed(&self.bootstrap, &self.input, ids.clone());
        if let Some(s) = &self.stacked {
            produce_keyed(&self.bootstrap, &s.others, ids);
        }
    }

    /// The SQL file: a stateless copy, a count per record key (update mode)
    /// and a count per key and 2 s window sliding by 1 s (append mode), each
    /// a query of its own, divided as `tasks` says, running until stopped;
    /// `group_by` is both counts' key.
    fn sql(&self, tasks: &str, group_by: &str) -> PathBuf {
        let settings = format!("SET 'tasks' = '{tasks}';\nSET 'trigger' = '200 ms';\n");
        self.sql_with(&format!("{tasks}-{group_by}"), &settings, group_by)
    }

    /// The SQL file named `name` with `settings` before the queries.
    fn sql_with(&self, name: &str, settings: &str, group_by: &str) -> PathBuf {
        self.through_hop
            .store(group_by != "_key", std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.path().join(format!("q-{name}.sql"));
        let checkpoint = |name: &str| format!("{}/{name}", self.checkpoints);
        std::fs::write(
            &path,
            format!(
                "CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = '{input}', \
                   'bootstrap.servers' = '{b}', 'max-records-per-epoch' = '150');\n\
                 CREATE STREAM copy WITH (connector = 'kafka', topic = '{copy}', \
                   'bootstrap.servers' = '{b}');\n\
                 CREATE STREAM counts WITH (connector = 'kafka', topic = '{counts}', \
                   'bootstrap.servers' = '{b}');\n\
                 CREATE STREAM timed (id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - \
                   INTERVAL '{delay}' SECOND) WITH (connector = 'kafka', topic = '{input}', \
                   'bootstrap.servers' = '{b}', 'max-records-per-epoch' = '150');\n\
                 CREATE STREAM windows WITH (connector = 'kafka', topic = '{windows}', \
                   'bootstrap.servers' = '{b}');\n\
                 {settings}\
                 SET 'pipeline.name' = '{p}-copy';\n\
                 SET 'checkpoint.location' = '{copy_cp}';\n\
                 INSERT INTO copy SELECT id, _key AS k, _partition AS p FROM input;\n\
                 SET 'pipeline.name' = '{p}-counts';\n\
                 SET 'checkpoint.location' = '{counts_cp}';\n\
                 INSERT INTO counts SELECT {group_by} AS k, count(*) AS n FROM input \
                   GROUP BY {group_by};\n\
                 SET 'pipeline.name' = '{p}-windows';\n\
                 SET 'checkpoint.location' = '{windows_cp}';\n\
                 INSERT INTO windows SELECT {group_by} AS k, window_start, count(*) AS n \
                   FROM TABLE(HOP(TABLE timed, DESCRIPTOR(ts), INTERVAL '{slide}' SECOND, \
                   INTERVAL '{size}' SECOND)) GROUP BY {group_by}, window_start, window_end;\n\
                 {stacked}",
                stacked = self.stacked_sql(),
                windows = self.windows,
                delay = DELAY_MS / 1_000,
                slide = SLIDE_MS / 1_000,
                size = WINDOW_MS / 1_000,
                windows_cp = checkpoint("windows"),
                input = self.input,
                copy = self.copy,
                counts = self.counts,
                b = self.bootstrap,
                p = self.pipeline,
                copy_cp = checkpoint("copy"),
                counts_cp = checkpoint("counts"),
            ),
        )
        .unwrap();
        path
    }

    /// With stacked queries, their statements: an interval join of the
    /// two inputs on a key neither is partitioned by (each record with its
    /// own copy and the copy of the record [`JOIN_STRIDE`] later, 500 ms
    /// after it), and Nexmark q5 over the first (per HOP window, the
    /// groups `id % HOT_GROUPS` with the most records).
    fn stacked_sql(&self) -> String {
        let Some(s) = &self.stacked else {
            return String::new();
        };
        let (b, checkpoint) = (&self.bootstrap, |name: &str| {
            format!("{}/{name}", self.checkpoints)
        });
        let hop = format!(
            "TABLE(HOP(TABLE timed, DESCRIPTOR(ts), INTERVAL '{slide}' SECOND, INTERVAL '{size}' \
             SECOND))",
            slide = SLIDE_MS / 1_000,
            size = WINDOW_MS / 1_000
        );
        format!(
            "CREATE STREAM others (id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL \
               '{delay}' SECOND) WITH (connector = 'kafka', topic = '{others}', \
               'bootstrap.servers' = '{b}', 'max-records-per-epoch' = '150');\n\
             CREATE STREAM joined WITH (connector = 'kafka', topic = '{joined}', \
               'bootstrap.servers' = '{b}');\n\
             CREATE STREAM hot WITH (connector = 'kafka', topic = '{hot}', \
               'bootstrap.servers' = '{b}');\n\
             SET 'pipeline.name' = '{p}-joined';\n\
             SET 'checkpoint.location' = '{joined_cp}';\n\
             INSERT INTO joined SELECT t.id AS a, o.id AS b FROM timed t JOIN others o \
               ON t.id % {JOIN_STRIDE} = o.id % {JOIN_STRIDE} \
               AND o.ts BETWEEN t.ts AND t.ts + INTERVAL '{stride_ms}' MILLISECOND;\n\
             SET 'pipeline.name' = '{p}-hot';\n\
             SET 'checkpoint.location' = '{hot_cp}';\n\
             INSERT INTO hot SELECT c.g, c.num, m.window_end \
             FROM (SELECT id % {HOT_GROUPS} AS g, count(*) AS num, window_start, window_end \
                   FROM {hop} GROUP BY id % {HOT_GROUPS}, window_start, window_end) c \
             JOIN (SELECT max(num) AS maxn, window_start, window_end \
                   FROM (SELECT count(*) AS num, window_start, window_end FROM {hop} \
                         GROUP BY id % {HOT_GROUPS}, window_start, window_end) \
                   GROUP BY window_start, window_end) m \
               ON c.window_start = m.window_start AND c.window_end = m.window_end \
               AND c.num >= m.maxn;\n",
            delay = DELAY_MS / 1_000,
            others = s.others,
            joined = s.joined,
            hot = s.hot,
            p = self.pipeline,
            joined_cp = checkpoint("joined"),
            hot_cp = checkpoint("hot"),
            stride_ms = event_ms(JOIN_STRIDE),
        )
    }

    fn command(&self, sql: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(sql).stdout(Stdio::null());
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `sluice checkpoint inspect` of query `query`'s checkpoint, checked
    /// against Kafka: its report, after asserting it succeeded.
    fn inspect(&self, query: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["checkpoint", "inspect"])
            .arg(format!("{}/{query}", self.checkpoints))
            .args(["--bootstrap", &self.bootstrap])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

    async fn read(&self, topic: &str) -> Vec<ReadRecord> {
        let (b, t) = (self.bootstrap.clone(), topic.to_string());
        tokio::task::spawn_blocking(move || read_topic(&b, &t, true, Duration::from_secs(60)))
            .await
            .unwrap()
            .unwrap()
    }
}

/// A repartition record of the count query, `(k0 VARCHAR, p0 BIGINT)` in
/// Avro's single-object encoding: the magic `C3 01`, the schema's 8-byte
/// fingerprint, then the body, each field a zigzag varint or a length and
/// bytes, possibly behind a union index (`02`: not null). Fails on
/// anything else, trailing bytes included.
fn avro_key_and_count(value: &[u8]) -> (String, i64) {
    assert_eq!(
        &value[..2],
        [0xc3, 0x01],
        "not single-object Avro: {value:?}"
    );
    let body = &value[10..];
    let varint = |bytes: &[u8]| -> (i64, usize) {
        let (mut n, mut shift, mut used) = (0u64, 0, 0);
        for b in bytes {
            n |= u64::from(b & 0x7f) << shift;
            shift += 7;
            used += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        (((n >> 1) as i64) ^ -((n & 1) as i64), used)
    };
    // The key's length is even (positive) and at least 2 ("k0"): a 1 here
    // is a union's "not null".
    let mut at = usize::from(body[0] == 0x02);
    let (len, used) = varint(&body[at..]);
    at += used;
    let key = String::from_utf8(body[at..at + len as usize].to_vec()).unwrap();
    at += len as usize;
    let rest = &body[at..];
    let at = usize::from(rest.len() >= 2 && rest[0] == 0x02);
    let (count, used) = varint(&rest[at..]);
    assert_eq!(at + used, rest.len(), "trailing bytes in {value:?}");
    (key, count)
}

fn json(record: &ReadRecord) -> serde_json::Value {
    serde_json::from_slice(record.value.as_deref().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_divided_per_partition_commits_each_task_alone_and_is_exact_through_kill_9() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let d = Divided::new().await;
    produce_keyed(&d.bootstrap, &d.input, 0..RECORDS);
    let sql = d.sql("per-partition", &key_from_value());

    // Kill -9 at random moments, then run to the end of the input. Where
    // each kill landed is read from the checkpoint: it must have hit, at
    // least once, a process past its first commit and a task between an
    // epoch's plan and its commit record (more kills until it has, up to
    // 20).
    let mut rng = Lcg(crash_seed("kill -9", || 0x7a5c));
    let (mut after_commit, mut mid_epoch) = (0, 0);
    // Each task's last planned epoch after the previous kill: an epoch
    // left open by an earlier kill is not this one's.
    let mut before = epochs(d.dir.path());
    let inside = |now: &BTreeMap<String, (Option<u64>, Option<u64>)>,
                  before: &BTreeMap<String, (Option<u64>, Option<u64>)>| {
        now.iter().any(|(task, (planned, done))| {
            planned > done && *planned > before.get(task).and_then(|b| b.0)
        })
    };
    for kill in 0..20 {
        if kill >= 6 && after_commit > 0 && mid_epoch > 0 {
            break;
        }
        let mut run = Run::new(d.command(&sql));
        std::thread::sleep(Duration::from_millis(700 + rng.next(2_500)));
        // Every other kill waits for a task to be inside an epoch (planned,
        // its commit not recorded), then strikes at once.
        if kill % 2 == 1 {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !inside(&epochs(d.dir.path()), &before) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert!(run.running(), "the run ended: {}", run.stderr());
        run.kill_9();
        let now = epochs(d.dir.path());
        after_commit += usize::from(now.values().any(|(_, done)| done.is_some()));
        mid_epoch += usize::from(inside(&now, &before));
        before = now;
    }
    assert!(after_commit > 0, "no kill landed after a first commit");
    assert!(mid_epoch > 0, "no kill landed inside an epoch");
    let mut last = Run::new(d.command(&sql));
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while !complete(&d).await {
        assert!(last.running(), "the last run ended: {}", last.stderr());
        assert!(
            std::time::Instant::now() < deadline,
            "the output was not complete within 300 s: {}",
            last.stderr()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last.terminate();
    let status = last.wait(Duration::from_secs(60));
    assert!(status.success(), "the last run failed: {}", last.stderr());

    check_output(&d).await;

    // Each task committed alone: its own checkpoint folder and its own
    // progress record (keyed by its transactional identity).
    for query in ["copy", "counts", "windows"] {
        let tasks: BTreeSet<String> = std::fs::read_dir(d.dir.path().join(query).join("tasks"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let want: BTreeSet<String> = (0..PARTITIONS).map(|i| i.to_string()).collect();
        assert_eq!(tasks, want, "{query}'s task folders");
        let progress = d
            .read(&format!("sluice-progress.{}-{query}", d.pipeline))
            .await;
        let keys: BTreeSet<String> = progress
            .iter()
            .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
            .collect();
        let want: BTreeSet<String> = (0..PARTITIONS)
            .map(|i| format!("{}-{query}-{i}", d.pipeline))
            .collect();
        assert_eq!(keys, want, "{query}'s progress records");

        // `sluice checkpoint inspect` shows every task, each agreeing with
        // its own progress record.
        let report = d.inspect(query);
        assert!(
            report.contains(&format!("divided into {PARTITIONS} tasks")),
            "{report}"
        );
        assert_eq!(
            report.matches("agrees with the checkpoint").count(),
            PARTITIONS as usize,
            "{report}"
        );
    }

    // A query is divided, or not, for its whole life.
    let mut once = Run::new(d.command(&d.sql("1", "_key")));
    let status = once.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{}", once.stderr());
    assert!(
        once.stderr().contains("'tasks' changed"),
        "{}",
        once.stderr()
    );

    // EXPLAIN says how each query is divided.
    let plan = crate::util::explain(&sql);
    assert_eq!(
        plan.matches("tasks: one per partition of the inputs")
            .count(),
        3,
        "{plan}"
    );
    // The counts' GROUP BYs are not on `_key`: two sub-topologies and the
    // repartition topic between them, for each.
    assert_eq!(plan.matches("repartition step").count(), 2, "{plan}");
    let topic = format!("sluice-{}-counts-repartition-0", d.pipeline);
    assert!(plan.contains(&topic), "{plan}");
    let windows_topic = format!("sluice-{}-windows-repartition-0", d.pipeline);
    assert!(plan.contains(&windows_topic), "{plan}");
    // The windows' rows cross one by one, each upstream task's watermark
    // after them.
    assert!(
        plan.contains("then its watermark to every partition")
            && plan.contains("its watermark the least of every upstream task's"),
        "{plan}"
    );
    assert!(plan.contains("-- sub-topology 1"), "{plan}");
    assert!(
        plan.contains("sub-topology 0: aggregates each epoch's rows"),
        "{plan}"
    );
    // It was created with a partition per task, and the records the
    // tasks had committed past were deleted: every partition's start
    // moved past records it held (and the output is exact, above, so none
    // the query still needed went).
    let left = d.read(&topic).await;
    assert!(left.len() < RECORDS as usize, "{} records left", left.len());
    // Each epoch's rows were counted per group upstream: a record is the
    // group key's value and its partial count, not the `id` it is
    // computed from, in Avro.
    for r in &left {
        let (key, count) = avro_key_and_count(r.value.as_deref().unwrap());
        assert!(key.starts_with('k'), "{key}");
        assert!(count >= 1, "{key}: {count}");
    }
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &d.bootstrap)
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        use rdkafka::consumer::Consumer;
        let (low, high) = consumer
            .fetch_watermarks(&topic, p, Duration::from_secs(10))
            .unwrap();
        assert!(
            0 < low && low <= high,
            "{topic} partition {p}: {low}..{high}"
        );
    }

    // What a repartition step cannot take is refused.
    let (input, counts, windows, b) = (&d.input, &d.counts, &d.windows, &d.bootstrap);
    let streams = format!(
        "CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = '{input}', \
           'bootstrap.servers' = '{b}');\n\
         CREATE STREAM timed (id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' \
           SECOND) WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{b}');\n\
         CREATE STREAM counts WITH (connector = 'kafka', topic = '{counts}', \
           'bootstrap.servers' = '{b}');\n\
         CREATE STREAM windows WITH (connector = 'kafka', topic = '{windows}', \
           'bootstrap.servers' = '{b}');\n\
         SET 'tasks' = 'per-partition';\n"
    );
    let count = "INSERT INTO counts SELECT id % 7 AS k, count(*) AS n FROM input GROUP BY id % 7;";
    for (name, statements, message) in [
        // An operator over another whose rows change: a chain's links
        // carry closed windows only.
        (
            "stacked",
            "INSERT INTO counts SELECT sum(n) AS n FROM (SELECT id % 7 AS k, count(*) AS n \
             FROM input GROUP BY id % 7);"
                .to_string(),
            "stacks a stateful operator whose rows change",
        ),
        // A task group without the identity its processes share.
        (
            "nameless",
            format!("SET 'tasks.group' = 'true';\n{count}"),
            "needs SET 'pipeline.name'",
        ),
    ] {
        let sql = d.dir.path().join(format!("{name}.sql"));
        let checkpoint = d.dir.path().join(name);
        std::fs::write(
            &sql,
            format!(
                "{streams}SET 'checkpoint.location' = '{}';\n{statements}\n",
                checkpoint.display()
            ),
        )
        .unwrap();
        let mut refused = Run::new(d.command(&sql));
        let status = refused.wait(Duration::from_secs(60));
        assert_eq!(status.code(), Some(2), "{name}: {}", refused.stderr());
        assert!(
            refused.stderr().contains(message),
            "{name}: {}",
            refused.stderr()
        );
    }
}

/// Each task's last planned epoch (`offsets/N`) and last epoch recorded
/// as committed (`commits/N`) in the checkpoints under `dir`.
fn epochs(dir: &Path) -> BTreeMap<String, (Option<u64>, Option<u64>)> {
    let last = |path: PathBuf| {
        std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
            .max()
    };
    let mut out = BTreeMap::new();
    for query in ["copy", "counts", "windows"] {
        for task in 0..PARTITIONS {
            let dir = dir.join(query).join("tasks").join(task.to_string());
            let planned_done = (last(dir.join("offsets")), last(dir.join("commits")));
            out.insert(format!("{query}/{task}"), planned_done);
        }
    }
    out
}

/// The outputs of [`Divided`]'s queries are exact: the copy holds every
/// input record once; per key the counts grow strictly (an update
/// repeated by a replayed epoch would show twice) up to the key's count in
/// the input, counted here independently; every window that closed is
/// emitted once with its count.
async fn check_output(d: &Divided) {
    let copied = d.read(&d.copy).await;
    let mut ids: Vec<i64> = copied
        .iter()
        .map(|r| json(r)["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    let expected: Vec<i64> = (0..RECORDS).collect();
    assert_eq!(ids.len(), expected.len(), "lost or repeated records");
    assert_eq!(ids, expected);
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in d.read(&d.counts).await {
        let v = json(&r);
        per_key
            .entry(v["k"].as_str().unwrap().to_string())
            .or_default()
            .push(v["n"].as_i64().unwrap());
    }
    assert_eq!(per_key.len() as i64, KEYS, "{per_key:?}");
    for (key, updates) in &per_key {
        let k: i64 = key[1..].parse().unwrap();
        let count = (0..RECORDS).filter(|id| id % KEYS == k).count() as i64;
        assert!(
            updates.windows(2).all(|w| w[0] < w[1]),
            "key {key}: updates not strictly growing: {updates:?}"
        );
        assert_eq!(updates.last(), Some(&count), "key {key}: {updates:?}");
    }
    // The windows: each closed window emitted once (append mode), with
    // its count; none that must stay open.
    let emitted = emitted_windows(d).await;
    let expected = expected_windows(d).await;
    assert!(!expected.is_empty());
    for (window, counts) in &emitted {
        assert_eq!(counts.len(), 1, "window {window:?} emitted {counts:?}");
    }
    let emitted: BTreeMap<(String, i64), i64> = emitted
        .into_iter()
        .map(|(w, counts)| (w, counts[0]))
        .collect();
    assert_eq!(emitted, expected, "windows emitted vs expected");
    // The join's pairs and q5's rows, each once.
    if let Some(s) = &d.stacked {
        let (joined, hot) = stacked_outputs(d, s).await;
        assert_eq!(joined, expected_joined(), "join pairs emitted vs expected");
        let expected = expected_hot(d).await;
        assert!(!expected.is_empty());
        assert_eq!(hot, expected, "q5 rows emitted vs expected");
    }
}

/// Per key and window start (ms), the count the windowed query must emit,
/// computed here from the input topic as written. A window closes once
/// its watermark (latest event time less the delay) reaches the window's
/// end, so the last windows stay open. Grouped by `_key`, the watermark is
/// the partition's own; through a repartition step, the least over every
/// partition's, and none while a partition has no rows.
async fn expected_windows(d: &Divided) -> BTreeMap<(String, i64), i64> {
    let input = d.read(&d.input).await;
    let mut latest: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &input {
        let at = latest.entry(r.partition).or_insert(i64::MIN);
        *at = (*at).max(event_ms(json(r)["id"].as_i64().unwrap()));
    }
    let every = match latest.len() == PARTITIONS as usize {
        true => latest.values().min().map(|l| l - DELAY_MS),
        false => None,
    };
    let through_hop = d.through_hop.load(std::sync::atomic::Ordering::Relaxed);
    let mut expected = BTreeMap::new();
    for r in &input {
        let ts = event_ms(json(r)["id"].as_i64().unwrap());
        let watermark = match through_hop {
            true => every,
            false => Some(latest[&r.partition] - DELAY_MS),
        };
        // Every window holding `ts`: the last starts at or before it.
        let last = ts.div_euclid(SLIDE_MS) * SLIDE_MS;
        for start in (0..WINDOW_MS / SLIDE_MS).map(|k| last - k * SLIDE_MS) {
            if watermark.is_some_and(|w| start + WINDOW_MS <= w) {
                let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
                *expected.entry((key, start)).or_insert(0) += 1;
            }
        }
    }
    expected
}

/// The windowed query's output: per key and window start (ms), every count
/// emitted for it.
async fn emitted_windows(d: &Divided) -> BTreeMap<(String, i64), Vec<i64>> {
    let mut emitted: BTreeMap<(String, i64), Vec<i64>> = BTreeMap::new();
    for r in d.read(&d.windows).await {
        let v = json(&r);
        let ms = ms_after_2026(v["window_start"].as_str().unwrap());
        emitted
            .entry((v["k"].as_str().unwrap().to_string(), ms))
            .or_default()
            .push(v["n"].as_i64().unwrap());
    }
    emitted
}

/// `2026-01-01T00:MM:SS[.fff][Z]` as ms after 2026-01-01 (the first HOP
/// window starts the second before).
fn ms_after_2026(text: &str) -> i64 {
    let (day, time) = text.split_once('T').unwrap();
    let time = time.trim_end_matches('Z');
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    let ms = ((parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]) * 1000.0).round() as i64;
    match day {
        "2025-12-31" => ms - 86_400_000,
        _ => ms,
    }
}

/// The join query's pairs, by a plain loop over the ids: each record with
/// the other input's copy of itself and of the record `JOIN_STRIDE` later.
fn expected_joined() -> Vec<(i64, i64)> {
    let mut pairs: Vec<(i64, i64)> = (0..RECORDS)
        .flat_map(|a| [(a, a), (a, a + JOIN_STRIDE)])
        .filter(|(_, b)| *b < RECORDS)
        .collect();
    pairs.sort_unstable();
    pairs
}

/// The q5 query's rows (group, count, window end in ms), by plain loops
/// over the input as written: per window the last watermark closed (the
/// least over every partition's, as through the hop), the groups with
/// the most records.
async fn expected_hot(d: &Divided) -> Vec<(i64, i64, i64)> {
    let input = d.read(&d.input).await;
    let mut latest: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &input {
        let at = latest.entry(r.partition).or_insert(i64::MIN);
        *at = (*at).max(event_ms(json(r)["id"].as_i64().unwrap()));
    }
    if latest.len() < PARTITIONS as usize {
        return Vec::new();
    }
    let watermark = latest.values().min().unwrap() - DELAY_MS;
    let mut counts: BTreeMap<i64, BTreeMap<i64, i64>> = BTreeMap::new();
    for r in &input {
        let id = json(r)["id"].as_i64().unwrap();
        let last = event_ms(id).div_euclid(SLIDE_MS) * SLIDE_MS;
        for start in (0..WINDOW_MS / SLIDE_MS).map(|k| last - k * SLIDE_MS) {
            let end = start + WINDOW_MS;
            if end <= watermark {
                *counts
                    .entry(end)
                    .or_default()
                    .entry(id % HOT_GROUPS)
                    .or_default() += 1;
            }
        }
    }
    let mut rows = Vec::new();
    for (end, groups) in counts {
        let most = groups.values().copied().max().unwrap_or(0);
        rows.extend(
            groups
                .into_iter()
                .filter(|(_, n)| *n == most)
                .map(|(g, n)| (g, n, end)),
        );
    }
    rows.sort_unstable();
    rows
}

/// The stacked queries' outputs, read committed and sorted: the join's
/// pairs and q5's rows.
async fn stacked_outputs(d: &Divided, s: &Stacked) -> (Vec<(i64, i64)>, Vec<(i64, i64, i64)>) {
    let mut joined: Vec<(i64, i64)> = d
        .read(&s.joined)
        .await
        .iter()
        .map(|r| {
            let v = json(r);
            (v["a"].as_i64().unwrap(), v["b"].as_i64().unwrap())
        })
        .collect();
    joined.sort_unstable();
    let mut hot: Vec<(i64, i64, i64)> = d
        .read(&s.hot)
        .await
        .iter()
        .map(|r| {
            let v = json(r);
            (
                v["g"].as_i64().unwrap(),
                v["num"].as_i64().unwrap(),
                ms_after_2026(v["window_end"].as_str().unwrap()),
            )
        })
        .collect();
    hot.sort_unstable();
    (joined, hot)
}

/// Whether every output is complete, read_committed: the copy has every
/// record, the last count of every key is its total, and every window that
/// must close has been emitted.
async fn complete(d: &Divided) -> bool {
    if d.read(&d.copy).await.len() < RECORDS as usize {
        return false;
    }
    if emitted_windows(d).await.len() < expected_windows(d).await.len() {
        return false;
    }
    if let Some(s) = &d.stacked {
        let (joined, hot) = stacked_outputs(d, s).await;
        if joined.len() < expected_joined().len() || hot.len() < expected_hot(d).await.len() {
            return false;
        }
    }
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in d.read(&d.counts).await {
        let v = json(&r);
        last.insert(
            v["k"].as_str().unwrap().to_string(),
            v["n"].as_i64().unwrap(),
        );
    }
    last.values().sum::<i64>() == RECORDS
}

/// Every commit of a stateful task deletes the state files its chain no
/// longer needs (`state.retained.snapshots` = 1): no file in an operator's
/// folder is older than the chain the task's last commit names. (Under a
/// memory limit the chain is sliced and keeps its files until every slice
/// is written whole after them, so their number is no bound.)
fn state_files_were_deleted(root: &Path) {
    let epoch_of = |file: &str| -> u64 {
        let name = file.rsplit('/').next().unwrap_or(file);
        name.split('.').next().unwrap().parse().unwrap()
    };
    for query in ["counts", "windows"] {
        for task in 0..PARTITIONS {
            let dir = root.join(query).join(format!("tasks/{task}"));
            let last = std::fs::read_dir(dir.join("commits"))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .max()
                .unwrap_or_else(|| panic!("no commit in {}", dir.display()));
            let framed = std::fs::read(dir.join(format!("commits/{last}"))).unwrap();
            let body = &framed[framed.iter().position(|&b| b == b'\n').unwrap() + 1..];
            let commit: serde_json::Value = serde_json::from_slice(body).unwrap();
            let named: Vec<&str> = commit["state_files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect();
            let operators: Vec<PathBuf> = std::fs::read_dir(dir.join("state"))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(!operators.is_empty(), "no state in {}", dir.display());
            for operator in operators {
                let folder = operator.file_name().unwrap().to_string_lossy().to_string();
                let chain_start = named
                    .iter()
                    .filter(|f| f.starts_with(&format!("state/{folder}/")))
                    .map(|f| epoch_of(f))
                    .min()
                    .unwrap_or_else(|| {
                        panic!("commit {last} names no file of {folder}: {named:?}")
                    });
                for file in std::fs::read_dir(&operator).unwrap().flatten() {
                    let name = file.file_name().to_string_lossy().to_string();
                    assert!(
                        epoch_of(&name) >= chain_start,
                        "{name} in {} is older than the chain commit {last} names \
                         (from epoch {chain_start}): deletions did not run",
                        operator.display()
                    );
                }
            }
        }
    }
}
