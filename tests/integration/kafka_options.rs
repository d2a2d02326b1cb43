//! How Kafka streams are configured: Flink's spellings, session-wide
//! client properties, properties Sluice refuses, `${ENV}` values and
//! compression, against the tests' real broker.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice::broker::{create_topic, fresh_topic};
use sluice::Session;

use crate::kafka::{json_rows, read};
use crate::no_silent_loss::{produce_plain, produce_plain_to, topic_with};

/// The `id` of each JSON record, in offset order.
fn ids(records: &[sluice::broker::ReadRecord]) -> Vec<i64> {
    records
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r.value_str()).unwrap();
            v["id"].as_i64().unwrap()
        })
        .collect()
}

/// Runs `sql` over the input present now, in a new session, with its
/// checkpoint in a temporary directory.
async fn run_available_now(sql: &str) {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n{sql}",
        dir.path().display()
    );
    let query = crate::util::start_sql(&Session::new(), &sql).await;
    query.await_termination().await.unwrap();
}

/// A Flink user's DDL works as written: `CREATE TABLE ... WITH
/// ('connector' = 'kafka')`, `'properties.bootstrap.servers'` (here as a
/// session-wide `SET`), `'properties.group.id'` and `'scan.startup.mode' =
/// 'group-offsets'`, which starts where an existing consumer group stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flink_ddl_with_group_offsets_starts_where_the_group_stopped() {
    let bootstrap = crate::util::broker().await;
    let (input, output) = (fresh_topic("flink-in"), fresh_topic("flink-out"));
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let group = fresh_topic("flink-group");
    {
        let (b, topic, group) = (bootstrap.clone(), input.clone(), group.clone());
        tokio::task::spawn_blocking(move || {
            produce_plain(&b, &topic, 0..10);
            // Another consumer of the group read the first four.
            let consumer: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &b)
                .set("group.id", &group)
                .create()
                .unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(4))
                .unwrap();
            consumer.commit(&tpl, CommitMode::Sync).unwrap();
        })
        .await
        .unwrap();
    }
    run_available_now(&format!(
        "SET 'properties.bootstrap.servers' = '{bootstrap}';\n\
         CREATE TABLE orders (id BIGINT, name VARCHAR) WITH (\n\
           'connector' = 'kafka',\n\
           'topic' = '{input}',\n\
           'properties.group.id' = '{group}',\n\
           'scan.startup.mode' = 'group-offsets',\n\
           'format' = 'json'\n\
         );\n\
         CREATE TABLE copy WITH ('connector' = 'kafka', 'topic' = '{output}');\n\
         INSERT INTO copy SELECT id FROM orders;",
    ))
    .await;
    assert_eq!(
        ids(&read(&bootstrap, &output).await),
        (4..10).collect::<Vec<_>>()
    );
}

/// Client properties that would undo a guarantee are refused at the option
/// that sets them, saying why; nothing is read or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_that_would_undo_a_guarantee_are_refused_at_the_option() {
    let cases = [
        (
            "source",
            "'kafka.isolation.level' = 'read_uncommitted'",
            "read_committed",
        ),
        (
            "source",
            "'properties.enable.auto.commit' = 'true'",
            "checkpoint",
        ),
        (
            "source",
            "'kafka.auto.offset.reset' = 'latest'",
            "scan.startup.mode",
        ),
        ("sink", "'kafka.acks' = '1'", "acks=all"),
        ("sink", "'kafka.enable.idempotence' = 'false'", "idempotent"),
        (
            "sink",
            "'kafka.transactional.id' = 'mine'",
            "sink.transactional-id-prefix",
        ),
    ];
    for (side, option, why) in cases {
        let (source_extra, sink_extra) = match side {
            "source" => (format!(", {option}"), String::new()),
            _ => (String::new(), format!(", {option}")),
        };
        let sql = format!(
            "CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = 'in', \
               'bootstrap.servers' = '127.0.0.1:9'{source_extra});\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = 'out', \
               'bootstrap.servers' = '127.0.0.1:9'{sink_extra});\n\
             INSERT INTO out SELECT id FROM input;"
        );
        let err = match Session::new().sql(&sql).await {
            Ok(_) => panic!("{option} was accepted"),
            Err(e) => e,
        };
        let key = option.split('\'').nth(1).unwrap();
        assert!(
            err.message.contains(&format!("'{key}' cannot be set")) && err.message.contains(why),
            "{option}: {err}"
        );
        let line = if side == "source" { 1 } else { 2 };
        let column = sql.lines().nth(line - 1).unwrap().find(key).unwrap();
        assert_eq!(
            (err.line, err.column),
            (line as u64, column as u64),
            "{err}"
        );
    }
}

/// `${NAME}` takes an option's value from the environment; an unset one is
/// named at the value, without running anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_environment_variable_is_named_at_its_value() {
    let sql = "CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = 'in',\n\
               'bootstrap.servers' = '127.0.0.1:9', 'kafka.sasl.password' = '${SLUICE_TEST_SURELY_UNSET}');";
    let err = match Session::new().sql(sql).await {
        Ok(_) => panic!("an unset variable was accepted"),
        Err(e) => e,
    };
    assert!(
        err.message
            .contains("environment variable 'SLUICE_TEST_SURELY_UNSET'")
            && err.message.contains("not set"),
        "{err}"
    );
    let column = sql.lines().nth(1).unwrap().find("'${").unwrap() + 1;
    assert_eq!((err.line, err.column), (2, column as u64), "{err}");
}

/// A zstd-compressed input topic is read, and the sink compresses as
/// `'kafka.compression.type'` says: the output partition's log on the
/// broker's disk is a fraction of the records' size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_topic_is_read_and_the_output_compressed_as_configured() {
    let bootstrap = crate::util::broker().await;
    let (input, output) = (fresh_topic("zstd-in"), fresh_topic("zstd-out"));
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    const ROWS: i64 = 2_000;
    {
        let (b, topic) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || {
            let producer: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &b)
                .set("compression.type", "zstd")
                .set("linger.ms", "50")
                .create()
                .unwrap();
            for v in json_rows(0..ROWS) {
                producer
                    .send(BaseRecord::<(), _>::to(&topic).payload(&v))
                    .unwrap();
            }
            producer.flush(Duration::from_secs(30)).unwrap();
        })
        .await
        .unwrap();
    }
    run_available_now(&format!(
        "SET 'kafka.bootstrap.servers' = '{bootstrap}';\n\
         CREATE STREAM input (id BIGINT, name VARCHAR) WITH (connector = 'kafka', topic = '{input}');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
           'kafka.compression.type' = 'zstd');\n\
         INSERT INTO out SELECT id, name, repeat(name, 40) AS padding FROM input;",
    ))
    .await;
    let records = read(&bootstrap, &output).await;
    assert_eq!(ids(&records), (0..ROWS).collect::<Vec<_>>());
    let bytes: usize = records.iter().map(|r| r.value_str().len()).sum();
    let on_disk = partition_log_bytes(&output);
    assert!(
        on_disk * 5 < bytes,
        "{on_disk} bytes on disk for {bytes} bytes of records: not compressed"
    );
}

/// The size of partition 0's log segments of `topic` on the tests' broker.
fn partition_log_bytes(topic: &str) -> usize {
    let out = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
        .arg("logs")
        .env(
            "SLUICE_KAFKA_PORT",
            crate::util::test_broker_port().to_string(),
        )
        .output()
        .unwrap();
    let log = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let partition = log
        .parent()
        .unwrap()
        .join("data")
        .join(format!("{topic}-0"));
    std::fs::read_dir(&partition)
        .unwrap_or_else(|e| panic!("{}: {e}", partition.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().unwrap().len() as usize)
        .sum()
}

/// `'purge-committed'` deletes the records a query has committed past,
/// and only those: the first commit deletes what its epoch read (later
/// deletions wait 10 s), never what the next epoch, read while that
/// commit ran, still needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_committed_deletes_what_the_first_epoch_committed_and_no_more() {
    use sluice::datafusion::prelude::col;
    let (bootstrap, input) = topic_with("purge", 0..30).await;
    let out = sluice::MemorySink::new();
    let query = crate::util::kafka_stream(
        &bootstrap,
        &input,
        &[("max-records-per-epoch", "10"), ("purge-committed", "true")],
    )
    .select(vec![col("id")])
    .unwrap()
    .write_stream()
    .memory(&out)
    .trigger(sluice::Trigger::AvailableNow)
    .start()
    .await
    .unwrap();
    query.await_termination().await.unwrap();
    assert_eq!(
        crate::util::ints(&out.batches(), "id"),
        (0..30).collect::<Vec<_>>(),
        "every record was read before it was deleted"
    );
    let (b, t) = (bootstrap.clone(), input.clone());
    let low = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .create()
            .unwrap();
        // The deletion runs in the background: wait for it (30 s at most).
        let mut low = 0;
        for _ in 0..300 {
            low = consumer
                .fetch_watermarks(&t, 0, Duration::from_secs(10))
                .unwrap()
                .0;
            if low > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        low
    })
    .await
    .unwrap();
    assert_eq!(low, 10, "the first epoch read offsets 0..10");
}

/// A partition added to the topic while a query runs is read from its
/// beginning, without a restart: the partition list is asked for again in
/// the background (every 5 s) and the next plan uses the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_added_while_the_query_runs_is_read_from_its_beginning() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use sluice::datafusion::prelude::col;
    let (bootstrap, input) = topic_with("grows", 0..10).await;
    let out = sluice::MemorySink::new();
    let query = crate::util::kafka_stream(&bootstrap, &input, &[])
        .select(vec![col("id")])
        .unwrap()
        .write_stream()
        .memory(&out)
        .start()
        .await
        .unwrap();
    let read_until = |n: usize| {
        let out = out.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let mut ids = crate::util::ints(&out.batches(), "id");
                if ids.len() >= n || std::time::Instant::now() > deadline {
                    ids.sort_unstable();
                    return ids;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(read_until(10).await, (0..10).collect::<Vec<_>>());

    let admin: AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let added = admin
        .create_partitions(&[NewPartitions::new(&input, 2)], &AdminOptions::new())
        .await
        .unwrap();
    assert!(added.iter().all(|r| r.is_ok()), "{added:?}");
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || {
        // A producer that does not know partition 1 yet drops what is sent
        // there (a delivery error nobody reads): wait until the broker
        // names it, and check the records arrived.
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .create()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while consumer
            .fetch_metadata(Some(&t), Duration::from_secs(10))
            .unwrap()
            .topics()
            .iter()
            .all(|topic| topic.partitions().len() < 2)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the broker never named partition 1"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        produce_plain_to(&b, &t, 1, 10..20);
        let (_, end) = consumer
            .fetch_watermarks(&t, 1, Duration::from_secs(10))
            .unwrap();
        assert_eq!(end, 10, "the records reached partition 1");
    })
    .await
    .unwrap();
    assert_eq!(
        read_until(20).await,
        (0..20).collect::<Vec<_>>(),
        "the new partition's records, each once, within 60 s"
    );
    query.stop().await.unwrap();
}
