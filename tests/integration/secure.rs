//! Secured Kafka: a real broker with SASL_SSL (SCRAM) and mutual-TLS
//! listeners (`SLUICE_KAFKA_SECURE=1 scripts/kafka start`), exactly-once
//! through it under kill -9, quick and clear failures for a wrong password,
//! an unknown CA or a hostname mismatch, and secrets that never reach
//! anything Sluice prints. The same over SASL/OAUTHBEARER with tokens of a
//! real OpenID Connect provider (Keycloak, `scripts/keycloak`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer};
use sluice::broker::{create_topic, fresh_topic, read_topic, SecureBroker};
use sluice::Checkpoint;
use sluice_kafka::ClientOptions;

/// The environment variable the tests' SQL reads the password from.
const PASSWORD_VAR: &str = "SLUICE_TEST_KAFKA_PASSWORD";

/// The secured broker of this test process: `SLUICE_TEST_SECURE_KAFKA_PORT`
/// (default 19192; its listeners on the four ports after it).
fn secure_broker() -> &'static SecureBroker {
    static BROKER: OnceLock<SecureBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let port = crate::util::port_from_env("SLUICE_TEST_SECURE_KAFKA_PORT", 19192);
        sluice::broker::ensure_secure_broker_on(port).expect("a secured broker")
    })
}

/// A second secured broker whose extra listener takes OAUTHBEARER tokens
/// of a real OpenID Connect provider: `SLUICE_TEST_OIDC_KAFKA_PORT`
/// (default 19292), the provider (Keycloak) on that port + 8.
fn oidc_broker() -> &'static SecureBroker {
    static BROKER: OnceLock<SecureBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let port = crate::util::port_from_env("SLUICE_TEST_OIDC_KAFKA_PORT", 19292);
        sluice::broker::ensure_oidc_broker_on(port, port + 8).expect("a broker with OIDC")
    })
}

/// Produces `rows` JSON records `{"id": i, "k": i % 13}` to `topic`,
/// zstd-compressed, through `client`'s listener.
fn produce(client: &ClientOptions, topic: &str, rows: i64) {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", client.bootstrap())
        .set("compression.type", "zstd")
        .set("linger.ms", "20");
    for (k, v) in client.properties() {
        config.set(k, v);
    }
    let producer: BaseProducer = config.create().unwrap();
    for i in 0..rows {
        let value = format!("{{\"id\": {i}, \"k\": {}}}", i % 13);
        let key = i.to_string();
        crate::util::send_keyed(&producer, topic, &key, &value);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// `SET 'kafka.<key>' = '<value>'` for each of `client`'s properties and
/// its brokers, the password (or OIDC client secret) as
/// `${SLUICE_TEST_KAFKA_PASSWORD}`.
fn connection_settings(client: &ClientOptions) -> String {
    let mut sql = format!(
        "SET 'kafka.bootstrap.servers' = '{}';\n",
        client.bootstrap()
    );
    for (k, v) in client.properties() {
        let v = if k == "sasl.password" || k == "sasl.oauthbearer.client.secret" {
            format!("${{{PASSWORD_VAR}}}")
        } else {
            v.to_string()
        };
        sql.push_str(&format!("SET 'kafka.{k}' = '{v}';\n"));
    }
    sql
}

struct Job {
    dir: tempfile::TempDir,
    input: String,
    output: String,
    client: ClientOptions,
    password: String,
}

impl Job {
    /// An input topic of `rows` records and an output topic, on the
    /// listener `client` reaches.
    async fn new(client: ClientOptions, password: &str, rows: i64) -> Self {
        let (input, output) = (fresh_topic("secure-in"), fresh_topic("secure-out"));
        create_topic(&client, &input, 2).await.unwrap();
        create_topic(&client, &output, 1).await.unwrap();
        let c = client.clone();
        let topic = input.clone();
        tokio::task::spawn_blocking(move || produce(&c, &topic, rows))
            .await
            .unwrap();
        Self {
            dir: tempfile::tempdir().unwrap(),
            input,
            output,
            client,
            password: password.to_string(),
        }
    }

    fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("checkpoint")
    }

    /// The query's file for `trigger`: connection settings declared once
    /// for both streams, a GROUP BY from the input to the output.
    fn sql(&self, trigger: &str) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("{}.sql", trigger.replace(' ', "")));
        std::fs::write(
            &path,
            format!(
                "{settings}SET 'checkpoint.location' = '{checkpoint}';\n\
                 SET 'trigger' = '{trigger}';\n\
                 CREATE STREAM input (id BIGINT, k BIGINT) WITH (connector = 'kafka', \
                   topic = '{input}', 'max-records-per-epoch' = '150');\n\
                 CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
                   'kafka.compression.type' = 'lz4');\n\
                 INSERT INTO out SELECT k, count(*) AS n, sum(id) AS total FROM input GROUP BY k;\n",
                settings = connection_settings(&self.client),
                checkpoint = self.checkpoint().display(),
                input = self.input,
                output = self.output,
            ),
        )
        .unwrap();
        path
    }

    fn sluice(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.env(PASSWORD_VAR, &self.password)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn committed(&self) -> Option<u64> {
        Checkpoint::open_existing(self.checkpoint())
            .ok()
            .and_then(|cp| cp.latest_commit_epoch().ok().flatten())
    }

    /// `cmd` spawned with its standard error (debug logging: more than a
    /// pipe holds) in a new file of the job's directory; that file.
    fn spawn(&self, cmd: &mut Command) -> (Child, PathBuf) {
        let path = self
            .dir
            .path()
            .join(format!("{}.stderr", fresh_topic("run")));
        let file = std::fs::File::create(&path).unwrap();
        (cmd.stderr(file).spawn().unwrap(), path)
    }

    /// Runs continuously until `epochs` more epochs are committed, then
    /// kills the process with SIGKILL; what it printed.
    fn run_and_kill_9(&self, epochs: u64) -> String {
        let before = self.committed().unwrap_or(0);
        let (mut child, stderr) = self.spawn(self.sluice().arg("run").arg(self.sql("200 ms")));
        let printed = || std::fs::read_to_string(&stderr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.committed().unwrap_or(0) < before + epochs {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the query ended early ({status}): {}", printed());
            }
            assert!(Instant::now() < deadline, "no commits: {}", printed());
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        printed()
    }

    /// `sluice checkpoint inspect` of the job's checkpoint against the
    /// secured listener, given the client's properties on the command line.
    fn inspect(&self) -> Output {
        self.sluice()
            .args(["checkpoint", "inspect"])
            .arg(self.checkpoint())
            .args(["--bootstrap", self.client.bootstrap()])
            .args(property_args(&self.client))
            .output()
            .unwrap()
    }

    /// Runs until the input present at start is committed.
    fn run_to_end(&self) -> Output {
        let out = self
            .sluice()
            .arg("run")
            .arg(self.sql("available-now"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        out
    }

    /// The output as an independent client reads it, `read_committed`,
    /// through the secured listener: per key, every `(n, total)` in order.
    fn updates(&self) -> BTreeMap<i64, Vec<(i64, i64)>> {
        let records =
            read_topic(&self.client, &self.output, true, Duration::from_secs(30)).unwrap();
        let mut out: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
        for r in records {
            let v: serde_json::Value = serde_json::from_str(&r.value_str()).unwrap();
            out.entry(v["k"].as_i64().unwrap())
                .or_default()
                .push((v["n"].as_i64().unwrap(), v["total"].as_i64().unwrap()));
        }
        out
    }
}

/// `--kafka-property key=value` for each of `client`'s properties.
fn property_args(client: &ClientOptions) -> Vec<String> {
    client
        .properties()
        .flat_map(|(k, v)| ["--kafka-property".to_string(), format!("{k}={v}")])
        .collect()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Kafka source → GROUP BY → exactly-once Kafka sink through `client`,
/// killed with SIGKILL twice mid-run and finished; then the committed
/// output, read through the same secured listener by another client, is
/// exactly the updates of the inputs' counts and sums (no update lost or
/// repeated), `sluice verify` agrees with DataFusion's batch answer, and
/// `sluice checkpoint inspect --bootstrap` reads the progress topic.
async fn exactly_once_through(client: ClientOptions, password: &str) {
    const ROWS: i64 = 3_000;
    let job = Job::new(client, password, ROWS).await;
    let mut logs = String::new();
    logs += &job.run_and_kill_9(3);
    logs += &job.run_and_kill_9(3);
    logs += &text(&job.run_to_end());

    let updates = job.updates();
    assert_eq!(updates.len(), 13, "{updates:?}");
    for (k, seen) in &updates {
        let ids: Vec<i64> = (0..ROWS).filter(|i| i % 13 == *k).collect();
        let last = *seen.last().unwrap();
        assert_eq!(last, (ids.len() as i64, ids.iter().sum()), "key {k}");
        // A repeated epoch would show a count again; a lost one, a sum that
        // does not add up.
        assert!(
            seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
            "key {k}: updates repeat or go back: {seen:?}"
        );
    }

    let verify = job
        .sluice()
        .arg("verify")
        .arg(job.sql("available-now"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", text(&verify));
    logs += &text(&verify);

    let inspected = job.inspect();
    let report = text(&inspected);
    assert!(inspected.status.success(), "{report}");
    assert!(report.contains("agrees with the checkpoint"), "{report}");
    logs += &report;
    if !password.is_empty() {
        assert!(
            !logs.contains(password),
            "the password was printed:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_over_sasl_ssl_with_scram_survives_kill_9() {
    let broker = secure_broker();
    exactly_once_through(broker.scram(), &broker.password).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_over_mutual_tls_survives_kill_9() {
    exactly_once_through(secure_broker().mtls(), "").await;
}

/// SASL/OAUTHBEARER with OIDC client credentials: every client fetches
/// its token from Keycloak with the client's id and secret, and the
/// broker checks the token's signature, issuer and audience.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_over_oauthbearer_with_oidc_tokens_survives_kill_9() {
    let broker = oidc_broker();
    let (_, provider) = broker.oauthbearer.as_ref().unwrap();
    exactly_once_through(broker.oidc().unwrap(), &provider.client_secret).await;
}

/// `sluice run` of a query reading `topic` through `client`'s listener:
/// the exit and what it printed, and how long it took.
fn run_against(client: &ClientOptions, password: &str, topic: &str) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "{settings}SET 'checkpoint.location' = '{checkpoint}';\n\
             SET 'trigger' = 'available-now';\n\
             CREATE STREAM input (id BIGINT, k BIGINT) WITH (connector = 'kafka', topic = '{topic}');\n\
             CREATE STREAM out WITH (connector = 'blackhole');\n\
             INSERT INTO out SELECT * FROM input;\n",
            settings = connection_settings(client),
            checkpoint = dir.path().join("checkpoint").display(),
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .env(PASSWORD_VAR, password)
        .arg("run")
        .arg(&sql)
        .output()
        .unwrap();
    (out, started.elapsed())
}

/// A query whose `client` has the `wrong` password (or secret) under
/// `key` exits 1 within 30 s saying that authentication failed, without
/// printing it.
async fn refused_login(client: ClientOptions, key: &str, wrong: &str) {
    let topic = fresh_topic("secure-auth");
    create_topic(&client, &topic, 1).await.unwrap();
    let client = client.property(key, wrong);
    let (out, took) = run_against(&client, wrong, &topic);
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {printed}");
    assert!(printed.contains("authentication failed"), "{printed}");
    assert!(!printed.contains(wrong), "{key} was printed:\n{printed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_fails_within_30_s_saying_authentication_failed() {
    refused_login(
        secure_broker().scram(),
        "sasl.password",
        "not-the-password-4711",
    )
    .await;
}

/// The OIDC provider refuses the client's secret: no token, no login.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_oidc_client_secret_fails_within_30_s_saying_authentication_failed() {
    let client = oidc_broker().oidc().unwrap();
    refused_login(
        client,
        "sasl.oauthbearer.client.secret",
        "not-the-secret-4711",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_ca_or_a_hostname_mismatch_fails_quickly_naming_tls() {
    let broker = secure_broker();
    let topic = fresh_topic("secure-tls");
    create_topic(&broker.scram(), &topic, 1).await.unwrap();
    let password = broker.password.as_str();
    // No CA given: the system's CAs do not know the test CA.
    let unknown_ca = ClientOptions::new(broker.sasl_ssl.as_str())
        .property("security.protocol", "SASL_SSL")
        .property("sasl.mechanism", "SCRAM-SHA-512")
        .property("sasl.username", broker.user.as_str())
        .property("sasl.password", password);
    // The broker's certificate is for 127.0.0.1 only.
    let port = broker.sasl_ssl.rsplit(':').next().unwrap();
    let mut mismatch = ClientOptions::new(format!("localhost:{port}"));
    for (k, v) in broker.scram().properties() {
        mismatch = mismatch.property(k, v);
    }
    for (case, client) in [("unknown CA", unknown_ca), ("hostname mismatch", mismatch)] {
        let (out, took) = run_against(&client, password, &topic);
        let printed = text(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {printed}");
        assert!(
            took < Duration::from_secs(30),
            "{case}: took {took:?}: {printed}"
        );
        assert!(
            printed.contains("TLS handshake failed") && printed.contains("certificate"),
            "{case}: {printed}"
        );
        assert!(
            !printed.contains(password),
            "{case}: the password was printed:\n{printed}"
        );
    }
}

/// Reads the Prometheus text at `addr`, once it answers.
fn scrape(addr: &str) -> String {
    use std::io::Write;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
            let mut body = String::new();
            if s.read_to_string(&mut body).is_ok() && body.contains("sluice_") {
                return body;
            }
        }
        assert!(Instant::now() < deadline, "no metrics at {addr}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A password written in SQL and one given through `${ENV}` appear nowhere:
/// not on stderr (debug logging on), not in EXPLAIN, the progress log, the
/// metrics or `checkpoint inspect`, nor when librdkafka refuses a property.
#[tokio::test(flavor = "multi_thread")]
async fn a_password_is_never_printed() {
    let broker = secure_broker();
    let password = broker.password.clone();
    let job = Job::new(broker.scram(), &password, 500).await;
    let mut printed = String::new();

    // Written in the file itself.
    let literal = job.dir.path().join("literal.sql");
    let through_env = std::fs::read_to_string(job.sql("1 s")).unwrap();
    std::fs::write(
        &literal,
        through_env.replace(&format!("${{{PASSWORD_VAR}}}"), &password),
    )
    .unwrap();
    let explain = job.sluice().arg("explain").arg(&literal).output().unwrap();
    assert!(explain.status.success(), "{}", text(&explain));
    printed += &text(&explain);

    // Through ${ENV}: run with a progress log and metrics, then inspect.
    let progress = job.dir.path().join("progress.jsonl");
    let metrics = format!("127.0.0.1:{}", crate::util::free_port());
    let (mut child, stderr) = job.spawn(
        job.sluice()
            .arg("run")
            .arg(job.sql("1 s"))
            .arg("--progress-log")
            .arg(&progress)
            .arg("--metrics-addr")
            .arg(&metrics),
    );
    let logged = || std::fs::read_to_string(&stderr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while job.committed().is_none() {
        assert!(Instant::now() < deadline, "no commit: {}", logged());
        std::thread::sleep(Duration::from_millis(100));
    }
    printed += &scrape(&metrics);
    // SIGTERM, as a service manager would send.
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{}", logged());
    // RUST_LOG=debug is honoured: the log holds debug events.
    assert!(logged().contains("DEBUG"), "{}", logged());
    printed += &logged();
    printed += &std::fs::read_to_string(&progress).unwrap();
    printed += &text(&job.inspect());

    // librdkafka refuses a misspelt property: its message would repeat
    // the value.
    let refused = job.dir.path().join("refused.sql");
    std::fs::write(
        &refused,
        through_env.replace("'kafka.sasl.password'", "'kafka.sasl.pasword'"),
    )
    .unwrap();
    let out = job.sluice().arg("run").arg(&refused).output().unwrap();
    let message = text(&out);
    assert!(!out.status.success(), "{message}");
    assert!(message.contains("sasl.pasword"), "{message}");
    printed += &message;

    assert!(
        !printed.contains(&password),
        "the password was printed:\n{printed}"
    );
    // Nor is it kept in the checkpoint.
    let mut dirs = vec![job.checkpoint()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes
                        .windows(password.len())
                        .any(|w| w == password.as_bytes()),
                    "{} holds the password",
                    path.display()
                );
            }
        }
    }
}

/// `sluice nexmark load` writes its topics through the secured listener.
#[tokio::test(flavor = "multi_thread")]
async fn nexmark_load_works_over_sasl_ssl() {
    let broker = secure_broker();
    let client = broker.scram();
    let prefix = fresh_topic("secure-nexmark");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["nexmark", "load", "--events", "500", "--partitions", "1"])
        .args(["--bootstrap", client.bootstrap(), "--prefix", &prefix])
        .args(property_args(&client));
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(&broker.password));
    let mut total = 0;
    for table in ["person", "auction", "bid"] {
        let c = client.clone();
        let topic = format!("{prefix}-{table}");
        total += tokio::task::spawn_blocking(move || {
            read_topic(&c, &topic, false, Duration::from_secs(30))
                .unwrap()
                .len()
        })
        .await
        .unwrap();
    }
    assert_eq!(total, 500);
}
