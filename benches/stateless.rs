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

mod common;

use std::sync::Arc;
use std::time::Instant;

use sluice::arrow::array::{Int64Array, TimestampNanosecondArray};
use sluice::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sluice::arrow::record_batch::RecordBatch;
use sluice::datafusion::catalog::MemTable;
use sluice::datafusion::prelude::*;

/// DataFusion alone: the same filter and projection over batches of one
/// epoch's size, already in memory.
async fn datafusion_side(
    a: &common::Args,
    rows: usize,
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
    let a = common::args();
    let session = common::session(a.partitions);
    let frame = common::rate(&session, &a)?
        .filter((col("value") % lit(3)).not_eq(lit(0)))?
        .select(vec![
            (col("value") * lit(2)).alias("doubled"),
            col("timestamp"),
        ])?;
    let progress = common::run(&session, frame, &a, |w| w).await?;
    let mut report = common::report(&progress);
    let rows = report["median_input_rows"].as_f64().unwrap_or(1.0) as usize;
    let df = common::sorted(datafusion_side(&a, rows.max(1)).await?);
    report["datafusion_alone_median_rows_per_s"] = common::percentile(&df, 0.5).into();
    println!("{report}");
    Ok(())
}
