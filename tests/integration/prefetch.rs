//! The epoch loop reads epoch N+1 while epoch N commits, and keeps its
//! rules while doing so: N+1's plan is written only after N's commit, a
//! source hears of a commit only after it, and what was read ahead for a
//! commit that fails is dropped, the failed epoch re-run.
//!
//! A connector of the test's own (`gate`) logs every plan, read and commit
//! and holds epoch 1's commit until epoch 2's range has been read, so the
//! order is asserted, not timed. The rows it has left are its lag: back to
//! back the loop reads ahead only while they make two more epochs, with
//! `available-now` while there are any.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sluice::{
    CommittedEpoch, EpochCommit, EpochOutput, Handover, Offset, Partitions, Result, Session, Sink,
    SluiceError, Source, Trigger,
};

use crate::util::{batch, ints, OneConnector};

/// Epochs the input makes: one batch of ten rows each.
const BATCHES: u64 = 4;

/// What happened, in order, and the rows committed per epoch.
#[derive(Debug, Default)]
struct Log {
    events: Mutex<Vec<String>>,
    committed: Mutex<std::collections::BTreeMap<u64, Vec<i64>>>,
    /// Set once epoch 2's first write has failed.
    failed_once: Mutex<bool>,
    /// The end of the last planned range.
    planned: Mutex<u64>,
}

impl Log {
    fn push(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    /// Where `event` first occurs (after `from`).
    fn position(&self, event: &str, from: usize) -> Option<usize> {
        self.events()
            .iter()
            .skip(from)
            .position(|e| e == event)
            .map(|i| i + from)
    }
}

#[derive(Debug)]
struct Gate {
    log: Arc<Log>,
    checkpoint: PathBuf,
}

fn position(offset: Option<&Offset>) -> u64 {
    offset.and_then(|o| o["batch"].as_u64()).unwrap_or(0)
}

#[async_trait]
impl Source for Gate {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let at = position(start);
        self.log.push(format!("plan from {at}"));
        if at < BATCHES {
            *self.log.planned.lock().unwrap() = at + 1;
        }
        Ok((at < BATCHES).then(|| serde_json::json!({ "batch": at + 1 })))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let (from, to) = (position(start), position(Some(end)));
        self.log.push(format!("read {from}..{to}"));
        Ok(vec![(from..to)
            .map(|b| batch(b as i64 * 10..b as i64 * 10 + 10))
            .collect()])
    }

    /// The rows left after the last planned range, less 5: 25, 15, 5, 0
    /// after epochs 1 to 4 of ten rows each. Back to back the loop reads
    /// ahead only while they make two more epochs (after epoch 1);
    /// `available-now` while there are any.
    fn lag(&self) -> std::collections::BTreeMap<String, i64> {
        let planned = *self.log.planned.lock().unwrap();
        let left = ((BATCHES - planned) as i64 * 10 - 5).max(0);
        [("0".to_string(), left)].into()
    }

    fn committed(&self, end: &Offset) -> Result<()> {
        self.log
            .push(format!("source told {} is committed", position(Some(end))));
        Ok(())
    }
}

#[async_trait]
impl Sink for Gate {
    async fn write_epoch(
        &self,
        commit: &EpochCommit,
        output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        let epoch = commit.epoch();
        self.log.push(format!("write {epoch} began"));
        if epoch == 1 {
            // Held until the loop has read epoch 2 (at most 30 s: a loop
            // that does not read ahead fails the assertions below).
            for _ in 0..3000 {
                if self.log.position("read 1..2", 0).is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let next_plan = self.checkpoint.join("offsets").join("2").exists();
            self.log
                .push(format!("while 1 commits, offsets/2 exists: {next_plan}"));
        }
        if epoch == 2 && !std::mem::replace(&mut *self.log.failed_once.lock().unwrap(), true) {
            self.log.push("write 2 failed".into());
            return Err(SluiceError::Unreachable {
                what: "the gate".into(),
                message: "failing epoch 2 once".into(),
                hint: None,
            });
        }
        let rows = ints(&output.rows, "id");
        self.log.committed.lock().unwrap().insert(epoch, rows);
        self.log.push(format!("write {epoch} done"));
        Ok(())
    }

    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        Ok(CommittedEpoch::NotRecorded)
    }

    fn describe(&self) -> String {
        "gate".into()
    }
}

/// Runs the gate's query with `trigger` until its fourth epoch is
/// committed; returns what happened and the checkpoint.
async fn run_gate(trigger: Trigger) -> (Arc<Log>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::default());
    let gate = Arc::new(Gate {
        log: Arc::clone(&log),
        checkpoint: dir.path().to_path_buf(),
    });
    let session = Session::new();
    session.register_connector(Arc::new(OneConnector {
        name: "gate",
        inner: gate,
    }));
    let query = session
        .read_stream()
        .format("gate")
        .load()
        .unwrap()
        .write_stream()
        .format("gate")
        .checkpoint_location(dir.path())
        .trigger(trigger)
        .start()
        .await
        .unwrap();
    if trigger == Trigger::AvailableNow {
        query.await_termination().await.unwrap();
    } else {
        // Back to back, the query runs on after its input: stopped once
        // the last epoch is in (30 s at most).
        for _ in 0..3000 {
            if log.position(&format!("write {BATCHES} done"), 0).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        query.stop().await.unwrap();
    }
    (log, dir)
}

/// The rules every run of the gate keeps, whatever its trigger; returns
/// where the source heard that epoch 3 is committed (the end of its
/// commit, and of any read ahead beside it).
fn assert_rules(log: &Log, dir: &std::path::Path) -> usize {
    let events = log.events();
    let at = |event: &str, from: usize| {
        log.position(event, from)
            .unwrap_or_else(|| panic!("no '{event}' after {from} in {events:#?}"))
    };

    // Epoch 2 was read while epoch 1's commit was held, and planned
    // (offsets/2) only after it.
    let held = at("write 1 began", 0);
    let read_ahead = at("read 1..2", 0);
    let done = at("write 1 done", held);
    assert!(held < read_ahead && read_ahead < done, "{events:#?}");
    at("while 1 commits, offsets/2 exists: false", held);
    assert!(at("source told 1 is committed", 0) > done, "{events:#?}");

    // Epoch 2 failed once: the source was not told, epoch 3's read ahead
    // (if any) was dropped, and epoch 2 ran again over its own range.
    let failed = at("write 2 failed", 0);
    let reread = at("read 1..2", failed);
    let written = at("write 2 done", reread);
    at("source told 2 is committed", written);

    // Caught up after epoch 4 (no lag): the next plan waited for its commit.
    let last = at("write 4 done", written);
    assert!(at("plan from 4", 0) > last, "{events:#?}");

    // Every row committed once, each epoch with its own batch.
    let committed = log.committed.lock().unwrap().clone();
    let expected: std::collections::BTreeMap<u64, Vec<i64>> = (1..=BATCHES)
        .map(|e| (e, ((e as i64 - 1) * 10..e as i64 * 10).collect()))
        .collect();
    assert_eq!(committed, expected, "{events:#?}");
    for e in 1..=BATCHES {
        assert!(dir.join("commits").join(e.to_string()).exists());
    }
    at("source told 3 is committed", written)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_the_next_epoch_is_read_during_a_commit_while_two_more_wait() {
    let (log, dir) = run_gate(Trigger::ProcessingTime(Duration::ZERO)).await;
    let epoch_3_committed = assert_rules(&log, dir.path());
    // After epoch 3 only 5 rows were left, less than two epochs: epoch 4
    // was planned after epoch 3's commit, to take what arrived meanwhile.
    let plan_4 = log.position("plan from 3", 0).unwrap();
    assert!(plan_4 > epoch_3_committed, "{:#?}", log.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn available_now_reads_the_next_epoch_during_a_commit_while_any_backlog_is_left() {
    let (log, dir) = run_gate(Trigger::AvailableNow).await;
    let epoch_3_committed = assert_rules(&log, dir.path());
    // The 5 rows left after epoch 3 were read during its commit: nothing
    // arriving later joins an available-now backlog.
    let plan_4 = log.position("plan from 3", 0).unwrap();
    assert!(plan_4 < epoch_3_committed, "{:#?}", log.events());
}
