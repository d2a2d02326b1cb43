//! Aggregation benchmark: rate source (4M rows/s offered, 2 partitions, 1 s
//! epochs) → `SELECT value % K AS k, count(*), max(timestamp) GROUP BY k`
//! in update mode → blackhole, with the state snapshot written to the
//! checkpoint every epoch. Reports rows per second of epoch execution,
//! epoch latency p50/p99 and the state phase (snapshot write) per epoch,
//! then the restore time of the last snapshot.
//!
//!     cargo bench --bench aggregate -- [--rows-per-second R] [--epochs N] [--keys K]
//!
//! The last line of stdout is a JSON object; `benches/run-aggregate.sh`
//! runs this side by side with Spark.

mod common;

use std::time::Instant;

use sluice::datafusion::functions_aggregate::expr_fn::{count, max};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, OutputMode};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = common::args();
    let checkpoint = tempfile::tempdir()?;
    let session = common::session(a.partitions);
    let frame = || -> sluice::Result<sluice::StreamFrame> {
        common::rate(&session, &a)?.aggregate(
            vec![(col("value") % lit(a.keys as i64)).alias("k")],
            vec![
                count(lit(1)).alias("n"),
                max(col("timestamp")).alias("last"),
            ],
        )
    };
    let dir = checkpoint.path().to_path_buf();
    let progress = common::run(&session, frame()?, &a, |w| {
        w.output_mode(OutputMode::Update).checkpoint_location(&dir)
    })
    .await?;
    let mut report = common::report(&progress);

    // Restore: a restart from the same checkpoint loads the last snapshot
    // before it can start; time `start()` with a source that has no data.
    let t = Instant::now();
    let query = frame()?
        .write_stream()
        .memory(&MemorySink::new())
        .output_mode(OutputMode::Update)
        .checkpoint_location(&dir)
        .start()
        .await?;
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    query.stop().await?;
    report["restore_ms"] = restore_ms.into();
    report["keys"] = a.keys.into();
    println!("{report}");
    Ok(())
}
