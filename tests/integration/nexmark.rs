//! Nexmark over Kafka: `sluice nexmark load` fills the topics, the
//! benchmark's queries (benches/nexmark/q*.sql) run on them exactly once,
//! and `sluice verify` checks each output against DataFusion's batch
//! answer to the same SQL over the loaded events.

use std::path::Path;
use std::process::{Command, Output};

use sluice::broker::fresh_topic;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const QUERIES: [&str; 8] = ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_nexmark_topics_run_the_queries_and_verify_against_the_batch_answer() {
    const EVENTS: u64 = 20_000;
    let bootstrap = crate::util::broker().await;
    let prefix = fresh_topic("nexmark");
    let events = EVENTS.to_string();
    let load = sluice(&[
        "nexmark",
        "load",
        "--events",
        &events,
        "--prefix",
        &prefix,
        "--bootstrap",
        &bootstrap,
    ]);
    assert!(load.status.success(), "{}", text(&load));
    // 1 person, 3 auctions and 46 bids in every 50 events.
    let loaded = text(&load);
    for (table, n) in [("person", 400), ("auction", 1_200), ("bid", 18_400)] {
        assert!(
            loaded.contains(&format!("{prefix}-{table}: {n} records")),
            "{loaded}"
        );
    }
    // The loader refuses to mix two loads in one topic.
    let again = sluice(&[
        "nexmark",
        "load",
        "--prefix",
        &prefix,
        "--bootstrap",
        &bootstrap,
    ]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("already exists"), "{}", text(&again));

    let dir = tempfile::tempdir().unwrap();
    let benches = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/nexmark");
    let mut sql = std::fs::read_to_string(benches.join("kafka-sources.sql"))
        .unwrap()
        .replace("{prefix}", &prefix)
        .replace("{bootstrap}", &bootstrap)
        // Several epochs per query: state carried between them.
        .replace("{source_options}", ", 'max-records-per-epoch' = '4000'");
    sql.push_str("SET 'trigger' = 'available-now';\n");
    for q in QUERIES {
        sql.push_str(&format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             CREATE STREAM nexmark_{q} WITH (connector = 'kafka', topic = '{topic}', \
               'bootstrap.servers' = '{bootstrap}');\n{text}",
            cp = dir.path().join(q).display(),
            topic = fresh_topic(q),
            text = std::fs::read_to_string(benches.join(format!("{q}.sql"))).unwrap(),
        ));
    }
    let file = dir.path().join("nexmark.sql");
    std::fs::write(&file, sql).unwrap();
    let file = file.to_str().unwrap();

    let run = sluice(&["run", file]);
    assert!(run.status.success(), "{}", text(&run));
    let verified = sluice(&["verify", file]);
    let report = text(&verified);
    // q5 and q7 chain windowed aggregations, whose rows verify cannot
    // tell (tests/integration/pipelines.rs checks their shapes); it says
    // so. q4's chain (join, aggregation, aggregation) it checks.
    assert_eq!(verified.status.code(), Some(2), "{report}");
    assert_eq!(report.matches("\nOK: ").count(), 6, "{report}");
    assert_eq!(report.matches("NOT CHECKED").count(), 2, "{report}");
    assert!(report.contains("chains stateful operators"), "{report}");
    // q0 and q1 pass every bid through; q2, q3, q4 and q8 keep some, not
    // none.
    assert_eq!(
        report
            .matches("equals the batch answer (18400 rows)")
            .count(),
        2,
        "{report}"
    );
    assert!(
        !report.contains("equals the batch answer (0 rows)"),
        "{report}"
    );
    // q4 folds its update-mode output by category (a tombstone would
    // delete one), and every category holds auctions.
    let q4 = report
        .split("query '")
        .find(|s| s.contains("nexmark_q4"))
        .unwrap_or_default();
    assert!(q4.contains("compared by key (update mode"), "{report}");
    assert!(q4.contains("OK: "), "{report}");
}
