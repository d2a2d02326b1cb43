//! Fault points at the commit boundaries, for crash tests.
//!
//! `SLUICE_FAILPOINT=<name>` (or `<name>@<epoch>`) makes the process abort
//! — as abruptly as `kill -9` — when it reaches the named point (in that
//! epoch). This makes "crash exactly between staging and commit"
//! reproducible; the random `kill -9` tests cover the rest.
//!
//! `<name>@<epoch>:pause=<file>` pauses there instead, until `<file>`
//! exists: a fault test stops the broker at that moment (an open
//! transaction, say) and then lets the process go on into the fault.
//! Points:
//!
//! | name | where |
//! | --- | --- |
//! | `after-offsets` | `offsets/N` written, nothing read yet |
//! | `before-commit-record` | the sink has epoch N, `commits/N` not written |
//! | `kafka-before-commit` | output and progress record produced, transaction open |
//! | `kafka-after-commit` | transaction committed, not yet reported to the engine |
//! | `files-before-commit-record` | the `filesystem` sink's files staged, its commit record not written |
//! | `files-after-commit-record` | its commit record written, the files not yet renamed into place |

use std::sync::OnceLock;

/// A configured fail point: where, in which epoch, and what it does.
struct Point {
    name: String,
    epoch: Option<u64>,
    /// Pause until this file exists, instead of aborting.
    resume_file: Option<std::path::PathBuf>,
}

fn configured() -> Option<&'static Point> {
    static POINT: OnceLock<Option<Point>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let spec = std::env::var("SLUICE_FAILPOINT").ok()?;
            let (at, resume_file) = match spec.split_once(":pause=") {
                Some((at, file)) => (at.to_string(), Some(file.into())),
                None => (spec, None),
            };
            let (name, epoch) = match at.split_once('@') {
                Some((name, epoch)) => (name.to_string(), epoch.parse().ok()),
                None => (at, None),
            };
            Some(Point {
                name,
                epoch,
                resume_file,
            })
        })
        .as_ref()
}

/// Aborts the process (or pauses it) if `SLUICE_FAILPOINT` names this
/// point (and epoch).
pub fn fail_point(name: &str, epoch: u64) {
    let Some(point) = configured() else { return };
    if point.name != name || point.epoch.is_some_and(|e| e != epoch) {
        return;
    }
    match &point.resume_file {
        None => {
            eprintln!("sluice: fail point '{name}' reached in epoch {epoch}: aborting");
            std::process::abort();
        }
        Some(file) => {
            eprintln!(
                "sluice: fail point '{name}' reached in epoch {epoch}: pausing until {} exists",
                file.display()
            );
            while !file.exists() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}
