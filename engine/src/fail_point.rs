//! Fault points at the commit boundaries, for crash tests.
//!
//! `SLUICE_FAILPOINT=<name>` (or `<name>@<epoch>`) makes the process abort
//! — as abruptly as `kill -9` — when it reaches the named point (in that
//! epoch). This makes "crash exactly between staging and commit"
//! reproducible; the random `kill -9` tests cover the rest. Points:
//!
//! | name | where |
//! | --- | --- |
//! | `after-offsets` | `offsets/N` written, nothing read yet |
//! | `before-commit-record` | the sink has epoch N, `commits/N` not written |
//! | `kafka-before-commit` | output and progress record produced, transaction open |
//! | `kafka-after-commit` | transaction committed, not yet reported to the engine |

use std::sync::OnceLock;

fn configured() -> Option<&'static (String, Option<u64>)> {
    static POINT: OnceLock<Option<(String, Option<u64>)>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let spec = std::env::var("SLUICE_FAILPOINT").ok()?;
            match spec.split_once('@') {
                Some((name, epoch)) => Some((name.to_string(), epoch.parse().ok())),
                None => Some((spec, None)),
            }
        })
        .as_ref()
}

/// Aborts the process if `SLUICE_FAILPOINT` names this point (and epoch).
pub fn fail_point(name: &str, epoch: u64) {
    if let Some((point, at)) = configured() {
        if point == name && at.is_none_or(|e| e == epoch) {
            eprintln!("sluice: fail point '{name}' reached in epoch {epoch}: aborting");
            std::process::abort();
        }
    }
}
