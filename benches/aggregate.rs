//! Aggregation benchmark: rate source (4M rows/s offered, 2 partitions, 1 s
//! epochs) → `SELECT value % K AS k, count(*), max(timestamp) GROUP BY k`
//! in update mode → blackhole, with the state snapshot written to the
//! checkpoint every epoch. Reports rows per second of epoch execution,
//! epoch latency p50/p99 and the state phase (snapshot write) per epoch,
//! then the restore time of the last snapshot, and DataFusion alone on the
//! same GROUP BY over an epoch's rows already in memory (the physical
//! limit: one batch aggregation, no state).
//!
//!     cargo bench --bench aggregate -- [--rows-per-second R] [--epochs N] [--keys K]
//!
//! With `--seed-topic T [--bootstrap B]` it runs the seed pipeline instead
//! (`examples/seed.sql`: `GROUP BY value % 4 AS bucket` with `count(*)`,
//! `sum(value)`, `max(timestamp)`) into the Kafka topic T, exactly once.
//!
//! With `--query Q` it keeps rows per key `k = value % K` instead of
//! aggregating them (update mode, blackhole): `first` keeps each key's
//! first row (`drop_duplicates(["k"])`, the append-only form), `top1`
//! the same through a Top-N (`ROW_NUMBER() OVER (PARTITION BY k ORDER BY
//! timestamp) = 1`, Flink's deduplication), `top10` each key's ten rows of
//! highest `value` (`ROW_NUMBER() ... ORDER BY value DESC <= 10`),
//! `rank10` the same through `RANK()`, `top1-event-time` the first row
//! by event time (the stream watermarked 1 s behind, append mode: emitted
//! once the watermark passes it), `over` each row with the average of its
//! key's last ten (`avg(value) OVER (PARTITION BY k ORDER BY timestamp
//! ROWS BETWEEN 9 PRECEDING AND CURRENT ROW)`, append mode),
//! `join-changes` two aggregations whose rows change every epoch (per key
//! the count, and the highest even value) full outer joined on the key,
//! as a join of two CDC streams is, `min-changes` min and max per
//! `k % 100` over the per-key counts (an aggregation's changelog, through
//! multiset state), and `join-interval` the append-only
//! form: the stream joined with itself on `value` within one second of
//! event time (each row meets itself once). The report adds the state's
//! bytes per key.
//!
//! The last line of stdout is a JSON object; `benches/run-aggregate.sh`
//! runs this side by side with Spark.

mod common;

use std::time::Instant;

use sluice::datafusion::common::ScalarValue;
use sluice::datafusion::functions_aggregate::average::avg_udaf;
use sluice::datafusion::functions_aggregate::expr_fn::{count, max, min, sum};
use sluice::datafusion::functions_window::expr_fn::{rank, row_number};
use sluice::datafusion::logical_expr::expr::WindowFunction;
use sluice::datafusion::logical_expr::ExprFunctionExt;
use sluice::datafusion::logical_expr::{WindowFrame, WindowFrameBound, WindowFrameUnits};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, OutputMode};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = common::args();
    let checkpoint = tempfile::tempdir()?;
    let session = common::session(a.partitions);
    let seed = common::flag("--seed-topic");
    let keys = if seed.is_some() { 4 } else { a.keys as i64 };
    let kept = common::flag("--query");
    let frame = || -> sluice::Result<sluice::StreamFrame> {
        let rate = common::rate(&session, &a)?;
        if let Some(query) = kept.as_deref().filter(|q| q.starts_with("join-")) {
            return joined(rate, query, keys);
        }
        if kept.as_deref() == Some("min-changes") {
            // min and max over an aggregation's changelog: every epoch
            // changes every count, which the outer groups take back and
            // add again (multiset state).
            return rate
                .aggregate(
                    vec![(col("value") % lit(keys)).alias("k")],
                    vec![count(lit(1)).alias("n")],
                )?
                .aggregate(
                    vec![(col("k") % lit(100i64)).alias("g")],
                    vec![min(col("n")).alias("lo"), max(col("n")).alias("hi")],
                );
        }
        if let Some(query) = &kept {
            return keep_rows(rate, query, keys);
        }
        if seed.is_some() {
            return rate.aggregate(
                vec![(col("value") % lit(4i64)).alias("bucket")],
                vec![
                    count(lit(1)).alias("ticks"),
                    sum(col("value")).alias("total"),
                    max(col("timestamp")).alias("last_tick"),
                ],
            );
        }
        rate.aggregate(
            vec![(col("value") % lit(keys)).alias("k")],
            vec![
                count(lit(1)).alias("n"),
                max(col("timestamp")).alias("last"),
            ],
        )
    };
    let dir = checkpoint.path().to_path_buf();
    let mode = match kept.as_deref() {
        Some("join-interval" | "top1-event-time" | "over") => OutputMode::Append,
        _ => OutputMode::Update,
    };
    let progress = common::run(&session, frame()?, &a, |w| {
        let w = w.output_mode(mode).checkpoint_location(&dir);
        match &seed {
            Some(topic) => w.format("kafka").option("topic", topic).option(
                "bootstrap.servers",
                common::flag("--bootstrap").unwrap_or_else(|| "127.0.0.1:9092".into()),
            ),
            None => w,
        }
    })
    .await?;
    let mut report = common::report(&progress);

    // Restore: a restart from the same checkpoint loads the last snapshot
    // before it can start; time `start()` with a source that has no data.
    let t = Instant::now();
    let query = frame()?
        .write_stream()
        .memory(&MemorySink::new())
        .output_mode(mode)
        .checkpoint_location(&dir)
        .start()
        .await?;
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    query.stop().await?;
    report["restore_ms"] = restore_ms.into();
    // The physical limit: DataFusion's batch GROUP BY over an epoch's rows,
    // already decoded to Arrow.
    let rows = report["median_input_rows"].as_f64().unwrap_or(1.0) as usize;
    let sql = if seed.is_some() {
        "SELECT value % 4 AS bucket, count(*) AS ticks, sum(value) AS total, \
         max(timestamp) AS last_tick FROM t GROUP BY value % 4"
            .to_string()
    } else {
        format!(
            "SELECT value % {keys} AS k, count(*) AS n, max(timestamp) AS last FROM t \
             GROUP BY value % {keys}"
        )
    };
    if kept.is_none() {
        let df = common::sorted(common::datafusion_alone(&a, rows.max(1), &sql).await?);
        report["datafusion_alone_median_rows_per_s"] = common::percentile(&df, 0.5).into();
    }
    report["keys"] = keys.into();
    report["state_bytes_per_key"] =
        (report["median_state_bytes"].as_f64().unwrap_or(0.0) / keys as f64).into();
    report["pipeline"] = match (&seed, &kept) {
        (Some(_), _) => "seed".to_string(),
        (None, Some(query)) => query.clone(),
        (None, None) => "group-by".to_string(),
    }
    .into();
    println!("{report}");
    Ok(())
}

/// `--query join-…`: a join of two changing aggregations, or the rate
/// stream interval-joined with itself (see the module's text).
fn joined(
    rate: sluice::StreamFrame,
    query: &str,
    keys: i64,
) -> sluice::Result<sluice::StreamFrame> {
    use sluice::datafusion::common::JoinType;
    let k = || (col("value") % lit(keys)).alias("k");
    match query {
        "join-changes" => {
            let counts = rate
                .clone()
                .aggregate(vec![k()], vec![count(lit(1)).alias("n")])?
                .alias("c")?;
            let tops = rate
                .filter((col("value") % lit(2i64)).eq(lit(0i64)))?
                .aggregate(vec![k()], vec![max(col("value")).alias("top")])?
                .alias("t")?;
            counts
                .join(tops, JoinType::Full, vec![col("c.k").eq(col("t.k"))])?
                .select(vec![
                    col("c.k").alias("ck"),
                    col("c.n"),
                    col("t.k").alias("tk"),
                    col("t.top"),
                ])
        }
        "join-interval" => {
            let rate = rate.with_watermark("timestamp", std::time::Duration::from_secs(1))?;
            let second = lit(
                sluice::datafusion::common::ScalarValue::IntervalMonthDayNano(Some(
                    sluice::arrow::datatypes::IntervalMonthDayNano::new(0, 0, 1_000_000_000),
                )),
            );
            rate.clone()
                .alias("a")?
                .join(
                    rate.alias("b")?,
                    JoinType::Inner,
                    vec![
                        col("a.value").eq(col("b.value")),
                        col("b.timestamp").between(col("a.timestamp"), col("a.timestamp") + second),
                    ],
                )?
                .select(vec![col("a.value"), col("b.timestamp")])
        }
        other => Err(sluice::SluiceError::config(format!(
            "--query {other}: expected join-changes or join-interval"
        ))),
    }
}

/// `--query`'s rows kept per key `k = value % keys` (see the module's text).
fn keep_rows(
    rate: sluice::StreamFrame,
    query: &str,
    keys: i64,
) -> sluice::Result<sluice::StreamFrame> {
    let watermarked = || {
        rate.clone()
            .with_watermark("timestamp", std::time::Duration::from_secs(1))
    };
    let keyed = match query {
        "top1-event-time" | "over" => watermarked()?,
        _ => rate.clone(),
    }
    .with_column("k", col("value") % lit(keys))?;
    let (function, order, limit) = match query {
        "first" => return keyed.drop_duplicates(&["k"]),
        "top1" | "top1-event-time" => (row_number(), col("timestamp").sort(true, false), 1u64),
        "top10" => (row_number(), col("value").sort(false, true), 10),
        "rank10" => (rank(), col("value").sort(false, true), 10),
        "over" => {
            let last10 = Expr::from(WindowFunction::new(avg_udaf(), vec![col("value")]))
                .partition_by(vec![col("k")])
                .order_by(vec![col("timestamp").sort(true, false)])
                .window_frame(WindowFrame::new_bounds(
                    WindowFrameUnits::Rows,
                    WindowFrameBound::Preceding(ScalarValue::UInt64(Some(9))),
                    WindowFrameBound::CurrentRow,
                ))
                .build()?
                .alias("last10");
            return keyed.select(vec![col("k"), col("value"), col("timestamp"), last10]);
        }
        other => {
            return Err(sluice::SluiceError::config(format!(
                "--query {other}: expected first, top1, top1-event-time, top10, rank10, over, \
                 join-changes or join-interval"
            )))
        }
    };
    let rn = function
        .partition_by(vec![col("k")])
        .order_by(vec![order])
        .build()?
        .alias("rn");
    keyed
        .select(vec![col("k"), col("value"), col("timestamp"), rn])?
        .filter(col("rn").lt_eq(lit(limit)))
}
