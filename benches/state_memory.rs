//! State memory benchmark: a GROUP BY with K distinct BIGINT keys of
//! (count, sum) — the 10M-key case — fed fixed-size epochs so the
//! engine never falls behind a clock: epochs 1..=K/B each bring B new keys,
//! the following ones B updates of existing keys. Update mode, discarding
//! sink, state checkpointed (delta per epoch, snapshot every 10).
//!
//!     cargo bench --bench state_memory -- [--keys K] [--batch B] [--updates U] [--keep-input]
//!         [--limit SIZE] [--snapshot-interval N] [--no-restart]
//!
//! `--limit '1 GB'` sets `state.memory.limit`: past it the coldest keys
//! go to local disk (the default temporary directory).
//!
//! Each epoch's input is released once the epoch has committed, as a
//! Kafka source holds nothing it has handed over; `--keep-input` keeps it
//! all in the memory stream (B × 16 bytes per epoch), as this bench did
//! before 2026-12-02.
//!
//! Reports per-epoch duration, the state's own size, the checkpoint bytes
//! the update epochs wrote (against the 24 bytes of each row they
//! changed), and the process's peak resident memory (VmHWM) as the last
//! line of stdout (JSON).
//!
//! The output is checked: a last epoch brings one row of value 0 for every
//! hundredth key, so it emits those keys' final (count + 1, sum). A
//! checksum of them, Σ a(k)·count + b(k)·sum for fixed pseudo-random a and
//! b, must equal the same sum over the input rows of those keys (plus a(k)
//! per probe row), which a plain loop adds up as it makes them: linear in
//! the rows, it needs no per-key memory. The bench fails on a mismatch.

mod common;

use std::sync::Arc;
use std::time::Instant;

use sluice::arrow::array::{Int64Array, RecordBatch};
use sluice::arrow::datatypes::{DataType, Field, Schema};
use sluice::datafusion::functions_aggregate::expr_fn::{count, sum};
use sluice::datafusion::prelude::*;
use sluice::{MemoryStream, OutputMode};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys = common::number("--keys", 10_000_000);
    let batch = common::number("--batch", 1_000_000);
    let updates = common::number("--updates", 5);
    let keep_input = std::env::args().any(|a| a == "--keep-input");
    let limit = common::flag("--limit");
    let snapshot_interval = common::flag("--snapshot-interval");
    // Without the restart, a heap profile's peak is the run's.
    let restart = !std::env::args().any(|a| a == "--no-restart");
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let input = MemoryStream::new(schema.clone());
    let out = sluice::MemorySink::new();
    let session = common::session(2);
    let checkpoint = tempfile::tempdir()?;
    let progress = common::collect_progress(&session);
    let query_over = |input: &MemoryStream| -> sluice::Result<sluice::DataStreamWriter> {
        let writer = session
            .read_stream()
            .memory(input)?
            .aggregate(
                vec![col("k")],
                vec![count(lit(1)).alias("n"), sum(col("v")).alias("total")],
            )?
            .write_stream()
            .memory(&out)
            .output_mode(OutputMode::Update)
            .checkpoint_location(checkpoint.path());
        let writer = match &snapshot_interval {
            Some(n) => writer.set("state.snapshot.interval", n)?,
            None => writer,
        };
        match &limit {
            Some(limit) => writer.set("state.memory.limit", limit),
            None => Ok(writer),
        }
    };
    let query = query_over(&input)?.start().await?;
    let epochs = keys.div_ceil(batch) + updates;
    let mut times = Vec::new();
    // Per epoch, the bytes of the state files it added to the checkpoint.
    let mut written = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // The checksum the probed keys' final values must have.
    let mut expected = 0u64;
    let began = Instant::now();
    for e in 0..epochs {
        // New keys first; then updates spread over all keys.
        let start = (e * batch) as i64;
        let ks: Vec<i64> = (0..batch as i64)
            .map(|i| {
                if e * batch < keys {
                    start + i
                } else {
                    (i * 7919 + start) % keys as i64
                }
            })
            .collect();
        let vs: Vec<i64> = (0..batch as i64).collect();
        for (k, v) in ks.iter().zip(&vs) {
            if k % PROBE_EVERY == 0 {
                expected = expected.wrapping_add(weight(*k, *v));
            }
        }
        input.add_batch(RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ks)),
                Arc::new(Int64Array::from(vs)),
            ],
        )?)?;
        let t = Instant::now();
        query.process_all_available().await?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        written.push(new_state_bytes(
            &checkpoint.path().join("state"),
            &mut seen,
        )?);
        if !keep_input {
            input.release(e as usize + 1);
        }
        drop(out.take());
        eprint!("\rsluice: epoch {}/{epochs}", e + 1);
    }
    eprintln!();
    let running_s = began.elapsed().as_secs_f64();
    let last = query.last_progress().ok_or("no progress")?;
    // The probe: every hundredth key once more, with 0.
    let probed: Vec<i64> = (0..keys as i64).step_by(PROBE_EVERY as usize).collect();
    for k in &probed {
        expected = expected.wrapping_add(weight(*k, 0));
    }
    let zeros = Int64Array::from(vec![0i64; probed.len()]);
    input.add_batch(RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from(probed.clone())), Arc::new(zeros)],
    )?)?;
    query.process_all_available().await?;
    let mut got = 0u64;
    let mut rows = 0;
    for b in out.take() {
        let column = |name: &str| -> Result<Int64Array, Box<dyn std::error::Error>> {
            Ok(sluice::arrow::compute::cast(
                b.column_by_name(name).ok_or("no such column")?,
                &DataType::Int64,
            )?
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not BIGINT")?
            .clone())
        };
        let (k, n, total) = (column("k")?, column("n")?, column("total")?);
        for i in 0..b.num_rows() {
            got = got
                .wrapping_add(mix(k.value(i) as u64).wrapping_mul(n.value(i) as u64))
                .wrapping_add(mix(!k.value(i) as u64).wrapping_mul(total.value(i) as u64));
        }
        rows += b.num_rows();
    }
    if rows != probed.len() || got != expected {
        return Err(format!(
            "the probed keys' final values are wrong: {rows} rows for {} keys, checksum {got:#x} \
             against {expected:#x}",
            probed.len()
        )
        .into());
    }
    query.stop().await?;
    let peak_running = common::peak_rss_bytes();
    // Restore: a restart from the checkpoint loads the last snapshot and
    // its deltas before it can start.
    let t = Instant::now();
    if restart {
        let restarted = query_over(&MemoryStream::new(schema.clone()))?
            .start()
            .await?;
        restarted.stop().await?;
    }
    let restore_ms = restart.then(|| t.elapsed().as_secs_f64() * 1e3);
    let state_ms = common::sorted(progress().iter().map(|p| p.duration_ms.state).collect());
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    // The update epochs' checkpoint bytes against the rows they changed
    // (a BIGINT key, count and sum: 24 bytes a row).
    let update_epochs = &written[written.len().saturating_sub(updates as usize)..];
    let changed_bytes = (batch * 24) as f64;
    let update_written: u64 = update_epochs.iter().sum();
    let report = serde_json::json!({
        "engine": "sluice",
        "keys": keys,
        "batch_rows": batch,
        "epochs": epochs,
        "input_kept": keep_input,
        "memory_limit": limit,
        "rows_per_second": (epochs * batch) as f64 / running_s,
        "epoch_ms_median": common::percentile(&sorted, 0.5),
        "epoch_ms_max": sorted.last(),
        "state_rows": last.state_rows,
        "state_bytes": last.state_bytes,
        "state_disk_bytes": last.state_disk_bytes,
        "state_write_ms_median": common::percentile(&state_ms, 0.5),
        "state_write_ms_max": state_ms.last(),
        "restore_ms": restore_ms,
        "checkpoint_bytes_per_update_epoch": update_written as f64 / updates.max(1) as f64,
        "checkpoint_bytes_per_changed_row_byte": update_written as f64 / (changed_bytes * updates.max(1) as f64),
        "checkpoint_bytes_max_epoch": written.iter().max(),
        "checkpoint_bytes_max_update_epoch": update_epochs.iter().max(),
        "peak_rss_bytes": peak_running,
        "peak_rss_bytes_after_restore": common::peak_rss_bytes(),
        "checked_keys": probed.len(),
    });
    println!("{report}");
    Ok(())
}

/// Every how many keys the last epoch probes.
const PROBE_EVERY: i64 = 100;

/// A row `(k, v)`'s share of the checksum: a(k)·1 + b(k)·v, as its key's
/// (count, sum) carries it.
fn weight(k: i64, v: i64) -> u64 {
    mix(k as u64).wrapping_add(mix(!k as u64).wrapping_mul(v as u64))
}

/// SplitMix64's finaliser: a fixed pseudo-random weight per key.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The bytes of the files under `dir` not in `seen` (which they join).
fn new_state_bytes(
    dir: &std::path::Path,
    seen: &mut std::collections::HashSet<std::path::PathBuf>,
) -> std::io::Result<u64> {
    let mut bytes = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            bytes += new_state_bytes(&path, seen)?;
        } else if seen.insert(path.clone()) {
            bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
        }
    }
    Ok(bytes)
}
