//! Processes sharing a divided query's tasks through its Kafka group
//! (`'tasks.group'`): killed, added and stopped ones whose tasks the
//! others take over, exactly, with checkpoints on a local disk and on the
//! S3-compatible server; a fenced task started again, and an idle one
//! handed over without waiting.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use sluice::broker::fresh_topic;

use super::{
    check_output, complete, key_from_value, produce_keyed, state_files_were_deleted, Divided,
    PARTITIONS, RECORDS,
};
use crate::util::{crash_seed, Lcg, Run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_of_one_query_share_its_tasks_through_the_kafka_group_and_take_over_the_killed_ones(
) {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let d = Divided::new().await;
    share_and_take_over(&d).await;
}

/// The same with the checkpoints on the S3-compatible server, and two
/// queries more: an interval join of two topics on a key neither is
/// partitioned by (each side through a repartition step), and Nexmark q5
/// (a chain of four statements and five channels). The tasks of
/// the killed process are restored from object storage by the others,
/// every join pair and q5 row is emitted once, and `sluice checkpoint
/// inspect` reads every task back from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_checkpoints_on_object_storage_a_killed_process_tasks_are_restored_from_there() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let mut d = Divided::new().await.with_stacked().await;
    let s3 = crate::util::object_store().await;
    let prefix = fresh_topic("tasks-checkpoints");
    d.checkpoints = format!("s3://{}/{prefix}", s3.bucket);
    d.env = s3.env.clone();
    share_and_take_over(&d).await;
    state_files_were_deleted(&s3.data.join(&s3.bucket).join(&prefix));
    // The checkpoints are objects on the server (its files, one per
    // object), every task's.
    for query in d.queries() {
        for task in 0..PARTITIONS {
            let commits = s3
                .data
                .join(&s3.bucket)
                .join(&prefix)
                .join(query)
                .join(format!("tasks/{task}/commits"));
            let epochs = std::fs::read_dir(&commits).map(|e| e.count()).unwrap_or(0);
            assert!(
                epochs > 0,
                "no commits of {query} task {task} in {}",
                commits.display()
            );
        }
        let report = d.inspect(query);
        assert_eq!(
            report.matches("agrees with the checkpoint").count(),
            PARTITIONS as usize,
            "{report}"
        );
    }
}

/// Three processes share the queries' tasks while, at random moments
/// (seeded: `SLUICE_CRASH_SEED`), one of them is killed with SIGKILL and
/// restarted, a fourth joins, and one leaves with SIGTERM, the input
/// arriving in between. The output is exact, and completes after the
/// last of these: every task ended owned by a live process. Each
/// process's state is held to 4 KB in memory: the counts' and the
/// windows' groups beyond it live on local disk, and their checkpoints are
/// sliced chains, each commit deleting the files its chain left behind,
/// so the checkpoint store's deletions are on the commits' path.
async fn share_and_take_over(d: &Divided) {
    let sql = d.sql_with(
        "group",
        "SET 'tasks' = 'per-partition';\n\
         SET 'tasks.group' = 'true';\n\
         SET 'tasks.group.session.timeout' = '6 s';\n\
         SET 'trigger' = '200 ms';\n\
         SET 'state.snapshot.interval' = '1';\n\
         SET 'state.retained.snapshots' = '1';\n\
         SET 'state.memory.limit' = '4 KB';\n",
        &key_from_value(),
    );
    let spawn = || {
        let mut cmd = d.command(&sql);
        cmd.env("SLUICE_LOG", "sluice_kafka::group=info,warn");
        Run::new(cmd)
    };
    // Whether a process was given tasks.
    let given = |run: &Run| run.stderr().contains("tasks come to this process");
    let mut rng = Lcg(crash_seed("chaos", || 0x3b1d));
    // Started together: they open the new checkpoints at the same moment.
    let mut running: Vec<Run> = (0..3).map(|_| spawn()).collect();
    let mut log = String::new();
    let chunks = 6;
    let chunk = RECORDS / chunks;
    let mut joined: Option<u32> = None;
    for step in 0..chunks {
        d.produce(step * chunk..(step + 1) * chunk);
        std::thread::sleep(Duration::from_millis(1_000 + rng.next(2_500)));
        for run in &mut running {
            assert!(run.running(), "a process ended: {}", run.stderr());
        }
        match step {
            // A fourth process joins.
            2 => {
                let run = spawn();
                joined = Some(run.pid());
                running.push(run);
            }
            // One leaves with SIGTERM and is not restarted: it finishes its
            // epochs and leaves the group.
            4 => {
                let mut leaving = running.remove(rng.next(running.len() as u64) as usize);
                leaving.terminate();
                let status = leaving.wait(Duration::from_secs(60));
                assert!(status.success(), "{}", leaving.stderr());
                log.push_str(&format!("left:\n{}\n", leaving.stderr()));
            }
            // One dies with SIGKILL, its tasks in hand, and comes back.
            _ => {
                // The victim is one that was given tasks: after a kill the
                // group hands them on only once the dead member's session
                // expires, and a kill of a process without tasks tests
                // nothing.
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                let holders = loop {
                    let holders: Vec<usize> =
                        (0..running.len()).filter(|&i| given(&running[i])).collect();
                    if !holders.is_empty() {
                        break holders;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no process was given a task within 60 s:\n{log}"
                    );
                    std::thread::sleep(Duration::from_millis(500));
                };
                let victim = holders[rng.next(holders.len() as u64) as usize];
                running[victim].kill_9();
                log.push_str(&format!("killed:\n{}\n", running[victim].stderr()));
                std::thread::sleep(Duration::from_millis(rng.next(2_000)));
                running[victim] = spawn();
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while !complete(d).await {
        for run in &mut running {
            assert!(run.running(), "a process ended: {}", run.stderr());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the output was not complete within 180 s:\n{log}{}",
            running
                .iter()
                .map(Run::stderr)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(joined) = running.iter().find(|r| Some(r.pid()) == joined) {
        assert!(
            given(joined),
            "the process that joined got no task: {}",
            joined.stderr()
        );
    }
    // Every task is owned by a live process, as `sluice checkpoint
    // inspect` reads the task group, and is not behind its input.
    let live: BTreeSet<String> = running
        .iter()
        .map(|r| format!("owner: sluice-{}@", r.pid()))
        .collect();
    for query in d.queries() {
        // A rebalance may still be settling the last restarted process in.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let report = d.inspect(query);
            let owners: Vec<&str> = report.lines().filter(|l| l.contains("owner: ")).collect();
            assert_eq!(owners.len(), PARTITIONS as usize, "{report}");
            // Each task's lag, in records: none is behind its input.
            let lags: Vec<Option<u64>> = report
                .lines()
                .filter_map(|l| l.trim().strip_prefix("lag: "))
                .map(|l| l.split(' ').next()?.parse().ok())
                .collect();
            assert_eq!(lags.len(), PARTITIONS as usize, "{report}");
            let owned_live = owners
                .iter()
                .all(|o| live.iter().any(|l| o.contains(l.as_str())));
            if owned_live && lags.iter().all(|l| *l == Some(0)) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a task owned by no live process ({live:?}) or behind its input: {report}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // SIGTERM: each finishes its epoch, leaves the group and exits cleanly.
    for run in &mut running {
        run.terminate();
    }
    for run in &mut running {
        let status = run.wait(Duration::from_secs(60));
        assert!(status.success(), "{}", run.stderr());
    }
    check_output(d).await;
    if !d.checkpoints.starts_with("s3://") {
        state_files_were_deleted(Path::new(&d.checkpoints));
    }
}

/// The settings of a query whose tasks processes share through the group.
const GROUP_SETTINGS: &str = "SET 'tasks' = 'per-partition';\n\
     SET 'tasks.group' = 'true';\n\
     SET 'tasks.group.session.timeout' = '6 s';\n\
     SET 'trigger' = '200 ms';\n";

/// Waits until the copy query's output holds `want` records (read
/// committed), at most 120 s; returns how many it holds.
async fn copied(d: &Divided, want: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let copied = d.read(&d.copy).await.len();
        if copied >= want {
            return copied;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{copied} of {want} records copied within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A task fenced while the group still gives it to its process is started
/// again, not left without a runner while the process looks healthy. The
/// fence comes from outside here (a producer initialising the tasks'
/// transactional ids), which is what the sink hears when an abort is
/// answered as fenced after an outage longer than the transaction timeout.
/// Every task of the copy query is fenced, then the second half of the
/// input arrives: it must all be copied, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_fenced_while_its_process_still_owns_it_is_started_again() {
    use rdkafka::producer::{BaseProducer, Producer};
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let d = Divided::new().await;
    let sql = d.sql_with("fenced", GROUP_SETTINGS, "_key");
    let mut cmd = d.command(&sql);
    cmd.env("SLUICE_LOG", "sluice_kafka::group=info,warn");
    let mut run = Run::new(cmd);
    let half = RECORDS / 2;
    produce_keyed(&d.bootstrap, &d.input, 0..half);
    copied(&d, half as usize).await;
    assert!(run.running(), "{}", run.stderr());
    let fencers: Vec<BaseProducer> = (0..PARTITIONS)
        .map(|task| {
            let producer: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &d.bootstrap)
                .set(
                    "transactional.id",
                    format!("sluice-{}-copy-{task}", d.pipeline),
                )
                .create()
                .unwrap();
            producer.init_transactions(Duration::from_secs(30)).unwrap();
            producer
        })
        .collect();
    produce_keyed(&d.bootstrap, &d.input, half..RECORDS);
    assert_eq!(copied(&d, RECORDS as usize).await, RECORDS as usize);
    let log = run.stderr();
    assert!(
        log.contains("a task this process still owns was fenced; starting it again"),
        "the tasks were not fenced, so this tests nothing: {log}"
    );
    drop(fencers);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !complete(&d).await {
        assert!(
            std::time::Instant::now() < deadline,
            "not complete: {}",
            run.stderr()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.terminate();
    let status = run.wait(Duration::from_secs(60));
    assert!(status.success(), "{}", run.stderr());
    check_output(&d).await;
}

/// A task taken from a process that is not running it (here: waiting to
/// retry its start, its sink's brokers unreachable) is released to the
/// group at once: a process that joins gets its share in seconds, not
/// after the revoke's release wait (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_is_not_running_is_handed_over_without_waiting() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    let d = Divided::new().await;
    let path = d.dir.path().join("q-idle.sql");
    std::fs::write(
        &path,
        format!(
            "CREATE STREAM input (id BIGINT) WITH (connector = 'kafka', topic = '{input}', \
               'bootstrap.servers' = '{b}');\n\
             CREATE STREAM copy WITH (connector = 'kafka', topic = '{copy}', \
               'bootstrap.servers' = '127.0.0.1:1', 'connect.timeout' = '1 s');\n\
             {GROUP_SETTINGS}\
             SET 'outage.limit' = '10 min';\n\
             SET 'pipeline.name' = '{p}-idle';\n\
             SET 'checkpoint.location' = '{cp}/idle';\n\
             INSERT INTO copy SELECT id FROM input;\n",
            input = d.input,
            copy = d.copy,
            b = d.bootstrap,
            p = d.pipeline,
            cp = d.checkpoints,
        ),
    )
    .unwrap();
    let spawn = || {
        let mut cmd = d.command(&path);
        cmd.env("SLUICE_LOG", "sluice_kafka::group=info,warn");
        Run::new(cmd)
    };
    let given = "tasks come to this process";
    let mut first = spawn();
    first.wait_for_line(given);
    first.wait_for_line("a task could not start; retrying");
    let joined_at = std::time::Instant::now();
    let mut second = spawn();
    second.wait_for_line(given);
    let handed = joined_at.elapsed();
    assert!(first.running(), "{}", first.stderr());
    assert!(
        handed < Duration::from_secs(20),
        "the joining process got its tasks after {handed:?}: {}",
        first.stderr()
    );
    assert!(
        !first.stderr().contains("did not stop within"),
        "{}",
        first.stderr()
    );
}
