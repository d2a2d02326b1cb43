//! Which instance a query is, across processes and checkpoints: a zombie
//! fenced by its replacement, one `pipeline.name` in two checkpoint
//! locations, a lost checkpoint location, and an epoch log torn by an
//! operating-system crash rebuilt from Kafka's record, each writing every
//! row once.

use std::time::Duration;

use super::{checkpoint_epochs, Pipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_is_fenced_and_says_another_instance_took_over() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let p = Pipeline::new(FILES, ROWS).await;
    let mut old = p.spawn("250 ms", None);
    // The first instance must own the transactional id before the second
    // starts: otherwise the second is the one fenced.
    p.wait_for_commits(&mut old, 3);

    let mut new = p.spawn("available-now", None);
    let old_status = old.wait(Duration::from_secs(60));
    let old_err = old.stderr();
    assert_eq!(old_status.code(), Some(1), "{old_err}");
    assert!(old_err.contains("another instance took over"), "{old_err}");

    let new_status = new.wait(Duration::from_secs(120));
    assert!(new_status.success(), "{}", new.stderr());
    let committed: Vec<String> = p.values(true).await;
    assert_eq!(committed, Pipeline::expected(FILES, ROWS));
}

/// One `pipeline.name`, two checkpoint locations: the second instance
/// fences the first and resumes from what Kafka says the first committed,
/// so every row is written once (without the name, the second would be a
/// new query writing everything again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pipeline_name_in_two_checkpoint_locations_fences_and_writes_each_row_once() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.identity = Some(format!("eos-{}", p.topic));
    let mut first = p.spawn_at("checkpoint-a", "250 ms", None);
    p.wait_for_commits_at("checkpoint-a", &mut first, 3);

    let mut second = p.spawn_at("checkpoint-b", "available-now", None);
    let first_status = first.wait(Duration::from_secs(60));
    let first_err = first.stderr();
    assert_eq!(first_status.code(), Some(1), "{first_err}");
    assert!(
        first_err.contains("another instance took over"),
        "{first_err}"
    );
    let second_status = second.wait(Duration::from_secs(120));
    assert!(second_status.success(), "{}", second.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
}

/// A lost checkpoint directory: killed, its checkpoint deleted, the same
/// pipeline started from a new location resumes where Kafka says it was;
/// nothing is written twice. A stateful pipeline whose state is lost stops
/// instead, saying what is missing and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_checkpoint_location_resumes_from_kafka_or_stops_when_state_is_lost() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.identity = Some(format!("lost-{}", p.topic));
    let mut run = p.spawn_at("checkpoint-a", "250 ms", None);
    p.wait_for_commits_at("checkpoint-a", &mut run, 3);
    run.kill_9();
    std::fs::remove_dir_all(p.dir.join("checkpoint-a")).unwrap();
    let mut again = p.spawn_at("checkpoint-b", "available-now", None);
    let status = again.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", again.stderr());
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));

    let mut p = Pipeline::with_query(
        4,
        ROWS,
        "SELECT id % 5 AS bucket, count(*) AS n FROM rows GROUP BY id % 5",
    )
    .await;
    p.identity = Some(format!("lost-state-{}", p.topic));
    let mut run = p.spawn_at("checkpoint-a", "available-now", None);
    assert!(
        run.wait(Duration::from_secs(120)).success(),
        "{}",
        run.stderr()
    );
    let written = p.values(true).await;
    std::fs::remove_dir_all(p.dir.join("checkpoint-a")).unwrap();
    let mut again = p.spawn_at("checkpoint-b", "available-now", None);
    let status = again.wait(Duration::from_secs(120));
    let err = again.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("state files this checkpoint location does not have")
            && err.contains("pipeline.name"),
        "{err}"
    );
    assert_eq!(p.values(true).await, written, "nothing was written again");
}

/// With the exactly-once Kafka sink, `offsets/N` and `commits/N` are
/// written without fsync (the sink's progress record decides): after an
/// operating-system crash they may be empty. Emptied here after a kill -9,
/// the newest of each (and a next epoch's plan) are rebuilt from Kafka's
/// record or planned again, and every row is written exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_log_torn_by_an_os_crash_is_rebuilt_from_kafka_exactly_once() {
    const FILES: usize = 40;
    const ROWS: usize = 20;
    let mut p = Pipeline::new(FILES, ROWS).await;
    p.identity = Some(format!("torn-{}", p.topic));
    let mut run = p.spawn("250 ms", None);
    p.wait_for_commits(&mut run, 3);
    run.kill_9();
    let cp = p.dir.join("checkpoint");
    let committed = checkpoint_epochs(&p).1.expect("a committed epoch");
    // What a crash before the page cache reached the disk leaves: the
    // newest records empty, and the plan of the epoch after them too
    // (whether or not the killed run had planned it, or Kafka committed it).
    for path in [
        cp.join("commits").join(committed.to_string()),
        cp.join("offsets").join(committed.to_string()),
        cp.join("offsets").join((committed + 1).to_string()),
    ] {
        std::fs::write(&path, b"").unwrap();
    }
    assert!(checkpoint_epochs(&p).0 >= Some(committed + 1));
    let mut again = p.spawn("available-now", None);
    let status = again.wait(Duration::from_secs(120));
    let err = again.stderr();
    assert!(status.success(), "{err}");
    assert!(
        err.contains("damaged"),
        "the damaged records were seen: {err}"
    );
    assert_eq!(p.values(true).await, Pipeline::expected(FILES, ROWS));
}
