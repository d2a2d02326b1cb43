//! Event-time windows, watermarks and deduplication, checked against an
//! independent answer: the test places rows in windows and judges lateness
//! itself (plain loops over the rules in `watermark`), and DataFusion's
//! batch execution aggregates (or deduplicates) the rows that were not late.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use sluice::arrow::array::{AsArray, Int64Array, RecordBatch};
use sluice::arrow::compute::cast;
use sluice::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use sluice::datafusion::functions_aggregate::expr_fn::{count, count_distinct, max, min, sum};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, OutputMode, Session, StreamFrame, Window};

use crate::util::{
    block_on, ints, property, timed_batch as to_batch, timed_schema as schema, Lcg, TimedRow as Row,
};

pub(crate) const DELAY_MS: i64 = 2_000;

/// An aggregated window: (window start ms, key) → (n, total, lo, hi, distinct v % 3).
pub(crate) type Answer = BTreeMap<(i64, i64), (i64, i64, i64, i64, i64)>;

/// Batches whose event time moves forward with jitter, so some rows are
/// out of order and some are later than the watermark allows.
pub(crate) fn input(rng: &mut Lcg, batches: usize) -> Vec<Vec<Row>> {
    let start = 1_700_000_000_000i64;
    let mut clock = start;
    (0..batches)
        .map(|b| {
            clock += rng.next(4_000) as i64;
            let n = 1 + rng.next(30) as usize;
            let mut rows: Vec<Row> = (0..n)
                .map(|_| {
                    let ts = clock - rng.next(6_000) as i64 + rng.next(800) as i64;
                    (rng.next(4) as i64, rng.next(100) as i64 - 20, ts)
                })
                .collect();
            if b > 0 {
                // A minute behind anything read: surely late.
                rows.push((rng.next(4) as i64, 7, start - 60_000));
            }
            rows
        })
        .collect()
}

/// Lateness by the documented rules: epoch N drops rows older than the
/// watermark left by epoch N-1, then moves it to max(ts) - delay.
/// Returns the kept rows, the late count, and the watermark after each epoch.
fn judge(batches: &[Vec<Row>]) -> (Vec<Row>, u64, Vec<Option<i64>>) {
    let mut watermark: Option<i64> = None;
    let (mut kept, mut late, mut marks) = (Vec::new(), 0, Vec::new());
    for batch in batches {
        for r in batch {
            if watermark.is_some_and(|w| r.2 < w) {
                late += 1;
            } else {
                kept.push(*r);
            }
        }
        let latest = batch.iter().map(|r| r.2).max().unwrap() - DELAY_MS;
        watermark = Some(watermark.map_or(latest, |w| w.max(latest)));
        marks.push(watermark);
    }
    (kept, late, marks)
}

/// How the tests' windows are laid out, in ms.
#[derive(Clone, Copy)]
enum Layout {
    /// HOP (TUMBLE when `slide == size`).
    Hop { slide: i64, size: i64 },
    /// CUMULATE.
    Cumulate { step: i64, size: i64 },
}

impl Layout {
    /// The ends of the windows holding `ts`, aligned to the Unix epoch: a
    /// window of these layouts is known by its end.
    fn windows_of(self, ts: i64) -> Vec<i64> {
        let mut out = Vec::new();
        match self {
            Layout::Hop { slide, size } => {
                let mut start = ts - ts.rem_euclid(slide);
                while start > ts - size {
                    out.push(start + size);
                    start -= slide;
                }
            }
            Layout::Cumulate { step, size } => {
                let start = ts - ts.rem_euclid(size);
                for end in (1..=size / step).map(|j| start + j * step) {
                    if end > ts {
                        out.push(end);
                    }
                }
            }
        }
        out
    }
}

/// DataFusion's batch answer over the rows placed in their windows, keyed
/// by window end.
async fn batch_answer(rows: &[Row], layout: Layout) -> Answer {
    let placed: Vec<(i64, Row)> = rows
        .iter()
        .flat_map(|r| layout.windows_of(r.2).into_iter().map(move |w| (w, *r)))
        .collect();
    aggregate_placed(&placed).await
}

/// Per key, rows whose `[ts, ts + gap)` touch form one session: returns
/// each row with its session's (start, end).
fn sessions_of(rows: &[Row], gap: i64) -> Vec<(i64, i64, Row)> {
    let mut by_key: BTreeMap<i64, Vec<Row>> = BTreeMap::new();
    for r in rows {
        by_key.entry(r.0).or_default().push(*r);
    }
    let mut out = Vec::new();
    for (_, mut rows) in by_key {
        rows.sort_by_key(|r| r.2);
        let mut run: Vec<Row> = Vec::new();
        let (mut start, mut end) = (0, 0);
        for r in rows {
            if !run.is_empty() && r.2 > end {
                out.extend(run.drain(..).map(|x| (start, end, x)));
            }
            if run.is_empty() {
                start = r.2;
                end = r.2 + gap;
            }
            end = end.max(r.2 + gap);
            run.push(r);
        }
        out.extend(run.drain(..).map(|x| (start, end, x)));
    }
    out
}

/// DataFusion's GROUP BY (window bound, key) over placed rows.
async fn aggregate_placed(placed: &[(i64, Row)]) -> Answer {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("ws", DataType::Int64, false),
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values(placed.iter().map(|p| p.0))),
            Arc::new(Int64Array::from_iter_values(placed.iter().map(|p| p.1 .0))),
            Arc::new(Int64Array::from_iter_values(placed.iter().map(|p| p.1 .1))),
        ],
    )
    .unwrap();
    let ctx = SessionContext::new();
    ctx.register_batch("placed", batch).unwrap();
    let out = ctx
        .sql(
            "SELECT ws, k, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi, \
             count(DISTINCT v % 3) AS d FROM placed GROUP BY ws, k",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    fold(&out, "ws")
}

/// Rows of `batches` by (window bound, key); later rows replace earlier.
pub(crate) fn fold(batches: &[RecordBatch], bound: &str) -> Answer {
    let mut out = Answer::new();
    for b in batches {
        let ws = cast(b.column_by_name(bound).unwrap(), &DataType::Int64).unwrap();
        let ws = ws.as_primitive::<Int64Type>();
        let get = |name: &str| {
            cast(b.column_by_name(name).unwrap(), &DataType::Int64)
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone()
        };
        let (k, n, total, lo, hi, d) = (
            get("k"),
            get("n"),
            get("total"),
            get("lo"),
            get("hi"),
            get("d"),
        );
        for i in 0..b.num_rows() {
            out.insert(
                (ws.value(i), k.value(i)),
                (
                    n.value(i),
                    total.value(i),
                    lo.value(i),
                    hi.value(i),
                    d.value(i),
                ),
            );
        }
    }
    out
}

struct Run {
    /// Output batches per epoch, in epoch order.
    epochs: Vec<Vec<RecordBatch>>,
    /// The keys each epoch deleted (update mode).
    deleted: Vec<Option<RecordBatch>>,
    late_rows: u64,
    /// State rows after the last epoch.
    state_rows: u64,
    /// The query's watermark after each epoch, as progress reported it.
    watermarks: Vec<Option<String>>,
}

/// The windowed aggregation the tests run.
pub(crate) fn windowed(window: &Window) -> impl Fn(StreamFrame) -> StreamFrame + '_ {
    move |frame| {
        frame
            .window(window.clone())
            .unwrap()
            .aggregate(
                vec![col("window_start"), col("window_end"), col("k")],
                vec![
                    count(lit(1)).alias("n"),
                    sum(col("v")).alias("total"),
                    min(col("v")).alias("lo"),
                    max(col("v")).alias("hi"),
                    count_distinct(col("v") % lit(3)).alias("d"),
                ],
            )
            .unwrap()
    }
}

/// Runs `query` (over a stream with a watermark on `ts`) over `batches`,
/// one epoch each, stopping and restarting from the checkpoint at random
/// epochs.
async fn run_streaming(
    batches: &[Vec<Row>],
    query: impl Fn(StreamFrame) -> StreamFrame,
    mode: OutputMode,
    rng: &mut Lcg,
    dir: &std::path::Path,
) -> Run {
    let mut run = Run {
        epochs: Vec::new(),
        deleted: Vec::new(),
        late_rows: 0,
        state_rows: 0,
        watermarks: Vec::new(),
    };
    let mut fed = 0;
    while fed < batches.len() {
        let input = MemoryStream::new(schema());
        for b in &batches[..fed] {
            input.add_batch(to_batch(b)).unwrap();
        }
        let out = MemorySink::new();
        let frame = Session::new()
            .read_stream()
            .memory(&input)
            .unwrap()
            .with_watermark("ts", Duration::from_millis(DELAY_MS as u64))
            .unwrap();
        let query = query(frame)
            .write_stream()
            .memory(&out)
            .output_mode(mode)
            .checkpoint_location(dir)
            .start()
            .await
            .unwrap();
        let run_for = 1 + rng.next(4) as usize;
        for b in batches[fed..].iter().take(run_for) {
            input.add_batch(to_batch(b)).unwrap();
            query.process_all_available().await.unwrap();
            fed += 1;
        }
        for p in query.recent_progress() {
            run.late_rows += p.late_rows;
            run.state_rows = p.state_rows;
            run.watermarks.push(p.watermark.clone());
        }
        query.stop().await.unwrap();
        for e in out.epochs() {
            run.epochs.push(out.epoch_batches(e));
            run.deleted.push(out.epoch_retracted(e));
        }
    }
    run
}

/// An RFC 3339 time from progress as ms since the Unix epoch.
pub(crate) fn rfc3339_to_ms(text: &str) -> i64 {
    sluice::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(text).unwrap()
        / 1_000_000
}

async fn append_mode_emits_each_closed_window_once(seed: u64, window: Window, layout: Layout) {
    {
        let mut rng = Lcg(seed);
        let batches = input(&mut rng, 14);
        let dir = tempfile::tempdir().unwrap();
        let run = run_streaming(
            &batches,
            windowed(&window),
            OutputMode::Append,
            &mut rng,
            dir.path(),
        )
        .await;
        assert_eq!(run.epochs.len(), batches.len(), "one epoch per batch");
        let (kept, late, marks) = judge(&batches);
        assert!(late > 0, "seed {seed}: the input should have late rows");
        assert_eq!(run.late_rows, late, "seed {seed}: late rows counted");
        let expected = batch_answer(&kept, layout).await;
        // Each window is emitted exactly in the epoch whose watermark
        // passed its end, never before, never twice.
        let mut seen = BTreeSet::new();
        let mut emitted = Answer::new();
        for (epoch, out) in run.epochs.iter().enumerate() {
            let before = if epoch == 0 { None } else { marks[epoch - 1] };
            let now = marks[epoch].unwrap();
            let rows = fold(out, "window_end");
            for (key, value) in rows {
                let end = key.0;
                assert!(
                    end <= now && before.is_none_or(|b| end > b),
                    "seed {seed}: window {key:?} emitted in epoch {epoch} (watermark {before:?} -> {now})"
                );
                assert!(
                    seen.insert(key),
                    "seed {seed}: window {key:?} emitted twice"
                );
                emitted.insert(key, value);
            }
        }
        let final_mark = marks.last().unwrap().unwrap();
        let closed: Answer = expected
            .iter()
            .filter(|((end, _), _)| *end <= final_mark)
            .map(|(k, v)| (*k, *v))
            .collect();
        assert!(!closed.is_empty(), "seed {seed}");
        assert_eq!(emitted, closed, "seed {seed}");
        let open = expected.len() - closed.len();
        assert_eq!(
            run.state_rows, open as u64,
            "seed {seed}: only open windows stay in state"
        );
        let reported = run.watermarks.last().cloned().flatten().unwrap();
        assert_eq!(
            rfc3339_to_ms(&reported),
            final_mark,
            "seed {seed}: progress reports the watermark"
        );
    }
}

#[test]
fn tumbling_windows_in_append_mode_equal_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(append_mode_emits_each_closed_window_once(
            seed,
            Window::tumble("ts", Duration::from_secs(5)),
            Layout::Hop {
                slide: 5_000,
                size: 5_000,
            },
        ))
    });
}

#[test]
fn hopping_windows_in_append_mode_equal_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(append_mode_emits_each_closed_window_once(
            seed,
            Window::hop("ts", Duration::from_secs(2), Duration::from_secs(5)),
            Layout::Hop {
                slide: 2_000,
                size: 5_000,
            },
        ))
    });
}

#[test]
fn cumulating_windows_in_append_mode_equal_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(append_mode_emits_each_closed_window_once(
            seed,
            Window::cumulate("ts", Duration::from_secs(2), Duration::from_secs(6)),
            Layout::Cumulate {
                step: 2_000,
                size: 6_000,
            },
        ))
    });
}

#[test]
fn windows_in_update_mode_fold_to_the_batch_answer_and_evict_closed_state() {
    let layout = Layout::Hop {
        slide: 3_000,
        size: 6_000,
    };
    let window = Window::hop(
        "ts",
        Duration::from_millis(3_000),
        Duration::from_millis(6_000),
    );
    property(3, |seed| {
        let window = window.clone();
        block_on(async move {
            let mut rng = Lcg(seed);
            let batches = input(&mut rng, 12);
            let dir = tempfile::tempdir().unwrap();
            let run = run_streaming(
                &batches,
                windowed(&window),
                OutputMode::Update,
                &mut rng,
                dir.path(),
            )
            .await;
            let (kept, late, marks) = judge(&batches);
            assert_eq!(run.late_rows, late, "seed {seed}");
            let mut folded = Answer::new();
            for out in &run.epochs {
                folded.extend(fold(out, "window_end"));
            }
            assert_eq!(folded, batch_answer(&kept, layout).await, "seed {seed}");
            let final_mark = marks.last().unwrap().unwrap();
            let open = folded.keys().filter(|(end, _)| *end > final_mark).count();
            assert_eq!(
                run.state_rows, open as u64,
                "seed {seed}: closed windows evicted"
            );
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_mode_needs_a_watermark_on_the_window_column() {
    let input = MemoryStream::new(schema());
    let err = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .window(Window::tumble("ts", Duration::from_secs(10)))
        .unwrap()
        .aggregate(vec![col("window_start"), col("k")], vec![count(lit(1))])
        .unwrap()
        .write_stream()
        .memory(&MemorySink::new())
        .output_mode(OutputMode::Append)
        .start()
        .await
        .unwrap_err();
    assert!(err.is_user_error());
    let msg = err.to_string();
    assert!(msg.contains("WATERMARK FOR ts"), "{msg}");
    assert!(msg.contains("'update'"), "{msg}");

    let err = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .window(Window::tumble("k", Duration::from_secs(10)))
        .unwrap_err();
    assert!(err.to_string().contains("TIMESTAMP"), "{err}");
}

/// Every emitted row as (k, second column as i64), in emission order.
fn pairs(epochs: &[Vec<RecordBatch>], second: &str) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for b in epochs.iter().flatten() {
        let k = cast(b.column_by_name("k").unwrap(), &DataType::Int64).unwrap();
        let x = cast(b.column_by_name(second).unwrap(), &DataType::Int64).unwrap();
        let (k, x) = (k.as_primitive::<Int64Type>(), x.as_primitive::<Int64Type>());
        out.extend((0..b.num_rows()).map(|i| (k.value(i), x.value(i))));
    }
    out
}

/// DataFusion's batch `SELECT DISTINCT k, <second> FROM rows`.
async fn batch_distinct(rows: &[Row], second: &str) -> BTreeSet<(i64, i64)> {
    let ctx = SessionContext::new();
    ctx.register_batch("t", to_batch(rows)).unwrap();
    let out = ctx
        .sql(&format!("SELECT DISTINCT k, {second} AS x FROM t"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    pairs(&[out], "x").into_iter().collect()
}

#[test]
fn distinct_emits_each_row_once_equal_to_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let batches = input(&mut rng, 12);
            let dir = tempfile::tempdir().unwrap();
            let query = |f: StreamFrame| {
                f.select(vec![col("k"), (col("v") % lit(5)).alias("m")])
                    .unwrap()
                    .distinct()
                    .unwrap()
            };
            // Without event time in the rows, nothing is late and nothing leaves
            // the state.
            let run =
                run_streaming(&batches, query, OutputMode::Append, &mut rng, dir.path()).await;
            let emitted = pairs(&run.epochs, "m");
            let unique: BTreeSet<(i64, i64)> = emitted.iter().copied().collect();
            assert_eq!(
                unique.len(),
                emitted.len(),
                "seed {seed}: a row emitted twice"
            );
            let all: Vec<Row> = batches.concat();
            assert_eq!(unique, batch_distinct(&all, "v % 5").await, "seed {seed}");
            assert_eq!(run.late_rows, 0);
            assert_eq!(run.state_rows, unique.len() as u64);
        })
    });
}

#[test]
fn drop_duplicates_on_event_time_is_bounded_by_the_watermark() {
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            // Coarse times so that duplicates of (k, ts) are common.
            let batches: Vec<Vec<Row>> = input(&mut rng, 12)
                .into_iter()
                .map(|b| {
                    b.into_iter()
                        .map(|(k, v, ts)| (k, v, ts - ts % 1_000))
                        .collect()
                })
                .collect();
            let dir = tempfile::tempdir().unwrap();
            let query = |f: StreamFrame| f.drop_duplicates(&["k", "ts"]).unwrap();
            let run =
                run_streaming(&batches, query, OutputMode::Append, &mut rng, dir.path()).await;
            let (kept, late, marks) = judge(&batches);
            assert!(late > 0, "seed {seed}");
            assert_eq!(run.late_rows, late, "seed {seed}");
            let emitted = pairs(&run.epochs, "ts");
            let unique: BTreeSet<(i64, i64)> = emitted.iter().copied().collect();
            assert_eq!(
                unique.len(),
                emitted.len(),
                "seed {seed}: a row emitted twice"
            );
            assert_eq!(unique, batch_distinct(&kept, "ts").await, "seed {seed}");
            // Keys behind the watermark left the state: their rows would be late.
            let final_mark = marks.last().unwrap().unwrap();
            let live = unique.iter().filter(|(_, ts)| *ts >= final_mark).count();
            assert_eq!(run.state_rows, live as u64, "seed {seed}");
            assert!(live < unique.len(), "seed {seed}: something was evicted");
        })
    });
}

/// A GROUP BY over SESSION windows of gap `GAP` (per `k`) run in `mode`
/// over random batches across restarts, beside the answer: the watermark
/// after each epoch, each session's end by (start, k), and DataFusion's
/// aggregation of the rows placed in their sessions, by (start, k).
async fn sessions_run(
    seed: u64,
    mode: OutputMode,
) -> (Run, Vec<Option<i64>>, BTreeMap<(i64, i64), i64>, Answer) {
    const GAP: i64 = 1_500;
    let mut rng = Lcg(seed);
    let batches = input(&mut rng, 14);
    let dir = tempfile::tempdir().unwrap();
    let window = Window::session("ts", &["k"], Duration::from_millis(GAP as u64));
    let run = run_streaming(&batches, windowed(&window), mode, &mut rng, dir.path()).await;
    let (kept, late, marks) = judge(&batches);
    assert_eq!(run.late_rows, late, "seed {seed}");
    let sessions = sessions_of(&kept, GAP);
    let ends: BTreeMap<(i64, i64), i64> =
        sessions.iter().map(|(s, e, r)| ((*s, r.0), *e)).collect();
    let placed: Vec<(i64, Row)> = sessions.iter().map(|(s, _, r)| (*s, *r)).collect();
    let expected = aggregate_placed(&placed).await;
    (run, marks, ends, expected)
}

#[test]
fn session_windows_in_append_mode_equal_the_batch_answer_across_restarts() {
    property(3, |seed| {
        block_on(async move {
            let (run, marks, ends, expected) = sessions_run(seed, OutputMode::Append).await;
            // A session is final once the watermark is past its end.
            let mut seen = BTreeSet::new();
            let mut emitted = Answer::new();
            for (epoch, out) in run.epochs.iter().enumerate() {
                let before = if epoch == 0 { None } else { marks[epoch - 1] };
                let now = marks[epoch].unwrap();
                for (key, value) in fold(out, "window_start") {
                    let end = ends.get(&key).copied().unwrap_or(i64::MAX);
                    assert!(
                        end < now && before.is_none_or(|b| end >= b),
                        "seed {seed}: session {key:?} (end {end}) emitted in epoch {epoch} \
                         (watermark {before:?} -> {now})"
                    );
                    assert!(
                        seen.insert(key),
                        "seed {seed}: session {key:?} emitted twice"
                    );
                    emitted.insert(key, value);
                }
            }
            let final_mark = marks.last().unwrap().unwrap();
            let closed: Answer = expected
                .iter()
                .filter(|(key, _)| ends[key] < final_mark)
                .map(|(k, v)| (*k, *v))
                .collect();
            assert!(!closed.is_empty(), "seed {seed}");
            assert_eq!(emitted, closed, "seed {seed}");
            let open = expected.len() - closed.len();
            assert_eq!(
                run.state_rows, open as u64,
                "seed {seed}: open sessions stay"
            );
        })
    });
}

#[test]
fn session_windows_in_update_mode_fold_with_their_deletions_to_the_batch_answer() {
    property(3, |seed| {
        block_on(async move {
            let (run, _, ends, expected) = sessions_run(seed, OutputMode::Update).await;
            let expected: BTreeMap<(i64, i64, i64), _> = expected
                .into_iter()
                .map(|((start, k), v)| ((start, ends[&(start, k)], k), v))
                .collect();
            // The upsert meaning: per epoch, the deleted keys go, then the
            // rows emitted replace their keys.
            let mut folded = BTreeMap::new();
            let mut deletions = 0;
            for (out, deleted) in run.epochs.iter().zip(&run.deleted) {
                if let Some(d) = deleted {
                    let start =
                        cast(d.column_by_name("window_start").unwrap(), &DataType::Int64).unwrap();
                    let end =
                        cast(d.column_by_name("window_end").unwrap(), &DataType::Int64).unwrap();
                    let k = d.column_by_name("k").unwrap().as_primitive::<Int64Type>();
                    for i in 0..d.num_rows() {
                        let key = (
                            start.as_primitive::<Int64Type>().value(i),
                            end.as_primitive::<Int64Type>().value(i),
                            k.value(i),
                        );
                        assert!(
                            folded.remove(&key).is_some(),
                            "seed {seed}: deleted {key:?}, which the output does not hold"
                        );
                        deletions += 1;
                    }
                }
                for b in out {
                    let end =
                        cast(b.column_by_name("window_end").unwrap(), &DataType::Int64).unwrap();
                    let end = end.as_primitive::<Int64Type>();
                    let by_start = fold(std::slice::from_ref(b), "window_start");
                    let starts =
                        cast(b.column_by_name("window_start").unwrap(), &DataType::Int64).unwrap();
                    let k = b.column_by_name("k").unwrap().as_primitive::<Int64Type>();
                    for i in 0..b.num_rows() {
                        let (start, k) = (starts.as_primitive::<Int64Type>().value(i), k.value(i));
                        folded.insert((start, end.value(i), k), by_start[&(start, k)]);
                    }
                }
            }
            assert!(deletions > 0, "seed {seed}: no session merged");
            assert_eq!(folded, expected, "seed {seed}");
        })
    });
}

#[test]
fn keeping_the_first_row_by_event_time_emits_it_once_when_the_watermark_passes_it() {
    use sluice::datafusion::functions_window::expr_fn::row_number;
    use sluice::datafusion::logical_expr::ExprFunctionExt;
    property(3, |seed| {
        block_on(async move {
            let mut rng = Lcg(seed);
            let batches = input(&mut rng, 14);
            let dir = tempfile::tempdir().unwrap();
            // Partitions by `v % 9`, so that first rows keep arriving.
            let query = |f: StreamFrame| {
                f.with_column("p", col("v") % lit(9i64))
                    .unwrap()
                    .select(vec![
                        col("p"),
                        col("v"),
                        col("ts"),
                        row_number()
                            .partition_by(vec![col("p")])
                            .order_by(vec![col("ts").sort(true, false)])
                            .build()
                            .unwrap()
                            .alias("rn"),
                    ])
                    .unwrap()
                    .filter(col("rn").eq(lit(1i64)))
                    .unwrap()
                    .select(vec![col("p"), col("v"), col("ts")])
                    .unwrap()
            };
            let run =
                run_streaming(&batches, query, OutputMode::Append, &mut rng, dir.path()).await;
            let (kept, late, marks) = judge(&batches);
            assert!(late > 0, "seed {seed}");
            assert_eq!(run.late_rows, late, "seed {seed}");
            // The loop: per partition the earliest kept row, ties to the one
            // that arrived first, emitted in the first epoch whose
            // watermark is past it.
            let mut first: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            for (_, v, ts) in &kept {
                let best = first.entry(v % 9).or_insert((*ts, *v));
                if *ts < best.0 {
                    *best = (*ts, *v);
                }
            }
            let mut expected: BTreeMap<usize, BTreeSet<(i64, i64, i64)>> = BTreeMap::new();
            for (p, (ts, v)) in &first {
                if let Some(e) = marks.iter().position(|m| m.is_some_and(|m| m > *ts)) {
                    expected.entry(e).or_default().insert((*p, *v, *ts));
                }
            }
            let mut emitted: BTreeMap<usize, BTreeSet<(i64, i64, i64)>> = BTreeMap::new();
            for (e, out) in run.epochs.iter().enumerate() {
                let (p, v) = (ints(out, "p"), ints(out, "v"));
                let ts = ints(out, "ts");
                for i in 0..p.len() {
                    assert!(
                        emitted.entry(e).or_default().insert((p[i], v[i], ts[i])),
                        "seed {seed}: a row emitted twice in epoch {e}"
                    );
                }
            }
            emitted.retain(|_, rows| !rows.is_empty());
            assert!(!expected.is_empty(), "seed {seed}");
            assert_eq!(emitted, expected, "seed {seed}");
            // One row per partition seen stays in state.
            assert_eq!(run.state_rows, first.len() as u64, "seed {seed}");
            // DataFusion's batch answer over the kept rows: each partition's
            // earliest time (which row of a tie it keeps is its own choice).
            let ctx = SessionContext::new();
            ctx.register_batch("events", to_batch(&kept)).unwrap();
            let batch = ctx
                .sql(
                    "SELECT p, ts FROM (SELECT v % 9 AS p, ts, ROW_NUMBER() OVER \
                     (PARTITION BY v % 9 ORDER BY ts) AS rn FROM events) WHERE rn = 1",
                )
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            let answer: BTreeMap<i64, i64> = ints(&batch, "p")
                .into_iter()
                .zip(ints(&batch, "ts"))
                .collect();
            let ours: BTreeMap<i64, i64> = first.iter().map(|(p, (ts, _))| (*p, *ts)).collect();
            assert_eq!(ours, answer, "seed {seed}");
        })
    });
}

/// What a windowed count over Kafka gives and what its `'late.sink'`
/// gets: (window start ms → (rows, sum of ids)), and the late ids sorted.
type WithLate = (BTreeMap<i64, (i64, i64)>, Vec<i64>);

/// The answer by the watermark rules over epochs of `per_epoch` records
/// (one partition, all records there before the query starts, so every
/// epoch takes the next `per_epoch`): each record is either late or in its
/// 10-second window, which is emitted once the watermark passes its end.
fn windowed_with_late(records: &[(i64, i64)], per_epoch: usize, delay: i64) -> WithLate {
    let (mut windows, mut late) = (BTreeMap::new(), Vec::new());
    let mut watermark: Option<i64> = None;
    for chunk in records.chunks(per_epoch) {
        for &(id, ts) in chunk {
            if watermark.is_some_and(|w| ts < w) {
                late.push(id);
            } else {
                let w = windows.entry(ts - ts.rem_euclid(10_000)).or_insert((0, 0));
                *w = (w.0 + 1, w.1 + id);
            }
        }
        let latest = chunk.iter().map(|r| r.1).max().unwrap() - delay;
        watermark = Some(watermark.map_or(latest, |w: i64| w.max(latest)));
    }
    let last = watermark.unwrap();
    windows.retain(|start, _| start + 10_000 <= last);
    late.sort();
    (windows, late)
}

/// A windowed aggregation over Kafka whose stream sends its late rows to a
/// topic (`'late.sink'`), killed with SIGKILL at random moments: the
/// windows and the late rows, both read `read_committed`, end as the
/// watermark rules give them, each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_rows_reach_their_sink_in_the_epoch_that_dropped_them_through_kill_9() {
    use crate::util::{broker, crash_seed, kill_9_five_times_then_finish};
    use sluice::broker::{create_topic, fresh_topic};
    let bootstrap = broker().await;
    let (input, counts, late) = (
        fresh_topic("late-in"),
        fresh_topic("late-counts"),
        fresh_topic("late-rows"),
    );
    create_topic(&bootstrap, &input, 1).await.unwrap();
    create_topic(&bootstrap, &counts, 1).await.unwrap();
    create_topic(&bootstrap, &late, 2).await.unwrap();
    let mut rng = Lcg(crash_seed("kill -9", || 0x1a7e));
    let base = 1_767_225_600_000i64; // 2026-01-01
    let records: Vec<(i64, i64)> = (0..12_000i64)
        .map(|id| {
            let ts = base + id * 50 + rng.next(400) as i64;
            // Every 9th record is up to 20 s behind: often late.
            let ts = if id % 9 == 4 {
                ts - rng.next(20_000) as i64
            } else {
                ts
            };
            (id, ts)
        })
        .collect();
    let want = windowed_with_late(&records, 20, 2_000);
    assert!(
        want.1.len() > 100 && want.0.len() > 30,
        "{} late",
        want.1.len()
    );
    {
        let messages: Vec<(String, Option<String>)> = records
            .iter()
            .map(|(id, ts)| {
                let ts = sluice::arrow::temporal_conversions::timestamp_ms_to_datetime(*ts)
                    .unwrap()
                    .format("%Y-%m-%dT%H:%M:%S%.3fZ");
                (
                    id.to_string(),
                    Some(format!("{{\"id\": {id}, \"ts\": \"{ts}\"}}")),
                )
            })
            .collect();
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || crate::changelog::send_keyed(&b, &t, &messages))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("late.sql");
    let kafka = |topic: &str| {
        format!("connector = 'kafka', topic = '{topic}', 'bootstrap.servers' = '{bootstrap}'")
    };
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '30 ms';\n\
             CREATE STREAM bids (id BIGINT, ts TIMESTAMP, \
               WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH ({bids}, \
               'max-records-per-epoch' = '20', 'late.sink' = 'late_bids');\n\
             CREATE STREAM late_bids WITH ({late});\n\
             CREATE STREAM counts WITH ({counts});\n\
             INSERT INTO counts SELECT window_start, count(*) AS n, sum(id) AS ids \
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND)) \
               GROUP BY window_start, window_end;\n",
            cp = dir.path().join("cp").display(),
            bids = kafka(&input),
            late = kafka(&late),
            counts = kafka(&counts),
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };
    let output = || async {
        let mut windows = BTreeMap::new();
        for r in crate::kafka::read(&bootstrap, &counts).await {
            let v: serde_json::Value = serde_json::from_slice(&r.value.unwrap()).unwrap();
            let start = rfc3339_to_ms(v["window_start"].as_str().unwrap());
            let row = (v["n"].as_i64().unwrap(), v["ids"].as_i64().unwrap());
            assert!(windows.insert(start, row).is_none(), "window {start} twice");
        }
        let mut late_ids: Vec<i64> = crate::kafka::read(&bootstrap, &late)
            .await
            .into_iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_slice(&r.value.unwrap()).unwrap();
                v["id"].as_i64().unwrap()
            })
            .collect();
        late_ids.sort();
        (windows, late_ids)
    };
    kill_9_five_times_then_finish(command, &mut rng, &want, output).await;
}
