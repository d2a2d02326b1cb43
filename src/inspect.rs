//! `sluice checkpoint inspect DIR`: what a checkpoint holds, and whether the
//! Kafka progress topic agrees with it.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use sluice::{Checkpoint, SluiceError};
use sluice_kafka::ClientOptions;

/// The report, as text; a Kafka `client` adds the progress topic check.
/// A query divided into tasks gets one report per task, each checked
/// against the task's own progress record.
pub fn inspect(
    dir: &Path,
    client: Option<ClientOptions>,
    topic: Option<&str>,
) -> Result<String, SluiceError> {
    let cp = Checkpoint::open_existing(dir)?;
    let tasks = cp.tasks()?;
    if tasks.is_empty() {
        return report(dir, None, client, topic);
    }
    let id = &cp.metadata().query_id;
    let mut out = format!(
        "checkpoint {}\n  query id: {id}\n  divided into {} tasks, one per input partition, each \
         committing alone:\n",
        dir.display(),
        tasks.len()
    );
    let topic = topic.map_or_else(|| sluice_kafka::default_progress_topic(id), str::to_string);
    // Who runs each task now, as the query's task group says.
    let owners = client.as_ref().map(|c| {
        let c = c.clone().connect_timeout(Duration::from_secs(10));
        let id = id.clone();
        std::thread::spawn(move || sluice_kafka::task_owners(&c, &id))
            .join()
            .unwrap_or_else(|_| Err(SluiceError::Internal("the group query panicked".into())))
    });
    for index in tasks {
        let folder = dir.join("tasks").join(index.to_string());
        let task = report(&folder, Some(index), client.clone(), Some(&topic))?;
        for (i, line) in task.lines().enumerate() {
            let _ = writeln!(out, "  {line}");
            if i > 0 {
                continue;
            }
            let owner = match &owners {
                None => continue,
                Some(Err(e)) => format!("unknown: {e}"),
                Some(Ok(owners)) => owners.get(&index).cloned().unwrap_or_else(|| {
                    "none now (no process of the query's task group holds it)".into()
                }),
            };
            let _ = writeln!(out, "    owner: {owner}");
        }
    }
    Ok(out)
}

/// How many records the commit's Kafka inputs have beyond where it ended:
/// each input the fingerprint says reads `kafka topic <name>`, each
/// partition of its range against the partition's end now.
fn lag(client: &ClientOptions, commit: &sluice::EpochCommit) -> Result<Option<i64>, SluiceError> {
    let mut lag = None;
    for line in commit.fingerprint.as_deref().unwrap_or_default().lines() {
        let Some((key, topic)) = line
            .split_once("input ")
            .and_then(|(_, rest)| rest.split_once(" reads kafka topic "))
        else {
            continue;
        };
        let Some(range) = commit.plan.sources.get(key) else {
            continue;
        };
        let Some(ranges) = range.end.get("ranges").and_then(|r| r.as_object()) else {
            continue;
        };
        let ends = sluice_kafka::partition_ends(client, topic.trim())?;
        for (partition, span) in ranges {
            let (Ok(p), Some(to)) = (
                partition.parse::<i32>(),
                span.get(1).and_then(|v| v.as_i64()),
            ) else {
                continue;
            };
            if let Some(end) = ends.get(&p) {
                *lag.get_or_insert(0) += (end - to).max(0);
            }
        }
    }
    Ok(lag)
}

/// One checkpoint's report: the query's, or task `task`'s.
fn report(
    dir: &Path,
    task: Option<u32>,
    client: Option<ClientOptions>,
    topic: Option<&str>,
) -> Result<String, SluiceError> {
    let cp = Checkpoint::open_existing(dir)?;
    let meta = cp.metadata();
    let mut out = String::new();
    let w = &mut out;
    match task {
        Some(index) => {
            let _ = writeln!(w, "task {index}: {}", dir.display());
        }
        None => {
            let _ = writeln!(w, "checkpoint {}", dir.display());
            let _ = writeln!(w, "  query id: {}", meta.query_id);
        }
    }
    if task.is_none() {
        let _ = writeln!(
            w,
            "  written by: sluice {} (checkpoint format {})",
            meta.engine_version, meta.format_version
        );
    }
    let offsets = cp.offset_epochs()?;
    let commits = cp.commit_epochs()?;
    let span = |e: &[u64]| match (e.first(), e.last()) {
        (Some(a), Some(b)) => format!("{a}..={b} ({} kept)", e.len()),
        _ => "none".to_string(),
    };
    let _ = writeln!(w, "  planned epochs (offsets/): {}", span(&offsets));
    let _ = writeln!(w, "  committed epochs (commits/): {}", span(&commits));
    let last = commits.last().copied();
    if let Some(epoch) = last {
        last_commit(w, &cp, epoch)?;
    } else {
        let _ = writeln!(w, "  nothing committed yet");
    }
    if let Some(next) = offsets.last().filter(|o| Some(**o) > last) {
        let _ = writeln!(
            w,
            "  epoch {next} was planned but not committed: a restart re-runs it over the same offsets"
        );
    }
    if let Some(client) = client {
        let id = match task {
            // A task's progress record is keyed by its own identity.
            Some(index) => sluice_kafka::task_identity(&meta.query_id, index),
            None => meta.query_id.clone(),
        };
        kafka_report(w, &cp, client, &id, topic, last)?;
    }
    Ok(out)
}

/// The last committed epoch's part of a report: its offsets, watermarks
/// and state files.
fn last_commit(w: &mut String, cp: &Checkpoint, epoch: u64) -> Result<(), SluiceError> {
    let commit = cp.read_commit(epoch)?;
    let plan = cp.read_offsets(epoch)?;
    let when = chrono_like(commit.committed_at_ms);
    let _ = writeln!(
        w,
        "  last committed epoch {epoch} at {when}, {} output rows",
        commit.output_rows
    );
    let _ = writeln!(w, "    source offsets (end = where the next epoch starts):");
    for (key, range) in &plan.sources {
        let start = range
            .start
            .as_ref()
            .map_or("beginning".to_string(), |s| s.to_string());
        let _ = writeln!(w, "      {key}: {start} -> {}", range.end);
    }
    if commit.watermarks.is_empty() {
        let _ = writeln!(w, "    watermark: none");
    } else {
        for (key, ns) in &commit.watermarks {
            let _ = writeln!(
                w,
                "    watermark of {key}: {}",
                chrono_like(ns.div_euclid(1_000_000))
            );
        }
    }
    if commit.state_files.is_empty() {
        let _ = writeln!(w, "    state: none");
    } else {
        let mut total = 0;
        let _ = writeln!(
            w,
            "    state (per operator a snapshot, or a sliced chain's first delta, then the deltas after it, loaded in order):"
        );
        for f in &commit.state_files {
            let len = cp.state_file_len(f)?;
            total += len;
            let _ = writeln!(w, "      {f}  {len} bytes");
        }
        let _ = writeln!(w, "      total {total} bytes");
    }
    Ok(())
}

/// The Kafka part of a report: the input's lag after the `last` committed
/// epoch, and whether the progress record of query (or task) `id` agrees
/// with the checkpoint.
fn kafka_report(
    w: &mut String,
    cp: &Checkpoint,
    client: ClientOptions,
    id: &str,
    topic: Option<&str>,
    last: Option<u64>,
) -> Result<(), SluiceError> {
    let bootstrap = client.bootstrap().to_string();
    let client = client.connect_timeout(Duration::from_secs(10));
    if let Some(epoch) = last {
        let commit = cp.read_commit(epoch)?;
        let c = client.clone();
        let behind = std::thread::spawn(move || lag(&c, &commit))
            .join()
            .map_err(|_| SluiceError::Internal("the lag query panicked".into()))?;
        let _ = match behind {
            Ok(Some(n)) => writeln!(
                w,
                "  lag: {n} records in its Kafka input partitions after the last committed epoch"
            ),
            Ok(None) => Ok(()),
            Err(e) => writeln!(w, "  lag: unknown: {e}"),
        };
    }
    let q = id.to_string();
    let t = topic.map(str::to_string);
    let kafka = std::thread::spawn(move || sluice_kafka::last_committed(&client, t.as_deref(), &q))
        .join()
        .map_err(|_| SluiceError::Internal("the Kafka check panicked".into()))?;
    let _ = writeln!(w, "kafka progress topic on {bootstrap}:");
    match kafka {
        Err(e) => {
            let _ = writeln!(w, "  cannot read it: {e}");
        }
        Ok(None) => {
            let _ = writeln!(
                w,
                "  no record for this query: {}",
                if last.is_some() {
                    "the checkpoint says epochs were committed, so either this query's sink is \
                     not exactly-once Kafka, or the progress topic was lost (then the query \
                     refuses to start: use a new checkpoint location)"
                } else {
                    "consistent: nothing was committed"
                }
            );
        }
        Ok(Some((epoch, _))) => {
            let verdict = match last {
                Some(l) if l == epoch => "agrees with the checkpoint".to_string(),
                Some(l) if l < epoch => format!(
                    "is ahead of the checkpoint ({l}): the process stopped right after a Kafka \
                     commit; the next start records epochs {}..={epoch} and continues",
                    l + 1
                ),
                Some(l) => format!(
                    "is behind the checkpoint ({l}): the progress topic lost records or belongs \
                     to another query; the query refuses to start: use a new checkpoint \
                     location, or restore the topic"
                ),
                None => "but the checkpoint has no commit: the next start records it".into(),
            };
            let _ = writeln!(w, "  last committed epoch {epoch}: {verdict}");
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch as RFC 3339.
fn chrono_like(ms: i64) -> String {
    sluice::arrow::temporal_conversions::timestamp_ms_to_datetime(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}
