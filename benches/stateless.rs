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

use sluice::datafusion::prelude::*;

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
    let sql = "SELECT value * 2 AS doubled, timestamp FROM t WHERE value % 3 <> 0";
    let df = common::sorted(common::datafusion_alone(&a, rows.max(1), sql).await?);
    report["datafusion_alone_median_rows_per_s"] = common::percentile(&df, 0.5).into();
    println!("{report}");
    Ok(())
}
