//! Stream–stream interval joins, checked against an independent answer:
//! the test judges lateness itself (plain loops over the rules in
//! `watermark`, two inputs), and DataFusion's batch join over the rows
//! that were not late gives the pairs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sluice::arrow::array::{AsArray, Int64Array, RecordBatch};
use sluice::arrow::compute::cast;
use sluice::arrow::datatypes::{DataType, Field, Int64Type, IntervalMonthDayNano, Schema};
use sluice::datafusion::common::{JoinType, ScalarValue};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, OutputMode, Session, Trigger, Window};

use crate::util::{
    block_on, property, state_deltas, timed_batch as to_batch, timed_schema as schema, Lcg,
    TimedRow as Row,
};

const DELAY_MS: i64 = 1_000;
/// `l.ts - r.ts` must lie in `[LO_MS, HI_MS]`.
const LO_MS: i64 = -1_000;
const HI_MS: i64 = 3_000;

/// One joined row: left (k, v, ts), right (v, ts) or nulls.
type Joined = (i64, i64, i64, Option<i64>, Option<i64>);

/// Per epoch, a batch for each side. With `both`, either may be empty but
/// not both; without, exactly one side has rows.
fn input(rng: &mut Lcg, epochs: usize, both: bool) -> Vec<[Vec<Row>; 2]> {
    let start = 1_700_000_000_000i64;
    let mut clock = start;
    let mut id = 0;
    let mut unmatched_placed = false;
    (0..epochs)
        .map(|e| {
            clock += 200 + rng.next(1_500) as i64;
            let side = |present: bool, rng: &mut Lcg, id: &mut i64| -> Vec<Row> {
                if !present {
                    return Vec::new();
                }
                (0..1 + rng.next(8))
                    .map(|_| {
                        *id += 1;
                        let ts = clock - rng.next(4_000) as i64 + rng.next(300) as i64;
                        (rng.next(6) as i64, *id, ts)
                    })
                    .collect()
            };
            let (left_present, right_present) = if both {
                (e % 5 != 3, e % 5 != 1)
            } else {
                let left = rng.next(2) == 0;
                (left, !left)
            };
            let mut left = side(left_present, rng, &mut id);
            if left_present && !unmatched_placed {
                // No right row has key 99: this one surely stays unmatched.
                id += 1;
                left.push((99, id, clock + 300));
                unmatched_placed = true;
            }
            if e > 0 && left_present {
                // A minute behind anything read: surely late.
                id += 1;
                left.push((0, id, start - 60_000));
            }
            [left, side(right_present, rng, &mut id)]
        })
        .collect()
}

/// The rows that are not late, per side, and the final query watermark.
fn judge(epochs: &[[Vec<Row>; 2]]) -> ([Vec<Row>; 2], u64, Option<i64>) {
    let mut marks: [Option<i64>; 2] = [None, None];
    let mut kept: [Vec<Row>; 2] = [Vec::new(), Vec::new()];
    let mut late = 0;
    let query = |m: &[Option<i64>; 2]| m.iter().flatten().copied().min();
    for epoch in epochs {
        let before = query(&marks);
        for (side, rows) in epoch.iter().enumerate() {
            for r in rows {
                if before.is_some_and(|w| r.2 < w) {
                    late += 1;
                } else {
                    kept[side].push(*r);
                }
            }
            if let Some(latest) = rows.iter().map(|r| r.2).max() {
                let w = latest - DELAY_MS;
                marks[side] = Some(marks[side].map_or(w, |m| m.max(w)));
            }
        }
    }
    (kept, late, query(&marks))
}

fn interval(ms: i64) -> Expr {
    lit(ScalarValue::IntervalMonthDayNano(Some(
        IntervalMonthDayNano::new(0, 0, ms * 1_000_000),
    )))
}

/// Which join of the two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// On the key and `l.ts - r.ts` within `[LO_MS, HI_MS]`.
    Interval,
    /// On the key alone.
    Unbounded,
    /// On the key and the same TUMBLE window of `WINDOW_MS`.
    Window,
    /// On the key and `r.ts BETWEEN l.ts AND l.closes`: a bound by two
    /// columns of the left side (Nexmark q4's auction and its expiry), with
    /// `closes` ([`closes`]) not watermarked and varying per row.
    TwoColumns,
}

/// The left side's rows with `closes`, 1 or 3 seconds after `ts`.
fn with_closes() -> Vec<Expr> {
    let closes = when(
        (col("v") % lit(2i64)).eq(lit(0i64)),
        col("ts") + interval(1_000),
    )
    .otherwise(col("ts") + interval(3_000))
    .unwrap();
    vec![col("k"), col("v"), col("ts"), closes.alias("closes")]
}

const WINDOW_MS: i64 = 2_000;

/// The join condition: the key, and the time bound of `shape`.
fn condition(shape: Shape) -> Vec<Expr> {
    let mut on = vec![col("l.k").eq(col("r.k"))];
    match shape {
        Shape::Interval => on.push(
            col("l.ts").between(col("r.ts") + interval(LO_MS), col("r.ts") + interval(HI_MS)),
        ),
        Shape::Unbounded => {}
        Shape::Window => on.push(col("l.window_start").eq(col("r.window_start"))),
        Shape::TwoColumns => on.push(col("r.ts").between(col("l.ts"), col("l.closes"))),
    }
    on
}

fn output_columns() -> Vec<Expr> {
    vec![
        col("l.k").alias("k"),
        col("l.v").alias("lv"),
        col("l.ts").alias("lts"),
        col("r.v").alias("rv"),
        col("r.ts").alias("rts"),
    ]
}

fn rows_of(batches: &[RecordBatch]) -> Vec<Joined> {
    let mut out = Vec::new();
    for b in batches {
        let get = |name: &str| {
            cast(b.column_by_name(name).unwrap(), &DataType::Int64)
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone()
        };
        let (k, lv, lts, rv, rts) = (get("k"), get("lv"), get("lts"), get("rv"), get("rts"));
        for i in 0..b.num_rows() {
            let opt = |a: &Int64Array| (!a.is_null(i)).then(|| a.value(i));
            out.push((k.value(i), lv.value(i), lts.value(i), opt(&rv), opt(&rts)));
        }
    }
    out.sort();
    out
}

use sluice::arrow::array::Array;

/// DataFusion's batch join over the rows that were not late.
async fn batch_answer(kept: &[Vec<Row>; 2], join_type: JoinType, shape: Shape) -> Vec<Joined> {
    assert_ne!(shape, Shape::Window, "see window_answer");
    let ctx = SessionContext::new();
    let mut l = ctx.read_batch(to_batch(&kept[0])).unwrap();
    if shape == Shape::TwoColumns {
        l = l.select(with_closes()).unwrap();
    }
    let l = l.alias("l").unwrap();
    let r = ctx
        .read_batch(to_batch(&kept[1]))
        .unwrap()
        .alias("r")
        .unwrap();
    let out = l
        .join_on(r, join_type, condition(shape))
        .unwrap()
        .select(output_columns())
        .unwrap()
        .collect()
        .await
        .unwrap();
    rows_of(&out)
}

struct Run<T = Joined> {
    rows: Vec<T>,
    late_rows: u64,
    state_rows: u64,
}

/// Runs the join epoch by epoch. Continuous runs (one side per epoch, so
/// adding rows never races the epoch loop) restart from the checkpoint at
/// random; step runs start a fresh available-now run per epoch, so both
/// sides can bring rows to one epoch.
async fn run_streaming(
    epochs: &[[Vec<Row>; 2]],
    join_type: JoinType,
    shape: Shape,
    step: bool,
    rng: &mut Lcg,
    dir: &std::path::Path,
) -> Run {
    let as_rows = (
        output_columns(),
        rows_of as fn(&[RecordBatch]) -> Vec<Joined>,
    );
    run_streaming_as(epochs, join_type, shape, step, rng, dir, as_rows).await
}

/// The columns a join test selects, and how it reads them back.
type Selected<T> = (Vec<Expr>, fn(&[RecordBatch]) -> Vec<T>);

/// [`run_streaming`], selecting `columns` and reading them with `rows`.
async fn run_streaming_as<T: Ord>(
    epochs: &[[Vec<Row>; 2]],
    join_type: JoinType,
    shape: Shape,
    step: bool,
    rng: &mut Lcg,
    dir: &std::path::Path,
    (columns, rows): Selected<T>,
) -> Run<T> {
    let mut run = Run {
        rows: Vec::new(),
        late_rows: 0,
        state_rows: 0,
    };
    let mut fed = 0;
    while fed < epochs.len() {
        let inputs = [MemoryStream::new(schema()), MemoryStream::new(schema())];
        let feed = |epoch: &[Vec<Row>; 2]| {
            for (side, rows) in epoch.iter().enumerate() {
                if !rows.is_empty() {
                    inputs[side].add_batch(to_batch(rows)).unwrap();
                }
            }
        };
        epochs[..fed].iter().for_each(feed);
        if step {
            feed(&epochs[fed]);
        }
        let session = Session::new();
        let side = |i: usize, name: &str| {
            let mut frame = session
                .read_stream()
                .memory(&inputs[i])
                .unwrap()
                .with_watermark("ts", Duration::from_millis(DELAY_MS as u64))
                .unwrap();
            if shape == Shape::Window {
                let size = Duration::from_millis(WINDOW_MS as u64);
                frame = frame.window(Window::tumble("ts", size)).unwrap();
            }
            if shape == Shape::TwoColumns && i == 0 {
                frame = frame.select(with_closes()).unwrap();
            }
            frame.alias(name).unwrap()
        };
        let out = MemorySink::new();
        let query = side(0, "l")
            .join(side(1, "r"), join_type, condition(shape))
            .unwrap()
            .select(columns.clone())
            .unwrap()
            .write_stream()
            .memory(&out)
            .output_mode(OutputMode::Append)
            .trigger(if step {
                Trigger::AvailableNow
            } else {
                Trigger::ProcessingTime(Duration::ZERO)
            })
            .checkpoint_location(dir)
            .start()
            .await
            .unwrap();
        if step {
            query.await_termination().await.unwrap();
            fed += 1;
        } else {
            for epoch in epochs[fed..].iter().take(1 + rng.next(4) as usize) {
                feed(epoch);
                query.process_all_available().await.unwrap();
                fed += 1;
            }
        }
        for p in query.recent_progress() {
            run.late_rows += p.late_rows;
            run.state_rows = p.state_rows;
        }
        query.stop().await.unwrap();
        for e in out.epochs() {
            run.rows.extend(rows(&out.epoch_batches(e)));
        }
    }
    run.rows.sort();
    // Restored from a snapshot and the deltas after it, not snapshots only.
    assert!(state_deltas(dir) > 0, "no join delta in the checkpoint");
    run
}

/// A time-bounded inner join (`Interval`, `Window`, `TwoColumns`) emits exactly the
/// pairs of the rows that were not late (`Interval`: DataFusion's batch
/// join; `Window`: [`window_answer`]), and its state forgets rows no
/// partner can reach any more.
fn bounded_inner_join_equals_its_answer_across_restarts(shape: Shape) {
    property(4, |seed| {
        let step = seed % 2 == 0;
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16, step);
            let dir = tempfile::tempdir().unwrap();
            let run =
                run_streaming(&epochs, JoinType::Inner, shape, step, &mut rng, dir.path()).await;
            let (kept, late, _) = judge(&epochs);
            assert!(late > 0, "seed {seed}: the input should have late rows");
            assert_eq!(run.late_rows, late, "seed {seed}");
            let expected = match shape {
                Shape::Window => window_answer(&kept),
                _ => batch_answer(&kept, JoinType::Inner, shape).await,
            };
            assert!(!expected.is_empty(), "seed {seed}: no pairs");
            assert_eq!(run.rows, expected, "seed {seed}");
            let total: usize = kept.iter().map(Vec::len).sum();
            assert!(
                (run.state_rows as usize) < total,
                "seed {seed}: rows no partner can reach leave the state"
            );
        })
    });
}

#[test]
fn inner_interval_join_equals_the_batch_join_across_restarts() {
    bounded_inner_join_equals_its_answer_across_restarts(Shape::Interval);
}

#[test]
fn left_interval_join_emits_unmatched_rows_once_the_watermark_passes() {
    property(4, |seed| {
        let step = seed % 2 == 0;
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16, step);
            let dir = tempfile::tempdir().unwrap();
            let run = run_streaming(
                &epochs,
                JoinType::Left,
                Shape::Interval,
                step,
                &mut rng,
                dir.path(),
            )
            .await;
            let (kept, late, watermark) = judge(&epochs);
            assert_eq!(run.late_rows, late, "seed {seed}");
            let watermark = watermark.unwrap();
            // Matched pairs all appear; an unmatched left row appears once no
            // right row can match it any more: l.ts - LO < watermark.
            let expected: Vec<Joined> = batch_answer(&kept, JoinType::Left, Shape::Interval)
                .await
                .into_iter()
                .filter(|j| j.3.is_some() || j.2 - LO_MS < watermark)
                .collect();
            assert!(
                expected.iter().any(|j| j.3.is_none()),
                "seed {seed}: some left rows are unmatched"
            );
            assert_eq!(run.rows, expected, "seed {seed}");
            let mut per_left: BTreeMap<i64, usize> = BTreeMap::new();
            for j in run.rows.iter().filter(|j| j.3.is_none()) {
                *per_left.entry(j.1).or_default() += 1;
            }
            assert!(per_left.values().all(|n| *n == 1), "seed {seed}");
        })
    });
}

/// A row of a full outer join, either side's columns null when it had no
/// partner: (l.k, l.v, l.ts, r.k, r.v, r.ts).
type FullJoined = [Option<i64>; 6];

fn full_columns() -> Vec<Expr> {
    ["l.k", "l.v", "l.ts", "r.k", "r.v", "r.ts"]
        .iter()
        .enumerate()
        .map(|(i, c)| col(*c).alias(format!("c{i}")))
        .collect()
}

fn full_rows_of(batches: &[RecordBatch]) -> Vec<FullJoined> {
    let mut out = Vec::new();
    for b in batches {
        let columns: Vec<Int64Array> = (0..6)
            .map(|i| {
                cast(
                    b.column_by_name(&format!("c{i}")).unwrap(),
                    &DataType::Int64,
                )
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone()
            })
            .collect();
        for r in 0..b.num_rows() {
            out.push(std::array::from_fn(|i| {
                (!columns[i].is_null(r)).then(|| columns[i].value(r))
            }));
        }
    }
    out.sort();
    out
}

/// Right and full outer interval joins: every matched pair, and each row of
/// a kept side that found no partner, padded with nulls, once the watermark
/// rules a partner out (a left row once `l.ts - LO < watermark`, a right
/// row once `r.ts + HI < watermark`), exactly once across restarts.
#[test]
fn right_and_full_interval_joins_emit_unmatched_rows_once_the_watermark_passes() {
    property(3, |seed| {
        let step = seed % 2 == 0;
        for join_type in [JoinType::Right, JoinType::Full] {
            block_on(right_or_full(seed, step, join_type));
        }
    });
}

/// One case of the test above: `join_type` over the input of `seed`.
async fn right_or_full(seed: u64, step: bool, join_type: JoinType) {
    let mut rng = Lcg(seed);
    let epochs = input(&mut rng, 16, step);
    let dir = tempfile::tempdir().unwrap();
    let as_rows: Selected<FullJoined> = (full_columns(), full_rows_of);
    let run = run_streaming_as(
        &epochs,
        join_type,
        Shape::Interval,
        step,
        &mut rng,
        dir.path(),
        as_rows,
    )
    .await;
    let (kept, late, watermark) = judge(&epochs);
    assert_eq!(run.late_rows, late, "seed {seed}");
    let watermark = watermark.unwrap();
    let ctx = SessionContext::new();
    let side = |i: usize, name: &str| {
        ctx.read_batch(to_batch(&kept[i]))
            .unwrap()
            .alias(name)
            .unwrap()
    };
    let batch = side(0, "l")
        .join_on(side(1, "r"), join_type, condition(Shape::Interval))
        .unwrap()
        .select(full_columns())
        .unwrap()
        .collect()
        .await
        .unwrap();
    let expected: Vec<FullJoined> = full_rows_of(&batch)
        .into_iter()
        .filter(|j| match (j[2], j[5]) {
            (Some(_), Some(_)) => true,
            (Some(lts), None) => lts - LO_MS < watermark,
            (None, Some(rts)) => rts + HI_MS < watermark,
            (None, None) => false,
        })
        .collect();
    assert!(
        expected.iter().any(|j| j[2].is_none()),
        "seed {seed}: some right rows are unmatched"
    );
    if join_type == JoinType::Full {
        assert!(
            expected.iter().any(|j| j[5].is_none()),
            "seed {seed}: some left rows are unmatched"
        );
    }
    assert_eq!(run.rows, expected, "seed {seed} ({join_type})");
}

#[test]
fn unbounded_inner_join_equals_the_batch_join_across_restarts() {
    property(4, |seed| {
        let step = seed % 2 == 0;
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16, step);
            let dir = tempfile::tempdir().unwrap();
            let run = run_streaming(
                &epochs,
                JoinType::Inner,
                Shape::Unbounded,
                step,
                &mut rng,
                dir.path(),
            )
            .await;
            // Without a time bound nothing is late and nothing is forgotten:
            // the answer is the batch join of every row read.
            let all = [0, 1].map(|side| epochs.iter().flat_map(|e| e[side].clone()).collect());
            assert_eq!(run.late_rows, 0, "seed {seed}");
            let expected = batch_answer(&all, JoinType::Inner, Shape::Unbounded).await;
            assert!(!expected.is_empty(), "seed {seed}: no pairs");
            assert_eq!(run.rows, expected, "seed {seed}");
            let total: usize = all.iter().map(Vec::len).sum();
            assert_eq!(
                run.state_rows as usize, total,
                "seed {seed}: every row stays"
            );
        })
    });
}

/// The window join's pairs, by nested loops over the rows that were not
/// late: same key, same `[k·WINDOW_MS, (k+1)·WINDOW_MS)`.
fn window_answer(kept: &[Vec<Row>; 2]) -> Vec<Joined> {
    let window = |ts: i64| ts.div_euclid(WINDOW_MS);
    let mut out = Vec::new();
    for l in &kept[0] {
        for r in kept[1]
            .iter()
            .filter(|r| r.0 == l.0 && window(r.2) == window(l.2))
        {
            out.push((l.0, l.1, l.2, Some(r.1), Some(r.2)));
        }
    }
    out.sort();
    out
}

#[test]
fn window_join_equals_the_pairs_of_each_window_across_restarts() {
    bounded_inner_join_equals_its_answer_across_restarts(Shape::Window);
}

#[test]
fn join_bounded_by_two_columns_equals_the_batch_join_across_restarts() {
    bounded_inner_join_equals_its_answer_across_restarts(Shape::TwoColumns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_left_join_of_append_only_streams_into_the_output_is_refused_with_what_to_add()
{
    let inputs = [MemoryStream::new(schema()), MemoryStream::new(schema())];
    let session = Session::new();
    let side = |i: usize, name: &str| {
        session
            .read_stream()
            .memory(&inputs[i])
            .unwrap()
            .with_watermark("ts", Duration::from_secs(1))
            .unwrap()
            .alias(name)
            .unwrap()
    };
    let err = side(0, "l")
        .join(side(1, "r"), JoinType::Left, condition(Shape::Unbounded))
        .unwrap()
        .write_stream()
        .memory(&MemorySink::new())
        .start()
        .await
        .unwrap_err();
    // Its unmatched rows would be taken back later, and neither input has
    // a key to write them under.
    assert!(err.is_user_error());
    for part in ["left input has no key", "BETWEEN"] {
        assert!(err.to_string().contains(part), "{part}: {err}");
    }
}

#[test]
fn a_stream_joined_with_a_static_table_equals_the_batch_join() {
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            // Stream rows keyed 0..6; the table names keys 0..4 only, so a
            // LEFT join keeps some rows without a name.
            let epochs: Vec<Vec<Row>> = input(&mut rng, 10, true)
                .into_iter()
                .map(|[l, r]| [l, r].concat())
                .filter(|b| !b.is_empty())
                .collect();
            let dims = RecordBatch::try_new(
                Arc::new(Schema::new(vec![
                    Field::new("id", DataType::Int64, false),
                    Field::new("w", DataType::Int64, false),
                ])),
                vec![
                    Arc::new(Int64Array::from(vec![0, 1, 2, 3])),
                    Arc::new(Int64Array::from(vec![100, 101, 102, 103])),
                ],
            )
            .unwrap();
            let columns = || {
                vec![
                    col("s.k").alias("k"),
                    col("s.v").alias("lv"),
                    col("s.ts").alias("lts"),
                    col("d.w").alias("rv"),
                    col("d.id").alias("rts"),
                ]
            };
            let on = || vec![col("s.k").eq(col("d.id"))];
            let dir = tempfile::tempdir().unwrap();
            let mut got = Vec::new();
            let mut fed = 0;
            while fed < epochs.len() {
                let input = MemoryStream::new(schema());
                for b in &epochs[..fed] {
                    input.add_batch(to_batch(b)).unwrap();
                }
                let session = Session::new();
                session
                    .context()
                    .register_batch("dims", dims.clone())
                    .unwrap();
                let out = MemorySink::new();
                let query = session
                    .read_stream()
                    .memory(&input)
                    .unwrap()
                    .alias("s")
                    .unwrap()
                    .join(
                        session.table("dims").await.unwrap().alias("d").unwrap(),
                        JoinType::Left,
                        on(),
                    )
                    .unwrap()
                    .select(columns())
                    .unwrap()
                    .write_stream()
                    .memory(&out)
                    .checkpoint_location(dir.path())
                    .start()
                    .await
                    .unwrap();
                for b in epochs[fed..].iter().take(1 + rng.next(4) as usize) {
                    input.add_batch(to_batch(b)).unwrap();
                    query.process_all_available().await.unwrap();
                    fed += 1;
                }
                query.stop().await.unwrap();
                for e in out.epochs() {
                    got.extend(rows_of(&out.epoch_batches(e)));
                }
            }
            got.sort();
            let ctx = SessionContext::new();
            let all = ctx
                .read_batch(to_batch(&epochs.concat()))
                .unwrap()
                .alias("s")
                .unwrap();
            let d = ctx.read_batch(dims.clone()).unwrap().alias("d").unwrap();
            let expected = rows_of(
                &all.join_on(d, JoinType::Left, on())
                    .unwrap()
                    .select(columns())
                    .unwrap()
                    .collect()
                    .await
                    .unwrap(),
            );
            assert!(expected.iter().any(|j| j.3.is_none()), "seed {seed}");
            assert_eq!(got, expected, "seed {seed}");
        })
    });
}

/// A full outer interval join of two Kafka streams, through five kills
/// with SIGKILL: the committed output (read_committed) is every matched
/// pair and every unmatched row of either side exactly once, as
/// DataFusion's batch join gives it. Each stream's event times rise (no
/// row is late), and a last pair far ahead moves the watermark past every
/// other row, so every unmatched row is out by the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_outer_interval_join_is_exact_through_kill_9() {
    use crate::changelog::send_keyed;
    use crate::util::{broker, crash_seed, kill_9_five_times_then_finish};
    use sluice::broker::{create_topic, fresh_topic};
    // Each row's `v` is its own: the output names every row it holds.
    const JOINED: &str = "SELECT l.k AS lk, l.v AS lv, r.k AS rk, r.v AS rv FROM l FULL JOIN r \
                          ON l.k = r.k AND l.ts BETWEEN r.ts - INTERVAL '300' MILLISECOND \
                          AND r.ts + INTERVAL '300' MILLISECOND";
    let bootstrap = broker().await;
    let inputs = [fresh_topic("full-kill"), fresh_topic("full-kill")];
    let output = fresh_topic("full-kill-joined");
    for t in inputs.iter().chain([&output]) {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let mut rng = Lcg(crash_seed("kill -9", || 0xf011));
    let start = 1_767_225_600_000i64; // 2026-01-01
    let mut sides: [Vec<Row>; 2] = [Vec::new(), Vec::new()];
    for (side, rows) in sides.iter_mut().enumerate() {
        let mut ts = start;
        for i in 0..12_000 {
            ts += rng.next(20) as i64;
            rows.push((rng.next(100) as i64, (side * 100_000 + i) as i64, ts));
        }
        rows.push((-1, -1, start + 3_600_000));
    }
    for (rows, topic) in sides.iter().zip(&inputs) {
        let records: Vec<(String, Option<String>)> = rows
            .iter()
            .map(|(k, v, ts)| {
                let ts = chrono_free_rfc3339(*ts);
                (
                    k.to_string(),
                    Some(format!(r#"{{"k": {k}, "v": {v}, "ts": "{ts}"}}"#)),
                )
            })
            .collect();
        let (b, t) = (bootstrap.clone(), topic.clone());
        tokio::task::spawn_blocking(move || send_keyed(&b, &t, &records))
            .await
            .unwrap();
    }
    // The batch answer, each row as the Kafka sink's JSON encodes it.
    let ctx = SessionContext::new();
    for (rows, name) in sides.iter().zip(["l", "r"]) {
        ctx.register_batch(name, to_batch(rows)).unwrap();
    }
    let mut want = Vec::new();
    for b in ctx.sql(JOINED).await.unwrap().collect().await.unwrap() {
        let json = sluice_kafka::Format::Json.encode(&b).unwrap();
        want.extend(json.rows().map(|r| String::from_utf8(r.to_vec()).unwrap()));
    }
    want.sort();
    assert!(
        want.iter()
            .any(|r| r.contains(r#""lk":null"#) || !r.contains(r#""lk""#)),
        "some right rows are unmatched"
    );
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("full.sql");
    let stream = |name: &str, topic: &str| {
        format!(
            "CREATE STREAM {name} (k BIGINT, v BIGINT, ts TIMESTAMP, \
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
             WITH (connector = 'kafka', topic = '{topic}', 'bootstrap.servers' = '{bootstrap}', \
               'max-records-per-epoch' = '50');\n"
        )
    };
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '50 ms';\n\
             {l}{r}\
             CREATE STREAM joined WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO joined {JOINED};\n",
            cp = dir.path().join("cp").display(),
            l = stream("l", &inputs[0]),
            r = stream("r", &inputs[1]),
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };
    let output_now = || async {
        let mut rows: Vec<String> = crate::kafka::read(&bootstrap, &output)
            .await
            .into_iter()
            .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
            .collect();
        rows.sort();
        rows
    };
    kill_9_five_times_then_finish(command, &mut rng, &want, output_now).await;
}

/// `ms` since the epoch as RFC 3339 UTC text with milliseconds.
fn chrono_free_rfc3339(ms: i64) -> String {
    use sluice::arrow::array::TimestampMillisecondArray;
    let a = TimestampMillisecondArray::from(vec![ms]).with_timezone("UTC");
    let text = sluice::arrow::util::display::array_value_to_string(&a, 0).unwrap();
    text.replace("+00:00", "Z")
}
