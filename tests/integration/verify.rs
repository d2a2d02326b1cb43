//! `sluice verify`: each query shape passes on a correct run, input
//! produced after the commit is ignored, and records appended to an output
//! topic by someone else are pointed at.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use sluice::broker::{create_topic, fresh_topic, read_topic};

fn sluice(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

/// Produces `(partition, key, value)` records, not in a transaction (as
/// any producer may).
pub(crate) fn produce(bootstrap: &str, topic: &str, records: &[(i32, Option<String>, String)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (partition, key, value) in records {
        let mut r = BaseRecord::to(topic).payload(value).partition(*partition);
        if let Some(k) = key {
            r = r.key(k);
        }
        producer.send(r).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// `ms` after 2026-01-01T00:00:00Z, as JSON timestamps are written.
pub(crate) fn timestamp(ms: i64) -> String {
    format!(
        "2026-01-01T00:{:02}:{:02}.{:03}Z",
        ms / 60_000,
        ms / 1_000 % 60,
        ms % 1_000
    )
}

/// Bids `ids`: auction `i % 7`, price `(i * 37) % 101`, 100 ms apart in
/// event time, alternating between two partitions.
fn bids(ids: std::ops::Range<i64>) -> Vec<(i32, Option<String>, String)> {
    ids.map(|i| {
        (
            (i % 2) as i32,
            None,
            format!(
                "{{\"auction\": {}, \"price\": {}, \"ts\": \"{}\"}}",
                i % 7,
                (i * 37) % 101,
                timestamp(10_000 + i * 100)
            ),
        )
    })
    .collect()
}

/// Asks `ids`: auction `i % 7`, 300 ms apart, one partition.
fn asks(ids: std::ops::Range<i64>) -> Vec<(i32, Option<String>, String)> {
    ids.map(|i| {
        (
            0,
            None,
            format!(
                "{{\"auction\": {}, \"ask\": {i}, \"ts\": \"{}\"}}",
                i % 7,
                timestamp(10_000 + i * 300)
            ),
        )
    })
    .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_each_query_shape_and_points_at_tampered_output() {
    let bootstrap = crate::util::broker().await;
    let (bid_topic, ask_topic) = (fresh_topic("bids"), fresh_topic("asks"));
    create_topic(&bootstrap, &bid_topic, 2).await.unwrap();
    create_topic(&bootstrap, &ask_topic, 1).await.unwrap();
    let outs: Vec<String> = [
        "filtered",
        "per_auction",
        "windows",
        "matches",
        "set_high",
        "set_counts",
    ]
    .iter()
    .map(|n| fresh_topic(n))
    .collect();
    for t in &outs {
        create_topic(&bootstrap, t, 2).await.unwrap();
    }
    {
        let (b, bt, at) = (bootstrap.clone(), bid_topic.clone(), ask_topic.clone());
        tokio::task::spawn_blocking(move || {
            produce(&b, &bt, &bids(0..300));
            produce(&b, &at, &asks(0..100));
        })
        .await
        .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let sink = |name: &str, topic: &str| {
        format!(
            "CREATE STREAM {name} WITH (connector = 'kafka', topic = '{topic}', \
             'bootstrap.servers' = '{bootstrap}');\n"
        )
    };
    let checkpoint = |name: &str| {
        format!(
            "SET 'checkpoint.location' = '{}';\n",
            dir.path().join(name).display()
        )
    };
    let sql = format!(
        "SET 'trigger' = 'available-now';\n\
         CREATE STREAM bids (auction BIGINT, price BIGINT, ts TIMESTAMP, \
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (connector = 'kafka', \
           topic = '{bid_topic}', 'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '40');\n\
         CREATE STREAM asks (auction BIGINT, ask BIGINT, ts TIMESTAMP, \
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (connector = 'kafka', \
           topic = '{ask_topic}', 'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '15');\n\
         {s0}{s1}{s2}{s3}{s4}{s5}\
         {c0}INSERT INTO filtered SELECT auction, price * 2 AS doubled FROM bids WHERE price % 3 <> 0;\n\
         {c1}INSERT INTO per_auction SELECT auction, count(*) AS n, sum(price) AS total, \
           avg(price) AS mean FROM bids GROUP BY auction;\n\
         {c2}INSERT INTO windows SELECT window_start, window_end, count(*) AS n, max(price) AS top \
           FROM TABLE(CUMULATE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '3' SECOND)) \
           GROUP BY window_start, window_end;\n\
         {c3}INSERT INTO matches SELECT b.auction, b.price, a.ask FROM bids b JOIN asks a \
           ON b.auction = a.auction AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' SECOND;\n\
         {c4}EXECUTE STATEMENT SET BEGIN\n\
           INSERT INTO set_high SELECT auction, price FROM bids WHERE price > 50;\n\
           INSERT INTO set_counts SELECT auction, count(*) AS n FROM bids GROUP BY auction;\n\
         END;\n",
        s0 = sink("filtered", &outs[0]),
        s1 = sink("per_auction", &outs[1]),
        s2 = sink("windows", &outs[2]),
        s3 = sink("matches", &outs[3]),
        s4 = sink("set_high", &outs[4]),
        s5 = sink("set_counts", &outs[5]),
        c0 = checkpoint("filtered"),
        c1 = checkpoint("per_auction"),
        c2 = checkpoint("windows"),
        c3 = checkpoint("matches"),
        c4 = checkpoint("set"),
    );
    let file = dir.path().join("queries.sql");
    std::fs::write(&file, sql).unwrap();

    let run = sluice(&["run"], &file);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let verified = sluice(&["verify"], &file);
    let report = stdout(&verified);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{report}\n{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    // Four queries, and the statement set checked statement by statement.
    assert_eq!(report.matches("\nOK: ").count(), 6, "{report}");
    let high = (0..300).filter(|i| (i * 37) % 101 > 50).count();
    assert!(
        report.contains(&format!("equals the batch answer ({high} rows)")),
        "{report}"
    );
    // The comparisons are not of empty sets: the filter keeps the bids
    // whose price is not a multiple of 3, all 7 auctions are keys.
    let kept = (0..300).filter(|i| (i * 37) % 101 % 3 != 0).count();
    assert!(
        report.contains(&format!("equals the batch answer ({kept} rows)")),
        "{report}"
    );
    assert!(
        report.contains("equals the batch answer (7 rows)"),
        "{report}"
    );
    assert!(report.contains("compared by key"), "{report}");

    // Input produced after the last commit is not part of what the queries
    // committed: verify reads the inputs only up to the committed offsets.
    {
        let (b, bt) = (bootstrap.clone(), bid_topic.clone());
        tokio::task::spawn_blocking(move || produce(&b, &bt, &bids(300..400)))
            .await
            .unwrap();
    }
    let again = sluice(&["verify"], &file);
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
    assert_eq!(stdout(&again).matches("\nOK: ").count(), 6);

    // Someone appends to two output topics: a row to the filter's, and a
    // new value for auction 3 to the update stream.
    {
        let b = bootstrap.clone();
        let (t0, t1) = (outs[0].clone(), outs[1].clone());
        tokio::task::spawn_blocking(move || {
            produce(
                &b,
                &t0,
                &[(1, None, r#"{"auction":1,"doubled":4242}"#.into())],
            );
            produce(
                &b,
                &t1,
                &[(
                    0,
                    Some(r#"{"auction":3}"#.into()),
                    r#"{"auction":3,"n":1,"total":1,"mean":1.0}"#.into(),
                )],
            );
        })
        .await
        .unwrap();
    }
    let last_of = |topic: String, partition: i32| {
        let b = bootstrap.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                read_topic(&b, &topic, true, Duration::from_secs(30))
                    .unwrap()
                    .into_iter()
                    .rfind(|r| r.partition == partition)
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let (appended, overwritten) = (
        last_of(outs[0].clone(), 1).await,
        last_of(outs[1].clone(), 0).await,
    );
    let tampered = sluice(&["verify"], &file);
    let report = stdout(&tampered);
    assert_eq!(tampered.status.code(), Some(1), "{report}");
    assert!(
        String::from_utf8_lossy(&tampered.stderr).contains("filtered, per_auction"),
        "{}",
        String::from_utf8_lossy(&tampered.stderr)
    );
    // Without epoch headers (the default) verify cannot tell whose a
    // record is; it counts, as a consumer would see it.
    assert!(
        report.contains(&format!(
            "output record at partition {}, offset {}: ",
            appended.partition, appended.offset
        )),
        "{report}"
    );
    assert!(
        report.contains(r#"{"doubled":4242"#) || report.contains("4242"),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "key {{\"auction\":3}}: the output has {{\"auction\":3,\"n\":1,\"total\":1,\"mean\":1.0}} at partition {}, offset {}",
            overwritten.partition, overwritten.offset
        )),
        "{report}"
    );
    // The other queries still check out.
    assert_eq!(report.matches("\nOK: ").count(), 4, "{report}");

    // A query verify cannot check is named, with why; exit 2.
    let console = dir.path().join("console.sql");
    std::fs::write(
        &console,
        format!(
            "CREATE STREAM bids (auction BIGINT, price BIGINT, ts TIMESTAMP) WITH (connector = \
             'kafka', topic = '{bid_topic}', 'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM shown WITH (connector = 'console');\n\
             INSERT INTO shown SELECT auction FROM bids;\n"
        ),
    )
    .unwrap();
    let unchecked = sluice(&["verify"], &console);
    assert_eq!(unchecked.status.code(), Some(2));
    assert!(
        stdout(&unchecked).contains("NOT CHECKED: query 'shown' writes to console"),
        "{}",
        stdout(&unchecked)
    );

    // With epoch headers each record names its query and epoch: verify
    // sorts by those, and names a record another producer appended.
    let bare_topic = fresh_topic("headed");
    create_topic(&bootstrap, &bare_topic, 2).await.unwrap();
    let bare = dir.path().join("bare.sql");
    std::fs::write(
        &bare,
        format!(
            "SET 'trigger' = 'available-now';
             SET 'checkpoint.location' = '{}';
             CREATE STREAM bids (auction BIGINT, price BIGINT, ts TIMESTAMP) WITH (connector = \
             'kafka', topic = '{bid_topic}', 'bootstrap.servers' = '{bootstrap}', \
             'max-records-per-epoch' = '150');
             CREATE STREAM bare WITH (connector = 'kafka', topic = '{bare_topic}', \
             'bootstrap.servers' = '{bootstrap}', 'sink.epoch-headers' = 'true');
             INSERT INTO bare SELECT auction, price FROM bids WHERE price > 50;
",
            dir.path().join("bare").display()
        ),
    )
    .unwrap();
    let run = sluice(&["run"], &bare);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let records = {
        let (b, t) = (bootstrap.clone(), bare_topic.clone());
        tokio::task::spawn_blocking(move || read_topic(&b, &t, true, Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap()
    };
    let mut got: Vec<(i64, i64)> = records
        .iter()
        .map(|r| {
            let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["sluice.query.id", "sluice.epoch"]);
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (v["auction"].as_i64().unwrap(), v["price"].as_i64().unwrap())
        })
        .collect();
    got.sort_unstable();
    let mut want: Vec<(i64, i64)> = (0..400)
        .map(|i| (i % 7, (i * 37) % 101))
        .filter(|(_, price)| *price > 50)
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
    let checked = sluice(&["verify"], &bare);
    assert_eq!(checked.status.code(), Some(0), "{}", stdout(&checked));
    assert!(
        stdout(&checked).contains(&format!(
            "OK: the committed output equals the batch answer ({} rows)",
            want.len()
        )),
        "{}",
        stdout(&checked)
    );
    {
        let (b, t) = (bootstrap.clone(), bare_topic.clone());
        tokio::task::spawn_blocking(move || {
            produce(&b, &t, &[(0, None, r#"{"auction":1,"price":99}"#.into())])
        })
        .await
        .unwrap();
    }
    let appended = last_of(bare_topic.clone(), 0).await;
    let tampered = sluice(&["verify"], &bare);
    let report = stdout(&tampered);
    assert_eq!(tampered.status.code(), Some(1), "{report}");
    assert!(
        report.contains(&format!(
            "output record at partition 0, offset {}, not written by this query (no \
             sluice.query.id header of it)",
            appended.offset
        )),
        "{report}"
    );
}

/// A query divided into tasks, through a repartition step: verify puts
/// every task's committed ranges together, refuses while rows are still
/// crossing the repartition topic, and passes once they have crossed; for
/// an update-mode GROUP BY and for windows closed by the watermark that
/// crossed the step. A record forged into the output, as if one task had
/// written a wrong count, is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_a_divided_query_through_a_repartition_step() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let bootstrap = crate::util::broker().await;
    let bid_topic = fresh_topic("divided-bids");
    create_topic(&bootstrap, &bid_topic, 3).await.unwrap();
    let (counts, windows) = (
        fresh_topic("divided-counts"),
        fresh_topic("divided-windows"),
    );
    for t in [&counts, &windows] {
        create_topic(&bootstrap, t, 2).await.unwrap();
    }
    // Bids over three partitions, each in event-time order.
    let records: Vec<(i32, Option<String>, String)> = bids(0..600)
        .into_iter()
        .enumerate()
        .map(|(i, (_, key, value))| ((i % 3) as i32, key, value))
        .collect();
    {
        let (b, t) = (bootstrap.clone(), bid_topic.clone());
        tokio::task::spawn_blocking(move || produce(&b, &t, &records))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("divided.sql");
    let streams = format!(
        "SET 'tasks' = 'per-partition';\n\
         SET 'trigger' = '200 ms';\n\
         CREATE STREAM bids (auction BIGINT, price BIGINT, ts TIMESTAMP, \
           WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
           topic = '{bid_topic}', 'bootstrap.servers' = '{bootstrap}', \
           'max-records-per-epoch' = '50');\n\
         CREATE STREAM counts WITH (connector = 'kafka', topic = '{counts}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         SET 'pipeline.name' = '{counts}';\n\
         SET 'checkpoint.location' = '{cp}/counts';\n\
         INSERT INTO counts SELECT price % 7 AS g, count(*) AS n, sum(auction) AS total \
           FROM bids GROUP BY price % 7;\n",
        cp = dir.path().display()
    );
    // The count alone, one task at a time, so that no other transaction
    // is open when the process dies.
    let alone = dir.path().join("alone.sql");
    std::fs::write(&alone, format!("SET 'tasks.threads' = '1';\n{streams}")).unwrap();
    std::fs::write(
        &file,
        format!(
            "{streams}\
             CREATE STREAM windows WITH (connector = 'kafka', topic = '{windows}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             SET 'pipeline.name' = '{windows}';\n\
             SET 'checkpoint.location' = '{cp}/windows';\n\
             INSERT INTO windows SELECT price % 5 AS g, window_start, count(*) AS n \
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND)) \
               GROUP BY price % 5, window_start, window_end;\n",
            cp = dir.path().display()
        ),
    )
    .unwrap();
    let command = |file: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(file).stdout(std::process::Stdio::null());
        cmd
    };
    // The process dies right after a task's first commit: what its
    // upstream wrote to the repartition topic is committed and unread.
    let mut crashed = command(&alone);
    crashed.env("SLUICE_FAILPOINT", "kafka-after-commit@1");
    let mut crashed = crate::util::Run::new(crashed);
    assert!(!crashed.wait(Duration::from_secs(60)).success());
    let refused = sluice(&["verify"], &alone);
    let report = format!(
        "{}{}",
        stdout(&refused),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(refused.status.code(), Some(2), "{report}");
    assert!(
        report.contains("rows in flight through its repartition topic"),
        "{report}"
    );
    assert!(!report.contains("DIFFERENT"), "{report}");

    let mut run = crate::util::Run::new(command(&file));

    // While it runs, verify either refuses (rows in flight, or a commit
    // while it read) or passes, never finding a difference; once the query
    // has caught up, it passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let report = loop {
        assert!(run.running(), "{}", run.stderr());
        let verified = sluice(&["verify"], &file);
        let report = stdout(&verified);
        let stderr = String::from_utf8_lossy(&verified.stderr).into_owned();
        if verified.status.code() == Some(0) && report.matches("\nOK: the committed").count() == 2 {
            break report;
        }
        // Before the query starts there is no checkpoint to read yet.
        assert!(!report.contains("DIFFERENT"), "{report}{stderr}");
        assert!(
            std::time::Instant::now() < deadline,
            "verify did not pass within 120 s: {report}{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(report.contains("divided into 3 tasks"), "{report}");
    assert!(
        report.contains("input 0:bids: 600 rows"),
        "every task's range, put together: {report}"
    );
    assert!(
        report.contains("equals the batch answer (7 rows)"),
        "{report}"
    );
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );

    // One task's output, forged: a wrong count for one group.
    {
        let (b, t) = (bootstrap.clone(), counts.clone());
        tokio::task::spawn_blocking(move || {
            produce(
                &b,
                &t,
                &[(
                    0,
                    Some(r#"{"g":3}"#.into()),
                    r#"{"g":3,"n":1,"total":1}"#.into(),
                )],
            )
        })
        .await
        .unwrap();
    }
    let tampered = sluice(&["verify"], &file);
    let report = stdout(&tampered);
    assert_eq!(tampered.status.code(), Some(1), "{report}");
    assert!(
        report.contains(r#"key {"g":3}: the output has {"g":3,"n":1,"total":1}"#),
        "{report}"
    );
    assert_eq!(report.matches("\nOK: the committed").count(), 1, "{report}");
}
