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
    let (orders_topic, rates_topic, output) = (
        fresh_topic("temporal-orders"),
        fresh_topic("temporal-rates"),
        fresh_topic("temporal-out"),
    );
    for t in [&orders_topic, &rates_topic, &output] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let mut rng = Lcg(crash_seed("kill -9", || 0x7e3b));
    let (orders, rates) = data(&mut rng);
    let want = looked_up(&orders, &rates, 1_000);
    assert!(want.len() > 15_000, "{}", want.len());
    let order_records: Vec<(String, Option<String>)> = orders
        .iter()
        .map(|(id, c, amount, ts)| {
            let ts = rfc3339(*ts);
            let v =
                format!(r#"{{"id": {id}, "currency": "c{c}", "amount": {amount}, "ts": "{ts}"}}"#);
            (id.to_string(), Some(v))
        })
        .collect();
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
    for (topic, records) in [(&orders_topic, order_records), (&rates_topic, rate_records)] {
        let (b, t) = (bootstrap.clone(), topic.clone());
        tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &records))
            .await
            .unwrap();
    }

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
             CREATE STREAM rates (currency VARCHAR, rate BIGINT, ts TIMESTAMP(3), \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
               topic = '{rates_topic}', 'bootstrap.servers' = '{bootstrap}', format = 'json', \
               'max-records-per-epoch' = '10');\n\
             CREATE STREAM converted WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO converted \
             SELECT o.id, o.amount * r.rate AS value, r.ts AS rate_ts \
             FROM orders o JOIN rates FOR SYSTEM_TIME AS OF o.ts AS r \
               ON o.currency = r.currency;\n",
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
        let (bootstrap, output, want) = (bootstrap.clone(), output.clone(), want.clone());
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
    kill_9_five_times_then_finish(command, &mut rng, &(n, n, n), summary).await;
}
