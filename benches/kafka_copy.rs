//! Kafka → Kafka pass-through, exactly-once, against a raw librdkafka copy
//! of the same records on the same broker, and the broker's read and write
//! limits measured beside them.
//!
//! Loads `--records N` records (about 100 bytes each, 2 partitions) into an
//! input topic once, then alternates, `--rounds` times:
//! - **consume-only**: one librdkafka consumer (`read_committed`, partitions
//!   assigned) taking every record a batch at a time
//!   (`rd_kafka_consume_batch_queue`) and dropping it: the read limit.
//! - **produce-only**: the same records, read into memory first, produced
//!   to a fresh topic by one idempotent producer (`acks=all`, batches of up
//!   to 100 000 messages, `linger.ms=5`): the write limit.
//! - **raw copy**: that consumer and that producer together, moving each
//!   message's bytes to a fresh topic; no transactions, no decoding: the
//!   best-effort copy.
//! - **Sluice**: `INSERT INTO out SELECT value FROM input` (format `raw` on
//!   both sides), exactly-once sink, epochs back to back, each epoch capped
//!   at the records the raw copy moved in 100 ms and in 1 s
//!   (`max-records-per-epoch`): the "100 ms" and "1 s" epochs; each once
//!   as the sink writes by default and once with epoch headers on every
//!   record (`'sink.epoch-headers' = 'true'`).
//!
//! Each run drains the whole input; its rate is records / wall time from
//! start to the last commit (Sluice), to the last acknowledgement (raw copy,
//! produce-only) or to the last record (consume-only). Every rate is also
//! given as a fraction of the round's consume-only and produce-only rates.
//!
//!     cargo bench --bench kafka_copy -- [--records N] [--rounds R]
//!         [--nexmark-prefix P]
//!
//! With `--nexmark-prefix P` the input is the bid topic `P-bid` that
//! `sluice nexmark load --prefix P` filled (2 partitions), and Sluice runs
//! Nexmark q0 over it instead of the byte pass-through: JSON decoded into
//! the bid's columns and encoded again, against the raw copy of the same
//! records.
//!
//! With `--secure` the bench starts the secured broker (`SLUICE_KAFKA_SECURE=1
//! scripts/kafka start` on `SLUICE_KAFKA_PORT`, default 19192) and runs,
//! side by side in each round over the same input, the Sluice pass-through
//! (epochs of `--per-epoch` records, default 100000) through its PLAINTEXT,
//! SASL_SSL (SCRAM-SHA-512) and SSL (mutual TLS) listeners: the cost of
//! encryption and authentication.
//!
//! The last line of stdout is a JSON object with the medians and ratios;
//! a Markdown table precedes it (see benches/README.md).

mod common;

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice::broker::{create_topic, ensure_broker, fresh_topic};
use sluice::Trigger;
use sluice_kafka::ClientOptions;

const PARTITIONS: i32 = 2;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What Sluice runs over the input.
#[derive(Clone, Copy)]
enum Shape {
    /// `SELECT value`, format `raw` in and out.
    Bytes,
    /// Nexmark q0 over a bid topic, JSON in and out.
    NexmarkQ0,
}

/// Records in `topic` (all partitions).
fn count(bootstrap: &str, topic: &str) -> Result<u64, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let mut n = 0;
    for p in 0..PARTITIONS {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
        n += (high - low) as u64;
    }
    Ok(n)
}

fn send(
    p: &ThreadedProducer<DefaultProducerContext>,
    mut r: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), BoxError> {
    loop {
        match p.send(r) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                back,
            )) => {
                r = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Fills `topic` with `n` JSON-ish records of about 100 bytes.
fn load(bootstrap: &str, topic: &str, n: u64) -> Result<(), BoxError> {
    let p = best_producer(bootstrap)?;
    for i in 0..n {
        let value = format!(
            "{{\"auction\":{},\"bidder\":{},\"price\":{},\"channel\":\"channel-{}\",\"ts\":\"2026-01-01T00:00:00.000Z\"}}",
            1000 + i % 10_000,
            i * 7 % 100_000,
            i % 5000,
            i % 4
        );
        send(
            &p,
            BaseRecord::to(topic)
                .payload(value.as_bytes())
                .partition((i % PARTITIONS as u64) as i32),
        )?;
    }
    p.flush(Duration::from_secs(120))?;
    Ok(())
}

/// The producer of the best-effort clients: Sluice's guarantees without
/// the transaction (idempotent, `acks=all`), with batches as large as
/// librdkafka allows.
fn best_producer(bootstrap: &str) -> Result<ThreadedProducer<DefaultProducerContext>, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.num.messages", "100000")
        .set("batch.size", "16000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// A `read_committed` consumer with every partition of `from` assigned
/// from its beginning.
fn reader(bootstrap: &str, from: &str) -> Result<BaseConsumer, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", fresh_topic("raw-copy"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // librdkafka stops fetching a partition for this long (1 s by
        // default) whenever its queue holds `queued.min.messages`: a copy
        // slower than the fetcher stalled on it every 100 000 records.
        .set("fetch.queue.backoff.ms", "1")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(from, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// Reads the `n` records of `from` a batch at a time, handing each
/// (partition, key, value) to `each`.
fn read_all(
    bootstrap: &str,
    from: &str,
    n: u64,
    mut each: impl FnMut(i32, Option<&[u8]>, Option<&[u8]>) -> Result<(), BoxError>,
) -> Result<(), BoxError> {
    let consumer = reader(bootstrap, from)?;
    let mut batches = common::BatchReader::new(&consumer).ok_or("no consumer queue")?;
    let mut read = 0u64;
    let mut failed = None;
    let mut idle_since: Option<Instant> = None;
    while read < n {
        let got = batches.next(Duration::from_millis(1), |p, k, v| {
            if failed.is_none() {
                if let Err(e) = each(p, k, v) {
                    failed = Some(e);
                }
            }
        })?;
        if let Some(e) = failed.take() {
            return Err(e);
        }
        if got == 0 {
            if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10) {
                return Err(format!("reading {from} stalled at {read} of {n}").into());
            }
        } else {
            idle_since = None;
        }
        read += got as u64;
    }
    Ok(())
}

/// Consume-only: reads every record of `from`; returns records per second.
fn consume_only(bootstrap: &str, from: &str, n: u64) -> Result<f64, BoxError> {
    let start = Instant::now();
    let mut bytes = 0usize;
    read_all(bootstrap, from, n, |_, k, v| {
        bytes += k.map_or(0, <[u8]>::len) + v.map_or(0, <[u8]>::len);
        Ok(())
    })?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    std::hint::black_box(bytes);
    Ok(rate)
}

/// Produce-only: writes `records` (partition, value) to `to`; returns
/// records per second.
fn produce_only(bootstrap: &str, to: &str, records: &[(i32, Vec<u8>)]) -> Result<f64, BoxError> {
    let p = best_producer(bootstrap)?;
    let start = Instant::now();
    for (partition, value) in records {
        send(&p, BaseRecord::to(to).partition(*partition).payload(value))?;
    }
    p.flush(Duration::from_secs(120))?;
    Ok(records.len() as f64 / start.elapsed().as_secs_f64())
}

/// The CPU this process spent since `before` ([`common::cpu_seconds`]),
/// in µs per record of `n` (NaN where the CPU time cannot be read).
fn cpu_us_per_record(before: Option<f64>, n: u64) -> f64 {
    match (before, common::cpu_seconds()) {
        (Some(before), Some(now)) => (now - before) * 1e6 / n as f64,
        _ => f64::NAN,
    }
}

/// Copies every record of `from` to `to`; returns records per second.
fn raw_copy(bootstrap: &str, from: &str, to: &str, n: u64) -> Result<f64, BoxError> {
    let p = best_producer(bootstrap)?;
    let start = Instant::now();
    read_all(bootstrap, from, n, |partition, k, v| {
        let mut r = BaseRecord::to(to).partition(partition);
        if let Some(v) = v {
            r = r.payload(v);
        }
        if let Some(k) = k {
            r = r.key(k);
        }
        send(&p, r)
    })?;
    p.flush(Duration::from_secs(120))?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Runs the pass-through query over the whole input with epochs capped at
/// `per_epoch` records; returns records per second and the median epoch.
async fn sluice_copy(
    client: &ClientOptions,
    from: &str,
    to: &str,
    n: u64,
    per_epoch: u64,
    shape: Shape,
    epoch_headers: bool,
) -> Result<(f64, f64, usize), BoxError> {
    let dir = tempfile::tempdir()?;
    let session = sluice::Session::new();
    let (columns, format, select) = match shape {
        Shape::Bytes => ("", "raw", "SELECT value FROM input"),
        Shape::NexmarkQ0 => (
            "(auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP, extra VARCHAR)",
            "json",
            "SELECT auction, bidder, price, date_time, extra FROM input",
        ),
    };
    let bootstrap = client.bootstrap();
    let mut sql = String::new();
    for (k, v) in client.properties() {
        sql.push_str(&format!("SET 'kafka.{k}' = '{v}';\n"));
    }
    sql.push_str(&format!(
        "CREATE STREAM input {columns} WITH (connector = 'kafka', topic = '{from}', \
           'bootstrap.servers' = '{bootstrap}', format = '{format}', \
           'max-records-per-epoch' = '{per_epoch}');"
    ));
    session.sql(&sql).await?;
    let progress = common::collect_progress(&session);
    let start = Instant::now();
    let query = session
        .sql_frame(select)
        .await?
        .write_stream()
        .format("kafka")
        .option("topic", to)
        .option("bootstrap.servers", bootstrap)
        .option("format", format)
        .options(client.properties().map(|(k, v)| (format!("kafka.{k}"), v)))
        .option("sink.epoch-headers", epoch_headers.to_string())
        .checkpoint_location(dir.path())
        .trigger(Trigger::AvailableNow)
        .start()
        .await?;
    query.await_termination().await?;
    let secs = start.elapsed().as_secs_f64();
    let progress = progress();
    let rows: u64 = progress.iter().map(|p| p.num_input_rows).sum();
    if rows != n {
        return Err(format!("sluice read {rows} of {n} records").into());
    }
    let median = |f: fn(&sluice::QueryProgress) -> f64| {
        common::percentile(&common::sorted(progress.iter().map(f).collect()), 0.5)
    };
    eprintln!(
        "  median phases ms: plan {:.1}, read {:.1}, compute {:.1}, commit {:.1}",
        median(|p| p.duration_ms.plan),
        median(|p| p.duration_ms.read),
        median(|p| p.duration_ms.compute),
        median(|p| p.duration_ms.commit)
    );
    Ok((
        n as f64 / secs,
        median(|p| p.duration_ms.total),
        progress.len(),
    ))
}

/// Prints the Markdown table, then the summary as the last line.
fn report(table: &[String], summary: serde_json::Value) {
    for line in table {
        println!("{line}");
    }
    println!("{summary}");
}

/// `--secure`: the pass-through through each listener of the secured
/// broker, side by side.
async fn secure(n: u64, rounds: usize) -> Result<(), BoxError> {
    let port = std::env::var("SLUICE_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(19192);
    let broker = tokio::task::spawn_blocking(move || sluice::broker::ensure_secure_broker_on(port))
        .await??;
    let per_epoch = common::number("--per-epoch", 100_000);
    let input = fresh_topic("bench-secure-in");
    create_topic(&broker.plaintext, &input, PARTITIONS).await?;
    eprintln!("loading {n} records into {input}");
    let (b, t) = (broker.plaintext.clone(), input.clone());
    tokio::task::spawn_blocking(move || load(&b, &t, n)).await??;
    let listeners = [
        ("PLAINTEXT", ClientOptions::new(broker.plaintext.as_str())),
        ("SASL_SSL (SCRAM-SHA-512)", broker.scram()),
        ("SSL (mutual TLS)", broker.mtls()),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); listeners.len()];
    let mut table = vec![
        format!(
            "| round | {} |",
            listeners
                .iter()
                .map(|(name, _)| format!("{name} rec/s"))
                .collect::<Vec<_>>()
                .join(" | ")
        ),
        format!("| --- |{}", " ---: |".repeat(listeners.len())),
    ];
    for round in 1..=rounds {
        let mut cells = vec![round.to_string()];
        for (i, (name, client)) in listeners.iter().enumerate() {
            let out = fresh_topic("bench-secure-out");
            create_topic(&broker.plaintext, &out, PARTITIONS).await?;
            let (r, epoch_ms, epochs) =
                sluice_copy(client, &input, &out, n, per_epoch, Shape::Bytes, false).await?;
            common::delete_topics(&broker.plaintext, &[&out]).await;
            eprintln!(
                "round {round}: {name}: {r:.0} rec/s, {epochs} epochs, median {epoch_ms:.0} ms"
            );
            rates[i].push(r);
            cells.push(format!("{:.0} K ({epoch_ms:.0} ms epochs)", r / 1e3));
        }
        table.push(format!("| {} |", cells.join(" | ")));
    }
    let medians: Vec<f64> = rates
        .iter()
        .map(|v| common::percentile(&common::sorted(v.clone()), 0.5))
        .collect();
    table.push(format!(
        "| **median** | {} |",
        medians
            .iter()
            .map(|m| format!("**{:.0} K** ({:.2} of PLAINTEXT)", m / 1e3, m / medians[0]))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    report(
        &table,
        serde_json::json!({
            "records": n,
            "rounds": rounds,
            "per_epoch": per_epoch,
            "plaintext_median_rec_per_s": medians[0],
            "sasl_ssl_median_rec_per_s": medians[1],
            "mtls_median_rec_per_s": medians[2],
            "sasl_ssl_of_plaintext": medians[1] / medians[0],
            "mtls_of_plaintext": medians[2] / medians[0],
        }),
    );
    common::delete_topics(&broker.plaintext, &[&input]).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    // The malloc thresholds every query sets, from the start: the limits
    // and the raw copy run with the same allocator as Sluice, in every
    // round.
    sluice::tune_allocator();
    let n = common::number("--records", 2_000_000);
    let rounds = common::number("--rounds", 3) as usize;
    if std::env::args().any(|a| a == "--secure") {
        return secure(n, rounds).await;
    }
    let bootstrap = tokio::task::spawn_blocking(ensure_broker).await??;
    let (input, n, shape) = match common::flag("--nexmark-prefix") {
        Some(prefix) => {
            let input = format!("{prefix}-bid");
            let (b, t) = (bootstrap.clone(), input.clone());
            let n = tokio::task::spawn_blocking(move || count(&b, &t)).await??;
            eprintln!("Nexmark q0 over {input}: {n} records");
            (input, n, Shape::NexmarkQ0)
        }
        None => {
            let input = fresh_topic("bench-copy-in");
            create_topic(&bootstrap, &input, PARTITIONS).await?;
            eprintln!("loading {n} records into {input}");
            let (b, t) = (bootstrap.clone(), input.clone());
            tokio::task::spawn_blocking(move || load(&b, &t, n)).await??;
            (input, n, Shape::Bytes)
        }
    };
    let records = {
        let (b, i) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || {
            let mut records = Vec::with_capacity(n as usize);
            read_all(&b, &i, n, |p, _, v| {
                records.push((p, v.unwrap_or_default().to_vec()));
                Ok(())
            })
            .map(|()| records)
        })
        .await??
    };
    let (mut consumed, mut produced, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    // Sluice's runs: (name in the summary, epoch length in s, epoch headers),
    // each with (rec/s, of raw copy, of consume-only, of produce-only) per round.
    let variants = [
        ("100ms", 0.1, false),
        ("1s", 1.0, false),
        ("100ms_headers", 0.1, true),
        ("1s_headers", 1.0, true),
    ];
    let mut results: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); variants.len()];
    // CPU-µs per record of this process: the raw copy's, and each variant's.
    let mut raw_cpus = Vec::new();
    let mut sluice_cpus: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut table = vec![
        "| round | consume-only rec/s | produce-only rec/s | raw copy rec/s (of consume-only) | Sluice 100 ms epochs rec/s (epoch ms) | of raw copy | Sluice 1 s epochs rec/s (epoch ms) | of raw copy | with epoch headers: 100 ms | of raw copy | 1 s | of raw copy |".to_string(),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_string(),
    ];
    for round in 1..=rounds {
        let read_limit = {
            let (b, i) = (bootstrap.clone(), input.clone());
            tokio::task::spawn_blocking(move || consume_only(&b, &i, n)).await??
        };
        let write_limit = {
            let out = fresh_topic("bench-copy-produce");
            create_topic(&bootstrap, &out, PARTITIONS).await?;
            let b = bootstrap.clone();
            let records = &records;
            let rate = tokio::task::block_in_place(|| produce_only(&b, &out, records))?;
            common::delete_topics(&bootstrap, &[&out]).await;
            rate
        };
        let out = fresh_topic("bench-copy-raw");
        create_topic(&bootstrap, &out, PARTITIONS).await?;
        let cpu = common::cpu_seconds();
        let rate = {
            let (b, i, o) = (bootstrap.clone(), input.clone(), out.clone());
            tokio::task::spawn_blocking(move || raw_copy(&b, &i, &o, n)).await??
        };
        let raw_cpu = cpu_us_per_record(cpu, n);
        common::delete_topics(&bootstrap, &[&out]).await;
        eprintln!(
            "round {round}: consume-only {read_limit:.0}, produce-only {write_limit:.0}, raw copy \
             {rate:.0} rec/s, {raw_cpu:.2} CPU-µs per record (this process)"
        );
        raw_cpus.push(raw_cpu);
        consumed.push(read_limit);
        produced.push(write_limit);
        raw.push(rate);
        let mut cells = vec![
            format!("{round}"),
            format!("{:.0} K", read_limit / 1e3),
            format!("{:.0} K", write_limit / 1e3),
            format!("{:.0} K ({:.2})", rate / 1e3, rate / read_limit),
        ];
        for (((name, interval, headers), results), cpus) in
            variants.iter().zip(&mut results).zip(&mut sluice_cpus)
        {
            let out = fresh_topic("bench-copy-sluice");
            create_topic(&bootstrap, &out, PARTITIONS).await?;
            let per_epoch = ((rate * interval) as u64).max(1);
            let client = ClientOptions::new(bootstrap.as_str());
            let cpu = common::cpu_seconds();
            let (r, epoch_ms, epochs) =
                sluice_copy(&client, &input, &out, n, per_epoch, shape, *headers).await?;
            let sluice_cpu = cpu_us_per_record(cpu, n);
            common::delete_topics(&bootstrap, &[&out]).await;
            eprintln!(
                "round {round}: sluice {name} ({per_epoch} records per epoch): {r:.0} rec/s, \
                 {epochs} epochs, median {epoch_ms:.0} ms, {sluice_cpu:.2} CPU-µs per record"
            );
            results.push((r, r / rate, r / read_limit, r / write_limit));
            cpus.push(sluice_cpu);
            cells.push(format!("{:.0} K ({epoch_ms:.0})", r / 1e3));
            cells.push(format!("{:.2}", r / rate));
        }
        table.push(format!("| {} |", cells.join(" | ")));
    }
    let median = |v: Vec<f64>| common::percentile(&common::sorted(v), 0.5);
    let of = |v: &[(f64, f64, f64, f64)], f: fn(&(f64, f64, f64, f64)) -> f64| {
        median(v.iter().map(f).collect())
    };
    let raw_of_read = median(raw.iter().zip(&consumed).map(|(r, c)| r / c).collect());
    let mut cells = vec![
        "**median**".to_string(),
        format!("**{:.0} K**", median(consumed.clone()) / 1e3),
        format!("**{:.0} K**", median(produced.clone()) / 1e3),
        format!("**{:.0} K ({raw_of_read:.2})**", median(raw.clone()) / 1e3),
    ];
    for r in &results {
        cells.push(format!("**{:.0} K**", of(r, |x| x.0) / 1e3));
        cells.push(format!("**{:.2}**", of(r, |x| x.1)));
    }
    table.push(format!("| {} |", cells.join(" | ")));
    table.push(String::new());
    table.push(format!(
        "Sluice as a fraction of the limits (median): {}.",
        variants
            .iter()
            .zip(&results)
            .map(|((name, ..), r)| format!(
                "{name} {:.2} of consume-only, {:.2} of produce-only",
                of(r, |x| x.2),
                of(r, |x| x.3)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let mut summary = serde_json::json!({
        "records": n,
        "rounds": rounds,
        "shape": match shape {
            Shape::Bytes => "bytes",
            Shape::NexmarkQ0 => "nexmark-q0",
        },
        "consume_only_median_rec_per_s": median(consumed),
        "produce_only_median_rec_per_s": median(produced),
        "raw_copy_median_rec_per_s": median(raw),
        "raw_copy_of_consume_only": raw_of_read,
        "raw_copy_cpu_us_per_record": median(raw_cpus),
    });
    for (((name, ..), r), cpus) in variants.iter().zip(&results).zip(sluice_cpus) {
        summary[format!("sluice_{name}_cpu_us_per_record")] = median(cpus).into();
        summary[format!("sluice_{name}_median_rec_per_s")] = of(r, |x| x.0).into();
        summary[format!("ratio_{name}_median")] = of(r, |x| x.1).into();
        summary[format!("sluice_{name}_of_consume_only")] = of(r, |x| x.2).into();
        summary[format!("sluice_{name}_of_produce_only")] = of(r, |x| x.3).into();
    }
    // A Nexmark topic is the Nexmark run's, which loaded it.
    if matches!(shape, Shape::Bytes) {
        common::delete_topics(&bootstrap, &[&input]).await;
    }
    report(&table, summary);
    Ok(())
}
