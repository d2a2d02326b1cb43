//! Within an epoch, reading, computing and writing overlap: an input read
//! lazily is pulled as the plan runs, and an appending statement's output
//! goes to a sink that sends ahead batch by batch while the rest is still
//! being read. The epoch's write then gets the whole output to commit, and
//! the input's rows and rejected records are counted once it was read.
//!
//! A connector of the test's own (`relay`) holds each batch of an epoch's
//! input after the first until the sink has been sent the output of the
//! batch before it, so the overlap is asserted, not timed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sluice::arrow::record_batch::RecordBatch;
use sluice::datafusion::functions_aggregate::expr_fn::count;
use sluice::datafusion::prelude::{col, lit};
use sluice::{
    CommittedEpoch, EpochCommit, EpochOutput, Handover, LazyPartition, Offset, Partitions,
    Rejected, Result, Session, Sink, Source, Trigger,
};

use crate::util::{batch, ints, OneConnector};

/// Epochs the input makes, and batches of ten rows in each.
const EPOCHS: u64 = 3;
const BATCHES: i64 = 3;

/// Records each epoch's source "rejects" while it is read (counted as
/// skipped once its stream has ended).
const REJECTED: u64 = 7;

#[derive(Debug, Default)]
struct Log {
    events: Mutex<Vec<String>>,
    /// Per epoch, the ids sent ahead and those the write got.
    ahead: Mutex<BTreeMap<u64, Vec<i64>>>,
    written: Mutex<BTreeMap<u64, Vec<i64>>>,
    rejected: Mutex<Rejected>,
}

impl Log {
    fn push(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }

    fn has(&self, event: &str) -> bool {
        self.events.lock().unwrap().iter().any(|e| e == event)
    }

    fn at(&self, event: &str) -> usize {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .position(|e| e == event)
            .unwrap_or_else(|| panic!("no '{event}' in {events:#?}"))
    }
}

/// Rows of batch `b` of epoch `epoch`.
fn rows(epoch: u64, b: i64) -> RecordBatch {
    let first = epoch as i64 * 100 + b * 10;
    batch(first..first + 10)
}

#[derive(Debug)]
struct Relay {
    log: Arc<Log>,
    /// Whether a batch waits for the sink to have been sent the one
    /// before it.
    gated: bool,
    /// Whether it pipelines under `'epoch.pipeline' = 'auto'` (Kafka does
    /// not).
    by_default: bool,
}

fn epoch_of(offset: Option<&Offset>) -> u64 {
    offset.and_then(|o| o["epoch"].as_u64()).unwrap_or(0)
}

#[async_trait]
impl Source for Relay {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let at = epoch_of(start);
        Ok((at < EPOCHS).then(|| serde_json::json!({ "epoch": at + 1 })))
    }

    async fn read(&self, _start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let epoch = epoch_of(Some(end));
        Ok(vec![(0..BATCHES).map(|b| rows(epoch, b)).collect()])
    }

    fn read_lazily(
        &self,
        _start: Option<&Offset>,
        end: &Offset,
    ) -> Result<Option<Vec<LazyPartition>>> {
        let epoch = epoch_of(Some(end));
        let (log, gated) = (Arc::clone(&self.log), self.gated);
        let batches = futures::stream::iter(0..BATCHES).then(move |b| {
            let log = Arc::clone(&log);
            async move {
                // Held (30 s at most) until the batch before went ahead.
                let before = format!("ahead {epoch}: {}", epoch as i64 * 100 + (b - 1) * 10);
                for _ in 0..3000 {
                    if !gated || b == 0 || log.has(&before) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                log.push(format!("read {epoch}: batch {b}"));
                if b == BATCHES - 1 {
                    log.rejected.lock().unwrap().skipped += REJECTED;
                }
                Ok(rows(epoch, b))
            }
        });
        Ok(Some(vec![batches.boxed()]))
    }

    fn pipelines_by_default(&self) -> bool {
        self.by_default
    }

    fn take_rejected(&self) -> Rejected {
        std::mem::take(&mut *self.log.rejected.lock().unwrap())
    }
}

#[async_trait]
impl Sink for Relay {
    fn sends_ahead(&self) -> bool {
        true
    }

    fn pipelines_by_default(&self) -> bool {
        self.by_default
    }

    async fn send_ahead(&self, epoch: u64, statement: usize, rows: &RecordBatch) -> Result<()> {
        assert_eq!(statement, 0);
        let ids = ints(std::slice::from_ref(rows), "id");
        self.log.push(format!("ahead {epoch}: {}", ids[0]));
        self.log
            .ahead
            .lock()
            .unwrap()
            .entry(epoch)
            .or_default()
            .extend(ids);
        Ok(())
    }

    async fn write_epoch(
        &self,
        commit: &EpochCommit,
        output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        let epoch = commit.epoch();
        self.log.push(format!("write {epoch}"));
        let ids = match output.rows.first().and_then(|b| b.column_by_name("id")) {
            Some(_) => ints(&output.rows, "id"),
            None => ints(&output.rows, "n"),
        };
        self.log.written.lock().unwrap().insert(epoch, ids);
        Ok(())
    }

    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        Ok(CommittedEpoch::NotRecorded)
    }

    fn needs_checkpoint(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "relay".into()
    }
}

fn relay(gated: bool) -> (Arc<Log>, Session) {
    relay_pipelining(gated, true)
}

fn relay_pipelining(gated: bool, by_default: bool) -> (Arc<Log>, Session) {
    let log = Arc::new(Log::default());
    let session = Session::new();
    session.register_connector(Arc::new(OneConnector {
        name: "relay",
        inner: Arc::new(Relay {
            log: Arc::clone(&log),
            gated,
            by_default,
        }),
    }));
    (log, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appending_statement_sends_its_output_ahead_while_its_input_is_still_read() {
    let (log, session) = relay(true);
    let query = session
        .read_stream()
        .format("relay")
        .load()
        .unwrap()
        .write_stream()
        .format("relay")
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();

    for epoch in 1..=EPOCHS {
        // Batch b+1 was read only once batch b had gone ahead, and the
        // write came after the whole input was read and sent.
        for b in 0..BATCHES - 1 {
            let first = epoch as i64 * 100 + b * 10;
            let sent = log.at(&format!("ahead {epoch}: {first}"));
            assert!(log.at(&format!("read {epoch}: batch {b}")) < sent);
            assert!(sent < log.at(&format!("read {epoch}: batch {}", b + 1)));
        }
        assert!(
            log.at(&format!("read {epoch}: batch {}", BATCHES - 1))
                < log.at(&format!("write {epoch}"))
        );
        // The write got the whole output, the same rows in the same order
        // as were sent ahead.
        let all: Vec<i64> = (0..BATCHES)
            .flat_map(|b| ints(&[rows(epoch, b)], "id"))
            .collect();
        assert_eq!(log.ahead.lock().unwrap()[&epoch], all);
        assert_eq!(log.written.lock().unwrap()[&epoch], all);
    }

    // Rows and rejected records of a lazily read input are counted when it
    // has been read, in its own epoch.
    let progress = query.recent_progress();
    assert_eq!(progress.len() as u64, EPOCHS);
    for p in &progress {
        assert_eq!(p.num_input_rows, BATCHES as u64 * 10, "{p:?}");
        assert_eq!(p.num_output_rows, BATCHES as u64 * 10, "{p:?}");
        assert_eq!(p.sources[0].num_input_rows, BATCHES as u64 * 10, "{p:?}");
        assert_eq!(p.sources[0].skipped_records, REJECTED, "{p:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_with_state_is_written_whole_after_it_computed() {
    let (log, session) = relay(false);
    let query = session
        .read_stream()
        .format("relay")
        .load()
        .unwrap()
        .aggregate(
            vec![(col("id") % lit(2i64)).alias("parity")],
            vec![count(col("id")).alias("n")],
        )
        .unwrap()
        .write_stream()
        .format("relay")
        .output_mode(sluice::OutputMode::Update)
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();

    // Nothing went ahead; each write had the running counts of even and
    // odd ids.
    assert!(log.ahead.lock().unwrap().is_empty());
    let written = log.written.lock().unwrap().clone();
    let expected: BTreeMap<u64, Vec<i64>> = (1..=EPOCHS)
        .map(|e| (e, vec![e as i64 * BATCHES * 5; 2]))
        .collect();
    assert_eq!(written, expected);
    for p in query.recent_progress() {
        assert_eq!(p.num_input_rows, BATCHES as u64 * 10, "{p:?}");
        assert_eq!(p.sources[0].skipped_records, REJECTED, "{p:?}");
    }
}

/// `'epoch.pipeline'`: `'false'` reads every epoch whole and sends nothing
/// ahead; `'auto'` pipelines only where the source and sink do by default
/// (Kafka's do not); `'true'` wherever they can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_setting_decides_where_an_epoch_reads_and_writes_at_once() {
    for (by_default, setting, pipelined) in [
        (true, "false", false),
        (false, "auto", false),
        (false, "true", true),
    ] {
        let (log, session) = relay_pipelining(false, by_default);
        let query = session
            .read_stream()
            .format("relay")
            .load()
            .unwrap()
            .write_stream()
            .format("relay")
            .trigger(Trigger::AvailableNow)
            .set("epoch.pipeline", setting)
            .unwrap()
            .start()
            .await
            .unwrap();
        query.await_termination().await.unwrap();
        let case = format!("by default {by_default}, 'epoch.pipeline' = '{setting}'");
        // A lazy read logs each batch it yields; a whole read logs none.
        let lazy_reads = log
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.starts_with("read "))
            .count();
        assert_eq!(lazy_reads > 0, pipelined, "{case}");
        assert_eq!(log.ahead.lock().unwrap().is_empty(), !pipelined, "{case}");
        // Either way every epoch's whole output reaches the write.
        for epoch in 1..=EPOCHS {
            let all: Vec<i64> = (0..BATCHES)
                .flat_map(|b| ints(&[rows(epoch, b)], "id"))
                .collect();
            assert_eq!(log.written.lock().unwrap()[&epoch], all, "{case}");
        }
    }
}
