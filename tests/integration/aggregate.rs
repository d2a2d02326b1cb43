//! Incremental aggregation checked against an independent answer:
//! DataFusion's batch execution of the same query over all the input.

use std::sync::Arc;

use sluice::arrow::array::{Int64Array, RecordBatch};
use sluice::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use sluice::arrow::util::pretty::pretty_format_batches;
use sluice::datafusion::functions_aggregate::expr_fn::{
    approx_distinct, array_agg, avg, count, count_distinct, max, min, stddev, sum,
};
use sluice::datafusion::functions_nested::expr_fn::array_sort;
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, OutputMode, Session};

use crate::util::{block_on, property, Lcg};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// Random batches of random sizes (some empty-keyed, keys repeat across
/// batches so states merge).
fn input(rng: &mut Lcg, batches: usize) -> Vec<RecordBatch> {
    (0..batches)
        .map(|_| {
            let n = 1 + rng.next(40) as usize;
            let k: Vec<i64> = (0..n).map(|_| rng.next(12) as i64).collect();
            let v: Vec<i64> = (0..n).map(|_| rng.next(1000) as i64 - 300).collect();
            RecordBatch::try_new(
                schema(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
            )
            .unwrap()
        })
        .collect()
}

fn aggregates() -> Vec<Expr> {
    vec![
        count(lit(1)).alias("n"),
        sum(col("v")).alias("total"),
        min(col("v")).alias("lo"),
        max(col("v")).alias("hi"),
        avg(col("v")).alias("mean"),
        count_distinct(col("v") % lit(7)).alias("distinct_mod7"),
        stddev(col("v")).alias("sd"),
        approx_distinct(col("v")).alias("approx"),
        array_agg(col("v")).alias("vs"),
    ]
}

/// Rounds the floating columns so merge order cannot change the last bits.
fn tail() -> Vec<Expr> {
    vec![
        col("k"),
        col("n"),
        col("total"),
        col("lo"),
        col("hi"),
        round(vec![col("mean"), lit(6)]).alias("mean"),
        col("distinct_mod7"),
        round(vec![col("sd"), lit(6)]).alias("sd"),
        col("approx"),
        // Merge order decides the list's order; its contents must match.
        array_sort(col("vs"), lit("ASC"), lit("NULLS FIRST")).alias("vs"),
    ]
}

async fn batch_answer(all: &[RecordBatch]) -> String {
    let ctx = SessionContext::new();
    let df = ctx
        .read_batches(all.to_vec())
        .unwrap()
        .aggregate(vec![col("k")], aggregates())
        .unwrap()
        .select(tail())
        .unwrap()
        .sort(vec![col("k").sort(true, true)])
        .unwrap();
    pretty_format_batches(&df.collect().await.unwrap())
        .unwrap()
        .to_string()
}

/// Sorts rows by key (the first column) and prints them.
async fn sorted(batches: Vec<RecordBatch>) -> String {
    let ctx = SessionContext::new();
    let df = ctx
        .read_batches(batches)
        .unwrap()
        .sort(vec![col("k").sort(true, true)])
        .unwrap();
    pretty_format_batches(&df.collect().await.unwrap())
        .unwrap()
        .to_string()
}

/// Runs the aggregation over `batches`, one epoch each, stopping and
/// restarting from the checkpoint at random epochs.
async fn run_streaming(
    batches: &[RecordBatch],
    mode: OutputMode,
    rng: &mut Lcg,
    dir: &std::path::Path,
) -> Vec<Vec<RecordBatch>> {
    let mut per_epoch = Vec::new();
    let mut fed = 0;
    while fed < batches.len() {
        // A new "process": fresh session and stream, the same checkpoint.
        let input = MemoryStream::new(schema());
        for b in &batches[..fed] {
            input.add_batch(b.clone()).unwrap();
        }
        let out = MemorySink::new();
        let query = Session::new()
            .read_stream()
            .memory(&input)
            .unwrap()
            .aggregate(vec![col("k")], aggregates())
            .unwrap()
            .select(tail())
            .unwrap()
            .write_stream()
            .memory(&out)
            .output_mode(mode)
            .checkpoint_location(dir)
            // Chains of every length: snapshots, deltas, retention.
            .state_snapshot_interval(1 + rng.next(4))
            .state_retained_snapshots(1 + rng.next(2) as usize)
            .start()
            .await
            .unwrap();
        let run_for = 1 + rng.next(4) as usize;
        for b in batches[fed..].iter().take(run_for) {
            input.add_batch(b.clone()).unwrap();
            query.process_all_available().await.unwrap();
            fed += 1;
        }
        query.stop().await.unwrap();
        for e in out.epochs() {
            per_epoch.push(out.epoch_batches(e));
        }
    }
    per_epoch
}

#[test]
fn complete_mode_equals_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let batches = input(&mut rng, 12);
            let dir = tempfile::tempdir().unwrap();
            let epochs = run_streaming(&batches, OutputMode::Complete, &mut rng, dir.path()).await;
            assert_eq!(epochs.len(), batches.len(), "one epoch per batch");
            let last = epochs.last().unwrap().clone();
            assert_eq!(
                sorted(last).await,
                batch_answer(&batches).await,
                "seed {seed}"
            );
        })
    });
}

#[test]
fn update_mode_folded_by_key_equals_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let batches = input(&mut rng, 12);
            let dir = tempfile::tempdir().unwrap();
            let epochs = run_streaming(&batches, OutputMode::Update, &mut rng, dir.path()).await;
            // Fold: the last value emitted per key.
            let mut latest: std::collections::BTreeMap<i64, RecordBatch> = Default::default();
            for epoch in &epochs {
                for b in epoch {
                    let keys = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    for (i, k) in keys.values().iter().enumerate() {
                        latest.insert(*k, b.slice(i, 1));
                    }
                }
            }
            // Each epoch emits exactly the keys its batch touched.
            for (epoch, batch) in epochs.iter().zip(&batches) {
                let mut emitted: Vec<i64> = epoch
                    .iter()
                    .flat_map(|b| {
                        b.column(0)
                            .as_any()
                            .downcast_ref::<Int64Array>()
                            .unwrap()
                            .values()
                            .to_vec()
                    })
                    .collect();
                emitted.sort_unstable();
                let mut touched: Vec<i64> = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec();
                touched.sort_unstable();
                touched.dedup();
                assert_eq!(emitted, touched);
            }
            let folded: Vec<RecordBatch> = latest.into_values().collect();
            assert_eq!(
                sorted(folded).await,
                batch_answer(&batches).await,
                "seed {seed}"
            );
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_mode_on_a_plain_group_by_is_refused_with_what_works() {
    let input = MemoryStream::new(schema());
    let err = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .aggregate(vec![col("k")], vec![count(lit(1))])
        .unwrap()
        .write_stream()
        .memory(&MemorySink::new())
        .output_mode(OutputMode::Append)
        .start()
        .await
        .unwrap_err();
    assert!(err.is_user_error());
    let msg = err.to_string();
    assert!(
        msg.contains("'update'") && msg.contains("'complete'"),
        "{msg}"
    );
}

#[test]
fn state_is_committed_as_a_snapshot_and_deltas_and_old_chains_are_deleted() {
    block_on(async {
        let mut rng = Lcg(5);
        let batches = input(&mut rng, 14);
        let dir = tempfile::tempdir().unwrap();
        let stream = MemoryStream::new(schema());
        let out = MemorySink::new();
        let query = Session::new()
            .read_stream()
            .memory(&stream)
            .unwrap()
            .aggregate(vec![col("k")], aggregates())
            .unwrap()
            .write_stream()
            .memory(&out)
            .output_mode(OutputMode::Update)
            .checkpoint_location(dir.path())
            .state_snapshot_interval(4)
            .state_retained_snapshots(2)
            .start()
            .await
            .unwrap();
        for b in &batches {
            stream.add_batch(b.clone()).unwrap();
            query.process_all_available().await.unwrap();
        }
        query.stop().await.unwrap();

        let cp = sluice::Checkpoint::open(dir.path(), "unused").unwrap();
        let last = cp.latest_commit_epoch().unwrap().unwrap();
        assert_eq!(last, 14);
        // Epochs 1, 5, 9, 13 start chains; 14 is 13's first delta.
        let chain = cp.read_commit(last).unwrap().state_files;
        assert_eq!(chain.len(), 2, "{chain:?}");
        assert!(chain[0].starts_with("state/aggregate/13.") && chain[0].ends_with(".snapshot"));
        assert!(chain[1].starts_with("state/aggregate/14.") && chain[1].ends_with(".delta"));
        // Two snapshots' chains stay (9..=14); older files are gone.
        let mut epochs: Vec<u64> = std::fs::read_dir(dir.path().join("state/aggregate"))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                name.split('.').next().unwrap().parse().unwrap()
            })
            .collect();
        epochs.sort_unstable();
        assert_eq!(epochs, (9..=14).collect::<Vec<_>>());
    });
}
