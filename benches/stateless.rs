//! Stateless pipeline benchmark: rate source (4M rows/s offered, 2
//! partitions, 1 s epochs) → `WHERE value % 3 <> 0` → `value * 2` →
//! blackhole, measured the way Spark reports it: input rows per second of
//! epoch execution (rows / epoch duration), median over the measured epochs.
//!
//! It also measures DataFusion alone on the same filter and projection over
//! already-generated batches of the same size: the physical limit.
//!
//!     cargo bench --bench stateless -- [--rows-per-second R] [--epochs N] [--warmup W]
//!
//! The last line of stdout is a JSON object (see benches/README.md);
//! `benches/run-stateless.sh` runs this side by side with Spark.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::arrow::array::{Int64Array, TimestampNanosecondArray};
use sluice::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sluice::arrow::record_batch::RecordBatch;
use sluice::datafusion::catalog::MemTable;
use sluice::datafusion::prelude::*;
use sluice::{QueryProgress, Session, StreamingQueryListener, Trigger};

struct Args {
    rows_per_second: u64,
    epochs: usize,
    warmup: usize,
    partitions: usize,
}

fn args() -> Args {
    let mut a = Args {
        rows_per_second: 4_000_000,
        epochs: 20,
        warmup: 3,
        partitions: 2,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (argv[i].as_str(), value) {
            ("--rows-per-second", Some(v)) => a.rows_per_second = v,
            ("--epochs", Some(v)) => a.epochs = v as usize,
            ("--warmup", Some(v)) => a.warmup = v as usize,
            ("--partitions", Some(v)) => a.partitions = v as usize,
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

async fn sluice_side(a: &Args) -> Result<Vec<QueryProgress>, Box<dyn std::error::Error>> {
    let ctx =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(a.partitions));
    let session = Session::with_context(ctx);
    let collect = Arc::new(Collect::default());
    session.add_listener(collect.clone());
    let query = session
        .read_stream()
        .format("rate")
        .option("rows_per_second", a.rows_per_second.to_string())
        .option("num_partitions", a.partitions.to_string())
        .load()?
        .filter((col("value") % lit(3)).not_eq(lit(0)))?
        .select(vec![
            (col("value") * lit(2)).alias("doubled"),
            col("timestamp"),
        ])?
        .write_stream()
        .format("blackhole")
        .trigger(Trigger::ProcessingTime(Duration::from_secs(1)))
        .start()
        .await?;
    let wanted = a.warmup + a.epochs;
    let mut last = 0;
    while collect.0.lock().unwrap_or_else(|e| e.into_inner()).len() < wanted {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = collect.0.lock().unwrap_or_else(|e| e.into_inner()).len();
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

/// DataFusion alone: the same filter and projection over batches of one
/// epoch's size, already in memory.
async fn datafusion_side(a: &Args, rows: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
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
        let out = ctx
            .sql("SELECT value * 2 AS doubled, timestamp FROM t WHERE value % 3 <> 0")
            .await?
            .collect_partitioned()
            .await?;
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(out);
        rates.push(rows as f64 / secs);
    }
    Ok(rates)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let progress = sluice_side(&a).await?;
    let rates = sorted(
        progress
            .iter()
            .map(|p| p.processed_rows_per_second)
            .collect(),
    );
    let totals = sorted(progress.iter().map(|p| p.duration_ms.total).collect());
    let inputs = sorted(progress.iter().map(|p| p.num_input_rows as f64).collect());
    let phase =
        |f: fn(&QueryProgress) -> f64| percentile(&sorted(progress.iter().map(f).collect()), 0.5);
    let median_rows = percentile(&inputs, 0.5) as usize;
    let df = sorted(datafusion_side(&a, median_rows.max(1)).await?);
    let report = serde_json::json!({
        "engine": "sluice",
        "sluice_version": env!("CARGO_PKG_VERSION"),
        "epochs": progress.len(),
        "median_rows_per_s": percentile(&rates, 0.5),
        "p10": percentile(&rates, 0.1),
        "p90": percentile(&rates, 0.9),
        "median_epoch_ms": percentile(&totals, 0.5),
        "median_input_rows": median_rows,
        "median_phase_ms": {
            "plan": phase(|p| p.duration_ms.plan),
            "read": phase(|p| p.duration_ms.read),
            "compute": phase(|p| p.duration_ms.compute),
            "commit": phase(|p| p.duration_ms.commit),
        },
        "datafusion_alone_median_rows_per_s": percentile(&df, 0.5),
    });
    println!("{report}");
    Ok(())
}
