//! End-to-end latency at a fixed input rate, exactly-once, as an outside
//! client measures it.
//!
//! Three processes: a producer (this bench run again with `--role
//! produce`) writes Nexmark-shaped bids at `--rate` events per second
//! (paced on the wall clock, `linger.ms=1`), each stamped with its send
//! time in microseconds and a sequence number; Sluice (this process) runs
//! the Nexmark q0 pass-through from that topic to another with the
//! transactional sink and a `--interval-ms` processing-time trigger (`0`:
//! epochs back to back); a reader (`--role consume`) reads the output
//! `read_committed` and takes each record's receive time minus its send
//! stamp: everything a downstream reader waits for (the wait for the next
//! epoch, reading, computing, the transaction commit, the fetch that sees
//! it). Before Sluice runs, the same producer and reader measure the floor:
//! the reader on the input topic itself.
//!
//! After the producer stops, the reader drains until it has every record
//! sent (or fails after 60 s), and checks that each arrived exactly once.
//! The first `--warmup-seconds` of sends are left out of the percentiles.
//!
//!     cargo bench --bench latency -- [--rate 10000] [--seconds 30]
//!         [--warmup-seconds 5] [--interval-ms 100] [--no-floor]
//!         [--set KEY=VALUE]...
//!
//! Each `--set` becomes a `SET 'KEY' = 'VALUE'` before the query: e.g.
//! `--set kafka.linger.ms=1` tries a client setting on every Kafka client
//! of the query.
//!
//! `SLUICE_LOG` (a tracing filter such as `debug`) prints the engine's and
//! librdkafka's logs to stderr with their times.
//!
//! The five slowest epochs are printed phase by phase with the time each
//! was planned, to set beside the broker's collector pauses
//! (`scripts/kafka gc-log`): a slow commit during a pause is the broker's.
//!
//! The last line of stdout is a JSON object (see benches/README.md).

mod common;

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice::broker::{create_topic, ensure_broker, fresh_topic};

const PARTITIONS: i32 = 2;

/// How long the reader waits for the last records after the producer
/// stopped.
const DRAIN: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn required(name: &str) -> Result<String, BoxError> {
    common::flag(name).ok_or_else(|| format!("{name} is required").into())
}

/// `--role produce`: writes `--rate` bids per second to `--topic` for
/// `--seconds`, then prints how many.
fn produce() -> Result<(), BoxError> {
    let (bootstrap, topic) = (required("--bootstrap")?, required("--topic")?);
    let rate = common::number("--rate", 10_000);
    let seconds = common::number("--seconds", 30);
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "1")
        .create()?;
    let start = Instant::now();
    let end = Duration::from_secs(seconds);
    let mut sent = 0u64;
    let mut value = String::new();
    while start.elapsed() < end {
        // Send what is due by now, then wait for the next millisecond.
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            use std::fmt::Write as _;
            value.clear();
            write!(
                value,
                "{{\"auction\":{},\"bidder\":{},\"price\":{},\"channel\":\"channel-{}\",\"url\":\"https://www.nexmark.com/item.htm?query=1\",\"dateTime\":{},\"extra\":\"\",\"seq\":{sent},\"sent_us\":{}}}",
                1000 + sent % 10_000,
                sent * 7 % 100_000,
                sent % 5000,
                sent % 4,
                now_us() / 1000,
                now_us()
            )?;
            let mut record = BaseRecord::<(), _>::to(&topic)
                .payload(&value)
                .partition((sent % PARTITIONS as u64) as i32);
            // A full queue waits for deliveries (at 100 K events/s it can
            // fill while the broker is busy); anything else is an error.
            loop {
                match p.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        p.poll(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(format!("producing the input: {e}").into()),
                }
            }
            sent += 1;
        }
        p.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    p.flush(Duration::from_secs(30))?;
    println!("{sent}");
    Ok(())
}

/// `--role consume`: reads `--topic` `read_committed` from the start;
/// stdin's one line says how many records were sent, and the reader stops
/// when it has them all (or after [`DRAIN`]). Prints a JSON summary of the
/// latencies of records sent at or after `--measured-from-us`.
fn consume() -> Result<(), BoxError> {
    let (bootstrap, topic) = (required("--bootstrap")?, required("--topic")?);
    let measured_from = required("--measured-from-us")?.parse::<i64>()?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", fresh_topic("latency-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // A reader that wants low latency does not let the broker hold a
        // fetch for the default 500 ms.
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    // u64::MAX until the producer says how many it sent.
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    {
        let expected = Arc::clone(&expected);
        std::thread::spawn(move || {
            let mut line = String::new();
            if std::io::stdin().lock().read_line(&mut line).is_ok() {
                if let Ok(n) = line.trim().parse() {
                    expected.store(n, Ordering::Relaxed);
                }
            }
        });
    }
    let mut seen = Vec::<bool>::new();
    let (mut received, mut duplicates) = (0u64, 0u64);
    let mut latencies_us = Vec::new();
    let mut drain_since: Option<Instant> = None;
    loop {
        let want = expected.load(Ordering::Relaxed);
        if received >= want {
            break;
        }
        if want != u64::MAX && drain_since.get_or_insert_with(Instant::now).elapsed() > DRAIN {
            break;
        }
        let Some(m) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let at = now_us();
        let m = m?;
        let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
        let (Some(seq), Some(sent_us)) = (value["seq"].as_u64(), value["sent_us"].as_i64()) else {
            return Err(format!("a record without seq and sent_us: {value}").into());
        };
        let seq = seq as usize;
        if seen.len() <= seq {
            seen.resize(seq + 1, false);
        }
        if std::mem::replace(&mut seen[seq], true) {
            duplicates += 1;
            continue;
        }
        received += 1;
        if sent_us >= measured_from {
            latencies_us.push((at - sent_us) as f64 / 1000.0);
        }
    }
    let sorted = common::sorted(latencies_us);
    let p = |q: f64| common::percentile(&sorted, q);
    println!(
        "{}",
        serde_json::json!({
            "received": received,
            "duplicates": duplicates,
            "measured": sorted.len(),
            "p50": p(0.5),
            "p99": p(0.99),
            "p999": p(0.999),
            "max": sorted.last().copied().unwrap_or_default(),
        })
    );
    Ok(())
}

/// A producer and a reader as processes of their own: the producer writes
/// `input` for `seconds`, the reader reads `output` until it has all.
/// Returns (sent, the reader's summary).
fn measure(
    bootstrap: &str,
    input: &str,
    output: &str,
    rate: u64,
    seconds: u64,
    warmup: u64,
) -> Result<(u64, serde_json::Value), BoxError> {
    let me = std::env::current_exe()?;
    let measured_from = now_us() + (warmup * 1_000_000) as i64;
    let mut reader = Command::new(&me)
        .args([
            "--role",
            "consume",
            "--bootstrap",
            bootstrap,
            "--topic",
            output,
        ])
        .args(["--measured-from-us", &measured_from.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let producer = Command::new(&me)
        .args([
            "--role",
            "produce",
            "--bootstrap",
            bootstrap,
            "--topic",
            input,
        ])
        .args(["--rate", &rate.to_string()])
        .args(["--seconds", &(warmup + seconds).to_string()])
        .stdout(Stdio::piped())
        .output()?;
    if !producer.status.success() {
        let _ = reader.kill();
        return Err(format!(
            "the producer failed ({}): {}",
            producer.status,
            String::from_utf8_lossy(&producer.stderr).trim()
        )
        .into());
    }
    let sent: u64 = String::from_utf8_lossy(&producer.stdout).trim().parse()?;
    if let Some(mut stdin) = reader.stdin.take() {
        writeln!(stdin, "{sent}")?;
    }
    let out = reader.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("the reader failed: {}", out.status).into());
    }
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let received = summary["received"].as_u64().unwrap_or(0);
    if received != sent || summary["duplicates"].as_u64() != Some(0) {
        return Err(format!("sent {sent}, but the reader got {summary}").into());
    }
    Ok((sent, summary))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    // SLUICE_LOG (a tracing filter) prints the engine's and librdkafka's
    // logs with their times, e.g. with `--set kafka.debug=eos` to follow
    // each transaction through the client.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    match common::flag("--role").as_deref() {
        Some("produce") => return produce(),
        Some("consume") => return consume(),
        _ => {}
    }
    let rate = common::number("--rate", 10_000);
    let seconds = common::number("--seconds", 30);
    let warmup = common::number("--warmup-seconds", 5);
    let interval = Duration::from_millis(common::number("--interval-ms", 100));
    let bootstrap = tokio::task::spawn_blocking(ensure_broker).await??;

    let floor = if std::env::args().any(|a| a == "--no-floor") {
        None
    } else {
        let topic = fresh_topic("latency-floor");
        create_topic(&bootstrap, &topic, PARTITIONS).await?;
        let b = bootstrap.clone();
        let (_, summary) =
            tokio::task::spawn_blocking(move || measure(&b, &topic, &topic, rate, seconds, warmup))
                .await??;
        eprintln!("floor (the reader on the input itself): {summary}");
        Some(summary)
    };

    let (input, output) = (fresh_topic("latency-in"), fresh_topic("latency-out"));
    create_topic(&bootstrap, &input, PARTITIONS).await?;
    create_topic(&bootstrap, &output, PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let session = sluice::Session::new();
    let progress = common::collect_progress(&session);
    let sets: String = std::env::args()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "--set")
        .filter_map(|w| w[1].split_once('='))
        .map(|(k, v)| format!("SET '{k}' = '{v}';\n"))
        .collect();
    let sql = format!(
        "{sets}SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger.interval' = '{ms} ms';\n\
         CREATE STREAM bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, \
           url VARCHAR, \"dateTime\" BIGINT, extra VARCHAR, seq BIGINT, sent_us BIGINT) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           'scan.startup.mode' = 'earliest'{source_options});\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO out SELECT auction, bidder, price, \"dateTime\", seq, sent_us FROM bid;\n",
        cp = dir.path().display(),
        ms = interval.as_millis(),
        source_options = common::flag("--fetch-wait-ms")
            .map(|ms| format!(", 'kafka.fetch.wait.max.ms' = '{ms}'"))
            .unwrap_or_default(),
    );
    let query = session
        .sql(&sql)
        .await?
        .into_iter()
        .find_map(|o| match o {
            sluice::StatementOutcome::Started(q) => Some(q),
            _ => None,
        })
        .ok_or("the latency query did not start")?;
    eprintln!("{rate} events/s for {seconds} s ({warmup} s warm-up), epochs every {interval:?}");
    let (b, i, o) = (bootstrap.clone(), input.clone(), output.clone());
    let measured =
        tokio::task::spawn_blocking(move || measure(&b, &i, &o, rate, seconds, warmup)).await?;
    if let Some(e) = query.exception() {
        return Err(format!("the query failed: {e}").into());
    }
    query.stop().await?;
    let (sent, summary) = measured?;

    let progress = progress();
    let p = |v: &[f64], q: f64| common::percentile(v, q);
    let phase = |f: fn(&sluice::QueryProgress) -> f64| {
        let v = common::sorted(progress.iter().map(f).collect());
        serde_json::json!({"p50": p(&v, 0.5), "p99": p(&v, 0.99), "max": v.last().copied().unwrap_or_default()})
    };
    let phases = serde_json::json!({
        "total": phase(|q| q.duration_ms.total),
        "plan": phase(|q| q.duration_ms.plan),
        "read": phase(|q| q.duration_ms.read),
        "compute": phase(|q| q.duration_ms.compute),
        "commit": phase(|q| q.duration_ms.commit),
    });
    // The slowest epochs, phase by phase: where a tail comes from.
    let mut slowest: Vec<&sluice::QueryProgress> = progress.iter().collect();
    slowest.sort_by(|a, b| b.duration_ms.total.total_cmp(&a.duration_ms.total));
    for q in slowest.iter().take(5) {
        eprintln!(
            "slow epoch {} (planned {}): total {:.1} ms = plan {:.1} + read {:.1} + compute \
             {:.1} + commit {:.1}; {} rows",
            q.epoch,
            q.timestamp,
            q.duration_ms.total,
            q.duration_ms.plan,
            q.duration_ms.read,
            q.duration_ms.compute,
            q.duration_ms.commit,
            q.num_input_rows,
        );
    }
    eprintln!("phases ms: {phases}");
    eprintln!("sent {sent}; sluice: {summary}");
    let added = |q: &str| {
        floor
            .as_ref()
            .and_then(|f| Some(summary[q].as_f64()? - f[q].as_f64()?))
    };
    println!(
        "{}",
        serde_json::json!({
            "engine": "sluice",
            "rate": rate,
            "interval_ms": interval.as_millis() as u64,
            "sent": sent,
            "received": summary["received"],
            "measured": summary["measured"],
            "latency_ms_p50": summary["p50"],
            "latency_ms_p99": summary["p99"],
            "latency_ms_max": summary["max"],
            "floor_ms_p50": floor.as_ref().map(|f| f["p50"].clone()),
            "floor_ms_p99": floor.as_ref().map(|f| f["p99"].clone()),
            "floor_ms_max": floor.as_ref().map(|f| f["max"].clone()),
            "added_ms_p99": added("p99"),
            "phase_ms": phases,
            "epochs": progress.len(),
        })
    );
    Ok(())
}
