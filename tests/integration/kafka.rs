//! Kafka round trips against the real local broker.

use std::time::{Duration, Instant};

use sluice::broker::{create_topic, fresh_topic, read_topic};
use sluice::datafusion::prelude::*;
use sluice::{MemoryStream, Session, Trigger};

use crate::util::{batch, schema};

pub(crate) async fn read(bootstrap: &str, topic: &str) -> Vec<sluice::broker::ReadRecord> {
    let (b, t) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || read_topic(&b, &t, true, Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_kafka_as_json_with_keys_and_headers() {
    let bootstrap = crate::util::broker().await;
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
        .option("sink.epoch-headers", "true")
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
    let bootstrap = crate::util::broker().await;
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
            q.recent_progress()
        }
    };
    run(2).await;
    let second = run(5).await;
    let want: Vec<String> = (0..50).map(|i| format!("{i},n{i}")).collect();
    // A transaction's records become visible to read_committed readers a
    // moment after its commit returns (the markers are written after it):
    // read again until the second run's epoch shows, or give up.
    let deadline = Instant::now() + Duration::from_secs(15);
    let values = loop {
        let values: Vec<String> = read(&bootstrap, &topic)
            .await
            .iter()
            .map(|r| r.value_str())
            .collect();
        if values.len() >= want.len() || Instant::now() > deadline {
            break values;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let epochs: Vec<(u64, u64)> = second.iter().map(|p| (p.epoch, p.num_input_rows)).collect();
    assert_eq!(values, want, "second run's epochs: {epochs:?}");
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
    let bootstrap = crate::util::broker().await;
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

/// Produces `values` (key = index) to partition `partition % parts` in one
/// transaction, committed or aborted.
pub(crate) fn produce_txn(
    bootstrap: &str,
    topic: &str,
    values: &[String],
    parts: i32,
    commit: bool,
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::ClientConfig;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", fresh_topic("test-producer"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    for (i, v) in values.iter().enumerate() {
        let key = i.to_string();
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&key)
                    .payload(v)
                    .partition(i as i32 % parts),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    if commit {
        producer
            .commit_transaction(Duration::from_secs(30))
            .unwrap();
    } else {
        producer.abort_transaction(Duration::from_secs(30)).unwrap();
    }
}

pub(crate) fn json_rows(ids: std::ops::Range<i64>) -> Vec<String> {
    ids.map(|i| format!("{{\"id\": {i}, \"name\": \"n{i}\"}}"))
        .collect()
}

/// Consumer group `group`'s committed offsets on partitions `0..partitions`
/// of `topic`, and those partitions' end offsets.
fn group_offsets_and_ends(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> (Vec<rdkafka::Offset>, Vec<rdkafka::Offset>) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .unwrap();
    (0..partitions)
        .map(|p| {
            let (_, end) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(30))
                .unwrap();
            let at = committed.find_partition(topic, p).unwrap().offset();
            (at, rdkafka::Offset::Offset(end))
        })
        .unzip()
}

/// Flink's files read with `'properties.group.id'` and write to a
/// blackhole: the source then commits the offsets to the group itself once
/// each epoch is committed, as Flink's Kafka source does on checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_id_with_a_sink_outside_kafka_is_committed_by_the_source() {
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("grouped-in");
    create_topic(&bootstrap, &input, 2).await.unwrap();
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || produce_txn(&b, &t, &json_rows(0..40), 2, true))
            .await
            .unwrap();
    }
    let group = fresh_topic("group");
    let session = sluice::Session::new();
    let sql = format!(
        "SET 'trigger' = 'available-now';\n\
         CREATE TABLE src (id BIGINT, name VARCHAR) WITH ('connector' = 'kafka', \
           'topic' = '{input}', 'properties.bootstrap.servers' = '{bootstrap}', \
           'properties.group.id' = '{group}', 'scan.startup.mode' = 'earliest-offset', \
           'max-records-per-epoch' = '10', 'format' = 'json');\n\
         CREATE TABLE dst (id BIGINT) WITH ('connector' = 'blackhole');\n\
         INSERT INTO dst SELECT id FROM src;\n"
    );
    let query = crate::util::start_sql(&session, &sql).await;
    query.await_termination().await.unwrap();
    tokio::task::spawn_blocking(move || {
        // The last commit runs in the background: wait for it.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (at, ends) = group_offsets_and_ends(&bootstrap, &group, &input, 2);
            if at == ends {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the group's offsets {at:?}, the topic's ends {ends:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_reads_committed_records_once_with_virtual_columns() {
    let bootstrap = crate::util::broker().await;
    let (input, output) = (fresh_topic("in"), fresh_topic("out"));
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    {
        let b = bootstrap.clone();
        let t = input.clone();
        tokio::task::spawn_blocking(move || {
            produce_txn(&b, &t, &json_rows(0..30), 2, true);
            produce_txn(&b, &t, &json_rows(1000..1010), 2, false);
            produce_txn(&b, &t, &json_rows(30..60), 2, true);
        })
        .await
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let session = sluice::Session::new();
    let group = fresh_topic("group");
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM src (id BIGINT, name VARCHAR, part INT METADATA FROM 'partition' VIRTUAL, \
           record_offset BIGINT METADATA FROM 'offset', ts TIMESTAMP(3) METADATA FROM 'timestamp') \
           WITH (connector = 'kafka', topic = '{input}', \
           'bootstrap.servers' = '{bootstrap}', 'max-records-per-epoch' = '16', \
           'group.id' = '{group}');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', 'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO dst SELECT id, name, _key AS k, _partition AS p, _offset AS o, part, record_offset, \
           ts FROM src WHERE id % 2 = 0;\n",
        cp = dir.path().display()
    );
    let query = crate::util::start_sql(&session, &sql).await;
    query.await_termination().await.unwrap();
    assert!(
        query.recent_progress().len() >= 4,
        "max-records-per-epoch splits the input"
    );

    let records = read(&bootstrap, &output).await;
    // Flink's METADATA columns read the same as the virtual columns.
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["part"], v["p"], "{v}");
        assert_eq!(v["record_offset"], v["o"], "{v}");
        assert!(v["ts"].as_str().is_some_and(|t| t.starts_with("20")), "{v}");
    }
    let mut rows: Vec<(i64, String, String, i64, i64)> = records
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                v["id"].as_i64().unwrap(),
                v["name"].as_str().unwrap().to_string(),
                v["k"].as_str().unwrap().to_string(),
                v["p"].as_i64().unwrap(),
                v["o"].as_i64().unwrap(),
            )
        })
        .collect();
    rows.sort_unstable();
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let want: Vec<i64> = (0..60).filter(|i| i % 2 == 0).collect();
    assert_eq!(
        ids, want,
        "committed input exactly once, aborted input never"
    );
    // Virtual columns: the key and partition the producer chose.
    for (id, name, key, partition, _) in &rows {
        assert_eq!(name, &format!("n{id}"));
        let index = if *id < 30 { *id } else { id - 30 };
        assert_eq!(key, &index.to_string());
        assert_eq!(*partition, index % 2);
    }
    // Offsets are the input's: distinct per partition.
    let mut seen = std::collections::BTreeSet::new();
    assert!(rows.iter().all(|r| seen.insert((r.3, r.4))));

    // With 'group.id', the consumer group's committed offsets are the
    // query's end offsets (what kafka-consumer-groups.sh shows as lag 0).
    tokio::task::spawn_blocking(move || {
        let (at, ends) = group_offsets_and_ends(&bootstrap, &group, &input, 2);
        assert_eq!(at, ends, "the group's offsets, the topic's ends");
    })
    .await
    .unwrap();
}

/// A `raw` stream declared with its one `VARCHAR` column takes METADATA
/// columns and a watermark over one, as a JSON stream does (SQL's VARCHAR
/// is a string view, which the raw check once refused, and the stream
/// then failed on its computed columns with an unrelated error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_stream_takes_metadata_columns_and_a_watermark() {
    let bootstrap = crate::util::broker().await;
    let (input, output) = (fresh_topic("raw-in"), fresh_topic("raw-out"));
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let values = json_rows(0..5);
    {
        let (b, t, v) = (bootstrap.clone(), input.clone(), values.clone());
        tokio::task::spawn_blocking(move || produce_txn(&b, &t, &v, 1, true))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM src (value VARCHAR, ts TIMESTAMP(3) METADATA FROM 'timestamp', \
           WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (connector = 'kafka', \
           topic = '{input}', 'bootstrap.servers' = '{bootstrap}', format = 'raw');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO dst SELECT value, ts, _offset AS o FROM src;\n",
        cp = dir.path().display()
    );
    let session = sluice::Session::new();
    let query = crate::util::start_sql(&session, &sql).await;
    query.await_termination().await.unwrap();
    let mut got: Vec<(i64, String)> = read(&bootstrap, &output)
        .await
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            assert!(v["ts"].as_str().is_some_and(|t| t.starts_with("20")), "{v}");
            (
                v["o"].as_i64().unwrap(),
                v["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let texts: Vec<String> = got.into_iter().map(|(_, v)| v).collect();
    assert_eq!(texts, values);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_named_by_topic_partition_offset_skipped_or_dead_lettered() {
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("bad-in");
    create_topic(&bootstrap, &input, 1).await.unwrap();
    let mut values = json_rows(0..5);
    values.insert(3, "{\"id\": oops".to_string());
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || produce_txn(&b, &t, &values, 1, true))
            .await
            .unwrap();
    }
    let run = |on_error: &str| {
        let (bootstrap, input, on_error) = (bootstrap.clone(), input.clone(), on_error.to_string());
        async move {
            let out = sluice::MemorySink::new();
            let query = crate::util::kafka_stream(
                &bootstrap,
                &input,
                &[("format.on-error", on_error.as_str())],
            )
            .select(vec![col("id")])
            .unwrap()
            .write_stream()
            .memory(&out)
            .trigger(Trigger::AvailableNow)
            .start()
            .await
            .unwrap();
            let result = query.await_termination().await;
            (result, out, query.recent_progress())
        }
    };
    let (result, _, _) = run("fail").await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains(&format!("topic '{input}', partition 0, offset 3"))
            && err.contains("malformed"),
        "{err}"
    );
    let (result, out, progress) = run("skip").await;
    result.unwrap();
    assert_eq!(crate::util::ints(&out.batches(), "id"), vec![0, 1, 2, 3, 4]);
    assert_eq!(
        crate::util::skipped(&progress),
        1,
        "skipped records are counted in progress"
    );

    let dead_lettering = |dlq: &str| {
        Session::new()
            .read_stream()
            .format("kafka")
            .option("topic", input.clone())
            .option("bootstrap.servers", bootstrap.clone())
            .option("format.on-error", "dead-letter")
            .option("dead-letter.topic", dlq)
            .option("max-records-per-epoch", "2")
            .schema(crate::util::schema())
            .load()
            .unwrap()
    };
    // Dead letters need a sink that writes them in the epoch's transaction.
    let refused = dead_lettering("nowhere")
        .write_stream()
        .memory(&sluice::MemorySink::new())
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("needs a Kafka sink"), "{refused}");

    // With a Kafka sink, the bad record goes to the dead-letter topic in the
    // same transaction as the good ones' output: each input record ends up
    // in exactly one of the two.
    let (output, dlq) = (fresh_topic("good-out"), fresh_topic("dlq"));
    create_topic(&bootstrap, &output, 1).await.unwrap();
    create_topic(&bootstrap, &dlq, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let query = dead_lettering(&dlq)
        .select(vec![col("id")])
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", output.clone())
        .option("bootstrap.servers", bootstrap.clone())
        .checkpoint_location(dir.path())
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    let dead_lettered: u64 = query
        .recent_progress()
        .iter()
        .flat_map(|p| &p.sources)
        .map(|s| s.dead_lettered_records)
        .sum();
    assert_eq!(dead_lettered, 1);
    let good = read(&bootstrap, &output).await;
    let mut ids: Vec<i64> = good
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    let letters = read(&bootstrap, &dlq).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.value_str(), "{\"id\": oops");
    let header = |name: &str| {
        letter
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(
        header("sluice.source.topic").as_deref(),
        Some(input.as_str())
    );
    assert_eq!(header("sluice.source.partition").as_deref(), Some("0"));
    assert_eq!(header("sluice.source.offset").as_deref(), Some("3"));
    assert!(header("sluice.error").is_some_and(|e| !e.is_empty()));
    // Written by the epoch that read it: offsets 2 and 3 are the second.
    assert_eq!(
        header("sluice.epoch").as_deref(),
        Some("2"),
        "{letter:?}; progress: {:?}",
        query
            .recent_progress()
            .iter()
            .map(|p| (
                p.epoch,
                p.sources[0].start_offset.clone(),
                p.sources[0].end_offset.clone()
            ))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_stream_is_keyed_by_its_group_key_by_default() {
    use sluice::datafusion::functions_aggregate::expr_fn::count;
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic("upsert");
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..10)).unwrap();
    input.add_batch(batch(10..13)).unwrap();
    let query = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .aggregate(
            vec![(col("id") % lit(3)).alias("bucket")],
            vec![count(lit(1)).alias("n")],
        )
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", &topic)
        .option("bootstrap.servers", &bootstrap)
        .checkpoint_location(dir.path())
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    let records = read(&bootstrap, &topic).await;
    let got: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (
                String::from_utf8_lossy(r.key.as_deref().unwrap()).into_owned(),
                r.value_str(),
            )
        })
        .collect();
    // Available-now reads both batches in one epoch: one update per bucket.
    assert_eq!(got.len(), 3, "{got:?}");
    for (key, value) in &got {
        let v: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(key, &format!("{{\"bucket\":{}}}", v["bucket"]));
    }
    let last: std::collections::BTreeMap<String, i64> = got
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::from_str::<serde_json::Value>(v).unwrap()["n"]
                    .as_i64()
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(last.values().copied().collect::<Vec<_>>(), vec![5, 4, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_stops_passing_having_is_deleted_by_a_tombstone() {
    use sluice::arrow::array::{AsArray, RecordBatch};
    use sluice::arrow::datatypes::Int64Type;
    use sluice::datafusion::datasource::MemTable;
    use sluice::datafusion::functions_aggregate::expr_fn::count;
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic("retract");
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    let query = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .aggregate(
            vec![(col("id") % lit(3)).alias("bucket")],
            vec![count(lit(1)).alias("n")],
        )
        .unwrap()
        .filter(col("n").lt(lit(8)))
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", &topic)
        .option("bootstrap.servers", &bootstrap)
        .checkpoint_location(dir.path())
        .start()
        .await
        .unwrap();
    // Per bucket (0, 1, 2): 4, 3, 3 rows; then 6, 6, 5; then 8, 8, 7, when
    // buckets 0 and 1 stop passing `n < 8`; then bucket 0, already gone,
    // changes again (9).
    let epochs = [
        batch(0..10),
        batch(100..107),
        batch(200..206),
        batch(300..301),
    ];
    for b in &epochs {
        input.add_batch(b.clone()).unwrap();
        query.process_all_available().await.unwrap();
    }
    query.stop().await.unwrap();

    // The topic, folded by key as a compacted topic keeps it.
    let records = read(&bootstrap, &topic).await;
    let mut folded = std::collections::BTreeMap::new();
    let mut tombstones = 0;
    for r in &records {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap()).into_owned();
        match r.value.as_deref() {
            Some(v) => {
                let v: serde_json::Value = serde_json::from_slice(v).unwrap();
                folded.insert(key, v["n"].as_i64().unwrap());
            }
            None => {
                tombstones += 1;
                folded.remove(&key);
            }
        }
    }
    assert_eq!(
        tombstones, 2,
        "buckets 0 and 1 are deleted once, when they leave the output, not again"
    );

    // DataFusion's batch answer over all the input.
    let ctx = sluice::datafusion::prelude::SessionContext::new();
    let table = MemTable::try_new(schema(), vec![epochs.to_vec()]).unwrap();
    ctx.register_table("t", std::sync::Arc::new(table)).unwrap();
    let answer: Vec<RecordBatch> = ctx
        .sql("SELECT id % 3 AS bucket, count(*) AS n FROM t GROUP BY id % 3 HAVING count(*) < 8")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut want = std::collections::BTreeMap::new();
    for b in &answer {
        let (k, n) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
        );
        for i in 0..b.num_rows() {
            want.insert(format!("{{\"bucket\":{}}}", k.value(i)), n.value(i));
        }
    }
    assert_eq!(folded.len(), 1, "bucket 2 stays: {folded:?}");
    assert_eq!(folded, want);
}

/// The value of `metric` (with `labels`, if any) in a Prometheus scrape.
fn metric(scrape: &str, metric: &str, labels: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(metric) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_a_kafka_query_works_and_lag_falls_to_zero() {
    const RECORDS: i64 = 3_000;
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("metrics-in");
    create_topic(&bootstrap, &input, 2).await.unwrap();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_txn(&b, &t, &json_rows(0..RECORDS), 2, true))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'trigger.interval' = '200 ms';\n\
             CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               'max-records-per-epoch' = '100');\n\
             CREATE STREAM out WITH (connector = 'blackhole');\n\
             INSERT INTO out SELECT id FROM src;\n"
        ),
    )
    .unwrap();
    let port = crate::util::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(&sql)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Scrape with curl, a real HTTP client, until the input is consumed.
    let url = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen_rows = Vec::new();
    let mut final_scrape = String::new();
    let mut max_lag: f64 = 0.0;
    let mut last_lag = None;
    while Instant::now() < deadline {
        let out = std::process::Command::new("curl")
            .args(["-sf", &url])
            .output()
            .unwrap();
        if out.status.success() {
            let scrape = String::from_utf8_lossy(&out.stdout).into_owned();
            if let Some(rows) = metric(&scrape, "sluice_input_rows_total", "query=\"out\"") {
                seen_rows.push(rows);
                // Consumed: every record read, and nothing left behind
                // (transaction markers take offsets too).
                let lag = metric(&scrape, "sluice_source_lag_records", "partition=\"0\"").zip(
                    metric(&scrape, "sluice_source_lag_records", "partition=\"1\""),
                );
                if let Some((a, b)) = lag {
                    max_lag = max_lag.max(a + b);
                }
                last_lag = lag;
                if rows as i64 == RECORDS && lag == Some((0.0, 0.0)) {
                    final_scrape = scrape;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !final_scrape.is_empty(),
        "input rows seen: {seen_rows:?}; the last lag (partitions 0, 1): {last_lag:?}"
    );
    // Rows grew over several scrapes, never backwards.
    assert!(seen_rows.windows(2).all(|w| w[0] <= w[1]), "{seen_rows:?}");
    assert!(
        seen_rows.iter().any(|r| *r > 0.0 && (*r as i64) < RECORDS),
        "{seen_rows:?}"
    );
    // While the input was read in capped epochs, the lag was above 0.
    assert!(max_lag > 0.0, "the lag never showed a backlog");
    let epochs = metric(
        &final_scrape,
        "sluice_epochs_committed_total",
        "query=\"out\"",
    )
    .unwrap();
    assert!(epochs >= (RECORDS / 100) as f64, "{final_scrape}");
    assert!(final_scrape.contains(
        "sluice_epoch_duration_seconds_bucket{query=\"out\",phase=\"commit\",le=\"+Inf\"}"
    ));
    assert!(metric(&final_scrape, "process_resident_memory_bytes", "").unwrap() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_modes_timestamp_and_offsets_choose_where_a_new_query_begins() {
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("startup");
    create_topic(&bootstrap, &input, 2).await.unwrap();
    // Two transactions (ids 0..10, then 10..20), the second produced after
    // the time `between`.
    let between = {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || {
            produce_txn(&b, &t, &json_rows(0..10), 2, true);
            std::thread::sleep(Duration::from_millis(50));
            let between = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            std::thread::sleep(Duration::from_millis(50));
            produce_txn(&b, &t, &json_rows(10..20), 2, true);
            between
        })
        .await
        .unwrap()
    };
    let run = |options: Vec<(&'static str, String)>| {
        let (bootstrap, input) = (bootstrap.clone(), input.clone());
        async move {
            let out = sluice::MemorySink::new();
            let mut reader = Session::new()
                .read_stream()
                .format("kafka")
                .option("topic", input)
                .option("bootstrap.servers", bootstrap)
                .schema(schema());
            for (k, v) in options {
                reader = reader.option(k, v);
            }
            let query = reader
                .load()?
                .select(vec![col("id"), col("_partition"), col("_offset")])?
                .write_stream()
                .memory(&out)
                .trigger(Trigger::AvailableNow)
                .start()
                .await?;
            query.await_termination().await?;
            let mut ids = crate::util::ints(&out.batches(), "id");
            ids.sort_unstable();
            Ok::<_, sluice::SluiceError>(ids)
        }
    };
    let from_time = run(vec![
        ("scan.startup.mode", "timestamp".into()),
        ("scan.startup.timestamp-millis", between.to_string()),
    ])
    .await
    .unwrap();
    assert_eq!(from_time, (10..20).collect::<Vec<_>>());
    // produce_txn puts record i on partition i % 2: ids 0, 2, 4, .. at
    // offsets 0, 1, 2, ..; a transaction marker follows each transaction.
    let from_offsets = run(vec![
        ("scan.startup.mode", "offsets".into()),
        (
            "scan.startup.specific-offsets",
            "partition:0,offset:3;partition:1,offset:7".into(),
        ),
    ])
    .await
    .unwrap();
    let partition_0: Vec<i64> = vec![6, 8, 10, 12, 14, 16, 18];
    let partition_1: Vec<i64> = vec![13, 15, 17, 19];
    let mut want: Vec<i64> = partition_0.into_iter().chain(partition_1).collect();
    want.sort_unstable();
    assert_eq!(from_offsets, want);
    let bad = run(vec![
        ("scan.startup.mode", "offsets".into()),
        (
            "scan.startup.specific-offsets",
            "partition:0;offset:3".into(),
        ),
    ])
    .await
    .unwrap_err()
    .to_string();
    assert!(bad.contains("'partition:<n>,offset:<n>'"), "{bad}");
}

/// Reads an Avro `long` (zigzag varint) at `at`.
fn avro_long(bytes: &[u8], at: &mut usize) -> i64 {
    let (mut value, mut shift) = (0u64, 0);
    loop {
        let b = bytes[*at];
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return (value >> 1) as i64 ^ -((value & 1) as i64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_rows_reach_kafka_single_object_encoded_and_a_source_reads_them_back() {
    let bootstrap = crate::util::broker().await;
    let (avro_topic, json_topic) = (fresh_topic("avro"), fresh_topic("from-avro"));
    create_topic(&bootstrap, &avro_topic, 1).await.unwrap();
    create_topic(&bootstrap, &json_topic, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..40)).unwrap();
    input.add_batch(batch(40..100)).unwrap();
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
        .option("topic", &avro_topic)
        .option("bootstrap.servers", &bootstrap)
        .option("format", "avro")
        .checkpoint_location(dir.path().join("to-avro"))
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    let want: Vec<(i64, String, i64)> = (0..100)
        .filter(|i| i % 5 != 0)
        .map(|i| (i, format!("n{i}"), i * 2))
        .collect();

    // Decoded by hand, per the Avro specification: the single-object
    // header, then id (long), name (union index 1, then a string), twice.
    let records = read(&bootstrap, &avro_topic).await;
    let fingerprint = &records[0].value.as_deref().unwrap()[2..10];
    let mut got: Vec<(i64, String, i64)> = records
        .iter()
        .map(|r| {
            let v = r.value.as_deref().unwrap();
            assert_eq!(&v[..2], &[0xC3, 0x01], "single-object marker");
            assert_eq!(&v[2..10], fingerprint, "one schema for all rows");
            let mut at = 10;
            let id = avro_long(v, &mut at);
            assert_eq!(avro_long(v, &mut at), 1, "name is the non-null branch");
            let len = avro_long(v, &mut at) as usize;
            let name = String::from_utf8(v[at..at + len].to_vec()).unwrap();
            at += len;
            let twice = avro_long(v, &mut at);
            assert_eq!(at, v.len(), "nothing after the record");
            (id, name, twice)
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, want);

    // Something that is not Avro lands among them, then a query reads the
    // topic with format 'avro': the rows come back, the stranger is
    // skipped and counted.
    {
        let (b, t) = (bootstrap.clone(), avro_topic.clone());
        tokio::task::spawn_blocking(move || {
            produce_txn(&b, &t, &["{\"id\": 7}".to_string()], 1, true)
        })
        .await
        .unwrap();
    }
    let session = Session::new();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM src (id BIGINT NOT NULL, name VARCHAR, twice BIGINT NOT NULL) \
           WITH (connector = 'kafka', topic = '{avro_topic}', 'bootstrap.servers' = '{bootstrap}', \
           format = 'avro', 'format.on-error' = 'skip');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{json_topic}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO dst SELECT id, name, twice FROM src;\n",
        cp = dir.path().join("from-avro").display()
    );
    let query = crate::util::start_sql(&session, &sql).await;
    query.await_termination().await.unwrap();
    assert_eq!(
        crate::util::skipped(&query.recent_progress()),
        1,
        "the record that is not Avro is skipped"
    );
    let mut back: Vec<(i64, String, i64)> = read(&bootstrap, &json_topic)
        .await
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                v["id"].as_i64().unwrap(),
                v["name"].as_str().unwrap().to_string(),
                v["twice"].as_i64().unwrap(),
            )
        })
        .collect();
    back.sort_unstable();
    assert_eq!(back, want);
}

/// The names of the topics on the broker at `bootstrap`; none when nothing
/// answers there.
fn topics_on(bootstrap: &str) -> Option<std::collections::BTreeSet<String>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .ok()?;
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(5)).ok()?;
    Some(
        metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect(),
    )
}

/// The tests keep to a broker of their own (port 19092, or
/// `SLUICE_TEST_KAFKA_PORT`): an exactly-once Kafka → Kafka query run
/// through the test harness creates no topic on a broker a developer (or
/// `sluice demo`) runs on 9092. Where nothing listens on 9092, only the
/// port is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tests_leave_a_broker_on_9092_alone() {
    let ours = crate::util::broker().await;
    assert!(!ours.ends_with(":9092"), "the tests' broker is {ours}");
    let before = tokio::task::spawn_blocking(|| topics_on("127.0.0.1:9092"))
        .await
        .unwrap();
    let (input, output) = (fresh_topic("own-port-in"), fresh_topic("own-port-out"));
    create_topic(&ours, &input, 1).await.unwrap();
    create_topic(&ours, &output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
           topic = '{input}', 'bootstrap.servers' = '{ours}');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{ours}');\n\
         INSERT INTO dst SELECT id, name FROM src;\n",
        cp = dir.path().display()
    );
    let query = crate::util::start_sql(&sluice::Session::new(), &sql).await;
    query.await_termination().await.unwrap();
    let after = tokio::task::spawn_blocking(|| topics_on("127.0.0.1:9092"))
        .await
        .unwrap();
    // Topics the tests make: `fresh_topic`'s `<prefix>-<32 hex digits>`,
    // and progress topics. (Other topics may come and go on a developer's
    // broker meanwhile.)
    let a_tests = |t: &str| {
        t.starts_with("sluice-progress.")
            || t.rsplit_once('-')
                .is_some_and(|(_, id)| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()))
    };
    if let (Some(before), Some(after)) = (before, after) {
        let created: Vec<&String> = after.difference(&before).filter(|t| a_tests(t)).collect();
        assert!(
            created.is_empty(),
            "topics created on 9092 while the tests ran: {created:?}"
        );
    }
}
