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

/// The table of settings in `docs/sql.md`, as `sluice::SETTINGS` makes it.
fn settings_table() -> String {
    let mut table = String::from("| setting | values | default |\n| --- | --- | --- |\n");
    for s in sluice::SETTINGS {
        table.push_str(&format!(
            "| {} | {} | {} |\n",
            s.heading(),
            s.values,
            s.default
        ));
    }
    table
}

#[test]
fn the_settings_table_in_the_docs_is_the_engines() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/sql.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc
        .find("| setting | values | default |")
        .expect("the table's heading");
    let end = doc[start..]
        .find("\n\n")
        .map_or(doc.len(), |n| start + n + 1);
    let table = settings_table();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[end..])).unwrap();
        return;
    }
    assert_eq!(
        &doc[start..end],
        table,
        "docs/sql.md's settings table differs from sluice::SETTINGS (UPDATE_GOLDEN=1 \
         regenerates it)"
    );
    // Every setting is one `SET` takes, and a near miss is named.
    for s in sluice::SETTINGS.iter().filter(|s| s.is_query_wide()) {
        assert!(sluice::Setting::find(s.name).is_some_and(|f| f.name == s.name));
    }
    let typo = sluice::QuerySettings::default()
        .set("tasks.thread", "2")
        .unwrap_err()
        .to_string();
    assert!(typo.contains("did you mean 'tasks.threads'?"), "{typo}");
}
