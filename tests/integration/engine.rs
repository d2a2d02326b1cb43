//! The epoch loop, checkpoint and built-in connectors, without Kafka.

use std::time::Duration;

use sluice::datafusion::prelude::*;
use sluice::{MemorySink, MemoryStream, Session, Trigger};

use crate::util::{batch, ints, schema};

/// Runs `filter id % 2 = 0` from `input` into `out` with a checkpoint.
async fn start_even_filter(
    input: &MemoryStream,
    out: &MemorySink,
    checkpoint: &std::path::Path,
) -> sluice::StreamingQuery {
    Session::new()
        .read_stream()
        .memory(input)
        .unwrap()
        .filter((col("id") % lit(2)).eq(lit(0)))
        .unwrap()
        .write_stream()
        .memory(out)
        .checkpoint_location(checkpoint)
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_continues_at_the_next_epoch_without_gap_or_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let batches: Vec<_> = (0..5).map(|i| batch(i * 10..i * 10 + 10)).collect();

    // First run: three epochs, one per batch.
    let input = MemoryStream::new(schema());
    let out = MemorySink::new();
    let query = start_even_filter(&input, &out, dir.path()).await;
    for b in &batches[..3] {
        input.add_batch(b.clone()).unwrap();
        query.process_all_available().await.unwrap();
    }
    query.stop().await.unwrap();
    assert_eq!(out.epochs(), vec![1, 2, 3]);
    let first_run = ints(&out.batches(), "id");
    assert_eq!(
        first_run,
        (0..30).filter(|i| i % 2 == 0).collect::<Vec<_>>()
    );
    let first_id = query.id().to_string();

    // Second run, as a new process would: the same input replayed from the
    // start, the same checkpoint. Output continues at epoch 4.
    let input = MemoryStream::new(schema());
    for b in &batches[..3] {
        input.add_batch(b.clone()).unwrap();
    }
    let out = MemorySink::new();
    let query = start_even_filter(&input, &out, dir.path()).await;
    assert_eq!(query.id(), first_id, "the query id survives restarts");
    for b in &batches[3..] {
        input.add_batch(b.clone()).unwrap();
        query.process_all_available().await.unwrap();
    }
    query.stop().await.unwrap();
    assert_eq!(out.epochs().first(), Some(&4));
    let second_run = ints(&out.batches(), "id");
    assert_eq!(
        second_run,
        (30..50).filter(|i| i % 2 == 0).collect::<Vec<_>>()
    );
    let progress = query.recent_progress();
    assert_eq!(progress.first().map(|p| p.epoch), Some(4));
    assert_eq!(
        progress.iter().map(|p| p.num_input_rows).sum::<u64>(),
        20,
        "only the new batches were read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_planned_but_not_committed_is_rerun_over_the_same_rate_rows() {
    let dir = tempfile::tempdir().unwrap();
    let run = |out: MemorySink| {
        let dir = dir.path().to_path_buf();
        async move {
            Session::new()
                .read_stream()
                .format("rate")
                .option("rows_per_second", "2000")
                .option("num_partitions", "3")
                .load()
                .unwrap()
                .select(vec![
                    col("timestamp"),
                    col("value"),
                    (col("value") * lit(2)).alias("doubled"),
                ])
                .unwrap()
                .write_stream()
                .memory(&out)
                .checkpoint_location(dir)
                .trigger(Trigger::ProcessingTime(Duration::from_millis(100)))
                .start()
                .await
                .unwrap()
        }
    };
    let first = MemorySink::new();
    let query = run(first.clone()).await;
    while first.epochs().len() < 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    query.stop().await.unwrap();
    let last = *first.epochs().last().unwrap();
    let original = first.epoch_batches(last);
    assert!(original.iter().map(|b| b.num_rows()).sum::<usize>() > 0);

    // Pretend the process died after planning epoch `last` but before its
    // commit: the restart must re-run it over exactly the same offsets.
    std::fs::remove_file(dir.path().join("commits").join(last.to_string())).unwrap();
    let second = MemorySink::new();
    let query = run(second.clone()).await;
    while second.epochs().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    query.stop().await.unwrap();
    assert_eq!(second.epochs()[0], last);
    let replayed = second.epoch_batches(last);
    let sorted = |b: &[sluice::arrow::record_batch::RecordBatch]| {
        let mut v: Vec<(i64, i64)> = ints(b, "value")
            .into_iter()
            .zip(ints(b, "doubled"))
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(
        sorted(&replayed),
        sorted(&original),
        "replay yields identical rows"
    );
    let ts = |b: &[sluice::arrow::record_batch::RecordBatch]| {
        sluice::arrow::compute::concat_batches(&b[0].schema(), b)
            .unwrap()
            .column(0)
            .clone()
    };
    assert_eq!(ts(&replayed).len(), ts(&original).len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_file_is_named_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..4)).unwrap();
    let out = MemorySink::new();
    let query = start_even_filter(&input, &out, dir.path()).await;
    query.process_all_available().await.unwrap();
    query.stop().await.unwrap();

    let victim = dir.path().join("offsets").join("1");
    let mut bytes = std::fs::read(&victim).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();

    let err = Session::new()
        .read_stream()
        .memory(&input)
        .unwrap()
        .write_stream()
        .memory(&MemorySink::new())
        .checkpoint_location(dir.path())
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&victim.display().to_string()), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    // Nothing was reset: the damaged file is still there, untouched.
    assert_eq!(std::fs::read(&victim).unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn available_now_processes_what_exists_then_stops() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.json"),
        "{\"id\": 1, \"name\": \"x\"}\n{\"id\": 2}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.csv.json"),
        "{\"id\": 3, \"name\": \"z\"}\n",
    )
    .unwrap();
    let out = MemorySink::new();
    let session = Session::new();
    let query = session
        .read_stream()
        .format("files")
        .option("path", dir.path().display().to_string())
        .option("format", "json")
        .schema(schema())
        .option("max_files_per_epoch", "1")
        .load()
        .unwrap()
        .with_column("id10", col("id") * lit(10))
        .unwrap()
        .write_stream()
        .memory(&out)
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    assert!(query
        .await_termination_timeout(Duration::from_secs(30))
        .await
        .unwrap());
    assert_eq!(out.epochs(), vec![1, 2], "one file per epoch");
    let mut got = ints(&out.batches(), "id10");
    got.sort_unstable();
    assert_eq!(got, vec![10, 20, 30]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_hear_start_progress_and_end() {
    use std::sync::{Arc, Mutex};
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);
    impl sluice::StreamingQueryListener for Recorder {
        fn on_query_started(&self, _: &sluice::QueryStartedEvent) {
            self.0.lock().unwrap().push("started".into());
        }
        fn on_query_progress(&self, p: &sluice::QueryProgress) {
            self.0
                .lock()
                .unwrap()
                .push(format!("epoch {} rows {}", p.epoch, p.num_input_rows));
        }
        fn on_query_terminated(&self, e: &sluice::QueryTerminatedEvent) {
            self.0
                .lock()
                .unwrap()
                .push(format!("terminated error={:?}", e.error));
        }
    }
    let recorder = Arc::new(Recorder::default());
    let session = Session::new();
    session.add_listener(recorder.clone());
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..7)).unwrap();
    let query = session
        .read_stream()
        .memory(&input)
        .unwrap()
        .write_stream()
        .format("blackhole")
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    let events = recorder.0.lock().unwrap().clone();
    assert_eq!(
        events,
        vec!["started", "epoch 1 rows 7", "terminated error=None"]
    );
    let p = query.last_progress().unwrap();
    let line = p.log_line();
    for key in [
        "query",
        "epoch",
        "input_rows",
        "duration_ms",
        "state_rows",
        "state_bytes",
        "watermark",
        "late_rows",
    ] {
        assert!(
            line.get(key).is_some(),
            "progress log line lacks {key}: {line}"
        );
    }
    for phase in ["total", "read", "compute", "state", "commit"] {
        assert!(line["duration_ms"].get(phase).is_some(), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_mistakes_are_named_with_the_fix() {
    let session = Session::new();
    let err = session
        .read_stream()
        .format("rat")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown connector 'rat'") && err.contains("did you mean 'rate'"),
        "{err}"
    );

    let err = session
        .read_stream()
        .format("rate")
        .option("rows_per_sec", "5")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown option 'rows_per_sec'") && err.contains("'rows_per_second'"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let err = session
        .read_stream()
        .format("files")
        .option("path", dir.path().display().to_string())
        .option("format", "xml")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'format' = 'xml'") && err.contains("'parquet'"),
        "{err}"
    );

    let err = sluice::Session::new()
        .read_stream()
        .format("rate")
        .load()
        .unwrap()
        .write_stream()
        .format("kafka")
        .option("topic", "t")
        .option("bootstrap.servers", "127.0.0.1:9")
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs a checkpoint location"), "{err}");
}

/// A statement set's query-wide settings are the set's: a statement that
/// brings its own is refused, naming the setting, never silently ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_set_refuses_a_statement_with_settings_of_its_own() {
    let session = Session::new();
    let input = MemoryStream::new(schema());
    let frame = session.read_stream().memory(&input).unwrap();
    let own_trigger = frame
        .clone()
        .write_stream()
        .memory(&MemorySink::new())
        .trigger(Trigger::AvailableNow);
    let err = session
        .statement_set()
        .add_insert(frame.clone().write_stream().memory(&MemorySink::new()))
        .add_insert(own_trigger)
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("statement 1") && err.contains("trigger") && err.contains("statement set"),
        "{err}"
    );

    // Set on the set, the same settings run the query.
    input.add_batch(batch(0..4)).unwrap();
    let (a, b) = (MemorySink::new(), MemorySink::new());
    let query = session
        .statement_set()
        .add_insert(frame.clone().write_stream().memory(&a))
        .add_insert(frame.write_stream().memory(&b))
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    query.await_termination().await.unwrap();
    assert_eq!((a.num_rows(), b.num_rows()), (4, 4));
}

/// A checkpoint belongs to one query: started under another
/// `pipeline.name`, the query is refused before anything runs, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_another_pipeline_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..4)).unwrap();
    let run = |name: &'static str| {
        let (input, dir) = (input.clone(), dir.path().to_path_buf());
        async move {
            Session::new()
                .read_stream()
                .memory(&input)
                .unwrap()
                .write_stream()
                .memory(&MemorySink::new())
                .pipeline_name(name)
                .checkpoint_location(dir)
                .trigger(Trigger::AvailableNow)
                .start()
                .await
        }
    };
    run("orders")
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let err = run("payments").await.unwrap_err().to_string();
    assert!(
        err.contains("belongs to query 'orders'")
            && err.contains("'pipeline.name' is 'payments'")
            && err.contains("'pipeline.name' = 'orders'"),
        "{err}"
    );
    let checkpoint = sluice::Checkpoint::open_existing(dir.path()).unwrap();
    assert_eq!(checkpoint.metadata().query_id, "orders");
    assert_eq!(checkpoint.latest_commit_epoch().unwrap(), Some(1));
}

/// A changed query on an old checkpoint: what its state and offsets depend
/// on (the operators' keys, functions and columns; what its inputs read) is
/// recorded with each commit, and a restart that changes it is refused
/// before anything runs, showing both. A change to the stateless part (a
/// filter after the aggregation) keeps the state and runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_aggregate_function_is_refused_and_a_changed_filter_is_not() {
    use sluice::datafusion::functions_aggregate::expr_fn::{count, sum};
    let dir = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(batch(0..10)).unwrap();
    let run = |function: Expr, at_least: i64| {
        let (input, dir) = (input.clone(), dir.path().to_path_buf());
        async move {
            let out = MemorySink::new();
            let started = Session::new()
                .read_stream()
                .memory(&input)
                .unwrap()
                .aggregate(
                    vec![(col("id") % lit(2i64)).alias("parity")],
                    vec![function.alias("n")],
                )
                .unwrap()
                .filter(col("n").gt_eq(lit(at_least)))
                .unwrap()
                .write_stream()
                .memory(&out)
                .checkpoint_location(dir)
                .trigger(Trigger::AvailableNow)
                .start()
                .await;
            match started {
                Ok(query) => {
                    query.await_termination().await.unwrap();
                    Ok(ints(&out.batches(), "n"))
                }
                Err(e) => Err(e.to_string()),
            }
        }
    };
    assert_eq!(run(count(lit(1)), 0).await.unwrap(), vec![5, 5]);
    let err = run(sum(col("id")), 0).await.unwrap_err();
    assert!(
        err.contains("differs from the one that committed epoch 1")
            && err.contains("count(Int32(1))")
            && err.contains("sum("),
        "{err}"
    );
    input.add_batch(batch(10..14)).unwrap();
    assert_eq!(
        run(count(lit(1)), 7).await.unwrap(),
        vec![7, 7],
        "the counts go on from the restored state"
    );
}
