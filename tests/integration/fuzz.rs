//! Parse and plan never panic: statements from the SQL corpus and the
//! examples, mutated at random (pieces cut, repeated, swapped, and tokens
//! of the language dropped in), go through `SqlRunner::prepare`, which
//! must return a result or an error that points inside the text.
//!
//! CI runs a fixed seed and 2000 cases; a longer run:
//! `SLUICE_FUZZ_CASES=100000 SLUICE_FUZZ_SEED=7 cargo test --test integration fuzz`.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use sluice::Session;

/// Words and punctuation of the language, dropped in at random.
const TOKENS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "HAVING",
    "JOIN",
    "LEFT JOIN",
    "ON",
    "AND",
    "OR",
    "DISTINCT",
    "AS",
    "INSERT INTO",
    "CREATE STREAM",
    "WITH",
    "SET",
    "EXPLAIN",
    "DROP STREAM",
    "SHOW STREAMS",
    "WATERMARK FOR",
    "TABLE",
    "TUMBLE",
    "HOP",
    "SESSION",
    "DESCRIPTOR",
    "INTERVAL '5' SECOND",
    "INTERVAL",
    "BETWEEN",
    "(",
    ")",
    ",",
    ";",
    "'",
    "\"",
    "*",
    "=",
    "-",
    "+",
    "count(*)",
    "sum(",
    "window_start",
    "window_end",
    "ts",
    "k",
    "v",
    "events",
    "out",
    "'connector'",
    "'kafka'",
    "'rate'",
    "'files'",
    "NULL",
    "0",
    "-1",
    "99999999999999999999",
    "'1 second'",
    "'available-now'",
    "'append'",
    "TIMESTAMP",
    "BIGINT",
    "--",
    "/*",
    "\n",
    "é",
];

#[derive(Debug, Clone)]
enum Mutation {
    Cut { at: usize, len: usize },
    Insert { at: usize, token: usize },
    Repeat { at: usize, len: usize },
    Swap { a: usize, b: usize, len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..12).prop_map(|(at, len)| Mutation::Cut { at, len }),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, token)| Mutation::Insert { at, token }),
        (any::<usize>(), 1usize..20).prop_map(|(at, len)| Mutation::Repeat { at, len }),
        (any::<usize>(), any::<usize>(), 1usize..10).prop_map(|(a, b, len)| Mutation::Swap {
            a,
            b,
            len
        }),
    ]
}

/// Applies `m` on character boundaries.
fn apply(text: &str, m: &Mutation) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().max(1);
    let clamp = |at: usize, len: usize| {
        let start = at % n;
        (start.min(chars.len()), (start + len).min(chars.len()))
    };
    let mut out: Vec<char> = chars.clone();
    match m {
        Mutation::Cut { at, len } => {
            let (s, e) = clamp(*at, *len);
            out.drain(s..e);
        }
        Mutation::Insert { at, token } => {
            let (s, _) = clamp(*at, 0);
            let t: Vec<char> = format!(" {} ", TOKENS[*token]).chars().collect();
            out.splice(s..s, t);
        }
        Mutation::Repeat { at, len } => {
            let (s, e) = clamp(*at, *len);
            let piece: Vec<char> = chars[s..e].to_vec();
            out.splice(e..e, piece);
        }
        Mutation::Swap { a, b, len } => {
            let (s1, e1) = clamp(*a, *len);
            let (s2, e2) = clamp(*b, *len);
            if e1 <= s2 {
                let first: Vec<char> = chars[s1..e1].to_vec();
                let second: Vec<char> = chars[s2..e2].to_vec();
                out.splice(s2..e2, first);
                out.splice(s1..e1, second);
            }
        }
    }
    out.into_iter().collect()
}

fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut texts = Vec::new();
    for dir in ["tests/sql", "examples"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sql") {
                // The corpus reads files relative to tests/sql.
                let data = root.join("tests/sql/data");
                let text = std::fs::read_to_string(path).unwrap();
                texts.push(text.replace("'data/", &format!("'{}/", data.display())));
            }
        }
    }
    texts.sort();
    texts
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn mutated_statements_never_panic_parse_or_plan() {
    let texts = corpus();
    assert!(texts.len() >= 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seed = env_number("SLUICE_FUZZ_SEED", 1);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: env_number("SLUICE_FUZZ_CASES", 2000) as u32,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = (0..texts.len(), proptest::collection::vec(mutation(), 1..4));
    let planned = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&strategy, |(which, mutations)| {
            let mut text = texts[which].clone();
            for m in &mutations {
                text = apply(&text, m);
            }
            let lines = text.lines().count() as u64 + 1;
            let session = Session::new();
            let outcome = rt.block_on(async {
                let mut runner = session.sql_runner("fuzz.sql");
                runner.prepare(&text).await.map(|_| ())
            });
            match outcome {
                Ok(()) => {
                    planned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    prop_assert!(
                        e.line >= 1 && e.line <= lines,
                        "line {} of {lines}: {e}",
                        e.line
                    );
                    prop_assert!(!e.message.is_empty());
                }
            }
            Ok(())
        })
        .unwrap();
    // Some mutants must still plan, or the fuzzing never reaches the planner.
    let planned = planned.into_inner();
    assert!(
        planned >= runner.config().cases / 50,
        "only {planned} mutants planned"
    );
}
