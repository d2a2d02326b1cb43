//! State TTL (`state.ttl`): a key whose state no row has written for the
//! TTL starts again. Each test runs epochs at set moments, each a run of
//! its own from the same checkpoint, and checks every epoch's
//! output against a plain loop that applies Flink's meaning to the same
//! rows at the processing times the epochs recorded (`planned_at_ms` of
//! `offsets/N`), so no timing guess enters the answer.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::arrow::array::{Int64Array, RecordBatch};
use sluice::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use sluice::datafusion::common::JoinType;
use sluice::datafusion::functions_aggregate::expr_fn::{count, sum};
use sluice::datafusion::functions_window::expr_fn::row_number;
use sluice::datafusion::logical_expr::ExprFunctionExt;
use sluice::datafusion::prelude::*;
use sluice::{Checkpoint, MemorySink, MemoryStream, OutputMode, Session, StreamFrame, Trigger};

use crate::util::ints;

const TTL_MS: i64 = 3_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

fn rows(pairs: &[(i64, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.0))),
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.1))),
        ],
    )
    .unwrap()
}

/// The epochs: at each moment (seconds after the start) a batch of rows.
/// Keys written at 0 s are 4 s old at 4 s (past the 3 s TTL), keys
/// written at 2 s are 2 s old then; at 7.5 s every key is past it.
fn schedule() -> Vec<(f64, Vec<(i64, i64)>)> {
    vec![
        (0.0, vec![(1, 10), (2, 20), (3, 30)]),
        (2.0, vec![(2, 25), (3, 5)]),
        (4.0, vec![(1, 11), (2, 21), (3, 1)]),
        (7.5, vec![(2, 22)]),
    ]
}

/// An epoch's processing time and output.
type Epoch = (i64, Vec<RecordBatch>);

/// Runs `query` over [`schedule`], one epoch per batch, in update mode with
/// a TTL of [`TTL_MS`]; returns each epoch's processing time and output,
/// and the state's rows after the last epoch. Each epoch is a run of its
/// own (`AvailableNow`, a new session and streams holding every batch so
/// far) from the same checkpoint, so each restores the state the last one
/// committed. The query reads two streams, each given every batch (a
/// query over one leaves the second unread).
async fn run(query: fn(StreamFrame, StreamFrame) -> StreamFrame, dir: &Path) -> (Vec<Epoch>, u64) {
    let start = Instant::now();
    let mut fed: Vec<RecordBatch> = Vec::new();
    let mut outputs: BTreeMap<u64, Vec<RecordBatch>> = BTreeMap::new();
    let mut state_rows = 0;
    for (at, batch) in schedule() {
        let at = Duration::from_secs_f64(at);
        tokio::time::sleep(at.saturating_sub(start.elapsed())).await;
        fed.push(rows(&batch));
        let (input, second) = (MemoryStream::new(schema()), MemoryStream::new(schema()));
        for b in &fed {
            input.add_batch(b.clone()).unwrap();
            second.add_batch(b.clone()).unwrap();
        }
        let out = MemorySink::new();
        let session = Session::new();
        let frame = session.read_stream().memory(&input).unwrap();
        let other = session.read_stream().memory(&second).unwrap();
        let handle = query(frame, other)
            .write_stream()
            .memory(&out)
            .output_mode(OutputMode::Update)
            .trigger(Trigger::AvailableNow)
            .checkpoint_location(dir)
            .set("state.ttl", &format!("{TTL_MS} ms"))
            .unwrap()
            .start()
            .await
            .unwrap();
        assert!(handle
            .await_termination_timeout(Duration::from_secs(60))
            .await
            .unwrap());
        state_rows = handle.last_progress().map_or(0, |p| p.state_rows);
        for e in out.epochs() {
            outputs.insert(e, out.epoch_batches(e));
        }
    }
    let checkpoint = Checkpoint::open_existing(dir).unwrap();
    let epochs = checkpoint.latest_commit_epoch().unwrap().unwrap();
    assert_eq!(epochs, schedule().len() as u64, "one epoch per batch");
    let epochs = (1..=epochs)
        .map(|e| {
            let at = checkpoint.read_offsets(e).unwrap().planned_at_ms;
            (at, outputs.remove(&e).unwrap_or_default())
        })
        .collect();
    (epochs, state_rows)
}

/// Whether state last written at `written` has expired at `now`.
fn expired(written: i64, now: i64) -> bool {
    written < now - TTL_MS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_by_keys_unwritten_for_the_ttl_start_again_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (epochs, state_rows) = run(
        |f, _| {
            f.aggregate(
                vec![col("k")],
                vec![count(lit(1)).alias("n"), sum(col("v")).alias("total")],
            )
            .unwrap()
        },
        dir.path(),
    )
    .await;
    // The loop: per key (count, sum, written at).
    let mut state: BTreeMap<i64, (i64, i64, i64)> = BTreeMap::new();
    let (mut restarted, mut continued) = (0, 0);
    for ((now, got), (_, batch)) in epochs.iter().zip(schedule()) {
        let before = state.len();
        state.retain(|_, s| !expired(s.2, *now));
        restarted += before - state.len();
        let mut want = BTreeMap::new();
        for (k, v) in batch {
            let s = state.entry(k).or_insert((0, 0, *now));
            continued += usize::from(s.0 > 0 && s.2 < *now);
            *s = (s.0 + 1, s.1 + v, *now);
            want.insert(k, (s.0, s.1));
        }
        let emitted: BTreeMap<i64, (i64, i64)> = ints(got, "k")
            .into_iter()
            .zip(ints(got, "n").into_iter().zip(ints(got, "total")))
            .collect();
        assert_eq!(emitted, want, "the epoch at {now} ms");
    }
    assert!(restarted > 0 && continued > 0, "{restarted} {continued}");
    let now = epochs.last().unwrap().0;
    let live = state.values().filter(|s| !expired(s.2, now)).count();
    assert_eq!(state_rows, live as u64, "the keys the last epoch kept");

    // The keys' ages are in the checkpoint: the query without a TTL is
    // refused over it, saying why.
    let input = MemoryStream::new(schema());
    let refused = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .aggregate(
            vec![col("k")],
            vec![count(lit(1)).alias("n"), sum(col("v")).alias("total")],
        )
        .unwrap()
        .write_stream()
        .memory(&MemorySink::new())
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.path())
        .start()
        .await;
    let Err(err) = refused.map(|_| ()) else {
        panic!("a query without a TTL started over a checkpoint written with one");
    };
    let err = err.to_string();
    assert!(err.contains("'state.ttl'"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicated_key_is_emitted_again_once_its_first_row_is_older_than_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (epochs, _) = run(|f, _| f.drop_duplicates(&["k"]).unwrap(), dir.path()).await;
    // The loop: per key, when its first row came (a later row of the key
    // writes nothing, so the clock does not restart, as in Flink).
    let mut first: BTreeMap<i64, i64> = BTreeMap::new();
    let mut again = 0;
    for ((now, got), (_, batch)) in epochs.iter().zip(schedule()) {
        let before = first.len();
        first.retain(|_, at| !expired(*at, *now));
        again += before - first.len();
        let mut want = Vec::new();
        for (k, v) in batch {
            if let std::collections::btree_map::Entry::Vacant(slot) = first.entry(k) {
                slot.insert(*now);
                want.push((k, v));
            }
        }
        let emitted: Vec<(i64, i64)> = ints(got, "k").into_iter().zip(ints(got, "v")).collect();
        assert_eq!(emitted, want, "the epoch at {now} ms");
    }
    assert!(again > 0, "some key came back after its state expired");
}

/// The highest `v` per `k`: a partition's top row is written when a row
/// beats it, and the partition's state expires once that has not happened
/// for the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_n_partition_unwritten_for_the_ttl_ranks_its_next_row_first() {
    let dir = tempfile::tempdir().unwrap();
    let (epochs, _) = run(
        |f, _| {
            f.select(vec![
                col("k"),
                col("v"),
                row_number()
                    .partition_by(vec![col("k")])
                    .order_by(vec![col("v").sort(false, true)])
                    .build()
                    .unwrap()
                    .alias("rn"),
            ])
            .unwrap()
            .filter(col("rn").lt_eq(lit(1u64)))
            .unwrap()
        },
        dir.path(),
    )
    .await;
    let mut top: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    let mut lower_first = 0;
    for ((now, got), (_, batch)) in epochs.iter().zip(schedule()) {
        let gone: BTreeMap<i64, (i64, i64)> = top
            .iter()
            .filter(|(_, t)| expired(t.1, *now))
            .map(|(k, t)| (*k, *t))
            .collect();
        top.retain(|k, _| !gone.contains_key(k));
        let mut want = BTreeMap::new();
        for (k, v) in batch {
            if top.get(&k).is_some_and(|t| t.0 >= v) {
                continue;
            }
            lower_first += usize::from(gone.get(&k).is_some_and(|t| t.0 > v));
            top.insert(k, (v, *now));
            want.insert(k, v);
        }
        let emitted: BTreeMap<i64, i64> = ints(got, "k").into_iter().zip(ints(got, "v")).collect();
        assert_eq!(emitted, want, "the epoch at {now} ms");
    }
    assert!(
        lower_first > 0,
        "a lower row ranked first after its partition expired"
    );
}

/// An unbounded inner join of two append-only streams (Nexmark q3's
/// shape) on `k`: each row is forgotten once the TTL has passed since it
/// arrived, so a later row of the other side no longer meets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_join_forgets_each_row_once_older_than_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (epochs, state_rows) = run(
        |l, r| {
            l.alias("l")
                .unwrap()
                .join(
                    r.alias("r").unwrap(),
                    JoinType::Inner,
                    vec![col("l.k").eq(col("r.k"))],
                )
                .unwrap()
                .select(vec![
                    col("l.k").alias("k"),
                    col("l.v").alias("lv"),
                    col("r.v").alias("rv"),
                ])
                .unwrap()
        },
        dir.path(),
    )
    .await;
    // The loop: both sides' rows as (k, v, arrived at).
    let mut left: Vec<(i64, i64, i64)> = Vec::new();
    let mut right = left.clone();
    let mut forgotten = 0;
    for ((now, got), (_, batch)) in epochs.iter().zip(schedule()) {
        let before = left.len() + right.len();
        left.retain(|row| !expired(row.2, *now));
        right.retain(|row| !expired(row.2, *now));
        forgotten += before - left.len() - right.len();
        let new: Vec<(i64, i64, i64)> = batch.iter().map(|&(k, v)| (k, v, *now)).collect();
        let mut want = Vec::new();
        // New left rows against every right row, then old left rows
        // against the new right rows: each pair once.
        for l in &new {
            for r in right.iter().chain(&new).filter(|r| r.0 == l.0) {
                want.push((l.0, l.1, r.1));
            }
        }
        for l in &left {
            for r in new.iter().filter(|r| r.0 == l.0) {
                want.push((l.0, l.1, r.1));
            }
        }
        left.extend(&new);
        right.extend(&new);
        let mut emitted: Vec<(i64, i64, i64)> = ints(got, "k")
            .into_iter()
            .zip(ints(got, "lv").into_iter().zip(ints(got, "rv")))
            .map(|(k, (l, r))| (k, l, r))
            .collect();
        emitted.sort_unstable();
        want.sort_unstable();
        assert_eq!(emitted, want, "the epoch at {now} ms");
    }
    assert!(forgotten > 0, "some rows expired");
    assert_eq!(
        state_rows,
        (left.len() + right.len()) as u64,
        "the rows the last epoch kept"
    );
}
