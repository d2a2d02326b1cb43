//! Lookup joins (`JOIN t FOR SYSTEM_TIME AS OF o.p_time`) against a real
//! PostgreSQL (`scripts/postgres`), checked against a plain loop over the
//! rows the test wrote to the database.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::broker::{create_topic, fresh_topic};

use crate::util::{broker, postgres, Lcg};

/// A customer row: id → (name, tier).
type Customers = BTreeMap<i64, (String, i32)>;

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Writes `customers` into table `table` (created if needed), as they are.
async fn write(db: &tokio_postgres::Client, table: &str, customers: &Customers) {
    db.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, tier INT);
         DELETE FROM {table};"
    ))
    .await
    .unwrap();
    for (id, (name, tier)) in customers {
        db.execute(
            &format!("INSERT INTO {table} VALUES ($1, $2, $3)"),
            &[id, name, tier],
        )
        .await
        .unwrap();
    }
}

/// Orders `ids` over customers 0..60 (so some have no customer).
fn orders(ids: std::ops::Range<i64>, rng: &mut Lcg) -> Vec<(i64, i64, i64)> {
    ids.map(|id| (id, rng.next(60) as i64, 1 + rng.next(100) as i64))
        .collect()
}

/// The plain loop: each order with its customer's name and tier when the
/// customer exists and is not of tier 2 (the join's condition), else
/// NULLs: id → (amount, name, tier).
fn looked_up(
    orders: &[(i64, i64, i64)],
    customers: &Customers,
) -> BTreeMap<i64, (i64, Option<String>, Option<i64>)> {
    orders
        .iter()
        .map(|&(id, customer, amount)| {
            let found = customers.get(&customer).filter(|(_, tier)| *tier != 2);
            let name = found.map(|(n, _)| n.clone());
            (id, (amount, name, found.map(|(_, t)| i64::from(*t))))
        })
        .collect()
}

fn script(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("lookup.sql");
    std::fs::write(&path, body).unwrap();
    path
}

fn run(sql: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(sql)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_join_asks_postgres_for_each_rows_key_as_the_table_is_when_its_epoch_runs() {
    let bootstrap = broker().await;
    let (port, url) = postgres().await;
    let db = connect(&url).await;
    let table = fresh_topic("customers").replace('-', "_");
    let (orders_topic, output) = (fresh_topic("lookup-orders"), fresh_topic("lookup-out"));
    create_topic(&bootstrap, &orders_topic, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let mut rng = Lcg(0x10c4);
    let mut customers: Customers = (0..50)
        .map(|id| (id, (format!("n{id}"), (id % 3) as i32)))
        .collect();
    write(&db, &table, &customers).await;

    let dir = tempfile::tempdir().unwrap();
    let sql = script(
        dir.path(),
        &format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger' = 'available-now';\n\
             CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, p AS PROCTIME()) \
               WITH ('connector' = 'kafka', 'topic' = '{orders_topic}', \
               'properties.bootstrap.servers' = '{bootstrap}', 'format' = 'json', \
               'scan.startup.mode' = 'earliest-offset', 'max-records-per-epoch' = '40');\n\
             CREATE TABLE customers (id BIGINT, name VARCHAR, tier INT) WITH (\
               'connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:{port}/sluice', \
               'table-name' = '{table}', 'username' = 'sluice', 'password' = 'sluice', \
               'lookup.cache' = 'PARTIAL', 'lookup.partial-cache.max-rows' = '20', \
               'lookup.partial-cache.expire-after-write' = '1 h');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT o.id, o.amount, c.name, c.tier \
             FROM orders AS o LEFT JOIN customers FOR SYSTEM_TIME AS OF o.p AS c \
               ON o.customer = c.id AND c.tier <> 2;\n",
            cp = dir.path().join("cp").display()
        ),
    );
    let mut want = BTreeMap::new();
    // Round 2 runs after the table changed: its orders see the new rows,
    // the first round's output stays as it was.
    for round in 0..2 {
        let batch = orders(round * 300..(round + 1) * 300, &mut rng);
        want.extend(looked_up(&batch, &customers));
        let records: Vec<(String, Option<String>)> = batch
            .iter()
            .map(|(id, customer, amount)| {
                let v = format!(r#"{{"id": {id}, "customer": {customer}, "amount": {amount}}}"#);
                (id.to_string(), Some(v))
            })
            .collect();
        let (b, t) = (bootstrap.clone(), orders_topic.clone());
        tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &records))
            .await
            .unwrap();
        let out = run(&sql);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut got = BTreeMap::new();
        for r in crate::kafka::read(&bootstrap, &output).await {
            let row: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            let value = (
                row["amount"].as_i64().unwrap(),
                row["name"].as_str().map(str::to_string),
                row["tier"].as_i64(),
            );
            assert!(got.insert(row["id"].as_i64().unwrap(), value).is_none());
        }
        assert_eq!(got, want, "round {round}");
        // Renamed, moved to tier 2 (no longer joined), and new customers.
        customers.insert(1, ("renamed".into(), 1));
        customers.insert(4, ("n4".into(), 2));
        for id in 50..55 {
            customers.insert(id, (format!("new{id}"), 0));
        }
        write(&db, &table, &customers).await;
    }
    assert!(want
        .values()
        .any(|(_, name, _)| name.as_deref() == Some("renamed")));
    assert!(want.values().any(|(_, name, _)| name.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_table_that_cannot_be_reached_or_read_fails_at_its_statement_within_the_timeout() {
    let bootstrap = broker().await;
    let (port, _) = postgres().await;
    let dir = tempfile::tempdir().unwrap();
    let declare = |url: &str, table: &str, extra: &str| {
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             CREATE TABLE orders (id BIGINT, customer BIGINT) WITH (\
               'connector' = 'kafka', 'topic' = 'lookup-never', \
               'properties.bootstrap.servers' = '{bootstrap}', 'format' = 'json');\n\
             CREATE TABLE customers (id BIGINT, name VARCHAR) WITH ('connector' = 'jdbc',\n  \
               'url' = '{url}', 'table-name' = '{table}', 'username' = 'sluice', \
               'password' = 'sluice'{extra});\n",
            cp = dir.path().join("cp").display()
        )
    };
    // Nothing listens on port 1.
    let unreachable = script(
        dir.path(),
        &declare(
            "jdbc:postgresql://127.0.0.1:1/sluice",
            "customers",
            ", 'connection.max-retry-timeout' = '2 s'",
        ),
    );
    let started = Instant::now();
    let out = run(&unreachable);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The statement's line; the column of the option the message names.
    assert!(stderr.contains("lookup.sql:4:"), "{stderr}");
    assert!(stderr.contains("cannot connect within 2s"), "{stderr}");
    assert!(took < Duration::from_secs(30), "{took:?}");

    let url = format!("jdbc:postgresql://127.0.0.1:{port}/sluice");
    let missing = script(dir.path(), &declare(&url, "no_such_table", ""));
    let stderr = String::from_utf8_lossy(&run(&missing).stderr).into_owned();
    assert!(
        stderr.contains("relation \"no_such_table\" does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("lookup.sql:4:"), "{stderr}");

    let wrong_password =
        declare(&url, "x", "").replace("'password' = 'sluice'", "'password' = 'no'");
    let stderr =
        String::from_utf8_lossy(&run(&script(dir.path(), &wrong_password)).stderr).into_owned();
    assert!(stderr.contains("the server refused"), "{stderr}");
    assert!(
        !stderr.contains("'no'"),
        "the password is not shown: {stderr}"
    );
}
