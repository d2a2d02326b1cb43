//! Kafka round trips against the real local broker.

use std::time::{Duration, Instant};

use sluice::broker::{create_topic, ensure_broker, fresh_topic, read_topic};
use sluice::datafusion::prelude::*;
use sluice::{MemoryStream, Session, Trigger};

use crate::util::{batch, schema};

async fn read(bootstrap: &str, topic: &str) -> Vec<sluice::broker::ReadRecord> {
    let (b, t) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || read_topic(&b, &t, true, Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_kafka_as_json_with_keys_and_headers() {
    let bootstrap = tokio::task::spawn_blocking(ensure_broker)
        .await
        .unwrap()
        .unwrap();
    let topic = fresh_topic("roundtrip");
    create_topic(&bootstrap, &topic, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..50)).unwrap();
    input.add_batch(batch(50..100)).unwrap();
    let query = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .filter((col("id") % lit(5)).not_eq(lit(0)))
        .unwrap()
        .with_column("twice", col("id") * lit(2))
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", &topic)
        .option("bootstrap.servers", &bootstrap)
        .option("key.fields", "id")
        .option("sink.delivery", "at-least-once")
        .checkpoint_location(dir.path())
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();

    let records = read(&bootstrap, &topic).await;
    let mut got: Vec<(i64, String, i64)> = records
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            let k: serde_json::Value = serde_json::from_slice(r.key.as_deref().unwrap()).unwrap();
            assert_eq!(k["id"], v["id"], "the key carries key.fields");
            assert!(r
                .headers
                .iter()
                .any(|(h, val)| h == "sluice.query.id" && val == query.id().as_bytes()));
            (
                v["id"].as_i64().unwrap(),
                v["name"].as_str().unwrap().to_string(),
                v["twice"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort_unstable();
    let want: Vec<(i64, String, i64)> = (0..100)
        .filter(|i| i % 5 != 0)
        .map(|i| (i, format!("n{i}"), i * 2))
        .collect();
    assert_eq!(got, want);
    // The same key always lands on the same partition (murmur2).
    let parts: std::collections::BTreeSet<i32> = records.iter().map(|r| r.partition).collect();
    assert_eq!(parts.len(), 2, "keys spread over both partitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_query_produces_each_epoch_once_when_nothing_crashes() {
    let bootstrap = tokio::task::spawn_blocking(ensure_broker)
        .await
        .unwrap()
        .unwrap();
    let topic = fresh_topic("restart");
    let dir = tempfile::tempdir().unwrap();
    let run = |n: i64| {
        let (topic, bootstrap, dir) = (topic.clone(), bootstrap.clone(), dir.path().to_path_buf());
        async move {
            let input = MemoryStream::new(schema());
            for i in 0..n {
                input.add_batch(batch(i * 10..i * 10 + 10)).unwrap();
            }
            let q = Session::new()
                .read_stream()
                .memory(&input)
                .unwrap()
                .write_stream()
                .format("kafka")
                .option("topic", topic)
                .option("bootstrap.servers", bootstrap)
                .option("format", "csv")
                .checkpoint_location(dir)
                .trigger(Trigger::AvailableNow)
                .start()
                .await
                .unwrap();
            q.await_termination().await.unwrap();
        }
    };
    run(2).await;
    run(5).await;
    let values: Vec<String> = read(&bootstrap, &topic)
        .await
        .iter()
        .map(|r| r.value_str())
        .collect();
    let want: Vec<String> = (0..50).map(|i| format!("{i},n{i}")).collect();
    assert_eq!(values, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_fails_within_the_timeout_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 9 of loopback.
    let started = Instant::now();
    let err = Session::new()
        .read_stream()
        .format("rate")
        .load()
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", "nowhere")
        .option("bootstrap.servers", "127.0.0.1:9")
        .option("connect.timeout", "3 s")
        .checkpoint_location(dir.path())
        .start()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    let msg = err.to_string();
    assert!(!err.is_user_error());
    assert!(msg.contains("127.0.0.1:9"), "{msg}");
    assert!(
        msg.contains("scripts/kafka start") && msg.contains("connect.timeout"),
        "{msg}"
    );
    assert!(
        elapsed < Duration::from_secs(30),
        "gave up after {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_above_the_brokers_maximum_is_refused() {
    let bootstrap = tokio::task::spawn_blocking(ensure_broker)
        .await
        .unwrap()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = Session::new()
        .read_stream()
        .format("rate")
        .load()
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", fresh_topic("timeout"))
        .option("bootstrap.servers", bootstrap)
        .option("transaction.timeout", "20 minutes")
        .checkpoint_location(dir.path())
        .start()
        .await
        .unwrap_err();
    assert!(err.is_user_error());
    let msg = err.to_string();
    assert!(
        msg.contains("transaction.max.timeout.ms") && msg.contains("900s"),
        "{msg}"
    );
}
