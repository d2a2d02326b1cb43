//! How long a query takes to start with a long progress history: the
//! recovery read of the progress topic (shape check, the wait past open
//! transactions, each record validated) against the history it reads.
//!
//! Three cases, each a stateless `sluice run` (files → Kafka, exactly-once,
//! `available-now`) that committed one epoch and then lost its checkpoint
//! directory, so every start recovers from the progress topic alone:
//! - **own, 1**: the query's own progress topic holds its one record;
//! - **own, N**: the same topic then holds N more epochs of the query
//!   (appended as the query writes them: same record, growing epochs);
//! - **shared, N**: a progress topic shared with another query, whose N
//!   records follow the query's one, so the backward read must pass them.
//!
//! Each round times every case's start, process start to exit (no new
//! input: it recovers, finds nothing to do, and stops), in rotating order.
//!
//!     cargo bench --bench recovery -- [--history N] [--rounds R]
//!
//! The last line of stdout is a JSON object with the medians; a Markdown
//! table precedes it (see benches/README.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice::broker::{ensure_broker, fresh_topic};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One case: a query and how its history was made.
struct Case {
    label: &'static str,
    sql: PathBuf,
    checkpoint: PathBuf,
}

impl Case {
    /// Writes the case's SQL file and runs it once: one epoch committed.
    fn new(
        label: &'static str,
        dir: &Path,
        bootstrap: &str,
        progress_topic: Option<&str>,
    ) -> Result<(Self, String), BoxError> {
        let name = fresh_topic(&format!("recovery-{}", label.replace([' ', ','], "")));
        let checkpoint = dir.join(format!("{name}-checkpoint"));
        let output = fresh_topic("recovery-out");
        let sql = dir.join(format!("{name}.sql"));
        let progress = progress_topic
            .map(|t| format!(", 'progress.topic' = '{t}'"))
            .unwrap_or_default();
        std::fs::write(
            &sql,
            format!(
                "SET 'pipeline.name' = '{name}';\n\
                 SET 'checkpoint.location' = '{cp}';\n\
                 SET 'trigger' = 'available-now';\n\
                 CREATE STREAM rows (id BIGINT, name VARCHAR) WITH (connector = 'files', \
                   path = '{input}', format = 'json');\n\
                 CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
                   'bootstrap.servers' = '{bootstrap}'{progress});\n\
                 INSERT INTO out SELECT id, upper(name) AS name FROM rows;\n",
                cp = checkpoint.display(),
                input = dir.join("input").display(),
            ),
        )?;
        let case = Self {
            label,
            sql,
            checkpoint,
        };
        case.start()?;
        Ok((case, name))
    }

    /// One start after the checkpoint directory was lost: its wall time.
    fn start(&self) -> Result<Duration, BoxError> {
        if self.checkpoint.exists() {
            std::fs::remove_dir_all(&self.checkpoint)?;
        }
        let began = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("run")
            .arg(&self.sql)
            .output()?;
        let took = began.elapsed();
        if !out.status.success() {
            return Err(format!(
                "{}: sluice run failed: {}",
                self.label,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(took)
    }
}

/// The last record of partition 0 of `topic` (read_committed).
fn last_record(bootstrap: &str, topic: &str) -> Result<(Vec<u8>, Vec<u8>), BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sluice-bench-recovery")
        .set("isolation.level", "read_committed")
        .create()?;
    let (low, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Some((
                    m.key().unwrap_or_default().to_vec(),
                    m.payload().unwrap_or_default().to_vec(),
                ));
                if m.offset() + 1 >= high {
                    break;
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    last.ok_or_else(|| format!("no record in '{topic}'").into())
}

/// Appends `n` records to `topic` in one transaction: `(key, value)` for
/// each number from 1.
fn append(
    bootstrap: &str,
    topic: &str,
    n: u64,
    record: impl Fn(u64) -> (Vec<u8>, Vec<u8>),
) -> Result<(), BoxError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", fresh_topic("recovery-history"))
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    for i in 1..=n {
        let (key, value) = record(i);
        loop {
            match producer.send(BaseRecord::to(topic).key(&key).payload(&value)) {
                Ok(()) => break,
                Err((e, _))
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
                {
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }
    producer.commit_transaction(Duration::from_secs(60))?;
    Ok(())
}

/// The query's record `value` as epoch `epoch`.
fn with_epoch(value: &[u8], epoch: u64) -> Result<Vec<u8>, BoxError> {
    let mut json: serde_json::Value = serde_json::from_slice(value)?;
    json["epoch"] = serde_json::json!(epoch);
    Ok(serde_json::to_vec(&json)?)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), BoxError> {
    let history = arg("--history", 10_000);
    let rounds = arg("--rounds", 5) as usize;
    let bootstrap = ensure_broker()?;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input");
    std::fs::create_dir(&input)?;
    let rows: String = (0..10)
        .map(|i| format!("{{\"id\": {i}, \"name\": \"n{i}\"}}\n"))
        .collect();
    std::fs::write(input.join("0000.json"), rows)?;

    let (own_one, _) = Case::new("own, 1", dir.path(), &bootstrap, None)?;
    let (own_many, id) = Case::new("own, N", dir.path(), &bootstrap, None)?;
    let topic = format!("sluice-progress.{id}");
    let (key, value) = last_record(&bootstrap, &topic)?;
    append(&bootstrap, &topic, history, |i| {
        (key.clone(), with_epoch(&value, 1 + i).unwrap_or_default())
    })?;
    let shared = fresh_topic("recovery-shared-progress");
    let (shared_many, _) = Case::new("shared, N", dir.path(), &bootstrap, Some(&shared))?;
    let (_, other) = last_record(&bootstrap, &shared)?;
    append(&bootstrap, &shared, history, |i| {
        let other_id = b"another-query".to_vec();
        let mut json: serde_json::Value = serde_json::from_slice(&other).unwrap_or_default();
        json["query_id"] = serde_json::json!("another-query");
        json["epoch"] = serde_json::json!(i);
        (other_id, serde_json::to_vec(&json).unwrap_or_default())
    })?;

    let cases = [&own_one, &own_many, &shared_many];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for k in 0..cases.len() {
            let i = (round + k) % cases.len();
            times[i].push(cases[i].start()?.as_secs_f64() * 1e3);
        }
    }
    let medians: Vec<f64> = times.iter().cloned().map(median).collect();
    println!("| case | progress records read past | start to exit, median of {rounds} (ms) | vs own, 1 |");
    println!("| --- | ---: | ---: | ---: |");
    for (i, case) in cases.iter().enumerate() {
        let records = if i == 0 { 1 } else { history + 1 };
        println!(
            "| {} | {records} | {:.0} | {:.2}× |",
            case.label.replace('N', &history.to_string()),
            medians[i],
            medians[i] / medians[0]
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "history": history,
            "rounds": rounds,
            "own_1_ms": medians[0],
            "own_n_ms": medians[1],
            "shared_n_ms": medians[2],
            "all_ms": times,
        })
    );
    Ok(())
}
