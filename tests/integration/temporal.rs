//! Event-time temporal joins (`JOIN r FOR SYSTEM_TIME AS OF o.ts`) against
//! a plain loop that looks each order's rate up, through kill -9.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use sluice::broker::{create_topic, fresh_topic};

use crate::util::{broker, crash_seed, kill_9_five_times_then_finish, Lcg};

const START_MS: i64 = 1_767_225_600_000;

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An order: (id, currency, amount, ts ms); a rate: (currency, rate, ts ms).
type Order = (i64, i64, i64, i64);
type Rate = (i64, i64, i64);

/// Orders every 0–20 ms and rates every 0–200 ms of event time, each topic
/// in time order, over five currencies (the first rate of each comes
/// after some of its orders, which an inner join drops).
fn data(rng: &mut Lcg) -> (Vec<Order>, Vec<Rate>) {
    let (mut orders, mut rates) = (Vec::new(), Vec::new());
    let mut ts = START_MS;
    for id in 0..20_000 {
        ts += rng.next(20) as i64;
        orders.push((id, rng.next(5) as i64, 1 + rng.next(100) as i64, ts));
    }
    let end = ts;
    let mut ts = START_MS + 500;
    while ts < end {
        ts += rng.next(200) as i64;
        rates.push((rng.next(5) as i64, 1 + rng.next(1_000) as i64, ts));
    }
    (orders, rates)
}

/// The plain loop: each order the final watermark passed, with its
/// currency's latest rate at or before its time; id → (value, rate's ts).
fn looked_up(orders: &[Order], rates: &[Rate], delay_ms: i64) -> BTreeMap<i64, (i64, i64)> {
    let last = |times: &mut dyn Iterator<Item = i64>| times.max().unwrap_or(i64::MIN);
    let watermark =
        last(&mut orders.iter().map(|o| o.3)).min(last(&mut rates.iter().map(|r| r.2))) - delay_ms;
    let mut out = BTreeMap::new();
    for &(id, currency, amount, ts) in orders.iter().filter(|o| o.3 < watermark) {
        let rate = rates
            .iter()
            .filter(|r| r.0 == currency && r.2 <= ts)
            .max_by_key(|r| r.2);
        if let Some(&(_, rate, rate_ts)) = rate {
            out.insert(id, (amount * rate, rate_ts));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_time_temporal_join_takes_each_keys_version_at_the_rows_time_through_kill_9() {
    let bootstrap = broker().await;
    let rates_topic = fresh_topic("temporal-rates");
    create_topic(&bootstrap, &rates_topic, 1).await.unwrap();
    let mut rng = Lcg(crash_seed("kill -9", || 0x7e3b));
    let (orders, rates) = data(&mut rng);
    let want = looked_up(&orders, &rates, 1_000);
    assert!(want.len() > 15_000, "{}", want.len());
    let rate_records: Vec<(String, Option<String>)> = rates
        .iter()
        .map(|(c, rate, ts)| {
            let ts = rfc3339(*ts);
            (
                format!("c{c}"),
                Some(format!(
                    r#"{{"currency": "c{c}", "rate": {rate}, "ts": "{ts}"}}"#
                )),
            )
        })
        .collect();
    let (b, t) = (bootstrap.clone(), rates_topic.clone());
    tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &rate_records))
        .await
        .unwrap();
    let rates = |bootstrap: &str, topic: &str| {
        format!(
            "CREATE STREAM rates (currency VARCHAR, rate BIGINT, ts TIMESTAMP(3), \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
               topic = '{topic}', 'bootstrap.servers' = '{bootstrap}', format = 'json', \
               'max-records-per-epoch' = '10');\n"
        )
    };
    joined_through_kill_9(
        &bootstrap,
        &orders,
        &rates(&bootstrap, &rates_topic),
        "",
        want,
        &mut rng,
    )
    .await;
}

/// Sends `orders` to a new topic, runs the conversion (orders joined with
/// the stream `rates` declares, as of their time, `filter` after it) into
/// another, killing it five times, and checks its output against `want`.
async fn joined_through_kill_9(
    bootstrap: &str,
    orders: &[Order],
    rates: &str,
    filter: &str,
    want: BTreeMap<i64, (i64, i64)>,
    rng: &mut Lcg,
) {
    let (orders_topic, output) = (fresh_topic("temporal-orders"), fresh_topic("temporal-out"));
    for t in [&orders_topic, &output] {
        create_topic(bootstrap, t, 1).await.unwrap();
    }
    let order_records: Vec<(String, Option<String>)> = orders
        .iter()
        .map(|(id, c, amount, ts)| {
            let ts = rfc3339(*ts);
            let v =
                format!(r#"{{"id": {id}, "currency": "c{c}", "amount": {amount}, "ts": "{ts}"}}"#);
            (id.to_string(), Some(v))
        })
        .collect();
    let (b, t) = (bootstrap.to_string(), orders_topic.clone());
    tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &order_records))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("temporal.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '50 ms';\n\
             CREATE STREAM orders (id BIGINT, currency VARCHAR, amount BIGINT, ts TIMESTAMP(3), \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
               topic = '{orders_topic}', 'bootstrap.servers' = '{bootstrap}', format = 'json', \
               'max-records-per-epoch' = '50');\n\
             {rates}\
             CREATE STREAM converted WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO converted \
             SELECT o.id, o.amount * r.rate AS value, r.ts AS rate_ts \
             FROM orders o JOIN rates FOR SYSTEM_TIME AS OF o.ts AS r \
               ON o.currency = r.currency {filter};\n",
            cp = dir.path().join("cp").display()
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };
    // What the output holds: rows, distinct ids, and rows equal to the
    // loop's (each id once, each equal: all three are the loop's count).
    let summary = || {
        let (bootstrap, output, want) = (bootstrap.to_string(), output.clone(), want.clone());
        async move {
            let records = crate::kafka::read(&bootstrap, &output).await;
            let mut ids = std::collections::BTreeSet::new();
            let mut equal = 0;
            for r in &records {
                let row: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                let id = row["id"].as_i64().unwrap();
                ids.insert(id);
                let rate_ts = crate::nexmark::millis(&[row["rate_ts"].as_str().unwrap()])[0];
                if want.get(&id) == Some(&(row["value"].as_i64().unwrap(), rate_ts)) {
                    equal += 1;
                }
            }
            (records.len(), ids.len(), equal)
        }
    };
    let n = want.len();
    kill_9_five_times_then_finish(command, rng, &(n, n, n), summary).await;
}

/// How the versioned side of [`versions_and_deletions_through_kill_9`]
/// reaches Kafka.
#[derive(Clone, Copy)]
enum Versioned {
    /// `upsert-kafka`: a value per new version, a tombstone per deletion.
    Upsert,
    /// `debezium-json`: creates, updates (the old row taken back, the new
    /// one added) and deletes.
    Debezium,
}

/// A rate change: (currency, the new rate or `None` for a deletion, ts ms).
type RateChange = (i64, Option<i64>, i64);

/// Rate changes every 0–200 ms of event time over five currencies, in time
/// order: a new rate, or (one in six, of a currency that has one) its
/// deletion.
fn rate_changes(rng: &mut Lcg, end: i64) -> Vec<RateChange> {
    let mut live = [false; 5];
    let mut changes = Vec::new();
    let mut ts = START_MS + 500;
    while ts < end {
        ts += rng.next(200) as i64;
        let c = rng.next(5) as usize;
        let delete = live[c] && rng.next(6) == 0;
        live[c] = !delete;
        let rate = (!delete).then(|| 1 + rng.next(1_000) as i64);
        changes.push((c as i64, rate, ts));
    }
    changes
}

/// The plain loop over a versioned side with deletions: each order the
/// final watermark passed, with its currency's latest change at or before
/// its time (the later one of two at one time) if that is a rate above
/// `min_rate`; id → (value, rate's ts).
fn looked_up_versions(
    orders: &[Order],
    changes: &[RateChange],
    delay_ms: i64,
    min_rate: i64,
) -> BTreeMap<i64, (i64, i64)> {
    let last = |times: &mut dyn Iterator<Item = i64>| times.max().unwrap_or(i64::MIN);
    let watermark = last(&mut orders.iter().map(|o| o.3))
        .min(last(&mut changes.iter().map(|r| r.2)))
        - delay_ms;
    let mut out = BTreeMap::new();
    for &(id, currency, amount, ts) in orders.iter().filter(|o| o.3 < watermark) {
        let latest = changes.iter().rev().find(|r| r.0 == currency && r.2 <= ts);
        if let Some(&(_, Some(rate), rate_ts)) = latest {
            if rate > min_rate {
                out.insert(id, (amount * rate, rate_ts));
            }
        }
    }
    out
}

/// The versioned side's records: (key, value or tombstone, timestamp ms).
fn versioned_records(
    kind: Versioned,
    changes: &[RateChange],
) -> Vec<(String, Option<String>, Option<i64>)> {
    let mut current: [Option<String>; 5] = Default::default();
    changes
        .iter()
        .map(|&(c, rate, ts)| {
            let key = format!(r#"{{"currency": "c{c}"}}"#);
            let row = rate.map(|r| format!(r#"{{"currency": "c{c}", "rate": {r}}}"#));
            let value = match kind {
                Versioned::Upsert => row.clone(),
                Versioned::Debezium => {
                    let before = current[c as usize].clone().unwrap_or("null".into());
                    let op = match (&current[c as usize], &row) {
                        (None, _) => "c",
                        (Some(_), Some(_)) => "u",
                        (Some(_), None) => "d",
                    };
                    let after = row.clone().unwrap_or("null".into());
                    Some(format!(
                        r#"{{"before": {before}, "after": {after}, "op": "{op}"}}"#
                    ))
                }
            };
            current[c as usize] = row;
            (key, value, Some(ts))
        })
        .collect()
}

/// A temporal join against an upsert stream or a Debezium changelog, whose
/// deletions end a key's versions, with the versions' time the records'
/// timestamps and a filter on the version above the join, against the
/// plain loop, through kill -9.
async fn versions_and_deletions_through_kill_9(kind: Versioned) {
    let bootstrap = broker().await;
    let rates_topic = fresh_topic("versioned-rates");
    create_topic(&bootstrap, &rates_topic, 1).await.unwrap();
    let mut rng = Lcg(crash_seed("kill -9", || 0x5eed_7e3b));
    let (orders, _) = data(&mut rng);
    let end = orders.last().unwrap().3;
    let changes = rate_changes(&mut rng, end);
    // The rates' times are their records' timestamps, which the broker's
    // retention (2 hours in `scripts/kafka`) judges: all times move to
    // minutes ago.
    let shift = chrono::Utc::now().timestamp_millis() - 600_000 - START_MS;
    let orders: Vec<Order> = orders
        .into_iter()
        .map(|(id, c, amount, ts)| (id, c, amount, ts + shift))
        .collect();
    let changes: Vec<RateChange> = changes
        .into_iter()
        .map(|(c, rate, ts)| (c, rate, ts + shift))
        .collect();
    let deletions = changes.iter().filter(|c| c.1.is_none()).count();
    assert!(deletions > 100, "{deletions} deletions");
    let want = looked_up_versions(&orders, &changes, 1_000, 100);
    // The deletions decide many rows: an answer that ignored them differs.
    let versions_only: Vec<RateChange> =
        changes.iter().filter(|c| c.1.is_some()).copied().collect();
    let ignoring_deletions = looked_up_versions(&orders, &versions_only, 1_000, 100);
    assert!(want.len() > 10_000, "{}", want.len());
    assert!(ignoring_deletions.len() > want.len() + 1_000);
    let rate_records = versioned_records(kind, &changes);
    let (b, t) = (bootstrap.clone(), rates_topic.clone());
    tokio::task::spawn_blocking(move || crate::changelog::send_keyed_at(&b, &t, &rate_records))
        .await
        .unwrap();
    let rates = match kind {
        Versioned::Upsert => format!(
            "CREATE TABLE rates (currency VARCHAR NOT NULL, rate BIGINT, \
               ts TIMESTAMP(3) METADATA FROM 'timestamp', \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, PRIMARY KEY (currency) NOT ENFORCED) \
             WITH ('connector' = 'upsert-kafka', 'topic' = '{rates_topic}', \
               'properties.bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '10');\n"
        ),
        Versioned::Debezium => format!(
            "CREATE STREAM rates (currency VARCHAR NOT NULL, rate BIGINT, \
               ts TIMESTAMP(3) METADATA FROM 'timestamp', \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, PRIMARY KEY (currency) NOT ENFORCED) \
             WITH (connector = 'kafka', topic = '{rates_topic}', \
               'bootstrap.servers' = '{bootstrap}', format = 'debezium-json', \
               'max-records-per-epoch' = '10');\n"
        ),
    };
    joined_through_kill_9(
        &bootstrap,
        &orders,
        &rates,
        "WHERE r.rate > 100",
        want,
        &mut rng,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporal_join_against_an_upsert_stream_ends_versions_at_tombstones_through_kill_9() {
    versions_and_deletions_through_kill_9(Versioned::Upsert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporal_join_against_a_debezium_stream_ends_versions_at_deletes_through_kill_9() {
    versions_and_deletions_through_kill_9(Versioned::Debezium).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporal_join_refuses_versions_whose_deletions_it_cannot_place() {
    let bootstrap = broker().await;
    let topic = fresh_topic("versioned-refused");
    create_topic(&bootstrap, &topic, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let streams = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         CREATE STREAM orders (id BIGINT, currency VARCHAR, region VARCHAR, ts TIMESTAMP(3), \
           WATERMARK FOR ts AS ts) WITH (connector = 'kafka', topic = '{topic}', \
           'bootstrap.servers' = '{bootstrap}', format = 'json');\n\
         CREATE TABLE by_value (currency VARCHAR NOT NULL, rate BIGINT, ts TIMESTAMP(3), \
           WATERMARK FOR ts AS ts, PRIMARY KEY (currency) NOT ENFORCED) \
           WITH ('connector' = 'upsert-kafka', 'topic' = '{topic}', \
           'properties.bootstrap.servers' = '{bootstrap}');\n\
         CREATE TABLE by_region (currency VARCHAR NOT NULL, region VARCHAR NOT NULL, \
           rate BIGINT, ts TIMESTAMP(3) METADATA FROM 'timestamp', WATERMARK FOR ts AS ts, \
           PRIMARY KEY (currency, region) NOT ENFORCED) \
           WITH ('connector' = 'upsert-kafka', 'topic' = '{topic}', \
           'properties.bootstrap.servers' = '{bootstrap}');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = 'never', \
           'bootstrap.servers' = '{bootstrap}');\n",
        cp = dir.path().display()
    );
    for (query, problem) in [
        (
            "SELECT o.id, r.rate FROM orders o JOIN by_value FOR SYSTEM_TIME AS OF o.ts AS r \
             ON o.currency = r.currency",
            "its versions' time 'ts' is read from the record's value",
        ),
        (
            "SELECT o.id, r.rate FROM orders o JOIN by_region FOR SYSTEM_TIME AS OF o.ts AS r \
             ON o.currency = r.currency",
            "must equate exactly those columns (it equates currency)",
        ),
        (
            "SELECT u.currency, r.rate FROM by_value u \
             JOIN by_region FOR SYSTEM_TIME AS OF u.ts AS r \
             ON u.currency = r.currency AND u.currency = r.region",
            "the side before FOR SYSTEM_TIME AS OF is an append-only stream",
        ),
    ] {
        let sql = format!("{streams}INSERT INTO out {query};\n");
        let error = match sluice::Session::new().sql(&sql).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{query} was accepted"),
        };
        assert!(error.contains(problem), "{query}: {error}");
        assert!(error.contains(":6:1:"), "the statement's line: {error}");
    }
    // The same join by the whole key and the record's time plans.
    let sql = format!(
        "{streams}EXPLAIN INSERT INTO out SELECT o.id, r.rate FROM orders o \
         JOIN by_region FOR SYSTEM_TIME AS OF o.ts AS r \
         ON o.currency = r.currency AND o.region = r.region;\n"
    );
    let outcomes = sluice::Session::new().sql(&sql).await.unwrap();
    let explained = outcomes
        .iter()
        .find_map(|o| match o {
            sluice::StatementOutcome::Explained { plan, .. } => Some(plan.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        explained.contains("the versioned side's deletions end their key's versions"),
        "{explained}"
    );
}
