//! Repartition steps (a divided query's GROUP BY not on `_key`) against
//! the real broker: what crosses them exactly (NaN, partials), event time
//! crossing them, and joins through them.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::broker::{create_topic, fresh_topic, read_topic};

use crate::util::{broker, explain, wait_for_rows, Run};
use crate::verify::{produce as produce_to, timestamp};

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
    let records: Vec<(i32, Option<String>, String)> = rows
        .iter()
        .map(|r| {
            let value = format!("{{\"g\":{},\"ts\":\"{}\"}}", r.g, timestamp(r.ms));
            (r.partition, None, value)
        })
        .collect();
    produce_to(bootstrap, topic, &records);
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
    // A HOP's rows cross below its windows, once each, not once per
    // window: the window is assigned downstream (also under an alias of
    // the windowed table).
    let hop = dir.path().join("hop.sql");
    std::fs::write(
        &hop,
        std::fs::read_to_string(&sql).unwrap().replace(
            "INSERT INTO out SELECT g, window_start, count(*) AS n \
             FROM TABLE(TUMBLE(TABLE timed, DESCRIPTOR(ts), INTERVAL '1' SECOND)) \
             GROUP BY g, window_start, window_end;",
            "INSERT INTO out SELECT w.g, w.window_start, count(*) AS n \
             FROM TABLE(HOP(TABLE timed, DESCRIPTOR(ts), INTERVAL '1' SECOND, \
             INTERVAL '4' SECOND)) AS w GROUP BY w.g, w.window_start, w.window_end;",
        ),
    )
    .unwrap();
    let plan = explain(&hop);
    let (upstream, downstream) = plan
        .split_once("-- sub-topology 1")
        .unwrap_or_else(|| panic!("{plan}"));
    let upstream = upstream
        .split_once("-- sub-topology 0")
        .unwrap_or_else(|| panic!("{plan}"))
        .1;
    assert!(!upstream.contains("Unnest"), "{plan}");
    assert!(downstream.contains("Unnest"), "{plan}");
    assert!(
        plan.contains("avro: c0 Int64, ts Timestamp(ms), k0 Int64"),
        "{plan}"
    );

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
    divided_interval_join(false).await;
}

/// The same join of two topics co-partitioned by their record key (equal
/// keys in equal partition numbers), joined on `_key`: no repartition
/// step, task *i* joins partition *i* of both (Kafka Streams'
/// co-partitioning); every pair once, as verify agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_join_of_co_partitioned_topics_on_the_key_needs_no_repartition_step() {
    divided_interval_join(true).await;
}

/// An interval join of bids and asks divided per partition: the topics
/// `keyed` by auction (co-partitioned, joined on `_key`) or spread round
/// robin (joined on the auction column, through repartition steps).
async fn divided_interval_join(keyed: bool) {
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
    // Bids and asks spread over the partitions round robin, or keyed by
    // auction and in the auction's partition; each partition in
    // event-time order.
    let bid = |i: i64| (i % 7, (i * 37) % 101, 10_000 + i * 100);
    let ask = |i: i64| (i % 7, i, 10_000 + i * 300);
    let records = |rows: Vec<(i64, i64, i64)>, field: &str| -> Vec<(i32, Option<String>, String)> {
        rows.iter()
            .enumerate()
            .map(|(i, (auction, v, ms))| {
                let value = format!(
                    "{{\"auction\":{auction},\"{field}\":{v},\"ts\":\"{}\"}}",
                    timestamp(*ms)
                );
                match keyed {
                    true => ((auction % 3) as i32, Some(auction.to_string()), value),
                    false => ((i % 3) as i32, None, value),
                }
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
               ON {on} AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' SECOND;\n",
            cp = dir.path().join("cp").display(),
            on = match keyed {
                true => "b._key = a._key",
                false => "b.auction = a.auction",
            },
        ),
    )
    .unwrap();
    let plan = explain(&sql);
    match keyed {
        true => assert!(
            plan.contains("tasks: one per partition") && !plan.contains("repartition step"),
            "{plan}"
        ),
        false => assert!(
            plan.contains("the join is not on the record key, so each task runs 3 sub-topologies"),
            "{plan}"
        ),
    }

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    let got = wait_for_rows(
        &bootstrap,
        &output,
        want.len(),
        &mut run,
        Duration::from_secs(120),
        |v| {
            let n = |f: &str| v[f].as_i64().unwrap();
            (n("auction"), n("price"), n("ask"))
        },
    )
    .await;
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

/// NaN and the infinities cross a repartition step as themselves (a JSON
/// channel, which has no such numbers, once carried them as null, so
/// `count`, NaN and infinity counts differed from `'tasks' = '1'`).
/// Per group, the counts, the largest finite value, the sum and the mean
/// of ids equal a plain loop's: each epoch's partials (counts, sums, a
/// float maximum, NULL where an epoch has no value, an average's sum and
/// count) merge into the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_and_infinity_cross_a_repartition_step_as_themselves() {
    let bootstrap = broker().await;
    let (input, output) = (fresh_topic("floats-in"), fresh_topic("floats-out"));
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let rows_out = fresh_topic("floats-rows-out");
    create_topic(&bootstrap, &rows_out, 1).await.unwrap();
    let ids = 0..200i64;
    let records: Vec<(String, Option<String>)> = ids
        .clone()
        .map(|id| (id.to_string(), Some(format!(r#"{{"id": {id}}}"#))))
        .collect();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &records))
        .await
        .unwrap();
    // Per group: (values, NaNs, infinities), none of them null; the
    // largest finite value (a float partial crossing, NULL in epochs
    // where the group has none) and the sum of ids.
    let mut want: BTreeMap<i64, (i64, i64, i64, String, i64, String)> = BTreeMap::new();
    for id in ids.clone() {
        let counts = want.entry(id % 3).or_default();
        counts.0 += 1;
        counts.1 += i64::from(id % 4 == 0);
        counts.2 += i64::from(id % 4 == 1);
        if id % 4 == 3 {
            // SQL's `id * 0.1` is decimal arithmetic, then a DOUBLE: the
            // double nearest id / 10.
            let top = counts
                .3
                .parse::<f64>()
                .unwrap_or(f64::MIN)
                .max(id as f64 / 10.0);
            counts.3 = top.to_string();
        }
        counts.4 += id;
    }
    for (g, counts) in want.iter_mut() {
        let of_g = ids.clone().filter(|id| id % 3 == *g).count();
        counts.5 = (counts.4 as f64 / of_g as f64).to_string();
    }
    // A DISTINCT count does not merge from partials: that query's rows
    // cross one by one. Per group: the distinct `id % 7`, the mean id.
    let mut rows_want: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    for g in 0..3 {
        let of_g: Vec<i64> = ids.clone().filter(|id| id % 3 == g).collect();
        let kinds: BTreeSet<i64> = of_g.iter().map(|id| id % 7).collect();
        let mean = of_g.iter().sum::<i64>() as f64 / of_g.len() as f64;
        rows_want.insert(g, (kinds.len() as i64, mean.to_string()));
    }
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("floats.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'pipeline.name' = '{output}';\n\
             SET 'tasks' = 'per-partition';\n\
             SET 'trigger.interval' = '200 ms';\n\
             CREATE STREAM events (id BIGINT, \
               r AS CASE WHEN id % 4 = 0 THEN CAST('NaN' AS DOUBLE) \
                 WHEN id % 4 = 1 THEN CAST('inf' AS DOUBLE) \
                 WHEN id % 4 = 2 THEN CAST('-inf' AS DOUBLE) ELSE id * 0.1 END) \
               WITH (connector = 'kafka', topic = '{input}', \
               'bootstrap.servers' = '{bootstrap}', format = 'json');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT g, count(r) AS present, \
               sum(CASE WHEN isnan(r) THEN 1 ELSE 0 END) AS nans, \
               sum(CASE WHEN r = CAST('inf' AS DOUBLE) THEN 1 ELSE 0 END) AS infs, \
               max(CASE WHEN id % 4 = 3 THEN r END) AS top, sum(id) AS ids, avg(id) AS mean \
             FROM (SELECT id % 3 AS g, r, id FROM events) GROUP BY g;\n\
             CREATE STREAM rows_out WITH (connector = 'kafka', topic = '{rows_out}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             SET 'checkpoint.location' = '{cp}-rows';\n\
             SET 'pipeline.name' = '{rows_out}';\n\
             INSERT INTO rows_out SELECT g, count(DISTINCT id % 7) AS kinds, avg(id) AS mean \
             FROM (SELECT id % 3 AS g, id FROM events) GROUP BY g;\n",
            cp = dir.path().join("cp").display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut got = BTreeMap::new();
    while got != want {
        assert!(run.running(), "{}", run.stderr());
        assert!(
            std::time::Instant::now() < deadline,
            "{got:?} != {want:?}: {}",
            run.stderr()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        got = crate::changelog::compacted(&bootstrap, &output)
            .await
            .into_values()
            .map(|v| {
                let n = |name: &str| v[name].as_i64().unwrap();
                let f = |name: &str| v[name].as_f64().unwrap().to_string();
                (
                    n("g"),
                    (
                        n("present"),
                        n("nans"),
                        n("infs"),
                        f("top"),
                        n("ids"),
                        f("mean"),
                    ),
                )
            })
            .collect();
    }
    let mut rows_got = BTreeMap::new();
    while rows_got != rows_want {
        assert!(run.running(), "{}", run.stderr());
        assert!(
            std::time::Instant::now() < deadline,
            "{rows_got:?} != {rows_want:?}: {}",
            run.stderr()
        );
        rows_got = crate::changelog::compacted(&bootstrap, &rows_out)
            .await
            .into_values()
            .map(|v| {
                let mean = v["mean"].as_f64().unwrap().to_string();
                (
                    v["g"].as_i64().unwrap(),
                    (v["kinds"].as_i64().unwrap(), mean),
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );
}

/// A stream joined with a static table divides as a stateless query: no
/// repartition step, every task joining its partition with the whole
/// table, so every row finds its match whichever partition it is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_joined_with_a_static_table_divides_with_the_table_in_every_task() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = broker().await;
    let (input, output) = (fresh_topic("static-in"), fresh_topic("static-out"));
    create_topic(&bootstrap, &input, 3).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let records: Vec<(i32, Option<String>, String)> = (0..300i64)
        .map(|id| ((id % 3) as i32, None, format!("{{\"id\":{id}}}")))
        .collect();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_to(&b, &t, &records))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let names = dir.path().join("names.csv");
    let table: String = (0..10).map(|id| format!("{id},n{id}\n")).collect();
    std::fs::write(&names, format!("id,name\n{table}")).unwrap();
    let sql = dir.path().join("static.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'tasks' = 'per-partition';\n\
             SET 'trigger' = '200 ms';\n\
             CREATE TABLE names (id BIGINT, name VARCHAR) WITH (path = '{names}', \
               format = 'csv');\n\
             CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = '{input}', \
               'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '40');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT i.id, n.name FROM input i JOIN names n \
               ON i.id % 10 = n.id;\n",
            cp = dir.path().join("cp").display(),
            names = names.display(),
        ),
    )
    .unwrap();
    let plan = explain(&sql);
    assert!(
        plan.contains("tasks: one per partition") && !plan.contains("repartition step"),
        "{plan}"
    );

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    let want: Vec<(i64, String)> = (0..300).map(|id| (id, format!("n{}", id % 10))).collect();
    let got = wait_for_rows(
        &bootstrap,
        &output,
        want.len(),
        &mut run,
        Duration::from_secs(120),
        |v| {
            (
                v["id"].as_i64().unwrap(),
                v["name"].as_str().unwrap().to_string(),
            )
        },
    )
    .await;
    assert_eq!(got, want, "joined rows vs the plain loop's");
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );
}
