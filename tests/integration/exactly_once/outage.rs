//! The broker going away: an outage the query waits out and resumes from
//! exactly, a broker stopped during a commit (the outage limit, SIGTERM on
//! time), and a stream pointed at another cluster. Each stops and starts a
//! broker of its own, one test at a time.

use std::process::Command;
use std::time::{Duration, Instant};

use sluice::broker::{create_topic, fresh_topic, read_topic};

use super::Pipeline;
use crate::util::Run;

/// The port of the broker that outage tests stop and start, one test at a
/// time (they hold [`OWN_BROKER`]).
const OWN_PORT: u16 = 9192;
static OWN_BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let bootstrap = stdout.lines().last().unwrap_or_default().to_string();
    if command == "start" {
        // A restarted broker answers metadata before its transaction
        // coordinator has loaded: a query started then failed its
        // `init_transactions` ("Not coordinator") within its 5 s
        // connect.timeout. Wait until a transactional producer can start.
        use rdkafka::producer::{BaseProducer, Producer};
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("transactional.id", format!("ready-{}", fresh_topic("own")))
            .create()
            .unwrap();
        producer
            .init_transactions(std::time::Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("the broker on {port} takes no transactions: {e}"));
    }
    bootstrap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_second_broker_outage_stalls_the_query_which_then_resumes_exactly() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    const PORT: u16 = OWN_PORT;
    let _own = OWN_BROKER.lock().await;
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

/// The broker stops while an epoch's transaction is open: the query waits,
/// recovers, and after its `outage.limit` fails (status 1) naming the
/// limit. A SIGTERM during the next outage ends the process within
/// `--shutdown-timeout`, status 1. Once the broker is back the restart
/// writes every row exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_stopped_during_a_commit_fails_after_the_outage_limit_and_sigterm_exits_on_time()
{
    const FILES: usize = 12;
    const ROWS: usize = 20;
    let _own = OWN_BROKER.lock().await;
    let start = || tokio::task::spawn_blocking(|| own_broker("start", OWN_PORT));
    let stop = || tokio::task::spawn_blocking(|| own_broker("stop", OWN_PORT));
    let bootstrap = start().await.unwrap();
    let mut p = Pipeline::on(
        bootstrap,
        FILES,
        ROWS,
        "SELECT id, upper(name) AS name, id * 3 AS tripled FROM rows WHERE id % 7 <> 3",
    )
    .await;
    p.settings = "SET 'outage.limit' = '5 s';\n".into();
    p.sink_options = ", 'connect.timeout' = '5 s', 'transaction.timeout' = '10 s'".into();

    // 1. Stopped with epoch 3's transaction open: fails after the limit.
    let resume = p.dir.join("resume-1");
    let mut run = p.spawn(
        "available-now",
        Some(&format!("kafka-before-commit@3:pause={}", resume.display())),
    );
    run.wait_for_line("pausing until");
    stop().await.unwrap();
    std::fs::write(&resume, "").unwrap();
    let resumed = Instant::now();
    let status = run.wait(Duration::from_secs(120));
    let err = run.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("no epoch could commit for") && err.contains("outage limit"),
        "{err}"
    );
    // The commit waits up to 'transaction.timeout' and the abort as long;
    // each recovery attempt up to 'connect.timeout'.
    assert!(resumed.elapsed() < Duration::from_secs(60), "{err}");

    // 2. SIGTERM while epoch 5's commit waits for the stopped broker.
    start().await.unwrap();
    let resume = p.dir.join("resume-2");
    let mut cmd = p.command(
        "checkpoint",
        "available-now",
        Some(&format!("kafka-before-commit@5:pause={}", resume.display())),
    );
    cmd.args(["--shutdown-timeout", "3"]);
    let mut run = Run::new(cmd);
    run.wait_for_line("pausing until");
    stop().await.unwrap();
    std::fs::write(&resume, "").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(run.running(), "{}", run.stderr());
    let signalled = Instant::now();
    run.terminate();
    let status = run.wait(Duration::from_secs(30));
    let took = signalled.elapsed();
    let err = run.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        took < Duration::from_secs(6),
        "exited {took:?} after SIGTERM: {err}"
    );
    assert!(err.contains("did not commit within 3s"), "{err}");

    // 3. The broker back, the restart finishes: every row once.
    start().await.unwrap();
    let mut run = p.spawn("available-now", None);
    let status = run.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", run.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
    stop().await.unwrap();
}

/// The same topic name on another cluster is another input: a query whose
/// stream now reads another cluster is refused before its sink opens,
/// naming both cluster ids, instead of applying one log's offsets to the
/// other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_pointed_at_another_cluster_is_refused_naming_both() {
    let _own = OWN_BROKER.lock().await;
    let shared = crate::util::broker().await;
    let other = tokio::task::spawn_blocking(|| own_broker("start", OWN_PORT))
        .await
        .unwrap();
    let (input, output) = (fresh_topic("cluster-in"), fresh_topic("cluster-out"));
    create_topic(&shared, &input, 1).await.unwrap();
    create_topic(&other, &input, 1).await.unwrap();
    create_topic(&shared, &output, 1).await.unwrap();
    let (b, t) = (shared.clone(), input.clone());
    tokio::task::spawn_blocking(move || crate::no_silent_loss::produce_plain(&b, &t, 0..10))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = |source: &str| {
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger' = 'available-now';\n\
             CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{input}', 'bootstrap.servers' = '{source}');\n\
             CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{shared}');\n\
             INSERT INTO dst SELECT id, name FROM src;\n",
            cp = dir.path().display()
        )
    };
    let query = crate::util::start_sql(&sluice::Session::new(), &sql(&shared)).await;
    query.await_termination().await.unwrap();
    let err = sluice::Session::new()
        .sql(&sql(&other))
        .await
        .map(|_| ())
        .expect_err("another cluster is refused")
        .to_string();
    tokio::task::spawn_blocking(|| own_broker("stop", OWN_PORT))
        .await
        .unwrap();
    assert!(
        err.contains("now reads Kafka cluster '") && err.contains("committed reading cluster '"),
        "{err}"
    );
    let ids: Vec<&str> = err.split('\'').skip(1).step_by(2).collect();
    assert_ne!(ids.first(), ids.get(1), "two clusters named: {err}");
    assert_eq!(
        read_topic(&shared, &output, true, Duration::from_secs(30))
            .unwrap()
            .len(),
        10
    );
}
