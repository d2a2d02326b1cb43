//! The status page of `sluice run --ui-addr`: its JSON API against the
//! query's own progress log, the page's HTML and files, the token, the
//! misuse of its address; and, with a task group, the tasks of a stopped
//! process shown moved to the survivor with their lag. Requests go
//! through curl, a real HTTP client. (The page in a real browser:
//! `scripts/ui-check`.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::broker::{create_topic, fresh_topic};

use crate::kafka::{json_rows, produce_txn};
use crate::util::{free_port, Run};

const TOKEN: &str = "status-page-token";

/// `GET path` from the process at `port`: the status code and body.
fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut curl = Command::new("curl");
    curl.args(["-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "5"]);
    if let Some(t) = token {
        curl.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = curl
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// `GET path` as JSON, with the token; `None` until the process answers.
fn api(port: u16, path: &str) -> Option<Value> {
    match get(port, path, Some(TOKEN)) {
        (200, body) => Some(serde_json::from_str(&body).unwrap()),
        _ => None,
    }
}

/// Polls `/api/queries/<id>` until `done` holds, or fails after `limit`
/// showing the last answer and what the processes `runs` printed.
fn wait_for(
    port: u16,
    id: &str,
    limit: Duration,
    runs: &[&Run],
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(q) = api(port, &format!("/api/queries/{id}")) {
            if done(&q) {
                return q;
            }
            last = Some(q);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let printed: Vec<String> = runs.iter().map(|r| r.stderr()).collect();
    panic!(
        "not within {limit:?}; the last answer: {last:#?}\nthe processes printed:\n{}",
        printed.join("\n--\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_api_serves_what_the_progress_log_says_and_the_page_behind_a_token() {
    const RECORDS: i64 = 3_000;
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("status-in");
    create_topic(&bootstrap, &input, 2).await.unwrap();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_txn(&b, &t, &json_rows(0..RECORDS), 2, true))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let statement = "INSERT INTO out SELECT id % 7 AS k, count(*) AS n\n  FROM src GROUP BY id % 7";
    let sql = dir.path().join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'trigger.interval' = '200 ms';\n\
             SET 'pipeline.name' = 'status-page';\n\
             SET 'checkpoint.location' = '{cp}';\n\
             CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               'max-records-per-epoch' = '100');\n\
             CREATE STREAM out WITH (connector = 'blackhole');\n\
             {statement};\n",
            cp = dir.path().join("cp").display(),
        ),
    )
    .unwrap();
    let log = dir.path().join("progress.jsonl");
    let port = free_port();
    let mut run = Run::new({
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run")
            .arg(&sql)
            .args(["--ui-addr", &format!("127.0.0.1:{port}")])
            .arg("--progress-log")
            .arg(&log)
            .env("SLUICE_UI_TOKEN", TOKEN)
            .stdout(Stdio::null());
        cmd
    });

    // Without the token, or with another, 401 and no data.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(port, "/", None).0 == 0 {
        assert!(Instant::now() < deadline, "no answer: {}", run.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    for (path, token) in [
        ("/api/queries", None),
        ("/api/queries", Some("wrong")),
        ("/api/queries/status-page", Some("status-page-tokenx")),
        ("/", None),
        ("/metrics", None),
    ] {
        let (code, body) = get(port, path, token);
        assert_eq!(code, 401, "{path} {token:?}: {body}");
        assert!(!body.contains("status-page\""), "{body}");
    }

    // The query while it reads its backlog: running, a task of this
    // process, its statement as the file writes it, its plan.
    let q = wait_for(port, "status-page", Duration::from_secs(60), &[&run], |q| {
        q["epoch"].as_u64().is_some_and(|e| e >= 3)
    });
    assert_eq!(q["state"], "running", "{q:#}");
    assert_eq!(q["name"], "out");
    assert_eq!(q["statement"], statement);
    assert!(q["plan"].as_str().unwrap().contains("Aggregate"), "{q:#}");
    assert!(q["last_commit"]["sink"].is_string(), "{q:#}");
    let tasks = q["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{q:#}");
    assert_eq!(tasks[0]["owner"], "this process");
    assert_eq!(tasks[0]["process"]["pid"], run.pid());
    assert_eq!(tasks[0]["state"], "running");
    let list = api(port, "/api/queries").unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list:#}");
    assert_eq!(list[0]["id"], "status-page");

    // Once the backlog is read: lag 0 on both partitions, every record
    // read, the state's 7 groups.
    let q = wait_for(port, "status-page", Duration::from_secs(90), &[&run], |q| {
        q["input_rows"] == RECORDS && q["lag_records"] == 0
    });
    let partitions: BTreeSet<&str> = q["sources"][0]["lag"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(partitions, BTreeSet::from(["0", "1"]), "{q:#}");
    assert_eq!(q["state_rows"], 7, "{q:#}");
    assert!(
        q["epochs"].as_u64().unwrap() >= (RECORDS / 100) as u64,
        "{q:#}"
    );

    // The progress: the progress log's objects, epoch for epoch.
    let progress = api(port, "/api/queries/status-page/progress").unwrap();
    let progress = progress.as_array().unwrap();
    let logged = log_lines(&log);
    assert!(progress.len() >= 3, "{progress:#?}");
    for p in progress {
        let epoch = p["epoch"].as_u64().unwrap();
        let line = logged
            .iter()
            .find(|l| l["epoch"] == epoch)
            .unwrap_or_else(|| panic!("epoch {epoch} is not in the log"));
        assert_eq!(p, line);
    }
    let read: u64 = progress
        .iter()
        .map(|p| p["input_rows"].as_u64().unwrap())
        .sum();
    assert_eq!(read, RECORDS as u64);

    // The page and its files; the metrics beside them.
    let (code, page) = get(port, "/", Some(TOKEN));
    assert_eq!(code, 200);
    for part in [
        "id=\"epoch\"",
        "id=\"charts\"",
        "assets/uPlot.iife.min.js",
        "assets/page.js",
    ] {
        assert!(page.contains(part), "{part} not in the page:\n{page}");
    }
    for file in [
        "page.js",
        "page.css",
        "uPlot.iife.min.js",
        "uPlot.min.css",
        "uPlot.LICENSE.txt",
    ] {
        let (code, body) = get(port, &format!("/assets/{file}"), Some(TOKEN));
        assert_eq!(code, 200, "{file}");
        assert!(body.len() > 100, "{file}: {body}");
    }
    let (code, metrics) = get(port, "/metrics", Some(TOKEN));
    assert_eq!(code, 200);
    assert!(
        metrics.contains("sluice_epochs_committed_total{query=\"out\"}"),
        "{metrics}"
    );
    assert_eq!(get(port, "/api/queries/nothing", Some(TOKEN)).0, 404);

    // Its port taken: a second process exits 2 saying so, before starting
    // anything (a port alone is loopback's); so does an address that is
    // not this host's.
    for (addr, bound) in [
        (format!("127.0.0.1:{port}"), format!("127.0.0.1:{port}")),
        (port.to_string(), format!("127.0.0.1:{port}")),
        ("192.0.2.1:8080".to_string(), "192.0.2.1:8080".to_string()),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("run")
            .arg(&sql)
            .args(["--ui-addr", &addr])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("--ui-addr {addr}: cannot listen on {bound}")),
            "{err}"
        );
    }
    run.terminate();
    assert!(
        run.wait(Duration::from_secs(60)).success(),
        "{}",
        run.stderr()
    );
}

/// The progress log's lines.
fn log_lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap();
    text[..text.rfind('\n').map_or(0, |end| end + 1)]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Two processes share a divided query's four tasks; one is stopped with
/// SIGKILL. Within the group's session timeout (and the time the survivor
/// takes to restore them), the survivor's page shows every task as its
/// own, running, with its lag; before, it showed the other's as another
/// process's, named as the group names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_process_tasks_show_moved_to_the_survivor_with_their_lag() {
    let _one_at_a_time = crate::util::MANY_TASKS.lock().await;
    const PARTITIONS: i32 = 4;
    let bootstrap = crate::util::broker().await;
    let input = fresh_topic("status-group-in");
    let output = fresh_topic("status-group-out");
    create_topic(&bootstrap, &input, PARTITIONS).await.unwrap();
    create_topic(&bootstrap, &output, PARTITIONS).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'tasks' = 'per-partition';\n\
             SET 'tasks.group' = 'true';\n\
             SET 'tasks.group.session.timeout' = '6 s';\n\
             SET 'trigger' = '200 ms';\n\
             SET 'pipeline.name' = '{pipeline}';\n\
             SET 'checkpoint.location' = '{cp}';\n\
             CREATE STREAM src (id BIGINT, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{input}', 'bootstrap.servers' = '{bootstrap}');\n\
             CREATE STREAM out WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT id, name FROM src;\n",
            pipeline = fresh_topic("status-group"),
            cp = dir.path().join("cp").display(),
        ),
    )
    .unwrap();
    let id = std::fs::read_to_string(&sql)
        .unwrap()
        .split("'pipeline.name' = '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap()
        .to_string();
    let ports = [free_port(), free_port()];
    let mut runs: Vec<Run> = ports
        .iter()
        .map(|port| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
            cmd.arg("run")
                .arg(&sql)
                .args(["--ui-addr", &format!("127.0.0.1:{port}")])
                .env("SLUICE_UI_TOKEN", TOKEN)
                .env("SLUICE_LOG", "sluice_kafka::group=info,warn")
                .stdout(Stdio::null());
            Run::new(cmd)
        })
        .collect();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_txn(&b, &t, &json_rows(0..400), PARTITIONS, true))
        .await
        .unwrap();

    // The tasks each page shows as this process's, running.
    let here = |q: &Value| -> BTreeSet<u64> {
        q["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["owner"] == "this process" && t["state"] == "running")
            .map(|t| t["task"].as_u64().unwrap())
            .collect()
    };
    // What a page shows of the tasks it does not run: another process's,
    // elsewhere, named as process `other` (the group is asked every 3 s at
    // most, so a name may be a moment old).
    let named = |q: &Value, other: u32| {
        let held = here(q);
        q["tasks"].as_array().unwrap().iter().all(|t| {
            held.contains(&t["task"].as_u64().unwrap())
                || (t["owner"] == "another process"
                    && t["state"] == "elsewhere"
                    && t["owned_by"]
                        .as_str()
                        .is_some_and(|o| o.starts_with(&format!("sluice-{other}@"))))
        })
    };
    // Until the two pages agree: each runs some, together all, none twice,
    // with no lag, each naming the other as the owner of the rest (the
    // group may still be settling the second process in).
    let all: BTreeSet<u64> = (0..PARTITIONS as u64).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let [first, second] = ports.map(|port| api(port, &format!("/api/queries/{id}")));
        if let (Some(first), Some(second)) = (&first, &second) {
            let (mine, theirs) = (here(first), here(second));
            if !mine.is_empty()
                && !theirs.is_empty()
                && mine.is_disjoint(&theirs)
                && mine.union(&theirs).eq(all.iter())
                && first["lag_records"] == 0
                && second["lag_records"] == 0
                && named(first, runs[1].pid())
                && named(second, runs[0].pid())
            {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the pages did not agree within 90 s:\n{first:#?}\n{second:#?}\n{}\n{}",
            runs[0].stderr(),
            runs[1].stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The second dies; the first shows all four as its own, with their
    // lag, within the session timeout and the restore.
    runs[1].kill_9();
    let stopped = Instant::now();
    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || {
        produce_txn(&b, &t, &json_rows(400..800), PARTITIONS, true)
    })
    .await
    .unwrap();
    let moved = wait_for(ports[0], &id, Duration::from_secs(60), &[&runs[0]], |q| {
        here(q) == all
            && q["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["lag_records"].is_i64() && t["epoch"].is_u64())
    });
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(6 + 15), "moved after {took:?}");
    assert_eq!(moved["tasks_here"], PARTITIONS, "{moved:#}");
    assert_eq!(moved["state"], "running", "{moved:#}");
    // The last commit names its transaction: the exactly-once sink's
    // transactional id.
    assert!(
        moved["last_commit"]["sink"]
            .as_str()
            .unwrap()
            .contains("exactly-once, transactional.id="),
        "{moved:#}"
    );
    for t in moved["tasks"].as_array().unwrap() {
        assert_eq!(t["process"]["pid"], runs[0].pid(), "{moved:#}");
    }
    // And the lag falls to 0 as the survivor reads what came after.
    wait_for(ports[0], &id, Duration::from_secs(60), &[&runs[0]], |q| {
        q["lag_records"] == 0
            && q["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["lag_records"] == 0)
    });
    runs[0].terminate();
    assert!(
        runs[0].wait(Duration::from_secs(60)).success(),
        "{}",
        runs[0].stderr()
    );
}

/// Every metric the Grafana dashboard in docs/ queries is one the metrics
/// endpoint serves (a renamed family would leave a panel empty), and
/// every family served is on some panel.
#[test]
fn the_grafana_dashboard_reads_only_and_every_metric_sluice_serves() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana/sluice-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let served: BTreeSet<String> = sluice::Metrics::default()
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("sluice_") || word.starts_with("process_") {
                    let family = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|s| word.strip_suffix(s).filter(|f| served.contains(*f)))
                        .unwrap_or(word);
                    assert!(served.contains(family), "{family} in {expr}");
                    queried.insert(family.to_string());
                }
            }
        }
    }
    let unused: Vec<&String> = served.difference(&queried).collect();
    assert!(unused.is_empty(), "served but on no panel: {unused:?}");
}
