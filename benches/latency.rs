//! End-to-end latency at a fixed input rate, exactly-once.
//!
//! A producer writes Nexmark-shaped bids to a Kafka topic at `--rate`
//! events per second (paced on the wall clock, `linger.ms=1`); Sluice runs
//! the Nexmark q0 pass-through from that topic to another with the
//! transactional sink and a `--interval-ms` processing-time trigger; a
//! `read_committed` consumer reads the output as it commits. An event's
//! latency is the time the consumer receives its output record minus the
//! producer timestamp of the input record (carried through the query as
//! `_timestamp`): everything a downstream reader waits for — the wait for
//! the next epoch, reading, computing, the transaction commit, and the
//! fetch that sees it.
//!
//!     cargo bench --bench latency -- [--rate 10000] [--seconds 30]
//!         [--warmup-seconds 5] [--interval-ms 100]
//!
//! The last line of stdout is a JSON object (see benches/README.md).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice::broker::{create_topic, ensure_broker, fresh_topic};

const PARTITIONS: i32 = 2;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Writes `rate` bids per second to `topic` until `stop`; returns how many.
fn produce(bootstrap: &str, topic: &str, rate: u64, stop: &AtomicBool) -> Result<u64, BoxError> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "1")
        .create()?;
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // Send what is due by now, then wait for the next millisecond.
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let value = format!(
                "{{\"auction\":{},\"bidder\":{},\"price\":{},\"channel\":\"channel-{}\",\"url\":\"https://www.nexmark.com/item.htm?query=1\",\"dateTime\":{},\"extra\":\"\"}}",
                1000 + sent % 10_000,
                sent * 7 % 100_000,
                sent % 5000,
                sent % 4,
                now_ms()
            );
            let record = BaseRecord::<(), _>::to(topic)
                .payload(&value)
                .partition((sent % PARTITIONS as u64) as i32);
            if let Err((e, _)) = p.send(record) {
                return Err(format!("producing the input: {e}").into());
            }
            sent += 1;
        }
        p.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    p.flush(Duration::from_secs(30))?;
    Ok(sent)
}

/// Reads `topic` with `read_committed` until `stop`; returns each output
/// record's latency in ms (receive time minus the input's producer
/// timestamp), with the input's producer timestamp.
fn consume(bootstrap: &str, topic: &str, stop: &AtomicBool) -> Result<Vec<(i64, f64)>, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", fresh_topic("latency-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // A reader that wants low latency does not let the broker hold a
        // fetch for the default 500 ms.
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Some(m) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let received = now_ms();
        let m = m?;
        let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
        let produced = value["produced_ms"]
            .as_i64()
            .ok_or_else(|| format!("output record without produced_ms: {value}"))?;
        latencies.push((produced, (received - produced) as f64));
    }
    Ok(latencies)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let rate = common::number("--rate", 10_000);
    let seconds = common::number("--seconds", 30);
    let warmup = common::number("--warmup-seconds", 5);
    let interval = Duration::from_millis(common::number("--interval-ms", 100));
    let bootstrap = tokio::task::spawn_blocking(ensure_broker).await??;
    let (input, output) = (fresh_topic("latency-in"), fresh_topic("latency-out"));
    create_topic(&bootstrap, &input, PARTITIONS).await?;
    create_topic(&bootstrap, &output, PARTITIONS).await?;

    let dir = tempfile::tempdir()?;
    let session = sluice::Session::new();
    let progress = common::collect_progress(&session);
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger.interval' = '{ms} ms';\n\
         CREATE STREAM bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, \
           url VARCHAR, \"dateTime\" BIGINT, extra VARCHAR) WITH (connector = 'kafka', \
           topic = '{input}', 'bootstrap.servers' = '{bootstrap}', 'scan.startup.mode' = 'earliest');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO out SELECT auction, bidder, price, \"dateTime\", \
           CAST(_timestamp AS BIGINT) / 1000000 AS produced_ms FROM bid;\n",
        cp = dir.path().display(),
        ms = interval.as_millis(),
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

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (b, t, s) = (bootstrap.clone(), output.clone(), Arc::clone(&stop));
        std::thread::spawn(move || consume(&b, &t, &s))
    };
    let writer = {
        let (b, t, s) = (bootstrap.clone(), input.clone(), Arc::clone(&stop));
        std::thread::spawn(move || produce(&b, &t, rate, &s))
    };
    let measured_from = now_ms() + (warmup * 1000) as i64;
    eprintln!("{rate} events/s for {seconds} s ({warmup} s warm-up), epochs every {interval:?}");
    tokio::time::sleep(Duration::from_secs(warmup + seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let sent = writer.join().map_err(|_| "the producer panicked")??;
    // Let the last epochs commit before the reader stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let latencies = {
        let s = Arc::clone(&stop);
        s.store(true, Ordering::Relaxed);
        reader.join().map_err(|_| "the reader panicked")??
    };
    if let Some(e) = query.exception() {
        return Err(format!("the query failed: {e}").into());
    }
    query.stop().await?;

    let measured = common::sorted(
        latencies
            .iter()
            .filter(|(produced, _)| *produced >= measured_from)
            .map(|(_, l)| *l)
            .collect(),
    );
    if measured.is_empty() {
        return Err(format!(
            "no output after the warm-up ({} records in all)",
            latencies.len()
        )
        .into());
    }
    let progress = progress();
    let epochs = common::sorted(progress.iter().map(|p| p.duration_ms.total).collect());
    let commits = common::sorted(progress.iter().map(|p| p.duration_ms.commit).collect());
    let p = |v: &[f64], q: f64| common::percentile(v, q);
    let phase = |f: fn(&sluice::QueryProgress) -> f64| {
        let v = common::sorted(progress.iter().map(f).collect());
        serde_json::json!({"p50": p(&v, 0.5), "p99": p(&v, 0.99), "max": v.last().copied().unwrap_or_default()})
    };
    let phases = serde_json::json!({
        "plan": phase(|q| q.duration_ms.plan),
        "read": phase(|q| q.duration_ms.read),
        "compute": phase(|q| q.duration_ms.compute),
        "commit": phase(|q| q.duration_ms.commit),
    });
    eprintln!("phases ms: {phases}");
    eprintln!(
        "sent {sent}, received {} ({} measured); latency ms p50 {:.0} p99 {:.0} max {:.0}; \
         epoch ms p50 {:.1} p99 {:.1}; commit ms p50 {:.1}",
        latencies.len(),
        measured.len(),
        p(&measured, 0.5),
        p(&measured, 0.99),
        measured.last().copied().unwrap_or_default(),
        p(&epochs, 0.5),
        p(&epochs, 0.99),
        p(&commits, 0.5),
    );
    println!(
        "{}",
        serde_json::json!({
            "engine": "sluice",
            "rate": rate,
            "interval_ms": interval.as_millis() as u64,
            "sent": sent,
            "received": latencies.len(),
            "measured": measured.len(),
            "latency_ms_p50": p(&measured, 0.5),
            "latency_ms_p99": p(&measured, 0.99),
            "latency_ms_max": measured.last().copied().unwrap_or_default(),
            "epoch_ms_p50": p(&epochs, 0.5),
            "epoch_ms_p99": p(&epochs, 0.99),
            "commit_ms_p50": p(&commits, 0.5),
            "phase_ms": phases,
            "epochs": progress.len(),
        })
    );
    Ok(())
}
