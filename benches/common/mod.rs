//! What the benchmarks share: arguments, collecting progress, statistics.

#![allow(dead_code)] // each bench uses its own subset

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::arrow::array::{Int64Array, TimestampNanosecondArray};
use sluice::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sluice::arrow::record_batch::RecordBatch;
use sluice::datafusion::catalog::MemTable;
use sluice::datafusion::prelude::{SessionConfig, SessionContext};

use sluice::{QueryProgress, Session, StreamFrame, StreamingQueryListener, Trigger};

/// `--rows-per-second R --epochs N --warmup W --partitions P --keys K
/// [--rows-per-batch B]`.
pub struct Args {
    pub rows_per_second: u64,
    /// Fixed-size epochs of B rows (the rate source's `rows_per_batch`).
    pub rows_per_batch: Option<u64>,
    pub epochs: usize,
    pub warmup: usize,
    pub partitions: usize,
    pub keys: u64,
}

pub fn args() -> Args {
    let mut a = Args {
        rows_per_second: 4_000_000,
        rows_per_batch: None,
        epochs: 20,
        warmup: 3,
        partitions: 2,
        keys: 100_000,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (argv[i].as_str(), value) {
            ("--rows-per-second", Some(v)) => a.rows_per_second = v,
            ("--rows-per-batch", Some(v)) => a.rows_per_batch = Some(v),
            ("--epochs", Some(v)) => a.epochs = v as usize,
            ("--warmup", Some(v)) => a.warmup = v as usize,
            ("--partitions", Some(v)) => a.partitions = v as usize,
            ("--keys", Some(v)) => a.keys = v,
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// The value after `--name` on the command line, if any.
pub fn flag(name: &str) -> Option<String> {
    let argv: Vec<String> = std::env::args().collect();
    argv.iter()
        .position(|a| a == name)
        .and_then(|i| argv.get(i + 1).cloned())
}

/// The whole number after `--name`, or `default` when it is absent or not
/// a number.
pub fn number(name: &str, default: u64) -> u64 {
    flag(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Collect(Mutex<Vec<QueryProgress>>);

impl StreamingQueryListener for Collect {
    fn on_query_progress(&self, p: &QueryProgress) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p.clone());
    }
}

/// Every progress event of `session`'s queries from now on, read by the
/// returned function.
pub fn collect_progress(session: &Session) -> impl Fn() -> Vec<QueryProgress> {
    let collect = Arc::new(Collect::default());
    session.add_listener(collect.clone());
    move || collect.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A session planning with `partitions` partitions.
pub fn session(partitions: usize) -> Session {
    Session::with_context(SessionContext::new_with_config(
        SessionConfig::new().with_target_partitions(partitions),
    ))
}

/// The rate source the benchmarks read.
pub fn rate(session: &Session, a: &Args) -> sluice::Result<StreamFrame> {
    let mut reader = session
        .read_stream()
        .format("rate")
        .option("rows_per_second", a.rows_per_second.to_string())
        .option("num_partitions", a.partitions.to_string());
    if let Some(b) = a.rows_per_batch {
        reader = reader.option("rows_per_batch", b.to_string());
    }
    reader.load()
}

/// Runs `frame` into the blackhole with 1 s epochs for warm-up + measured
/// epochs; returns the measured epochs' progress.
pub async fn run(
    session: &Session,
    frame: StreamFrame,
    a: &Args,
    configure: impl FnOnce(sluice::DataStreamWriter) -> sluice::DataStreamWriter,
) -> Result<Vec<QueryProgress>, Box<dyn std::error::Error>> {
    let collect = Arc::new(Collect::default());
    session.add_listener(collect.clone());
    let writer = frame
        .write_stream()
        .format("blackhole")
        .trigger(Trigger::ProcessingTime(Duration::from_secs(1)));
    let query = configure(writer).start().await?;
    let wanted = a.warmup + a.epochs;
    let count = || collect.0.lock().unwrap_or_else(|e| e.into_inner()).len();
    let mut last = 0;
    while count() < wanted {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = count();
        if n != last {
            eprint!("\rsluice: epoch {n}/{wanted}");
            last = n;
        }
        if !query.is_active() {
            return Err(format!("query stopped: {:?}", query.exception()).into());
        }
    }
    eprintln!();
    query.stop().await?;
    let all = collect.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(all.into_iter().skip(a.warmup).take(a.epochs).collect())
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `p` quantile (0..=1) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The fields every benchmark reports, from the measured epochs.
pub fn report(progress: &[QueryProgress]) -> serde_json::Value {
    let of = |f: fn(&QueryProgress) -> f64| sorted(progress.iter().map(f).collect());
    let rates = of(|p| p.processed_rows_per_second);
    let totals = of(|p| p.duration_ms.total);
    serde_json::json!({
        "engine": "sluice",
        "sluice_version": env!("CARGO_PKG_VERSION"),
        "epochs": progress.len(),
        "median_rows_per_s": percentile(&rates, 0.5),
        "p10": percentile(&rates, 0.1),
        "p90": percentile(&rates, 0.9),
        "median_epoch_ms": percentile(&totals, 0.5),
        "p99_epoch_ms": percentile(&totals, 0.99),
        "median_input_rows": percentile(&of(|p| p.num_input_rows as f64), 0.5),
        "median_phase_ms": {
            "plan": percentile(&of(|p| p.duration_ms.plan), 0.5),
            "read": percentile(&of(|p| p.duration_ms.read), 0.5),
            "compute": percentile(&of(|p| p.duration_ms.compute), 0.5),
            "state": percentile(&of(|p| p.duration_ms.state), 0.5),
            "commit": percentile(&of(|p| p.duration_ms.commit), 0.5),
        },
        "median_state_rows": percentile(&of(|p| p.state_rows as f64), 0.5),
        "median_state_bytes": percentile(&of(|p| p.state_bytes as f64), 0.5),
        "final_state_rows": progress.last().map_or(0, |p| p.state_rows),
        "peak_rss_bytes": peak_rss_bytes(),
    })
}

/// CPU time this process has used so far, user and system, in seconds
/// (Linux; `None` elsewhere): the difference over a run is its CPU cost,
/// steadier on a shared machine than its wall time.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    // utime and stime (fields 14 and 15), in clock ticks of 1/100 s.
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// The process's peak resident memory (VmHWM), in bytes (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// DataFusion alone, the physical limit of a pipeline: `sql` over a table
/// `t` of `rows` rate-source rows (`timestamp`, `value`), already in memory
/// in the source's partitions, as one batch query per measured epoch;
/// returns each one's rows per second.
pub async fn datafusion_alone(
    a: &Args,
    rows: usize,
    sql: &str,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            false,
        ),
        Field::new("value", DataType::Int64, false),
    ]));
    let per_partition = rows / a.partitions;
    let mut partitions = Vec::new();
    for p in 0..a.partitions {
        let mut batches = Vec::new();
        let mut start = 0;
        while start < per_partition {
            let n = (per_partition - start).min(64 * 1024);
            let values = Int64Array::from_iter_values(
                (start..start + n).map(|i| (i * a.partitions + p) as i64),
            );
            let ts = TimestampNanosecondArray::from_iter_values(
                (start..start + n).map(|i| i as i64 * 250),
            );
            batches.push(RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(ts), Arc::new(values)],
            )?);
            start += n;
        }
        partitions.push(batches);
    }
    let ctx =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(a.partitions));
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, partitions)?))?;
    let mut rates = Vec::new();
    for _ in 0..a.epochs {
        let t = Instant::now();
        let out = ctx.sql(sql).await?.collect_partitioned().await?;
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(out);
        rates.push(rows as f64 / secs);
    }
    Ok(rates)
}

/// A consumer's messages a batch at a time (librdkafka's
/// `rd_kafka_consume_batch_queue` on the consumer's queue): the fastest way
/// librdkafka hands messages over, for the benches' best-effort clients.
pub struct BatchReader<'a> {
    /// The consumer outlives its queue.
    _consumer: &'a rdkafka::consumer::BaseConsumer,
    queue: std::ptr::NonNull<rdkafka::bindings::rd_kafka_queue_t>,
    batch: Vec<*mut rdkafka::bindings::rd_kafka_message_t>,
}

impl<'a> BatchReader<'a> {
    pub fn new(consumer: &'a rdkafka::consumer::BaseConsumer) -> Option<Self> {
        // SAFETY: a live consumer; the queue reference is destroyed on drop.
        let queue = unsafe {
            rdkafka::bindings::rd_kafka_queue_get_consumer(
                rdkafka::consumer::Consumer::client(consumer).native_ptr(),
            )
        };
        Some(BatchReader {
            _consumer: consumer,
            queue: std::ptr::NonNull::new(queue)?,
            batch: vec![std::ptr::null_mut(); 4096],
        })
    }

    /// Hands each message (partition, key, value) of one batch to `each`,
    /// waiting up to `wait` for the batch to fill; returns how many
    /// messages, or the first error a message carried.
    pub fn next(
        &mut self,
        wait: Duration,
        mut each: impl FnMut(i32, Option<&[u8]>, Option<&[u8]>),
    ) -> Result<usize, String> {
        // SAFETY: `batch` has room for its length in pointers.
        let got = unsafe {
            rdkafka::bindings::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                wait.as_millis() as i32,
                self.batch.as_mut_ptr(),
                self.batch.len(),
            )
        };
        let got = usize::try_from(got).unwrap_or(0);
        let mut error = None;
        for &m in &self.batch[..got] {
            // SAFETY: librdkafka returned `got` live messages, each
            // destroyed once, here.
            let message = unsafe { &*m };
            let bytes = |ptr: *mut std::ffi::c_void, len: usize| {
                (!ptr.is_null())
                    .then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
            };
            if message.err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                each(
                    message.partition,
                    bytes(message.key, message.key_len),
                    bytes(message.payload, message.len),
                );
            } else {
                error.get_or_insert(format!(
                    "{:?}",
                    rdkafka::types::RDKafkaErrorCode::from(message.err)
                ));
            }
            unsafe { rdkafka::bindings::rd_kafka_message_destroy(m) };
        }
        match error {
            Some(e) => Err(e),
            None => Ok(got),
        }
    }
}

impl Drop for BatchReader<'_> {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// Deletes `topics` from the broker at `bootstrap` once a bench has
/// measured them: benches that kept every topic they wrote filled the
/// local broker's disk (61 GB after a day of runs; the broker's 2 h
/// retention frees only segments that rolled). A failure is reported,
/// not fatal: the numbers are already taken.
pub async fn delete_topics(bootstrap: &str, topics: &[&str]) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: Result<AdminClient<DefaultClientContext>, _> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create();
    let result = match admin {
        Ok(admin) => admin
            .delete_topics(topics, &AdminOptions::new())
            .await
            .map(|results| {
                results
                    .into_iter()
                    .filter_map(Result::err)
                    .collect::<Vec<_>>()
            }),
        Err(e) => Err(e),
    };
    match result {
        Ok(failed) if failed.is_empty() => {}
        Ok(failed) => eprintln!("could not delete {failed:?}"),
        Err(e) => eprintln!("could not delete {topics:?}: {e}"),
    }
}
