//! The SQL corpus in `tests/sql/`: each `NAME.sql` is run with the `sluice`
//! binary (`sluice run`, or the command named by a first line
//! `-- command: explain`) from inside `tests/sql/`, and its exit status,
//! stdout and stderr must equal `NAME.expected` byte for byte — errors are
//! tested as exactly as results (file:line:column, message, caret).
//!
//! After a deliberate change, regenerate the files with
//! `UPDATE_GOLDEN=1 cargo test --test integration golden` and review the diff.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, file: &str) -> String {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let command = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("-- command: "))
        .unwrap_or("run")
        .trim()
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg(&command)
        .arg(file)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    format!(
        "exit: {}\n--- stdout\n{}--- stderr\n{}",
        out.status.code().map_or("signal".into(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn sql_corpus_matches_its_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sql");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "the corpus is in {}", dir.display());
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut differ = Vec::new();
    for file in &files {
        let actual = run(&dir, file);
        let golden = dir.join(file.replace(".sql", ".expected"));
        if update {
            std::fs::write(&golden, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_default();
        if actual != expected {
            differ.push(format!(
                "{file}:\n--- expected ({})\n{expected}\n--- actual\n{actual}",
                golden.display()
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} files differ from their golden output (UPDATE_GOLDEN=1 regenerates):\n{}",
        differ.len(),
        files.len(),
        differ.join("\n")
    );
}
