//! Repartition steps (a divided query's GROUP BY not on `_key`) against
//! the real broker: event time crossing them.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::broker::{create_topic, fresh_topic, read_topic};

use crate::util::{broker, Run};

/// A record of the test input: its partition, `g` and event time (ms
/// after 2026-01-01T00:00:00Z).
#[derive(Debug, Clone, Copy)]
struct Row {
    partition: i32,
    g: i64,
    ms: i64,
}

/// Produces `rows` into their partitions, in order, each value
/// `{"g": .., "ts": ".."}`.
fn produce(bootstrap: &str, topic: &str, rows: &[Row]) {
    let records: Vec<(i32, String)> = rows
        .iter()
        .map(|r| {
            let value = format!("{{\"g\":{},\"ts\":\"{}\"}}", r.g, timestamp(r.ms));
            (r.partition, value)
        })
        .collect();
    produce_to(bootstrap, topic, &records);
}

/// Produces `(partition, value)` records, in order.
fn produce_to(bootstrap: &str, topic: &str, records: &[(i32, String)]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (partition, value) in records {
        while producer
            .send(
                BaseRecord::<(), _>::to(topic)
                    .payload(value)
                    .partition(*partition),
            )
            .is_err()
        {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// `ms` after 2026-01-01T00:00:00Z, as JSON timestamps are written.
fn timestamp(ms: i64) -> String {
    format!(
        "2026-01-01T00:{:02}:{:02}.{:03}Z",
        ms / 60_000,
        ms / 1_000 % 60,
        ms % 1_000
    )
}

const WINDOW_MS: i64 = 1_000;
const DELAY_MS: i64 = 1_000;

/// Per group and window start (ms), the rows of `rows` in windows that end
/// at or before `watermark` (a plain loop, the batch answer).
fn closed(rows: &[Row], watermark: i64) -> BTreeMap<(i64, i64), i64> {
    let mut counts = BTreeMap::new();
    for r in rows {
        let start = r.ms / WINDOW_MS * WINDOW_MS;
        if start + WINDOW_MS <= watermark {
            *counts.entry((r.g, start)).or_insert(0) += 1;
        }
    }
    counts
}

/// The windows emitted to `topic`: per group and window start (ms), every
/// count emitted for it.
fn emitted(bootstrap: &str, topic: &str) -> BTreeMap<(i64, i64), Vec<i64>> {
    let mut out: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
    for r in read_topic(bootstrap, topic, true, Duration::from_secs(30)).unwrap() {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        // `2026-01-01T00:00:SS[.fff]`: the window's start, in ms.
        let start = v["window_start"].as_str().unwrap();
        let seconds: f64 = start
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('Z')
            .parse()
            .unwrap();
        out.entry((v["g"].as_i64().unwrap(), (seconds * 1_000.0).round() as i64))
            .or_default()
            .push(v["n"].as_i64().unwrap());
    }
    out
}

/// Waits (at most 120 s) until `topic` holds exactly one count for each
/// window of `want`, failing at once on a window emitted twice or not
/// wanted.
async fn wait_for(bootstrap: &str, topic: &str, want: &BTreeMap<(i64, i64), i64>, run: &mut Run) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (b, t) = (bootstrap.to_string(), topic.to_string());
        let got = tokio::task::spawn_blocking(move || emitted(&b, &t))
            .await
            .unwrap();
        for (window, counts) in &got {
            assert_eq!(counts.len(), 1, "window {window:?} emitted {counts:?}");
            assert!(
                want.contains_key(window),
                "window {window:?} ({counts:?}) emitted, but it is still open; wanted {want:?}"
            );
        }
        let got: BTreeMap<(i64, i64), i64> = got.into_iter().map(|(w, c)| (w, c[0])).collect();
        if &got == want {
            return;
        }
        assert!(run.running(), "the run ended: {}", run.stderr());
        assert!(
            Instant::now() < deadline,
            "{got:?} != {want:?} after 120 s: {}",
            run.stderr()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A tumbling window grouped by a column that does not decide the
/// partition divides through a repartition step, its watermark the least
/// of every upstream task's: a window closes only once both partitions
/// are past its end (partition 0 running ahead closes nothing of its own),
/// with the count of both partitions' rows. A row older than that
/// watermark is dropped once and counted once in the tasks' `late_rows`;
/// the windows stay the batch answer without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_through_a_repartition_step_waits_for_every_partition_and_drops_a_late_row_once() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = broker().await;
    let (input, output) = (fresh_topic("hop-wm-in"), fresh_topic("hop-wm-out"));
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("windows.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'pipeline.name' = '{output}';\n\
             SET 'tasks' = 'per-partition';\n\
             SET 'trigger' = '200 ms';\n\
             CREATE STREAM timed (g BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - \
               INTERVAL '{delay}' SECOND) WITH (connector = 'kafka', topic = '{input}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT g, window_start, count(*) AS n \
               FROM TABLE(TUMBLE(TABLE timed, DESCRIPTOR(ts), INTERVAL '{size}' SECOND)) \
               GROUP BY g, window_start, window_end;\n",
            cp = dir.path().join("cp").display(),
            delay = DELAY_MS / 1_000,
            size = WINDOW_MS / 1_000,
        ),
    )
    .unwrap();
    let log = dir.path().join("progress.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run")
        .arg(&sql)
        .arg("--progress-log")
        .arg(&log)
        .stdout(Stdio::null());

    // Partition 0 reaches 9.9 s, partition 1 only 4.9 s: the watermark
    // through the step is 3.9 s, so only windows ending by then close.
    let row = |partition, i: i64| Row {
        partition,
        g: i % 3,
        ms: i * 100,
    };
    let mut rows: Vec<Row> = (0..100).map(|i| row(0, i)).collect();
    rows.extend((0..50).map(|i| row(1, i)));
    produce(&bootstrap, &input, &rows);
    let mut run = Run::new(cmd);
    let first = closed(&rows, 4_900 - DELAY_MS);
    assert_eq!(first.len(), 9, "{first:?}");
    wait_for(&bootstrap, &output, &first, &mut run).await;
    // Nothing more closes while partition 1 stays behind.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for(&bootstrap, &output, &first, &mut run).await;

    // A row of a window long closed, then partition 1 catches up.
    let late = Row {
        partition: 0,
        g: 0,
        ms: 500,
    };
    produce(&bootstrap, &input, &[late]);
    let caught_up: Vec<Row> = (50..100).map(|i| row(1, i)).collect();
    produce(&bootstrap, &input, &caught_up);
    rows.extend(caught_up);
    let all = closed(&rows, 9_900 - DELAY_MS);
    wait_for(&bootstrap, &output, &all, &mut run).await;
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );

    let late_rows: u64 = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["late_rows"]
                .as_u64()
                .unwrap_or_else(|| panic!("no late_rows: {l}"))
        })
        .sum();
    assert_eq!(late_rows, 1, "late rows in {}", log.display());
}

/// An interval join of two topics whose partitions do not follow the join
/// key divides through two repartition steps, each side's rows crossing
/// to the partition of their key with its tasks' watermarks: every pair
/// within the bound is emitted once (a plain loop's pairs), and `sluice
/// verify` finds the divided output equal to the batch answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_join_through_repartition_steps_emits_every_pair_once() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = broker().await;
    let (bids, asks, output) = (
        fresh_topic("join-bids"),
        fresh_topic("join-asks"),
        fresh_topic("join-out"),
    );
    for t in [&bids, &asks] {
        create_topic(&bootstrap, t, 3).await.unwrap();
    }
    create_topic(&bootstrap, &output, 1).await.unwrap();
    // Bids and asks spread over the partitions round robin, not by
    // auction; each partition in event-time order.
    let bid = |i: i64| (i % 7, (i * 37) % 101, 10_000 + i * 100);
    let ask = |i: i64| (i % 7, i, 10_000 + i * 300);
    let records = |rows: Vec<(i64, i64, i64)>, field: &str| -> Vec<(i32, String)> {
        rows.iter()
            .enumerate()
            .map(|(i, (auction, v, ms))| {
                let value = format!(
                    "{{\"auction\":{auction},\"{field}\":{v},\"ts\":\"{}\"}}",
                    timestamp(*ms)
                );
                ((i % 3) as i32, value)
            })
            .collect()
    };
    let bid_rows: Vec<_> = (0..600).map(bid).collect();
    let ask_rows: Vec<_> = (0..200).map(ask).collect();
    {
        let (b, bt, at) = (bootstrap.clone(), bids.clone(), asks.clone());
        let (br, ar) = (
            records(bid_rows.clone(), "price"),
            records(ask_rows.clone(), "ask"),
        );
        tokio::task::spawn_blocking(move || {
            produce_to(&b, &bt, &br);
            produce_to(&b, &at, &ar);
        })
        .await
        .unwrap();
    }
    // Every pair of one auction whose bid is at most 1 s after the ask.
    let mut want: Vec<(i64, i64, i64)> = Vec::new();
    for &(auction, price, bts) in &bid_rows {
        for &(a_auction, a, ats) in &ask_rows {
            if auction == a_auction && ats <= bts && bts <= ats + 1_000 {
                want.push((auction, price, a));
            }
        }
    }
    want.sort_unstable();
    assert!(want.len() > 100, "{}", want.len());

    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("join.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'pipeline.name' = '{output}';\n\
             SET 'tasks' = 'per-partition';\n\
             SET 'trigger' = '200 ms';\n\
             CREATE STREAM bids (auction BIGINT, price BIGINT, ts TIMESTAMP(3), \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
               topic = '{bids}', 'bootstrap.servers' = '{bootstrap}', \
               'max-records-per-epoch' = '40');\n\
             CREATE STREAM asks (auction BIGINT, ask BIGINT, ts TIMESTAMP(3), \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
               topic = '{asks}', 'bootstrap.servers' = '{bootstrap}', \
               'max-records-per-epoch' = '15');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT b.auction, b.price, a.ask FROM bids b JOIN asks a \
               ON b.auction = a.auction AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' SECOND;\n",
            cp = dir.path().join("cp").display(),
        ),
    )
    .unwrap();
    let explained = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("explain")
        .arg(&sql)
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&explained.stdout);
    assert!(explained.status.success(), "{plan}");
    assert!(
        plan.contains("the join is not on the record key, so each task runs 3 sub-topologies"),
        "{plan}"
    );

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    let deadline = Instant::now() + Duration::from_secs(120);
    let got = loop {
        let (b, t) = (bootstrap.clone(), output.clone());
        let records = tokio::task::spawn_blocking(move || {
            read_topic(&b, &t, true, Duration::from_secs(30)).unwrap()
        })
        .await
        .unwrap();
        let mut got: Vec<(i64, i64, i64)> = records
            .iter()
            .map(|r| {
                let v: serde_json::Value =
                    serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                let n = |f: &str| v[f].as_i64().unwrap();
                (n("auction"), n("price"), n("ask"))
            })
            .collect();
        got.sort_unstable();
        if got.len() >= want.len() {
            break got;
        }
        assert!(run.running(), "{}", run.stderr());
        assert!(
            Instant::now() < deadline,
            "{} of {} pairs after 120 s: {}",
            got.len(),
            want.len(),
            run.stderr()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(got, want, "pairs emitted vs the plain loop's");

    // verify, once every row has crossed, agrees.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let verified = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("verify")
            .arg(&sql)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&verified.stdout).into_owned();
        assert!(!report.contains("DIFFERENT"), "{report}");
        if verified.status.code() == Some(0) {
            assert!(
                report.contains(&format!("equals the batch answer ({} rows)", want.len())),
                "{report}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{report}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );
}
