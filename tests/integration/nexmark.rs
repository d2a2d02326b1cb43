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

/// The queries of `benches/nexmark/flink/` that run as Flink writes them,
/// and for each that does not yet, the words of its refusal (the list in
/// docs/sql.md, *Flink's Nexmark queries*).
const FLINK_PLANS: [u32; 19] = [
    0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 14, 15, 16, 17, 18, 19, 20, 21, 22,
];
const FLINK_REFUSED: [(u32, &str); 4] = [
    (6, "OVER window over another stateful operator"),
    (10, "PARTITIONED"),
    (12, "'proctime'"),
    (13, "needs option 'path'"),
];

/// Flink's nexmark `count_char(s, c)`: how many times `c` occurs in `s`,
/// registered from Rust as q14's `CREATE FUNCTION` expects.
fn count_char() -> sluice::datafusion::logical_expr::ScalarUDF {
    use sluice::arrow::array::{Array, AsArray, Int64Array};
    use sluice::arrow::datatypes::DataType;
    use sluice::datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
    create_udf(
        "count_char",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Int64,
        Volatility::Immutable,
        std::sync::Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (text, letter) = (arrays[0].as_string::<i32>(), arrays[1].as_string::<i32>());
            let counts: Int64Array = (0..text.len())
                .map(|i| {
                    (!text.is_null(i) && !letter.is_null(i)).then(|| {
                        let c = letter.value(i);
                        text.value(i).matches(c).count() as i64
                    })
                })
                .collect();
            Ok(ColumnarValue::Array(std::sync::Arc::new(counts)))
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flinks_nexmark_queries_plan_as_flink_writes_them_or_are_refused_saying_why() {
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic("nexmark-flink");
    sluice::broker::create_topic(&bootstrap, &topic, 2)
        .await
        .unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/nexmark/flink");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let ddl = read("ddl_kafka.sql")
        .replace("{topic}", &topic)
        .replace("{bootstrap}", &bootstrap)
        + &read("ddl_views.sql");
    let out = tempfile::tempdir().unwrap();
    let mut planned = Vec::new();
    for n in 0..=22u32 {
        let query = read(&format!("q{n}.sql"))
            .replace("{output}", &out.path().display().to_string())
            .replace(
                "{side_input}",
                &out.path().join("side.csv").display().to_string(),
            );
        let session = sluice::Session::new();
        session.context().register_udf(count_char());
        let name = format!("q{n}.sql");
        let mut runner = session.sql_runner(&name);
        match runner.prepare(&format!("{ddl}{query}")).await {
            Ok(_) => planned.push(n),
            Err(e) => {
                let why = FLINK_REFUSED.iter().find(|(q, _)| *q == n).map(|(_, w)| *w);
                let message = e.to_string();
                assert!(
                    why.is_some_and(|w| message.contains(w)),
                    "q{n} was refused for a reason not on the list: {message}"
                );
            }
        }
    }
    assert_eq!(
        planned, FLINK_PLANS,
        "the queries that plan as Flink writes them"
    );
}

/// The Flink-form queries `sluice verify` checks against DataFusion's
/// batch answer, with the sink columns an update-mode output is keyed by.
/// q7, q9, q11, q18 and q19 it cannot check (a window feeding a join,
/// Top-Ns, sessions; it says why), and q14 needs a Rust UDF the binary
/// does not have.
const FLINK_VERIFIED: [(u32, &str); 11] = [
    (0, ""),
    (1, ""),
    (2, ""),
    (3, ""),
    (4, "id"),
    (15, "day"),
    (16, "channel,day"),
    (17, "auction,day"),
    (20, ""),
    (21, ""),
    (22, ""),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flinks_nexmark_queries_read_flinks_layout_and_equal_the_batch_answer() {
    let bootstrap = crate::util::broker().await;
    let topic = fresh_topic("nexmark-flink");
    sluice::broker::create_topic(&bootstrap, &topic, 2)
        .await
        .unwrap();
    let flink = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/nexmark/flink");
    let read = |name: &str| std::fs::read_to_string(flink.join(name)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    // The events, in Flink's layout, from Flink's generator.
    let load = write(
        "load.sql",
        format!(
            "SET 'checkpoint.location' = '{}';\n{}",
            dir.path().join("load").display(),
            read("load.sql")
                .replace("{topic}", &topic)
                .replace("{bootstrap}", &bootstrap)
                .replace("{events}", "20000")
        ),
    );
    let loaded = sluice(&["run", &load]);
    assert!(loaded.status.success(), "{}", text(&loaded));
    // Several epochs per query, so that state is carried between them.
    let ddl = read("ddl_kafka.sql")
        .replace("{topic}", &topic)
        .replace("{bootstrap}", &bootstrap)
        .replace(
            "'format' = 'json'",
            "'format' = 'json', 'max-records-per-epoch' = '6000'",
        )
        + &read("ddl_views.sql");
    assert!(ddl.contains("max-records-per-epoch"), "{ddl}");
    for (n, key) in FLINK_VERIFIED {
        // Flink's files write to a blackhole; verify reads a Kafka topic.
        let key = match key {
            "" => String::new(),
            k => format!(", 'key.fields' = '{k}'"),
        };
        let sink = format!(
            "WITH ('connector' = 'kafka', 'topic' = '{}', \
             'properties.bootstrap.servers' = '{bootstrap}', 'format' = 'json'{key});",
            fresh_topic(&format!("q{n}"))
        );
        let query = read(&format!("q{n}.sql")).replace("WITH ('connector' = 'blackhole');", &sink);
        let file = write(
            &format!("q{n}.sql"),
            format!(
                "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n{ddl}{query}",
                dir.path().join(format!("cp-q{n}")).display()
            ),
        );
        let run = sluice(&["run", &file]);
        assert!(run.status.success(), "q{n}: {}", text(&run));
        let verified = sluice(&["verify", &file]);
        let report = text(&verified);
        assert!(verified.status.success(), "q{n}: {report}");
        assert!(report.contains("\nOK: "), "q{n}: {report}");
        assert!(
            !report.contains("equals the batch answer (0 rows)"),
            "q{n} gave nothing: {report}"
        );
    }
}
