//! Nothing lost or repeated without a word, against the real broker: data
//! loss in a Kafka input (records deleted before they were read, a replayed
//! range gone, a topic recreated), one JSON value per message and
//! tombstones, `latest` resolved once, and the progress topic's shape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::broker::{create_topic, fresh_topic};
use sluice::datafusion::prelude::*;
use sluice::{Session, Trigger};

use crate::kafka::{json_rows, read};

/// Produces `ids` as JSON rows to partition 0, without a transaction, so
/// that offsets are the ids when the topic starts empty.
pub(crate) fn produce_plain(bootstrap: &str, topic: &str, ids: std::ops::Range<i64>) {
    produce_plain_to(bootstrap, topic, 0, ids)
}

/// A new one-partition topic named after `prefix` on the tests' broker,
/// holding `ids` as [`produce_plain`] writes them; returns the broker's
/// address and the topic.
pub(crate) async fn topic_with(prefix: &str, ids: std::ops::Range<i64>) -> (String, String) {
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic(prefix);
    create_topic(&bootstrap, &topic, 1).await.unwrap();
    let (b, t) = (bootstrap.clone(), topic.clone());
    tokio::task::spawn_blocking(move || produce_plain(&b, &t, ids))
        .await
        .unwrap();
    (bootstrap, topic)
}

/// [`produce_plain`] into `partition`.
pub(crate) fn produce_plain_to(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    ids: std::ops::Range<i64>,
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for v in json_rows(ids) {
        producer
            .send(
                BaseRecord::<(), _>::to(topic)
                    .payload(&v)
                    .partition(partition),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// The `id` of each JSON record.
fn ids(records: Vec<sluice::broker::ReadRecord>) -> Vec<i64> {
    records
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["id"].as_i64().unwrap()
        })
        .collect()
}

fn admin(bootstrap: &str) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap()
}

/// Deletes the records of partition 0 of `topic` below `offset`, as
/// retention would.
async fn delete_records_below(bootstrap: &str, topic: &str, offset: i64) {
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Offset(offset))
        .unwrap();
    let done = admin(bootstrap)
        .delete_records(&tpl, &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap();
    let low = done.find_partition(topic, 0).unwrap();
    assert_eq!(low.error(), Ok(()));
    assert_eq!(low.offset(), rdkafka::Offset::Offset(offset));
}

/// Deletes `topic` and creates it again, empty, with one partition.
async fn recreate(bootstrap: &str, topic: &str) {
    let options = rdkafka::admin::AdminOptions::new();
    let deleted = admin(bootstrap)
        .delete_topics(&[topic], &options)
        .await
        .unwrap();
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    // Deletion completes in the background: create until it is through.
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = create_topic(bootstrap, topic, 1).await {
        assert!(Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Data loss (Spark's failOnDataLoss, on by default): records gone before
/// the query read them — deleted during a run, deleted under an epoch
/// planned before a crash and replayed after it, a topic deleted and
/// recreated — stop the query with the topic, partition and offsets lost,
/// and nothing of the epoch is written. With 'fail-on-data-loss' = 'false'
/// the query skips them and counts them as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_gone_before_they_are_read_stop_the_query_naming_them_or_count_as_lost() {
    use std::process::Command;
    let bootstrap = crate::util::broker().await;
    let (input, output) = (fresh_topic("loss-in"), fresh_topic("loss-out"));
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let progress = dir.path().join("progress.jsonl");
    let run = |fail_on_loss: bool, failpoint: Option<&str>| {
        let sql = dir.path().join(format!("loss-{fail_on_loss}.sql"));
        std::fs::write(
            &sql,
            format!(
                "SET 'pipeline.name' = '{output}';\n\
                 SET 'checkpoint.location' = '{cp}';\n\
                 SET 'trigger' = 'available-now';\n\
                 CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
                   topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
                   'max-records-per-epoch' = '10', 'fail-on-data-loss' = '{fail_on_loss}');\n\
                 CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
                   'bootstrap.servers' = '{bootstrap}');\n\
                 INSERT INTO dst SELECT id FROM src;\n",
                cp = dir.path().join("checkpoint").display(),
            ),
        )
        .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run")
            .arg(&sql)
            .arg("--progress-log")
            .arg(&progress);
        if let Some(point) = failpoint {
            cmd.env("SLUICE_FAILPOINT", point);
        }
        let out = cmd.output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let lost = || -> u64 {
        std::fs::read_to_string(&progress)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["lost_records"]
                    .as_u64()
                    .unwrap()
            })
            .sum()
    };

    // During a run: 20..30 deleted before the query read them.
    let b = bootstrap.clone();
    let i = input.clone();
    tokio::task::spawn_blocking(move || produce_plain(&b, &i, 0..20))
        .await
        .unwrap();
    let (status, err) = run(true, None);
    assert!(status.success(), "{err}");
    let b = bootstrap.clone();
    let i = input.clone();
    tokio::task::spawn_blocking(move || produce_plain(&b, &i, 20..40))
        .await
        .unwrap();
    delete_records_below(&bootstrap, &input, 30).await;
    let (status, err) = run(true, None);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "data loss: topic '{input}' partition 0, offsets 20..30 were deleted"
        )) && err.contains("'fail-on-data-loss' = 'false'"),
        "{err}"
    );
    assert_eq!(
        ids(read(&bootstrap, &output).await),
        (0..20).collect::<Vec<_>>()
    );
    let (status, err) = run(false, None);
    assert!(status.success(), "{err}");
    let want: Vec<i64> = (0..20).chain(30..40).collect();
    assert_eq!(ids(read(&bootstrap, &output).await), want);
    assert_eq!(lost(), 10, "the skipped records are counted");

    // During a replay: epoch [40, 50) planned, the process killed, 40..45
    // deleted; the replay must read exactly its range, which is gone.
    let b = bootstrap.clone();
    let i = input.clone();
    tokio::task::spawn_blocking(move || produce_plain(&b, &i, 40..60))
        .await
        .unwrap();
    let (status, _) = run(true, Some("after-offsets"));
    assert!(!status.success(), "the fail point aborts the run");
    delete_records_below(&bootstrap, &input, 45).await;
    let (status, err) = run(true, None);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "data loss: topic '{input}' partition 0, offsets 40..45 were deleted"
        )),
        "{err}"
    );
    assert_eq!(ids(read(&bootstrap, &output).await), want);

    // The topic deleted and recreated: its offsets start over below where
    // the query had read to.
    let (status, err) = run(false, None);
    assert!(status.success(), "{err}");
    assert_eq!(lost(), 15);
    recreate(&bootstrap, &input).await;
    let b = bootstrap.clone();
    let i = input.clone();
    tokio::task::spawn_blocking(move || produce_plain(&b, &i, 100..105))
        .await
        .unwrap();
    let (status, err) = run(true, None);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("the query had read up to 60 but the partition now ends at 5"),
        "{err}"
    );
    let want: Vec<i64> = (0..20).chain(30..40).chain(45..60).collect();
    assert_eq!(ids(read(&bootstrap, &output).await), want);
}

/// Produces `values` to partition 0 in order, `None` as a tombstone (a
/// message without a value).
fn produce_values(bootstrap: &str, topic: &str, values: &[Option<&str>]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (i, v) in values.iter().enumerate() {
        let key = i.to_string();
        let mut record = BaseRecord::to(topic).key(&key).partition(0);
        if let Some(v) = v {
            record = record.payload(*v);
        }
        producer.send::<String, str>(record).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// One message, one value: a message holding two JSON objects is a bad
/// record (named, skipped or dead-lettered like any), never two rows that
/// push a later message's row out. A tombstone (no value) on an append
/// stream is no row: skipped and counted, it never stops the query. An
/// empty value is not a tombstone but a bad record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_one_value_a_tombstone_is_skipped_and_an_empty_value_is_malformed() {
    let bootstrap = crate::util::broker().await;
    let (doubled, tombstoned, emptied) = (
        fresh_topic("two-in-one"),
        fresh_topic("tombstone"),
        fresh_topic("empty-value"),
    );
    for topic in [&doubled, &tombstoned, &emptied] {
        create_topic(&bootstrap, topic, 1).await.unwrap();
    }
    {
        let (b, d, t, e) = (
            bootstrap.clone(),
            doubled.clone(),
            tombstoned.clone(),
            emptied.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let row = |i: i64| format!("{{\"id\": {i}, \"name\": \"n{i}\"}}");
            let two = format!("{}{}", row(1), row(100));
            let (r0, r2, r3) = (row(0), row(2), row(3));
            produce_values(&b, &d, &[Some(&r0), Some(&two), Some(&r2), Some(&r3)]);
            produce_values(&b, &t, &[Some(&r0), None, Some(&r2), None, Some(&r3)]);
            produce_values(&b, &e, &[Some(&r0), None, Some(&r2), Some(""), Some(&r3)]);
        })
        .await
        .unwrap();
    }
    let run = |topic: &str, on_error: &str| {
        let (bootstrap, topic, on_error) =
            (bootstrap.clone(), topic.to_string(), on_error.to_string());
        async move {
            let out = sluice::MemorySink::new();
            let query = crate::util::kafka_stream(
                &bootstrap,
                &topic,
                &[("format.on-error", on_error.as_str())],
            )
            .select(vec![col("id"), col("_offset")])
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
    let (result, _, _) = run(&doubled, "fail").await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains(&format!("topic '{doubled}', partition 0, offset 1"))
            && err.contains("not one"),
        "{err}"
    );
    let (result, out, progress) = run(&doubled, "skip").await;
    result.unwrap();
    let batches = out.batches();
    assert_eq!(crate::util::ints(&batches, "id"), vec![0, 2, 3]);
    assert_eq!(crate::util::ints(&batches, "_offset"), vec![0, 2, 3]);
    assert_eq!(crate::util::skipped(&progress), 1);

    // Tombstones do not fail the query, even with 'format.on-error' = 'fail'.
    let (result, out, progress) = run(&tombstoned, "fail").await;
    result.unwrap();
    let batches = out.batches();
    assert_eq!(crate::util::ints(&batches, "id"), vec![0, 2, 3]);
    assert_eq!(crate::util::ints(&batches, "_offset"), vec![0, 2, 4]);
    assert_eq!(crate::util::skipped(&progress), 2, "tombstones are counted");

    // An empty value is a bad record: it stops the query under 'fail',
    // and is skipped only when asked.
    let (result, _, _) = run(&emptied, "fail").await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains(&format!("topic '{emptied}', partition 0, offset 3"))
            && err.contains("an empty value"),
        "{err}"
    );
    let (result, out, progress) = run(&emptied, "skip").await;
    result.unwrap();
    assert_eq!(crate::util::ints(&out.batches(), "_offset"), vec![0, 2, 4]);
    assert_eq!(
        crate::util::skipped(&progress),
        2,
        "a tombstone, a bad record"
    );
}

/// Produces one JSON row `{"id": i}` per key, keyed by its bytes.
fn produce_keyed(bootstrap: &str, topic: &str, keys: &[&[u8]]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("{{\"id\": {i}, \"name\": \"n{i}\"}}");
        producer
            .send(BaseRecord::to(topic).key(*key).payload(&value).partition(0))
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// A key that is not UTF-8 text is never merged with another: `_key` is a
/// VARCHAR, so where a query reads it such a record is a bad record (named,
/// skipped or dead-lettered), and where it does not the record is read as
/// any other. A `BYTES` key column (`'key.format' = 'raw'`) reads binary
/// keys exactly: two keys that text with replacement characters would make
/// one stay two groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_keys_are_never_merged_as_text() {
    use sluice::arrow::array::{Array, AsArray};
    use sluice::arrow::datatypes::{DataType, Field, Schema};
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic("binary-keys");
    create_topic(&bootstrap, &topic, 1).await.unwrap();
    // 0xff 0x01 and 0xfe 0x01 are both "\u{fffd}\u{1}" as lossy text.
    let keys: Vec<&[u8]> = vec![&[0xff, 0x01], &[0xfe, 0x01], b"a", &[0xff, 0x01]];
    assert_eq!(
        String::from_utf8_lossy(keys[0]),
        String::from_utf8_lossy(keys[1])
    );
    {
        let (b, t) = (bootstrap.clone(), topic.clone());
        let owned: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        tokio::task::spawn_blocking(move || {
            let keys: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            produce_keyed(&b, &t, &keys)
        })
        .await
        .unwrap();
    }
    let run = |columns: Vec<Expr>, on_error: &str| {
        let (bootstrap, topic, on_error) = (bootstrap.clone(), topic.clone(), on_error.to_string());
        async move {
            let out = sluice::MemorySink::new();
            let query =
                crate::util::kafka_stream(&bootstrap, &topic, &[("format.on-error", &on_error)])
                    .select(columns)
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
    // Not reading `_key`: every record is a row.
    let (result, out, progress) = run(vec![col("id")], "fail").await;
    result.unwrap();
    assert_eq!(crate::util::ints(&out.batches(), "id"), vec![0, 1, 2, 3]);
    assert_eq!(crate::util::skipped(&progress), 0);
    // Reading it: the binary keys are bad records.
    let (result, _, _) = run(vec![col("id"), col("_key")], "fail").await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains(&format!("topic '{topic}', partition 0, offset 0"))
            && err.contains("not UTF-8 text")
            && err.contains("BYTES"),
        "{err}"
    );
    let (result, out, progress) = run(vec![col("id"), col("_key")], "skip").await;
    result.unwrap();
    let batches = out.batches();
    assert_eq!(crate::util::ints(&batches, "id"), vec![2]);
    assert_eq!(crate::util::skipped(&progress), 3);

    // The key as a BYTES column: one group per distinct key.
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Binary, false),
        Field::new("id", DataType::Int64, false),
    ]));
    let out = sluice::MemorySink::new();
    let query = Session::new()
        .read_stream()
        .format("kafka")
        .option("topic", topic.clone())
        .option("bootstrap.servers", bootstrap.clone())
        .option("key.format", "raw")
        .option("key.fields", "k")
        .option("value.fields-include", "EXCEPT_KEY")
        .schema(schema)
        .load()
        .unwrap()
        .aggregate(
            vec![col("k")],
            vec![sluice::datafusion::functions_aggregate::expr_fn::count(col("id")).alias("n")],
        )
        .unwrap()
        .write_stream()
        .memory(&out)
        .output_mode(sluice::OutputMode::Update)
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    let mut groups: Vec<(Vec<u8>, i64)> = Vec::new();
    for b in out.batches() {
        let k = b.column_by_name("k").unwrap().as_binary::<i32>();
        let n = crate::util::ints(std::slice::from_ref(&b), "n");
        for (i, n) in n.into_iter().enumerate() {
            assert!(k.is_valid(i));
            groups.retain(|(key, _)| key.as_slice() != k.value(i));
            groups.push((k.value(i).to_vec(), n));
        }
    }
    groups.sort();
    let mut want: Vec<(Vec<u8>, i64)> = Vec::new();
    for k in &keys {
        match want.iter_mut().find(|(w, _)| w.as_slice() == *k) {
            Some((_, n)) => *n += 1,
            None => want.push((k.to_vec(), 1)),
        }
    }
    want.sort();
    assert_eq!(groups, want);
    assert_eq!(groups.len(), 3);
}

/// `scan.startup.mode = 'latest'` is resolved once, when the query first
/// starts, and recorded: records that arrive while it is stopped, before
/// its first epoch, are read by the next run rather than skipped by a
/// `latest` resolved again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_is_resolved_once_and_what_arrives_before_the_first_epoch_is_read() {
    let (bootstrap, input) = topic_with("latest", 0..5).await;
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let (bootstrap, input, dir) = (bootstrap.clone(), input.clone(), dir.path().to_path_buf());
        async move {
            let out = sluice::MemorySink::new();
            let query =
                crate::util::kafka_stream(&bootstrap, &input, &[("scan.startup.mode", "latest")])
                    .select(vec![col("id")])
                    .unwrap()
                    .write_stream()
                    .memory(&out)
                    .checkpoint_location(dir)
                    .trigger(Trigger::AvailableNow)
                    .start()
                    .await
                    .unwrap();
            query.await_termination().await.unwrap();
            crate::util::ints(&out.batches(), "id")
        }
    };
    assert_eq!(run().await, Vec::<i64>::new(), "latest: nothing yet");
    let (b, i) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_plain(&b, &i, 5..10))
        .await
        .unwrap();
    assert_eq!(run().await, (5..10).collect::<Vec<_>>());
}

/// The progress topic is checked, not trusted: an existing one with more
/// than one partition, or without compaction, is refused before anything is
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_topic_of_the_wrong_shape_is_refused() {
    let bootstrap = crate::util::broker().await;
    let output = fresh_topic("shape-out");
    create_topic(&bootstrap, &output, 1).await.unwrap();
    // Two partitions; one partition but deleted by retention.
    let (two, deleting) = (fresh_topic("progress-two"), fresh_topic("progress-delete"));
    create_topic(&bootstrap, &two, 2).await.unwrap();
    create_topic(&bootstrap, &deleting, 1).await.unwrap();
    for (progress, shape) in [
        (&two, "2 partition(s)"),
        (&deleting, "cleanup.policy=delete"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let err = Session::new()
            .read_stream()
            .format("rate")
            .load()
            .unwrap()
            .write_stream()
            .format("kafka")
            .option("topic", output.clone())
            .option("bootstrap.servers", bootstrap.clone())
            .option("progress.topic", progress.clone())
            .checkpoint_location(dir.path())
            .start()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("progress topic '{progress}'"))
                && err.contains(shape)
                && err.contains("needs 1 partition"),
            "{err}"
        );
    }
    assert!(
        read(&bootstrap, &output).await.is_empty(),
        "nothing written"
    );
}

/// A query whose stream now reads another topic, restarted on the
/// checkpoint of the running one: its offsets belong to the old topic, so
/// it is refused, naming both topics, before its sink opens — the running
/// instance is not fenced and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_pointed_at_another_topic_is_refused_before_it_fences_the_running_one() {
    let bootstrap = crate::util::broker().await;
    let (first, second, output) = (
        fresh_topic("moved-a"),
        fresh_topic("moved-b"),
        fresh_topic("moved-out"),
    );
    for t in [&first, &second, &output] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    produce_plain(&bootstrap, &first, 0..20);
    produce_plain(&bootstrap, &second, 0..20);
    let dir = tempfile::tempdir().unwrap();
    let sql = |topic: &str| {
        format!(
            "SET 'pipeline.name' = 'moved-{output}';\n\
             SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger' = '200 ms';\n\
             CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{topic}', 'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM dst WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO dst SELECT id, name FROM src;\n",
            cp = dir.path().display()
        )
    };
    let session = Session::new();
    let running = crate::util::start_sql(&session, &sql(&first)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while running
        .last_progress()
        .is_none_or(|p| p.num_input_rows == 0)
    {
        assert!(running.is_active(), "{:?}", running.exception());
        assert!(Instant::now() < deadline, "no epoch committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let err = Session::new()
        .sql(&sql(&second))
        .await
        .map(|_| ())
        .expect_err("the changed query is refused")
        .to_string();
    assert!(
        err.contains(&format!("kafka topic {first}"))
            && err.contains(&format!("kafka topic {second}")),
        "{err}"
    );
    produce_plain(&bootstrap, &first, 20..30);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        running.is_active(),
        "the running instance was not fenced: {:?}",
        running.exception()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = ids(read(&bootstrap, &output).await);
        if got.len() >= 30 {
            assert_eq!(got, (0..30).collect::<Vec<_>>());
            break;
        }
        assert!(Instant::now() < deadline, "{got:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.stop().await.unwrap();
}

/// An epoch's input is capped in records and in bytes: from the second
/// epoch on, at most 'max-bytes-per-epoch' of records at the average size
/// read so far, so one epoch stays within memory and the transaction
/// timeout whatever the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_reads_at_most_its_record_and_byte_caps() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("byte-cap");
    create_topic(&bootstrap, &input, 1).await.unwrap();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .create()
            .unwrap();
        // About 422 bytes each: 2 KiB holds 4 of them.
        for i in 0..30 {
            let v = format!("{{\"id\": {i:2}, \"name\": \"{}\"}}", "x".repeat(400));
            producer
                .send(BaseRecord::<(), _>::to(&t).payload(&v).partition(0))
                .unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    })
    .await
    .unwrap();
    let out = sluice::MemorySink::new();
    let query = crate::util::kafka_stream(
        &bootstrap,
        &input,
        &[
            ("max-records-per-epoch", "10"),
            ("max-bytes-per-epoch", "2 KiB"),
        ],
    )
    .select(vec![col("id")])
    .unwrap()
    .write_stream()
    .memory(&out)
    .trigger(Trigger::AvailableNow)
    .start()
    .await
    .unwrap();
    query.await_termination().await.unwrap();
    let per_epoch: Vec<u64> = query
        .recent_progress()
        .iter()
        .map(|p| p.num_input_rows)
        .collect();
    assert_eq!(per_epoch, vec![10, 4, 4, 4, 4, 4]);
    assert_eq!(
        crate::util::ints(&out.batches(), "id"),
        (0..30).collect::<Vec<_>>()
    );
}

/// A checkpoint store that refuses the query (credentials it does not
/// accept, a bucket that does not exist) stops it at once with the reason:
/// no retry changes a refusal, so it is no outage to wait out for
/// 'outage.limit' (set to 10 minutes here), whether it refuses at the
/// start or while the query runs (its bucket deleted). Against the tests'
/// real S3-compatible server, which checks signatures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_store_that_refuses_the_query_stops_it_at_once() {
    let (bootstrap, input) = topic_with("store-refuses", 0..5).await;
    let s3 = crate::util::object_store().await;
    let dir = tempfile::tempdir().unwrap();
    // A bucket of this test's own (the server's buckets are directories),
    // deleted while the query runs.
    let bucket = fresh_topic("own-bucket");
    std::fs::create_dir_all(s3.data.join(&bucket)).unwrap();
    for (case, location, secret, reason) in [
        (
            "wrong secret",
            format!("s3://{}/{bucket}", s3.bucket),
            Some("not-the-secret"),
            "refuses these credentials",
        ),
        (
            "no bucket",
            format!("s3://no-such-{bucket}/cp"),
            None,
            "does not exist",
        ),
        (
            "bucket deleted",
            format!("s3://{bucket}/cp"),
            None,
            "does not exist",
        ),
    ] {
        let sql = dir.path().join(format!("{}.sql", case.replace(' ', "-")));
        std::fs::write(
            &sql,
            format!(
                "SET 'checkpoint.location' = '{location}';\n\
                 SET 'outage.limit' = '10 minutes';\n\
                 SET 'trigger.interval' = '100 ms';\n\
                 CREATE STREAM events (id BIGINT) WITH (connector = 'kafka', topic = '{input}', \
                   'bootstrap.servers' = '{bootstrap}', format = 'json');\n\
                 CREATE STREAM out WITH (connector = 'kafka', topic = '{}', \
                   'bootstrap.servers' = '{bootstrap}');\n\
                 INSERT INTO out SELECT id FROM events;\n",
                fresh_topic("store-refuses-out")
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        for (k, v) in &s3.env {
            match (k.as_str(), secret) {
                ("AWS_SECRET_ACCESS_KEY", Some(wrong)) => cmd.env(k, wrong),
                _ => cmd.env(k, v),
            };
        }
        let mut run = crate::util::Run::new(cmd);
        if case == "bucket deleted" {
            // Once it has committed there, the bucket goes, and new input
            // makes an epoch that must write to it.
            let commits = s3.data.join(&bucket).join("cp");
            let deadline = Instant::now() + Duration::from_secs(60);
            while std::fs::read_dir(&commits).map_or(0, |d| d.count()) == 0 {
                assert!(run.running(), "{}", run.stderr());
                assert!(Instant::now() < deadline, "no commit: {}", run.stderr());
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(Duration::from_millis(500));
            std::fs::remove_dir_all(s3.data.join(&bucket)).unwrap();
            let (b, t) = (bootstrap.clone(), input.clone());
            tokio::task::spawn_blocking(move || produce_plain(&b, &t, 5..10))
                .await
                .unwrap();
        }
        let status = run.wait(Duration::from_secs(120));
        let stderr = run.stderr();
        assert!(!status.success(), "{case}: {stderr}");
        assert!(
            stderr.contains("checkpoint store") && stderr.contains(reason),
            "{case}: {stderr}"
        );
    }
}
