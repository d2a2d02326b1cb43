//! When epochs run ([`Trigger`]).

use std::str::FromStr;
use std::time::Duration;

use crate::error::SluiceError;
use crate::options::parse_duration;

/// When the next epoch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// An epoch every interval (aligned to multiples of it); an epoch that
    /// runs long is followed at once by the next. `Duration::ZERO` runs
    /// epochs back to back. Epochs run only when there is new input.
    ProcessingTime(Duration),
    /// Process what exists when the query starts (possibly over several
    /// epochs), commit, and stop.
    AvailableNow,
}

impl Default for Trigger {
    fn default() -> Self {
        Self::ProcessingTime(Duration::ZERO)
    }
}

impl FromStr for Trigger {
    type Err = SluiceError;

    /// `'available-now'`, or an interval such as `'1 second'` / `'0'`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if matches!(
            t.as_str(),
            "available-now" | "availablenow" | "available_now"
        ) {
            return Ok(Self::AvailableNow);
        }
        parse_duration(&t).map(Self::ProcessingTime).map_err(|e| {
            SluiceError::config(format!(
                "trigger '{s}' is not valid: {e}; use 'available-now' or an interval like '1 second'"
            ))
        })
    }
}
