//! Shared helpers for the integration tests.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::arrow::array::{Int64Array, StringArray};
use sluice::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use sluice::arrow::record_batch::RecordBatch;
use sluice::{Connector, Result, Sink, SinkArgs, Source, SourceArgs, SourceFactory};

/// Runs the statements of `sql` in `session` and returns the query its
/// `INSERT INTO` started.
pub async fn start_sql(session: &sluice::Session, sql: &str) -> sluice::StreamingQuery {
    session
        .sql(sql)
        .await
        .expect("the SQL runs")
        .into_iter()
        .find_map(|o| match o {
            sluice::StatementOutcome::Started(q) => Some(q),
            _ => None,
        })
        .expect("an INSERT INTO started a query")
}

/// Records the sources skipped as malformed, summed over `progress`.
pub fn skipped(progress: &[sluice::QueryProgress]) -> u64 {
    progress
        .iter()
        .flat_map(|p| &p.sources)
        .map(|s| s.skipped_records)
        .sum()
}

/// `(id BIGINT, name VARCHAR)`.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// Rows `id` in `ids`, named `n<id>`.
pub fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .expect("valid batch")
}

/// The column `name` of every batch as Int64 (timestamps as their
/// numbers), concatenated.
pub fn ints(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    use sluice::arrow::array::AsArray;
    use sluice::arrow::compute::cast;
    use sluice::arrow::datatypes::{DataType, Int64Type};
    batches
        .iter()
        .flat_map(|b| {
            let column = b.column_by_name(name).expect("column exists");
            cast(column, &DataType::Int64)
                .expect("an integer or timestamp column")
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// The seed of a crash schedule: `SLUICE_CRASH_SEED` when set (to replay
/// a failure), else `default()`; printed, so a failure names it.
pub fn crash_seed(schedule: &str, default: impl FnOnce() -> u64) -> u64 {
    let seed = std::env::var("SLUICE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(default);
    eprintln!("{schedule} schedule: SLUICE_CRASH_SEED={seed}");
    seed
}

/// A small deterministic generator: no dependency, a fixed seed in CI.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..below`.
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// Checks `check` over random seeds with proptest: a fixed seed and
/// `default_cases` cases in CI; a longer run locally with
/// `SLUICE_ORACLE_CASES=200 SLUICE_ORACLE_SEED=<any number>`. A failure
/// names the failing seed; no shrinking, since every case runs queries.
pub fn property(default_cases: u32, check: impl Fn(u64)) {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&number("SLUICE_ORACLE_SEED").unwrap_or(0).to_le_bytes());
    let config = Config {
        cases: number("SLUICE_ORACLE_CASES").map_or(default_cases, |c| c as u32),
        failure_persistence: None,
        max_shrink_iters: 0,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    runner
        .run(&proptest::prelude::any::<u64>(), |seed| {
            check(seed);
            Ok(())
        })
        .unwrap();
}

/// How many of the operators' state files in checkpoint `dir` are deltas
/// (the rest are snapshots); none for a stateless query, which has no
/// state directory.
pub fn state_deltas(dir: &std::path::Path) -> usize {
    let Ok(operators) = std::fs::read_dir(dir.join("state")) else {
        return 0;
    };
    let mut deltas = 0;
    for operator in operators {
        for file in std::fs::read_dir(operator.expect("an operator").path()).expect("files") {
            let name = file.expect("a file").file_name();
            deltas += usize::from(name.to_string_lossy().ends_with(".delta"));
        }
    }
    deltas
}

/// Runs `f` on a fresh two-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// A row of the event-time tests: (key, value, event time in ms).
pub type TimedRow = (i64, i64, i64);

/// `(k BIGINT, v BIGINT, ts TIMESTAMP(ms))`.
pub fn timed_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(sluice::arrow::datatypes::TimeUnit::Millisecond, None),
            true,
        ),
    ]))
}

/// `rows` as one batch of [`timed_schema`].
pub fn timed_batch(rows: &[TimedRow]) -> RecordBatch {
    RecordBatch::try_new(
        timed_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(
                sluice::arrow::array::TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.2),
                ),
            ),
        ],
    )
    .expect("valid batch")
}

/// The port of the tests' own broker: `SLUICE_TEST_KAFKA_PORT`, default
/// 19092 (its controller on the next port). Never 9092, where a developer's
/// own Kafka (or the demo's) may listen: the tests create topics by the
/// hundred.
pub fn test_broker_port() -> u16 {
    port_from_env("SLUICE_TEST_KAFKA_PORT", 19092)
}

/// The port environment variable `var` names, else `default`.
pub fn port_from_env(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(default)
}

/// The tests' Kafka broker's bootstrap address, starting it if needed.
/// Held by the tests whose Sluice processes run many transactions at once
/// (a query divided into tasks, a task group of several processes), one
/// such test at a time: two side by side on a 2-core machine once starved
/// the broker until creating a topic timed out.
pub static MANY_TASKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn broker() -> String {
    tokio::task::spawn_blocking(|| sluice::broker::ensure_broker_on(test_broker_port()))
        .await
        .unwrap()
        .unwrap()
}

/// The tests' S3-compatible server (`scripts/s3proxy`), started if needed.
pub struct ObjectStore {
    /// The `AWS_*` variables its clients need.
    pub env: Vec<(String, String)>,
    /// Its bucket.
    pub bucket: String,
    /// The directory its objects are files in.
    pub data: std::path::PathBuf,
}

/// Starts the tests' S3-compatible server on `SLUICE_TEST_S3_PORT` (default
/// 19400) unless it runs, and returns how to reach it.
pub async fn object_store() -> ObjectStore {
    let port = port_from_env("SLUICE_TEST_S3_PORT", 19400).to_string();
    let env = tokio::task::spawn_blocking(move || {
        let port = ("SLUICE_S3_PORT", port.as_str());
        run_script("s3proxy", port, "start");
        run_script("s3proxy", port, "env")
    })
    .await
    .unwrap();
    let pairs: Vec<(String, String)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let value = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("scripts/s3proxy env has no {key}"))
    };
    ObjectStore {
        bucket: value("BUCKET"),
        data: value("DATA").into(),
        env: pairs
            .into_iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .collect(),
    }
}

/// `scripts/<script> <command>` with `port` (its variable and value) set;
/// its stdout, once it succeeded.
fn run_script(script: &str, port: (&str, &str), command: &str) -> String {
    let path = format!("{}/scripts/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&path)
        .arg(command)
        .env(port.0, port.1)
        .output()
        .unwrap_or_else(|e| panic!("scripts/{script} runs: {e}"));
    assert!(
        out.status.success(),
        "scripts/{script} {command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts the tests' PostgreSQL (`scripts/postgres`) on
/// `SLUICE_TEST_POSTGRES_PORT` (default 19600) unless it runs; returns its
/// port and the URL clients use (`postgres://sluice:sluice@...`).
pub async fn postgres() -> (u16, String) {
    let port = port_from_env("SLUICE_TEST_POSTGRES_PORT", 19600);
    let out = tokio::task::spawn_blocking(move || {
        run_script(
            "postgres",
            ("SLUICE_POSTGRES_PORT", &port.to_string()),
            "start",
        )
    })
    .await
    .unwrap();
    let url = out.lines().last().unwrap_or_default().to_string();
    assert!(
        url.starts_with("postgres://"),
        "scripts/postgres start said: {out}"
    );
    (port, url)
}

/// A Kafka stream of `topic` with columns [`schema`] and the extra
/// `options`.
pub fn kafka_stream(bootstrap: &str, topic: &str, options: &[(&str, &str)]) -> sluice::StreamFrame {
    sluice::Session::new()
        .read_stream()
        .format("kafka")
        .option("topic", topic)
        .option("bootstrap.servers", bootstrap)
        .options(options.iter().copied())
        .schema(schema())
        .load()
        .expect("a Kafka stream")
}

/// Runs `command` and kills it with SIGKILL at five random moments
/// (`rng`), each run resuming from the last committed epoch; checks that
/// the kills landed before `output()` reached `want`, then runs it once more
/// until it does (at most 240 s), two seconds longer (an input counted
/// twice would move the output off `want` for good), and stops it with
/// SIGTERM. The command's work must outlast the kills (at most 14 s, starts
/// included).
pub async fn kill_9_five_times_then_finish<T, F, Fut>(
    command: impl Fn() -> Command,
    rng: &mut Lcg,
    want: &T,
    output: F,
) where
    T: PartialEq + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    for _ in 0..5 {
        let mut run = Run::new(command());
        std::thread::sleep(std::time::Duration::from_millis(800 + rng.next(2_000)));
        assert!(run.running(), "the run ended: {}", run.stderr());
        run.kill_9();
    }
    assert_ne!(
        &output().await,
        want,
        "the kills landed after the work was done: give the runs more input"
    );
    let mut last = Run::new(command());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    loop {
        let now = output().await;
        if &now == want {
            break;
        }
        assert!(last.running(), "the last run ended: {}", last.stderr());
        assert!(
            std::time::Instant::now() < deadline,
            "the output did not reach the answer within 240 s: {now:?} != {want:?}\n{}",
            last.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    last.terminate();
    let status = last.wait(std::time::Duration::from_secs(60));
    assert!(status.success(), "the last run failed: {}", last.stderr());
    assert_eq!(&output().await, want);
}

/// A `sluice` process whose stderr is drained as it is written: a process
/// blocked on a full pipe would look like a hang.
pub struct Run {
    child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Run {
    pub fn new(mut cmd: Command) -> Self {
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

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM: the process finishes its epoch and exits.
    pub fn terminate(&mut self) {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    pub fn kill_9(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    /// Waits for the exit; past `limit` the process is killed and the test
    /// fails with what it wrote.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
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

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the process has written `text` to stderr.
    pub fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.stderr().contains(text) {
            assert!(self.running(), "ended before '{text}': {}", self.stderr());
            assert!(
                Instant::now() < deadline,
                "no '{text}' within 90 s: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends one keyed record through `producer`, waiting while its queue is
/// full.
pub fn send_keyed(producer: &rdkafka::producer::BaseProducer, topic: &str, key: &str, value: &str) {
    use rdkafka::producer::BaseRecord;
    while producer
        .send(BaseRecord::to(topic).key(key).payload(value))
        .is_err()
    {
        producer.poll(Duration::from_millis(10));
    }
}

/// Starts the tests' schema registry (`scripts/registry`, Apicurio
/// Registry's Confluent-compatible API) on `SLUICE_TEST_REGISTRY_PORT`
/// (default 19500) unless it runs, and returns the URL clients use.
pub async fn schema_registry() -> String {
    let port = port_from_env("SLUICE_TEST_REGISTRY_PORT", 19500);
    start_registry(port, false).await.0
}

/// A second schema registry serving HTTPS only, on
/// `SLUICE_TEST_TLS_REGISTRY_PORT` (default 19520): its URL and the path
/// of the CA certificate that signs its certificate.
pub async fn tls_schema_registry() -> (String, String) {
    let port = port_from_env("SLUICE_TEST_TLS_REGISTRY_PORT", 19520);
    start_registry(port, true).await
}

async fn start_registry(port: u16, tls: bool) -> (String, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/registry");
    tokio::task::spawn_blocking(move || {
        let run = |command: &str| {
            let out = Command::new(script)
                .arg(command)
                .env("SLUICE_REGISTRY_PORT", port.to_string())
                .env("SLUICE_REGISTRY_TLS", if tls { "1" } else { "0" })
                .output()
                .expect("scripts/registry runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "scripts/registry {command}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout.lines().last().unwrap_or_default().trim().to_string()
        };
        (run("start"), run("ca"))
    })
    .await
    .unwrap()
}

/// How long one `scripts/confluent-client` run may take, its first
/// run's install from PyPI included.
const CONFLUENT_CLIENT_LIMIT: Duration = Duration::from_secs(600);

/// Runs `scripts/confluent-client` (Confluent's Python serializers) with
/// `args`, `stdin` as its input; returns its output lines, or panics with
/// its error output. A run past [`CONFLUENT_CLIENT_LIMIT`] is killed (its
/// whole process group) and fails the test, rather than hang it.
pub async fn confluent_client(args: Vec<String>, stdin: String) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/confluent-client");
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(script)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("scripts/confluent-client runs");
        let group = child.id();
        let (ended, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let late = watch.recv_timeout(CONFLUENT_CLIENT_LIMIT)
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout);
            if late {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{group}")])
                    .status();
            }
            late
        });
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.as_bytes())
            .expect("writing its input");
        drop(input);
        let out = child.wait_with_output().expect("it ends");
        drop(ended);
        assert!(
            !watchdog.join().unwrap(),
            "scripts/confluent-client {} was killed after {CONFLUENT_CLIENT_LIMIT:?}",
            args.join(" ")
        );
        assert!(
            out.status.success(),
            "scripts/confluent-client {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.starts_with('%'))
                .collect::<Vec<_>>()
                .join("\n")
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    })
    .await
    .unwrap()
}

/// A connector named `name` whose source and sink are both `inner`, a
/// test's own (rows of [`schema`]): one object sees the whole epoch loop.
#[derive(Debug)]
pub struct OneConnector<T> {
    pub name: &'static str,
    pub inner: Arc<T>,
}

impl<T: Source + Sink + 'static> SourceFactory for OneConnector<T> {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::clone(&self.inner) as Arc<dyn Source>)
    }

    fn describe(&self) -> String {
        self.name.into()
    }
}

impl<T: Source + Sink + 'static> Connector for OneConnector<T> {
    fn name(&self) -> &str {
        self.name
    }

    fn is_source(&self) -> bool {
        true
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn source(&self, args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        args.options.finish(self.name, &[])?;
        Ok(Arc::new(OneConnector {
            name: self.name,
            inner: Arc::clone(&self.inner),
        }))
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        args.options.finish(self.name, &[])?;
        Ok(Arc::clone(&self.inner) as Arc<dyn Sink>)
    }
}

/// `sluice explain` of the SQL file `sql`: its plan, after asserting it
/// succeeded.
pub fn explain(sql: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("explain")
        .arg(sql)
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{plan}");
    plan
}

/// The JSON records of `topic` (read committed), each as `parse` makes
/// it, sorted, once there are at least `want`: read again every 300 ms
/// until then, failing after `limit` or when `run` has ended.
pub async fn wait_for_rows<T: Ord>(
    bootstrap: &str,
    topic: &str,
    want: usize,
    run: &mut Run,
    limit: Duration,
    parse: impl Fn(&serde_json::Value) -> T,
) -> Vec<T> {
    let deadline = Instant::now() + limit;
    loop {
        let (b, t) = (bootstrap.to_string(), topic.to_string());
        let records = tokio::task::spawn_blocking(move || {
            sluice::broker::read_topic(&b, &t, true, Duration::from_secs(30)).unwrap()
        })
        .await
        .unwrap();
        let mut got: Vec<T> = records
            .iter()
            .map(|r| parse(&serde_json::from_slice(r.value.as_deref().unwrap()).unwrap()))
            .collect();
        got.sort();
        if got.len() >= want {
            return got;
        }
        assert!(run.running(), "{}", run.stderr());
        assert!(
            Instant::now() < deadline,
            "{topic}: {} of {want} rows after {limit:?}: {}",
            got.len(),
            run.stderr()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A free loopback port, for a process to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
