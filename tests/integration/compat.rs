//! Checkpoints written by an earlier release restore in this one.
//!
//! `tests/fixtures/checkpoints-0.1.0/` holds one checkpoint per stateful
//! shape (GROUP BY, a tumbling window, deduplication, an interval join, a
//! windowed maximum joined back, a join feeding an aggregation, an
//! aggregation over a changelog), each written by release 0.1.0 (commit
//! `9a814b2`) after [`FIXTURE_EPOCHS`] epochs with a snapshot every
//! [`SNAPSHOT_EVERY`] state files, so each holds snapshots and deltas. This
//! release restores each and runs the epochs after it; their output must
//! equal that of a run of this release from an empty checkpoint over the
//! same input. A change to the state or checkpoint format that old
//! checkpoints cannot follow fails here.
//!
//! The fixtures were written by
//! `SLUICE_WRITE_FIXTURES=1 cargo test --test integration compat::write -- --ignored`
//! (which also writes them anew at a later release, into a folder named for
//! that release).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice::arrow::array::RecordBatch;
use sluice::arrow::util::pretty::pretty_format_batches;
use sluice::datafusion::common::JoinType;
use sluice::datafusion::functions_aggregate::expr_fn::{count, max, sum};
use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, OutputMode, Session, StreamFrame, Trigger, Window};

use crate::pipelines::{buckets_of_counts, input, pairs_per_key, top_rows, DELAY_MS, WINDOW_MS};
use crate::util::{block_on, state_deltas, timed_batch, timed_schema, Lcg, TimedRow as Row};

/// The release whose checkpoints are kept, and where.
const RELEASE: &str = "0.1.0";
/// Epochs the fixtures hold; the test runs [`MORE_EPOCHS`] after them.
const FIXTURE_EPOCHS: usize = 10;
const MORE_EPOCHS: usize = 4;
const SNAPSHOT_EVERY: u64 = 4;

type Shape = fn(&dyn Fn() -> StreamFrame) -> StreamFrame;

/// Every stateful shape with its output mode, by fixture name.
fn shapes() -> Vec<(&'static str, OutputMode, Shape)> {
    vec![
        ("group_by", OutputMode::Update, group_by),
        ("tumble", OutputMode::Append, tumble),
        ("dedup", OutputMode::Append, dedup),
        ("interval_join", OutputMode::Append, interval_join),
        ("windowed_max_joined", OutputMode::Append, top_rows),
        ("join_then_aggregate", OutputMode::Update, pairs_per_key),
        (
            "aggregate_over_changelog",
            OutputMode::Update,
            buckets_of_counts,
        ),
    ]
}

fn group_by(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    events()
        .aggregate(
            vec![col("v")],
            vec![
                count(lit(1)).alias("n"),
                sum(col("k")).alias("total"),
                max(col("ts")).alias("last"),
            ],
        )
        .unwrap()
}

fn tumble(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    events()
        .window(Window::tumble(
            "ts",
            Duration::from_millis(WINDOW_MS as u64),
        ))
        .unwrap()
        .aggregate(
            vec![col("window_start"), col("window_end"), col("v")],
            vec![count(lit(1)).alias("n"), max(col("k")).alias("top")],
        )
        .unwrap()
}

/// Ids repeat every 70 rows: some of the epochs after the fixture bring
/// new ones, some ids the fixture's state has seen.
fn dedup(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    events()
        .with_column("d", col("k") % lit(70i64))
        .unwrap()
        .drop_duplicates(&["d"])
        .unwrap()
}

fn interval_join(events: &dyn Fn() -> StreamFrame) -> StreamFrame {
    let second = || {
        lit(
            sluice::datafusion::common::ScalarValue::IntervalMonthDayNano(Some(
                sluice::arrow::datatypes::IntervalMonthDayNano::new(0, 0, 1_000_000_000),
            )),
        )
    };
    events()
        .alias("a")
        .unwrap()
        .join(
            events().alias("b").unwrap(),
            JoinType::Left,
            vec![
                col("a.v").eq(col("b.v")),
                col("a.ts").between(col("b.ts") - second(), col("b.ts") + second()),
            ],
        )
        .unwrap()
        .select(vec![col("a.k").alias("left"), col("b.k").alias("right")])
        .unwrap()
}

/// One epoch's output as sorted text lines: its rows, then the keys it
/// retracted.
type EpochText = (Vec<String>, Vec<String>);

fn lines(batches: &[RecordBatch]) -> Vec<String> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Vec::new();
    }
    let mut lines: Vec<String> = pretty_format_batches(batches)
        .unwrap()
        .to_string()
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Runs `shape` over `epochs`, one epoch per available-now run on the
/// checkpoint at `dir`, after `done` epochs that the checkpoint already
/// committed; returns each new epoch's output by epoch number.
async fn run(
    dir: &Path,
    epochs: &[Vec<Row>],
    done: usize,
    mode: OutputMode,
    shape: Shape,
) -> BTreeMap<u64, EpochText> {
    let input = MemoryStream::new(timed_schema());
    for rows in &epochs[..done] {
        input.add_batch(timed_batch(rows)).unwrap();
    }
    let mut out = BTreeMap::new();
    for rows in &epochs[done..] {
        input.add_batch(timed_batch(rows)).unwrap();
        let session = Session::new();
        let stream = session
            .read_stream()
            .memory(&input)
            .unwrap()
            .with_watermark("ts", Duration::from_millis(DELAY_MS as u64))
            .unwrap();
        let events = || stream.clone();
        let sink = MemorySink::new();
        let running = shape(&events)
            .write_stream()
            .memory(&sink)
            .output_mode(mode)
            .trigger(Trigger::AvailableNow)
            .checkpoint_location(dir)
            .state_snapshot_interval(SNAPSHOT_EVERY)
            .start()
            .await
            .unwrap();
        running.await_termination().await.unwrap();
        for e in sink.epochs() {
            let retracted: Vec<RecordBatch> = sink.epoch_retracted(e).into_iter().collect();
            out.insert(e, (lines(&sink.epoch_batches(e)), lines(&retracted)));
        }
    }
    out
}

fn fixtures(release: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("checkpoints-{release}"))
}

fn the_input() -> Vec<Vec<Row>> {
    input(&mut Lcg(7), FIXTURE_EPOCHS + MORE_EPOCHS)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn checkpoints_of_the_previous_release_restore_and_go_on_as_a_fresh_run_would() {
    block_on(async {
        let epochs = the_input();
        for (name, mode, shape) in shapes() {
            let fixture = fixtures(RELEASE).join(name);
            assert!(
                state_deltas(&fixture) > 0,
                "{name}: the fixture should hold state deltas"
            );
            let restored = tempfile::tempdir().unwrap();
            copy_dir(&fixture, restored.path());
            let after = run(restored.path(), &epochs, FIXTURE_EPOCHS, mode, shape).await;

            let fresh = tempfile::tempdir().unwrap();
            let mut expected = run(fresh.path(), &epochs, 0, mode, shape).await;
            expected.retain(|e, _| *e > FIXTURE_EPOCHS as u64);
            assert_eq!(
                after.keys().copied().collect::<Vec<_>>(),
                ((FIXTURE_EPOCHS + 1) as u64..=(FIXTURE_EPOCHS + MORE_EPOCHS) as u64)
                    .collect::<Vec<_>>(),
                "{name}: the restored query numbers its epochs on"
            );
            assert!(
                expected.values().any(|(rows, _)| !rows.is_empty()),
                "{name}: the epochs after the fixture should emit rows"
            );
            assert_eq!(after, expected, "{name}");
        }
    });
}

/// Writes the fixtures of this release (see the module's doc).
#[test]
#[ignore = "writes the fixtures of a release; run deliberately"]
fn write_fixtures() {
    if std::env::var_os("SLUICE_WRITE_FIXTURES").is_none() {
        return;
    }
    block_on(async {
        let epochs = the_input();
        let root = fixtures(env!("CARGO_PKG_VERSION"));
        for (name, mode, shape) in shapes() {
            let dir = root.join(name);
            let _ = std::fs::remove_dir_all(&dir);
            run(&dir, &epochs[..FIXTURE_EPOCHS], 0, mode, shape).await;
            assert!(state_deltas(&dir) > 0, "{name}: no deltas written");
        }
    });
}
