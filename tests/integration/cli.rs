//! The `sluice` binary: exit codes, signals, progress log.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn sql_file(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("query.sql");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

#[test]
fn a_mistake_exits_2_fast_naming_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("cp");
    let file = sql_file(
        dir.path(),
        &format!(
            "SET 'checkpoint.location' = '{}';\n\
             CREATE STREAM ticks WITH (connector = 'rate');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = 'x', 'bootstrap.servers' = '127.0.0.1:9');\n\
             INSERT INTO out SELECT valu FROM ticks;\n",
            checkpoint.display()
        ),
    );
    // Within 1 s: the fastest of up to three tries, since a shared machine
    // only ever adds time.
    let mut fastest = Duration::MAX;
    let mut out = None;
    for _ in 0..3 {
        let started = Instant::now();
        out = Some(sluice().arg("run").arg(&file).output().unwrap());
        fastest = fastest.min(started.elapsed());
        if fastest < Duration::from_secs(1) {
            break;
        }
    }
    let out = out.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(fastest < Duration::from_secs(1), "took {fastest:?}");
    assert!(
        stderr.contains(&format!("{}:4:24:", file.display())),
        "{stderr}"
    );
    assert!(stderr.contains("valu"), "{stderr}");
    assert!(
        stderr.contains("4 | INSERT INTO out SELECT valu FROM ticks;"),
        "{stderr}"
    );
    assert!(!checkpoint.exists(), "the checkpoint was not touched");
}

#[test]
fn sigterm_stops_cleanly_and_the_progress_log_has_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("progress.jsonl");
    let file = sql_file(
        dir.path(),
        "SET 'trigger.interval' = '200 ms';\n\
         CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_second' = '1000');\n\
         CREATE STREAM nowhere WITH (connector = 'blackhole');\n\
         INSERT INTO nowhere SELECT value * 2 AS doubled FROM ticks WHERE value % 3 <> 0;\n",
    );
    let mut child = sluice()
        .arg("run")
        .arg(&file)
        .arg("--progress-log")
        .arg(&log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "no progress within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM, as a service manager would send.
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert_eq!(exit.code(), Some(0));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["query"], "nowhere");
        assert_eq!(line["epoch"], (i + 1) as u64);
        assert!(line["input_rows"].as_u64().unwrap() > 0);
        for phase in ["total", "read", "compute", "state", "commit"] {
            assert!(line["duration_ms"][phase].is_number(), "{line}");
        }
    }
}

#[test]
fn explain_prints_the_incremental_plan() {
    let dir = tempfile::tempdir().unwrap();
    let file = sql_file(
        dir.path(),
        "CREATE STREAM ticks WITH (connector = 'rate');\n\
         CREATE STREAM out WITH (connector = 'console');\n\
         INSERT INTO out SELECT value FROM ticks WHERE value > 3;\n",
    );
    let out = sluice().arg("explain").arg(&file).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("output mode: append"), "{stdout}");
    assert!(stdout.contains("ticks ← rate(1 rows/s"), "{stdout}");
    assert!(
        stdout.contains("Filter: ticks.value > Int64(3)"),
        "{stdout}"
    );
}

/// Planning needs no broker: EXPLAIN of a query divided through a
/// repartition step, its brokers unreachable, prints the plan (the
/// sub-topologies too) and no Kafka client error, without waiting for
/// `connect.timeout` (30 s).
#[test]
fn explain_of_a_divided_kafka_query_opens_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let file = sql_file(
        dir.path(),
        "SET 'tasks' = 'per-partition';\n\
         CREATE STREAM input (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
           topic = 'in', 'bootstrap.servers' = '127.0.0.1:1');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = 'out', \
           'bootstrap.servers' = '127.0.0.1:1');\n\
         INSERT INTO out SELECT name, count(*) AS n FROM input GROUP BY name;\n",
    );
    let started = std::time::Instant::now();
    let out = sluice().arg("explain").arg(&file).output().unwrap();
    let took = started.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("-- sub-topology 1"), "{stdout}");
    assert!(
        !stderr.contains("librdkafka") && !stderr.contains("127.0.0.1:1"),
        "{stderr}"
    );
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}

#[test]
fn every_sql_example_plans() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sql") {
            let out = sluice().arg("explain").arg(&path).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains("output mode:"), "{stdout}");
            checked += 1;
        }
    }
    assert!(checked >= 3, "examples/*.sql: {checked} files");
}

#[test]
fn inspecting_a_directory_without_a_checkpoint_says_so_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice()
        .args(["checkpoint", "inspect"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no checkpoint here"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// `sluice completions SHELL` prints a completion script naming the
/// subcommands.
#[test]
fn completions_cover_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = sluice().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in ["run", "explain", "verify", "checkpoint", "demo"] {
            assert!(script.contains(sub), "{shell}: no '{sub}'");
        }
    }
    let out = sluice().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// `sluice --version` says what ran: the release, the commit it was built
/// from (this checkout's), and the librdkafka it links with its features.
#[test]
fn version_names_the_release_the_commit_and_librdkafka() {
    let out = sluice().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(
        text.starts_with(&format!(
            "sluice {} (commit {head}",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    let (librdkafka, features) = sluice_kafka::client_library();
    assert!(
        text.contains(&format!("librdkafka {librdkafka} ({features})")),
        "{text}"
    );
}
