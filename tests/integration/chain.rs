//! Stacked stateful operators divided into tasks as a chain of
//! statements joined by channels, against the real broker: the Nexmark q5
//! and q7 shapes, checked against plain loops over the input.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice::broker::{create_topic, fresh_topic, read_topic};

use crate::util::{broker, explain, wait_for_rows, Run};
use crate::verify::{produce, timestamp};

const PARTITIONS: i64 = 3;
const DELAY_MS: i64 = 1_000;

/// A bid of the test input: auction, price and event time (ms after
/// 2026-01-01T00:00:00Z, under a minute).
type Bid = (i64, i64, i64);

/// Bid `i`: 5 auctions, prices that repeat, 40 ms apart in event time,
/// spread round robin over the partitions (each in event-time order).
fn bid(i: i64) -> Bid {
    (i % 5, (i * 37) % 101, 10_000 + i * 40)
}

/// `2026-01-01T00:MM:SS[.fff][Z]` as ms after 2026-01-01T00:00:00Z.
fn ms(text: &str) -> i64 {
    let time = text.split_once('T').unwrap().1.trim_end_matches('Z');
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    ((parts[1] * 60.0 + parts[2]) * 1_000.0).round() as i64
}

/// The watermark once every bid is read: the least over the partitions
/// of their latest event time, less the delay.
fn final_watermark(bids: &[Bid]) -> i64 {
    let mut latest = BTreeMap::new();
    for (i, b) in bids.iter().enumerate() {
        let at = latest.entry(i as i64 % PARTITIONS).or_insert(i64::MIN);
        *at = (*at).max(b.2);
    }
    latest.values().min().unwrap() - DELAY_MS
}

/// Nexmark q5 over 2 s windows sliding by 1 s, by plain loops: per closed
/// window, the auctions with the most bids, as (auction, count, window end).
fn hot_items(bids: &[Bid], watermark: i64) -> Vec<(i64, i64, i64)> {
    let mut counts: BTreeMap<i64, BTreeMap<i64, i64>> = BTreeMap::new();
    for &(auction, _, ts) in bids {
        let last = ts / 1_000 * 1_000;
        for start in [last - 1_000, last] {
            let end = start + 2_000;
            if end <= watermark {
                *counts.entry(end).or_default().entry(auction).or_default() += 1;
            }
        }
    }
    let mut out = Vec::new();
    for (end, per_auction) in counts {
        let most = *per_auction.values().max().unwrap();
        for (auction, n) in per_auction {
            if n == most {
                out.push((auction, n, end));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Nexmark q7 over 1 s windows, by plain loops: the bids whose price is
/// the highest of a closed window ending at most 1 s after them, as
/// (auction, price, event time).
fn highest_bids(bids: &[Bid], watermark: i64) -> Vec<(i64, i64, i64)> {
    let mut highest: BTreeMap<i64, i64> = BTreeMap::new();
    for &(_, price, ts) in bids {
        let end = ts / 1_000 * 1_000 + 1_000;
        if end <= watermark {
            let max = highest.entry(end).or_insert(price);
            *max = (*max).max(price);
        }
    }
    let mut out = Vec::new();
    for (&end, &max) in &highest {
        for &(auction, price, ts) in bids {
            if price == max && end - 1_000 <= ts && ts <= end {
                out.push((auction, price, ts));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Produces `bids` to `topic`, round robin over its partitions, bidder
/// the bid's position.
async fn produce_bids(bootstrap: &str, topic: &str, bids: &[Bid]) {
    let records: Vec<(i32, Option<String>, String)> = bids
        .iter()
        .enumerate()
        .map(|(i, (auction, price, ts))| {
            let value = format!(
                "{{\"auction\":{auction},\"bidder\":{i},\"price\":{price},\"date_time\":\"{}\"}}",
                timestamp(*ts)
            );
            ((i as i64 % PARTITIONS) as i32, None, value)
        })
        .collect();
    let (b, t) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || produce(&b, &t, &records))
        .await
        .unwrap();
}

/// The bid stream over `input`, divided per partition, with `settings`.
fn bid_stream(bootstrap: &str, input: &str, settings: &str) -> String {
    format!(
        "SET 'tasks' = 'per-partition';\n\
         {settings}\
         CREATE STREAM bid (auction BIGINT, bidder BIGINT, price BIGINT, \
           date_time TIMESTAMP(3), WATERMARK FOR date_time AS date_time - INTERVAL '1' \
           SECOND) WITH (connector = 'kafka', topic = '{input}', \
           'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '60');\n"
    )
}

/// Nexmark q7 over 1 s windows into `sink`, as a statement.
const Q7: &str = "SELECT b.auction, b.price, b.date_time \
     FROM bid b \
     JOIN (SELECT window_start, window_end, max(price) AS maxprice \
           FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '1' SECOND)) \
           GROUP BY window_start, window_end) m \
       ON b.price = m.maxprice \
       AND b.date_time BETWEEN m.window_end - INTERVAL '1' SECOND AND m.window_end";

/// Three fields of an output row: `fields` names them, a timestamp given
/// by a name starting with `@` (as ms).
fn row(v: &serde_json::Value, fields: [&str; 3]) -> (i64, i64, i64) {
    let field = |f: &str| match f.strip_prefix('@') {
        Some(name) => ms(v[name].as_str().unwrap()),
        None => v[f].as_i64().unwrap(),
    };
    (field(fields[0]), field(fields[1]), field(fields[2]))
}

/// Nexmark q5 (a windowed count under a windowed maximum, both under a
/// join) and q7 (a windowed maximum under an interval join), each over
/// bids spread over three partitions by nothing they group or join by,
/// divided per partition: each runs as a chain of statements joined by
/// channels, every statement through repartition steps of its own.
/// EXPLAIN says so, and once every bid is read, the outputs are the plain
/// loops' answers over the windows the last watermark closed: every row
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_windowed_operators_divide_as_a_chain_of_statements() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = broker().await;
    let (input, q5, q7) = (
        fresh_topic("chain-bids"),
        fresh_topic("chain-q5"),
        fresh_topic("chain-q7"),
    );
    create_topic(&bootstrap, &input, PARTITIONS as i32)
        .await
        .unwrap();
    for t in [&q5, &q7] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let bids: Vec<Bid> = (0..900).map(bid).collect();
    produce_bids(&bootstrap, &input, &bids).await;
    let watermark = final_watermark(&bids);
    let want_q5 = hot_items(&bids, watermark);
    let want_q7 = highest_bids(&bids, watermark);
    assert!(
        want_q5.len() > 20 && want_q7.len() > 20,
        "{want_q5:?} {want_q7:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("chain.sql");
    let cp = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        &sql,
        format!(
            "{streams}\
             CREATE STREAM q5 WITH (connector = 'kafka', topic = '{q5}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM q7 WITH (connector = 'kafka', topic = '{q7}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             SET 'pipeline.name' = '{q5}';\n\
             SET 'checkpoint.location' = '{q5_cp}';\n\
             INSERT INTO q5 SELECT c.auction, c.num, m.window_end \
             FROM (SELECT auction, count(*) AS num, window_start, window_end \
                   FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '1' SECOND, \
                     INTERVAL '2' SECOND)) \
                   GROUP BY auction, window_start, window_end) c \
             JOIN (SELECT max(num) AS maxn, window_start, window_end \
                   FROM (SELECT count(*) AS num, window_start, window_end \
                         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '1' SECOND, \
                           INTERVAL '2' SECOND)) \
                         GROUP BY auction, window_start, window_end) \
                   GROUP BY window_start, window_end) m \
               ON c.window_start = m.window_start AND c.window_end = m.window_end \
               AND c.num >= m.maxn;\n\
             SET 'pipeline.name' = '{q7}';\n\
             SET 'checkpoint.location' = '{q7_cp}';\n\
             INSERT INTO q7 {Q7};\n",
            streams = bid_stream(&bootstrap, &input, "SET 'trigger' = '200 ms';\n"),
            q5_cp = cp("q5"),
            q7_cp = cp("q7"),
        ),
    )
    .unwrap();
    let plan = explain(&sql);
    assert_eq!(
        plan.matches("chain: the statement stacks stateful operators")
            .count(),
        2,
        "{plan}"
    );
    // q5's three links and q7's one, then their own statements.
    assert!(
        plan.contains("-- chain statement 3: the statement's outermost operator"),
        "{plan}"
    );
    assert!(
        plan.contains("-- chain statement 1: the statement's outermost operator"),
        "{plan}"
    );
    // Each link is keyed by what the operator above groups or joins it
    // by: q5's maximum and join, and q7's join's side, read them without
    // a repartition step of their own.
    assert_eq!(
        plan.matches("already keyed by its key: no repartition step")
            .count(),
        2,
        "{plan}"
    );
    assert!(plan.contains("(keyed by the join's key already)"), "{plan}");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    for (topic, want, fields) in [
        (&q5, &want_q5, ["auction", "num", "@window_end"]),
        (&q7, &want_q7, ["auction", "price", "@date_time"]),
    ] {
        let got = wait_for_rows(
            &bootstrap,
            topic,
            want.len(),
            &mut run,
            Duration::from_secs(180),
            |v| row(v, fields),
        )
        .await;
        assert_eq!(&got, want, "{topic}: emitted vs the plain loops'");
    }
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );
}

/// With `available-now`, a query divided through repartition steps and a
/// chain ends by itself once every task has drained what was there at its
/// start, what the others sent it included: Nexmark q7 (a chain) and a
/// count per auction (partials through a step), every bid read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn available_now_through_repartition_steps_ends_once_every_task_has_drained() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = broker().await;
    let (input, q7, counts) = (
        fresh_topic("now-bids"),
        fresh_topic("now-q7"),
        fresh_topic("now-counts"),
    );
    create_topic(&bootstrap, &input, PARTITIONS as i32)
        .await
        .unwrap();
    for t in [&q7, &counts] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let bids: Vec<Bid> = (0..600).map(bid).collect();
    produce_bids(&bootstrap, &input, &bids).await;
    let want_q7 = highest_bids(&bids, final_watermark(&bids));
    assert!(want_q7.len() > 10, "{want_q7:?}");
    let mut want_counts: BTreeMap<i64, i64> = BTreeMap::new();
    for (auction, _, _) in &bids {
        *want_counts.entry(*auction).or_default() += 1;
    }

    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("now.sql");
    let cp = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        &sql,
        format!(
            "{streams}\
             CREATE STREAM q7 WITH (connector = 'kafka', topic = '{q7}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM counts WITH (connector = 'kafka', topic = '{counts}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             SET 'pipeline.name' = '{q7}';\n\
             SET 'checkpoint.location' = '{q7_cp}';\n\
             INSERT INTO q7 {Q7};\n\
             SET 'pipeline.name' = '{counts}';\n\
             SET 'checkpoint.location' = '{counts_cp}';\n\
             INSERT INTO counts SELECT auction, count(*) AS n FROM bid GROUP BY auction;\n",
            streams = bid_stream(&bootstrap, &input, "SET 'trigger' = 'available-now';\n"),
            q7_cp = cp("q7"),
            counts_cp = cp("counts"),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run").arg(&sql).stdout(Stdio::null());
    let mut run = Run::new(cmd);
    let status = run.wait(Duration::from_secs(180));
    assert!(status.success(), "{}", run.stderr());

    // The run has ended: what it committed is all there is.
    let got_q7 = wait_for_rows(
        &bootstrap,
        &q7,
        want_q7.len(),
        &mut run,
        Duration::from_secs(30),
        |v| row(v, ["auction", "price", "@date_time"]),
    )
    .await;
    assert_eq!(got_q7, want_q7, "q7: emitted vs the plain loops'");
    // Update mode: each auction's last count is its number of bids.
    let (b, t) = (bootstrap.clone(), counts.clone());
    let records = tokio::task::spawn_blocking(move || {
        read_topic(&b, &t, true, Duration::from_secs(30)).unwrap()
    })
    .await
    .unwrap();
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        last.insert(v["auction"].as_i64().unwrap(), v["n"].as_i64().unwrap());
    }
    assert_eq!(last, want_counts, "counts: last per auction vs the loop's");
}
