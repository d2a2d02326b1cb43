//! The seed pipeline through the DataFrame API, printed to the console.
//!
//!     cargo run --example dataframe
//!
//! Rate source (5 rows/s) → keep values not divisible by 3 → add `doubled`
//! → console, one epoch per second, for five seconds; then the progress of
//! the last epoch.

use std::time::Duration;

use sluice::datafusion::prelude::*;
use sluice::{Session, Trigger};

#[tokio::main]
async fn main() -> sluice::Result<()> {
    let session = Session::new();
    let query = session
        .read_stream()
        .format("rate")
        .option("rows_per_second", "5")
        .load()?
        .filter((col("value") % lit(3)).not_eq(lit(0)))?
        .with_column("doubled", col("value") * lit(2))?
        .write_stream()
        .format("console")
        .query_name("doubled")
        .trigger(Trigger::ProcessingTime(Duration::from_secs(1)))
        .start()
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    query.stop().await?;
    if let Some(p) = query.last_progress() {
        println!(
            "last epoch {}: {} rows in, {} rows out, {:.1} ms",
            p.epoch, p.num_input_rows, p.num_output_rows, p.duration_ms.total
        );
    }
    Ok(())
}
