//! Queries of several stateful operators, run as one pipeline: a windowed
//! aggregation feeding a join (Nexmark q7's shape) and a join feeding an
//! aggregation, each checked across restarts against an answer computed
//! here with plain loops over the rules of `watermark` and `window`.
//! Every epoch is a run of its own, so each restores the pipeline's state
//! from the checkpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice::arrow::array::{Array, RecordBatch};
use sluice::arrow::datatypes::IntervalMonthDayNano;
use sluice::datafusion::common::{JoinType, ScalarValue};
use sluice::datafusion::functions_aggregate::expr_fn::{avg, count, max, sum};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, OutputMode, Session, StreamFrame, Trigger, Window};

use crate::util::{
    block_on, ints, property, state_deltas, timed_batch as to_batch, timed_schema as schema, Lcg,
    TimedRow as Row,
};

pub(crate) const DELAY_MS: i64 = 1_000;
pub(crate) const WINDOW_MS: i64 = 2_000;

fn interval(ms: i64) -> Expr {
    lit(ScalarValue::IntervalMonthDayNano(Some(
        IntervalMonthDayNano::new(0, 0, ms * 1_000_000),
    )))
}

/// Per epoch some rows around a rising clock, small values (so that a
/// window's maximum is often tied), and now and then a surely late row.
pub(crate) fn input(rng: &mut Lcg, epochs: usize) -> Vec<Vec<Row>> {
    let start = 1_700_000_000_000i64;
    let mut clock = start;
    let mut id = 0;
    (0..epochs)
        .map(|e| {
            clock += 300 + rng.next(1_500) as i64;
            let mut rows: Vec<Row> = (0..1 + rng.next(10))
                .map(|_| {
                    id += 1;
                    (id, rng.next(8) as i64, clock - rng.next(3_000) as i64)
                })
                .collect();
            if e > 0 && e % 3 == 0 {
                id += 1;
                rows.push((id, 99, start - 60_000));
            }
            rows
        })
        .collect()
}

/// The rows that are not late, and the watermark after the last epoch.
fn judge(epochs: &[Vec<Row>]) -> (Vec<Row>, u64, Option<i64>) {
    let (mut kept, mut late, mut mark) = (Vec::new(), 0, None::<i64>);
    for rows in epochs {
        for r in rows {
            if mark.is_some_and(|w| r.2 < w) {
                late += 1;
            } else {
                kept.push(*r);
            }
        }
        if let Some(latest) = rows.iter().map(|r| r.2).max() {
            mark = Some(mark.map_or(latest - DELAY_MS, |m| m.max(latest - DELAY_MS)));
        }
    }
    (kept, late, mark)
}

pub(crate) struct Run {
    /// Every epoch's output rows, in order; none of them null.
    pub batches: Vec<RecordBatch>,
    /// Per epoch, its rows and the keys it retracted.
    pub epochs: Vec<(Vec<RecordBatch>, Option<RecordBatch>)>,
    pub late_rows: u64,
    pub state_rows: u64,
    /// State files in the checkpoint at the end that are deltas.
    pub deltas: usize,
}

/// Runs `query` (built over the session's memory stream `events`) one
/// epoch of `epochs` at a time, each an available-now run of its own that
/// restarts from the checkpoint: every epoch restores the pipeline's state.
pub(crate) async fn run_with_nulls(
    epochs: &[Vec<Row>],
    mode: OutputMode,
    query: impl Fn(&dyn Fn() -> StreamFrame) -> StreamFrame,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    let mut out = Run {
        batches: Vec::new(),
        epochs: Vec::new(),
        late_rows: 0,
        state_rows: 0,
        deltas: 0,
    };
    for rows in epochs {
        input.add_batch(to_batch(rows)).unwrap();
        let session = Session::new();
        // One stream, read on every path of the query (one input).
        let stream = session
            .read_stream()
            .memory(&input)
            .unwrap()
            .with_watermark("ts", Duration::from_millis(DELAY_MS as u64))
            .unwrap();
        let events = || stream.clone();
        let sink = MemorySink::new();
        let running = query(&events)
            .write_stream()
            .memory(&sink)
            .output_mode(mode)
            .trigger(Trigger::AvailableNow)
            .checkpoint_location(dir.path())
            .start()
            .await
            .unwrap();
        running.await_termination().await.unwrap();
        for p in running.recent_progress() {
            out.late_rows += p.late_rows;
            out.state_rows = p.state_rows;
        }
        for e in sink.epochs() {
            out.batches.extend(sink.epoch_batches(e));
            out.epochs
                .push((sink.epoch_batches(e), sink.epoch_retracted(e)));
        }
    }
    out.deltas = state_deltas(dir.path());
    out
}

/// [`run_with_nulls`], for a query whose rows have no nulls.
pub(crate) async fn run(
    epochs: &[Vec<Row>],
    mode: OutputMode,
    query: impl Fn(&dyn Fn() -> StreamFrame) -> StreamFrame,
) -> Run {
    let out = run_with_nulls(epochs, mode, query).await;
    for b in &out.batches {
        assert!(
            b.columns().iter().all(|c| c.null_count() == 0),
            "a null in {b:?}"
        );
    }
    out
}

/// Nexmark q7's shape: each closed window's highest value, joined back
/// with the rows that have it.
pub(crate) fn top_rows(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    let size = Duration::from_millis(WINDOW_MS as u64);
    let tops = events()
        .window(Window::tumble("ts", size))
        .unwrap()
        .aggregate(
            vec![col("window_start"), col("window_end")],
            vec![max(col("v")).alias("top")],
        )
        .unwrap()
        .alias("m")
        .unwrap();
    events()
        .alias("e")
        .unwrap()
        .join(
            tops,
            JoinType::Inner,
            vec![
                col("e.v").eq(col("m.top")),
                col("e.ts").between(
                    col("m.window_end") - interval(WINDOW_MS),
                    col("m.window_end"),
                ),
            ],
        )
        .unwrap()
        .select(vec![
            col("e.k").alias("id"),
            col("e.v").alias("v"),
            col("e.ts").alias("ts"),
            col("m.window_end").alias("window_end"),
        ])
        .unwrap()
}

#[test]
fn a_windowed_maximum_joined_back_with_its_rows_equals_the_loops_across_restarts() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 24);
            let run = run(&epochs, OutputMode::Append, top_rows).await;
            let (kept, late, watermark) = judge(&epochs);
            let watermark = watermark.unwrap();
            // The windows closed by the last watermark, their highest value,
            // and the rows with it in `[end - size, end]` (BETWEEN).
            let mut tops: BTreeMap<i64, i64> = BTreeMap::new();
            for r in &kept {
                let end = (r.2.div_euclid(WINDOW_MS) + 1) * WINDOW_MS;
                let top = tops.entry(end).or_insert(r.1);
                *top = (*top).max(r.1);
            }
            let mut expected = Vec::new();
            for (end, top) in tops.iter().filter(|(end, _)| **end <= watermark) {
                for r in kept
                    .iter()
                    .filter(|r| r.1 == *top && (end - WINDOW_MS..=*end).contains(&r.2))
                {
                    expected.push((r.0, r.1, r.2, *end));
                }
            }
            expected.sort();
            let b = &run.batches;
            let (id, v, ts, end) = (
                ints(b, "id"),
                ints(b, "v"),
                ints(b, "ts"),
                ints(b, "window_end"),
            );
            let mut actual: Vec<_> = (0..id.len())
                .map(|i| (id[i], v[i], ts[i], end[i]))
                .collect();
            actual.sort();
            assert!(late > 0, "seed {seed}: the input should have late rows");
            assert_eq!(run.late_rows, late, "seed {seed}: one read of the stream");
            assert!(expected.len() > 3, "seed {seed}: too few windows");
            assert_eq!(actual, expected, "seed {seed}");
            assert!(
                (run.state_rows as usize) < kept.len(),
                "seed {seed}: closed windows and their rows leave the state"
            );
        })
    });
}

/// Nexmark q5's shape: per closed window, the values counted most often;
/// the counts feed both a maximum per window and the join with it.
fn most_frequent(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    let size = Duration::from_millis(WINDOW_MS as u64);
    let counts = || {
        events()
            .window(Window::tumble("ts", size))
            .unwrap()
            .aggregate(
                vec![col("v"), col("window_start"), col("window_end")],
                vec![count(lit(1)).alias("n")],
            )
            .unwrap()
    };
    let tops = counts()
        .aggregate(
            vec![col("window_start"), col("window_end")],
            vec![max(col("n")).alias("top")],
        )
        .unwrap()
        .alias("m")
        .unwrap();
    counts()
        .alias("c")
        .unwrap()
        .join(
            tops,
            JoinType::Inner,
            vec![
                col("c.window_start").eq(col("m.window_start")),
                col("c.window_end").eq(col("m.window_end")),
                col("c.n").gt_eq(col("m.top")),
            ],
        )
        .unwrap()
        .select(vec![
            col("c.v").alias("v"),
            col("c.n").alias("n"),
            col("m.window_end").alias("window_end"),
        ])
        .unwrap()
}

#[test]
fn the_most_frequent_values_per_window_equal_the_loops_across_restarts() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 24);
            let run = run(&epochs, OutputMode::Append, most_frequent).await;
            let (kept, _, watermark) = judge(&epochs);
            let watermark = watermark.unwrap();
            let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
            for r in &kept {
                let end = (r.2.div_euclid(WINDOW_MS) + 1) * WINDOW_MS;
                *counts.entry((end, r.1)).or_default() += 1;
            }
            let mut tops: BTreeMap<i64, i64> = BTreeMap::new();
            for ((end, _), n) in &counts {
                let top = tops.entry(*end).or_insert(*n);
                *top = (*top).max(*n);
            }
            let mut expected: Vec<(i64, i64, i64)> = counts
                .iter()
                .filter(|((end, _), n)| *end <= watermark && tops[end] == **n)
                .map(|((end, v), n)| (*v, *n, *end))
                .collect();
            expected.sort();
            let b = &run.batches;
            let (v, n, end) = (ints(b, "v"), ints(b, "n"), ints(b, "window_end"));
            let mut actual: Vec<_> = (0..v.len()).map(|i| (v[i], n[i], end[i])).collect();
            actual.sort();
            assert!(expected.len() > 3, "seed {seed}: too few windows");
            assert_eq!(actual, expected, "seed {seed}");
        })
    });
}

/// A join feeding an aggregation: per key, how many pairs of rows of one
/// stream lie within a second of each other (a self interval join).
pub(crate) fn pairs_per_key(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    events()
        .alias("a")
        .unwrap()
        .join(
            events().alias("b").unwrap(),
            JoinType::Inner,
            vec![
                col("a.v").eq(col("b.v")),
                col("a.ts").between(col("b.ts") - interval(1_000), col("b.ts") + interval(1_000)),
            ],
        )
        .unwrap()
        .aggregate(vec![col("a.v")], vec![count(lit(1)).alias("pairs")])
        .unwrap()
        .select(vec![col("v"), col("pairs")])
        .unwrap()
}

#[test]
fn an_aggregation_over_an_interval_join_equals_the_loops_across_restarts() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 24);
            let run = run(&epochs, OutputMode::Update, pairs_per_key).await;
            let (kept, _, _) = judge(&epochs);
            let mut expected: BTreeMap<i64, i64> = BTreeMap::new();
            for a in &kept {
                for b in kept
                    .iter()
                    .filter(|b| b.1 == a.1 && (a.2 - b.2).abs() <= 1_000)
                {
                    let _ = b;
                    *expected.entry(a.1).or_default() += 1;
                }
            }
            // Update mode: the last row of each key is its count.
            let (v, pairs) = (ints(&run.batches, "v"), ints(&run.batches, "pairs"));
            let actual: BTreeMap<i64, i64> = v.into_iter().zip(pairs).collect();
            assert!(!expected.is_empty(), "seed {seed}");
            assert_eq!(actual, expected, "seed {seed}");
        })
    });
}

/// Nexmark q4's shape: an aggregation over an aggregation without a
/// window, whose rows change every epoch. Per value, its count and highest
/// key; then per bucket of counts (`n / 4`), how many values, and the sum
/// and mean of their highest keys. A value moves to the next bucket as its
/// count grows, and a bucket left empty is retracted.
pub(crate) fn buckets_of_counts(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    events()
        .aggregate(
            vec![col("v")],
            vec![count(lit(1)).alias("n"), max(col("k")).alias("top")],
        )
        .unwrap()
        .aggregate(
            vec![(col("n") / lit(4i64)).alias("bucket")],
            vec![
                count(col("top")).alias("values"),
                sum(col("top")).alias("total"),
                avg(col("top")).alias("mean"),
            ],
        )
        .unwrap()
}

#[test]
fn an_aggregation_over_a_changing_aggregation_equals_the_loops_across_restarts() {
    use sluice::arrow::array::AsArray;
    use sluice::arrow::datatypes::Float64Type;
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 24);
            let run = run(&epochs, OutputMode::Update, buckets_of_counts).await;
            // No operator is bounded by event time, so no row is late.
            assert_eq!(run.late_rows, 0, "seed {seed}");
            let mut per_value: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            for r in epochs.iter().flatten() {
                let (n, top) = per_value.entry(r.1).or_insert((0, r.0));
                *n += 1;
                *top = (*top).max(r.0);
            }
            let mut expected: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            for (n, top) in per_value.values() {
                let (values, total) = expected.entry(n / 4).or_default();
                *values += 1;
                *total += top;
            }
            // The output folded by key, as an upsert sink keeps it.
            let mut actual: BTreeMap<i64, (i64, i64, f64)> = BTreeMap::new();
            let mut retractions = 0;
            for (rows, retracted) in &run.epochs {
                let (bucket, values, total) = (
                    ints(rows, "bucket"),
                    ints(rows, "values"),
                    ints(rows, "total"),
                );
                let mean: Vec<f64> = rows
                    .iter()
                    .flat_map(|b| b["mean"].as_primitive::<Float64Type>().values().to_vec())
                    .collect();
                for i in 0..bucket.len() {
                    actual.insert(bucket[i], (values[i], total[i], mean[i]));
                }
                for gone in ints(retracted.as_slice(), "bucket") {
                    retractions += 1;
                    assert!(
                        actual.remove(&gone).is_some(),
                        "seed {seed}: {gone} was not out"
                    );
                }
            }
            let expected: BTreeMap<i64, (i64, i64, f64)> = expected
                .into_iter()
                .map(|(b, (values, total))| (b, (values, total, total as f64 / values as f64)))
                .collect();
            assert!(
                retractions > 0,
                "seed {seed}: the low buckets empty as counts grow"
            );
            // Restored each epoch from a snapshot and the deltas after it.
            assert!(run.deltas > 0, "seed {seed}: no pipeline delta");
            // The state holds a row per value and one per live bucket: an
            // emptied bucket leaves the state, not only the output.
            assert_eq!(
                run.state_rows as usize,
                per_value.len() + expected.len(),
                "seed {seed}"
            );
            assert_eq!(actual, expected, "seed {seed}");
        })
    });
}

/// Functions that cannot take a value back, over an aggregation whose rows
/// change: per value its count and highest key, then per bucket of counts
/// the lowest and highest of those keys, how many distinct counts, and how
/// many values have an even count (`count(*) FILTER`). A value leaving a
/// bucket takes its key back, so the bucket's minimum or maximum may have
/// to come back to one seen before.
pub(crate) fn extremes_of_buckets(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    use sluice::datafusion::functions_aggregate::expr_fn::{count_distinct, min};
    use sluice::datafusion::logical_expr::ExprFunctionExt;
    events()
        .aggregate(
            vec![col("v")],
            vec![count(lit(1)).alias("n"), max(col("k")).alias("top")],
        )
        .unwrap()
        .aggregate(
            vec![(col("n") / lit(4i64)).alias("bucket")],
            vec![
                min(col("top")).alias("low"),
                max(col("top")).alias("high"),
                count_distinct(col("n")).alias("counts"),
                count(lit(1))
                    .filter((col("n") % lit(2i64)).eq(lit(0i64)))
                    .build()
                    .unwrap()
                    .alias("even"),
            ],
        )
        .unwrap()
}

#[test]
fn min_max_and_distinct_over_a_changing_aggregation_equal_the_loops_across_restarts() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 24);
            let run = run(&epochs, OutputMode::Update, extremes_of_buckets).await;
            let mut per_value: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            for r in epochs.iter().flatten() {
                let (n, top) = per_value.entry(r.1).or_insert((0, r.0));
                *n += 1;
                *top = (*top).max(r.0);
            }
            // bucket → (low, high, distinct counts, values with an even count)
            let mut members: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
            for &(n, top) in per_value.values() {
                members.entry(n / 4).or_default().push((n, top));
            }
            let expected: BTreeMap<i64, (i64, i64, i64, i64)> = members
                .into_iter()
                .map(|(bucket, m)| {
                    let tops = m.iter().map(|(_, t)| *t);
                    let counts: std::collections::BTreeSet<i64> =
                        m.iter().map(|(n, _)| *n).collect();
                    let even = m.iter().filter(|(n, _)| n % 2 == 0).count() as i64;
                    let low = tops.clone().min().unwrap();
                    (
                        bucket,
                        (low, tops.max().unwrap(), counts.len() as i64, even),
                    )
                })
                .collect();
            // The output folded by key, as an upsert sink keeps it.
            let mut actual: BTreeMap<i64, (i64, i64, i64, i64)> = BTreeMap::new();
            let mut retractions = 0;
            for (rows, retracted) in &run.epochs {
                let [bucket, low, high, counts, even] =
                    ["bucket", "low", "high", "counts", "even"].map(|c| ints(rows, c));
                for (i, bucket) in bucket.into_iter().enumerate() {
                    actual.insert(bucket, (low[i], high[i], counts[i], even[i]));
                }
                for gone in ints(retracted.as_slice(), "bucket") {
                    retractions += 1;
                    assert!(
                        actual.remove(&gone).is_some(),
                        "seed {seed}: {gone} was not out"
                    );
                }
            }
            assert!(
                retractions > 0,
                "seed {seed}: the low buckets empty as counts grow"
            );
            // Restored each epoch from a snapshot and the deltas after it.
            assert!(run.deltas > 0, "seed {seed}: no pipeline delta");
            assert_eq!(actual, expected, "seed {seed}");
        })
    });
}

/// `CURRENT_WATERMARK(ts)` is the watermark an epoch's rows are judged by:
/// a query keeping `ts < CURRENT_WATERMARK(ts)` gets exactly the rows a
/// stateful operator drops as late, and its complement the others, each
/// epoch a run of its own that restores the watermark.
#[test]
fn current_watermark_routes_exactly_the_late_rows_across_restarts() {
    use sluice::CurrentWatermark;
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16);
            let mark = || CurrentWatermark::call(col("ts"));
            let late = run(&epochs, OutputMode::Append, |events| {
                events().filter(col("ts").lt(mark())).unwrap()
            })
            .await;
            let on_time = run(&epochs, OutputMode::Append, |events| {
                events()
                    .filter(col("ts").gt_eq(mark()).or(mark().is_null()))
                    .unwrap()
            })
            .await;
            let (kept, late_rows, _) = judge(&epochs);
            let sorted = |mut ids: Vec<i64>| {
                ids.sort();
                ids
            };
            let kept_ids = sorted(kept.iter().map(|r| r.0).collect());
            let late_ids: Vec<i64> = sorted(
                epochs
                    .iter()
                    .flatten()
                    .map(|r| r.0)
                    .filter(|id| kept_ids.binary_search(id).is_err())
                    .collect(),
            );
            assert!(late_rows > 0, "seed {seed}: the input has late rows");
            assert_eq!(late_ids.len() as u64, late_rows, "seed {seed}");
            assert_eq!(sorted(ints(&late.batches, "k")), late_ids, "seed {seed}");
            assert_eq!(sorted(ints(&on_time.batches, "k")), kept_ids, "seed {seed}");
        })
    });
}

/// Two aggregations over one stream, full outer joined on their key: per
/// value `v` among rows with an even `k`, how many (`n`); per value among
/// rows whose `k` divides by 3, the highest `k` (`top`). A value in one
/// and not yet in the other is padded with nulls until it is.
pub(crate) fn counts_beside_tops(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    let side = |divisor: i64, agg: Expr, alias: &str| {
        events()
            .filter((col("k") % lit(divisor)).eq(lit(0i64)))
            .unwrap()
            .aggregate(vec![col("v")], vec![agg])
            .unwrap()
            .alias(alias)
            .unwrap()
    };
    side(2, count(lit(1)).alias("n"), "a")
        .join(
            side(3, max(col("k")).alias("top"), "b"),
            JoinType::Full,
            vec![col("a.v").eq(col("b.v"))],
        )
        .unwrap()
        .select(vec![
            col("a.v").alias("av"),
            col("a.n").alias("n"),
            col("b.v").alias("bv"),
            col("b.top").alias("top"),
        ])
        .unwrap()
}

/// The values of column `name`, nulls as `None`.
fn nullable_ints(batches: &[RecordBatch], name: &str) -> Vec<Option<i64>> {
    use sluice::arrow::array::AsArray;
    use sluice::arrow::datatypes::Int64Type;
    batches
        .iter()
        .flat_map(|b| {
            b[name]
                .as_primitive::<Int64Type>()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect()
}

type Pair = (Option<i64>, Option<i64>);

#[test]
fn a_full_outer_join_of_two_changing_aggregations_equals_the_loops_after_every_epoch() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16);
            let run = run_with_nulls(&epochs, OutputMode::Update, counts_beside_tops).await;
            assert_eq!(run.epochs.len(), epochs.len(), "seed {seed}");
            // The output folded by its key (av, bv), as an upsert sink keeps
            // it, after each epoch, against the loops over the rows so far.
            let mut actual: BTreeMap<Pair, Pair> = BTreeMap::new();
            let (mut counts, mut tops) = (BTreeMap::new(), BTreeMap::new());
            let mut retractions = 0;
            for (e, (rows, retracted)) in run.epochs.iter().enumerate() {
                for r in &epochs[e] {
                    if r.0 % 2 == 0 {
                        *counts.entry(r.1).or_insert(0i64) += 1;
                    }
                    if r.0 % 3 == 0 {
                        let top = tops.entry(r.1).or_insert(r.0);
                        *top = (*top).max(r.0);
                    }
                }
                let (av, n, bv, top) = (
                    nullable_ints(rows, "av"),
                    nullable_ints(rows, "n"),
                    nullable_ints(rows, "bv"),
                    nullable_ints(rows, "top"),
                );
                for i in 0..av.len() {
                    actual.insert((av[i], bv[i]), (n[i], top[i]));
                }
                if let Some(gone) = retracted {
                    let (av, bv) = (
                        nullable_ints(std::slice::from_ref(gone), "av"),
                        nullable_ints(std::slice::from_ref(gone), "bv"),
                    );
                    for i in 0..av.len() {
                        retractions += 1;
                        assert!(
                            actual.remove(&(av[i], bv[i])).is_some(),
                            "seed {seed}: ({:?}, {:?}) was not out",
                            av[i],
                            bv[i]
                        );
                    }
                }
                let mut expected: BTreeMap<Pair, Pair> = BTreeMap::new();
                for v in counts.keys().chain(tops.keys()) {
                    let (n, top) = (counts.get(v).copied(), tops.get(v).copied());
                    let key = (n.map(|_| *v), top.map(|_| *v));
                    expected.insert(key, (n, top));
                }
                assert_eq!(actual, expected, "seed {seed}, epoch {e}");
            }
            assert!(
                retractions > 0,
                "seed {seed}: a value padded with nulls is replaced once the other side has it"
            );
            assert!(run.deltas > 0, "seed {seed}: no pipeline delta");
        })
    });
}

/// Each row joined with its value's count so far (an aggregation without
/// a window, whose rows change), then counted per count: a row moves to
/// the next count each time a row of its value arrives.
pub(crate) fn rows_per_count(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    let counts = events()
        .aggregate(vec![col("v")], vec![count(lit(1)).alias("n")])
        .unwrap()
        .alias("c")
        .unwrap();
    events()
        .alias("e")
        .unwrap()
        .join(counts, JoinType::Inner, vec![col("e.v").eq(col("c.v"))])
        .unwrap()
        .aggregate(vec![col("c.n")], vec![count(lit(1)).alias("rows")])
        .unwrap()
}

#[test]
fn an_aggregation_over_a_join_with_a_changing_aggregation_equals_the_loops_across_restarts() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let epochs = input(&mut rng, 16);
            let run = run(&epochs, OutputMode::Update, rows_per_count).await;
            let mut actual: BTreeMap<i64, i64> = BTreeMap::new();
            for (rows, retracted) in &run.epochs {
                let (n, count) = (ints(rows, "n"), ints(rows, "rows"));
                for i in 0..n.len() {
                    actual.insert(n[i], count[i]);
                }
                for gone in ints(retracted.as_slice(), "n") {
                    assert!(actual.remove(&gone).is_some(), "seed {seed}: {gone}");
                }
            }
            let mut per_value: BTreeMap<i64, i64> = BTreeMap::new();
            for r in epochs.iter().flatten() {
                *per_value.entry(r.1).or_default() += 1;
            }
            let mut expected: BTreeMap<i64, i64> = BTreeMap::new();
            for n in per_value.values() {
                *expected.entry(*n).or_default() += n;
            }
            assert_eq!(actual, expected, "seed {seed}");
        })
    });
}

/// Per value `v`, ordered by event time: the sum of the row's `k` and the
/// two before it (ROWS), and how many rows of the value fall within the
/// last 1.5 s (RANGE).
fn over_windows() -> Vec<Expr> {
    use sluice::datafusion::functions_aggregate::count::count_udaf;
    use sluice::datafusion::functions_aggregate::sum::sum_udaf;
    use sluice::datafusion::logical_expr::expr::WindowFunction;
    use sluice::datafusion::logical_expr::{
        ExprFunctionExt, WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
    };
    let over = |f, arg: Expr, frame: WindowFrame, name: &str| {
        Expr::from(WindowFunction::new(
            WindowFunctionDefinition::AggregateUDF(f),
            vec![arg],
        ))
        .partition_by(vec![col("v")])
        .order_by(vec![col("ts").sort(true, false)])
        .window_frame(frame)
        .build()
        .unwrap()
        .alias(name)
    };
    let rows = WindowFrame::new_bounds(
        WindowFrameUnits::Rows,
        WindowFrameBound::Preceding(ScalarValue::UInt64(Some(2))),
        WindowFrameBound::CurrentRow,
    );
    let range = WindowFrame::new_bounds(
        WindowFrameUnits::Range,
        WindowFrameBound::Preceding(ScalarValue::IntervalMonthDayNano(Some(
            IntervalMonthDayNano::new(0, 0, 1_500_000_000),
        ))),
        WindowFrameBound::CurrentRow,
    );
    vec![
        col("k"),
        col("v"),
        col("ts"),
        over(sum_udaf(), col("k"), rows, "last3"),
        over(count_udaf(), col("k"), range, "recent"),
    ]
}

/// (k, v, ts, last3, recent) of each output row, sorted.
fn over_rows(batches: &[RecordBatch]) -> Vec<[i64; 5]> {
    let columns = ["k", "v", "ts", "last3", "recent"];
    let mut out = Vec::new();
    for b in batches {
        let values: Vec<Vec<i64>> = columns
            .iter()
            .map(|c| ints(std::slice::from_ref(b), c))
            .collect();
        out.extend((0..b.num_rows()).map(|i| std::array::from_fn(|c| values[c][i])));
    }
    out.sort();
    out
}

#[test]
fn over_aggregations_emit_each_row_once_the_watermark_passes_it_as_the_batch_window_gives() {
    property(4, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            // Event times unique within a value, so that a ROWS frame does
            // not depend on the order of ties.
            let mut seen = std::collections::HashSet::new();
            let epochs: Vec<Vec<Row>> = input(&mut rng, 24)
                .into_iter()
                .map(|rows| {
                    rows.into_iter()
                        .map(|(k, v, mut ts)| {
                            while !seen.insert((v, ts)) {
                                ts += 1;
                            }
                            (k, v, ts)
                        })
                        .collect()
                })
                .collect();
            let run = run(&epochs, OutputMode::Append, |events| {
                events().select(over_windows()).unwrap()
            })
            .await;
            let (kept, late, watermark) = judge(&epochs);
            assert!(late > 0, "seed {seed}: the input should have late rows");
            assert_eq!(run.late_rows, late, "seed {seed}");
            let watermark = watermark.unwrap();
            // DataFusion's window over every row not late; a row is out
            // once the watermark passed it.
            let ctx = SessionContext::new();
            let batch = ctx
                .read_batch(to_batch(&kept))
                .unwrap()
                .select(over_windows())
                .unwrap()
                .collect()
                .await
                .unwrap();
            let expected: Vec<[i64; 5]> = over_rows(&batch)
                .into_iter()
                .filter(|r| r[2] < watermark)
                .collect();
            assert!(expected.len() > 10, "seed {seed}: few rows out");
            assert_eq!(over_rows(&run.batches), expected, "seed {seed}");
            // The state holds what the watermark has not passed and what
            // later frames reach, not every row.
            assert!(
                (run.state_rows as usize) < kept.len(),
                "seed {seed}: {} rows kept of {}",
                run.state_rows,
                kept.len()
            );
        })
    });
}
