//! Output modes: what each epoch emits, as Spark names them.
//!
//! | mode | emits per epoch | valid for |
//! | --- | --- | --- |
//! | append | rows that will never change again | stateless queries; windows once the watermark passes their end; joins; deduplication |
//! | update | rows whose value changed this epoch (an upsert stream keyed by the group key) | any aggregation |
//! | complete | the whole result table | aggregations |
//!
//! The planner derives the mode when none is asked for, and refuses one a
//! query cannot honour (`planner::check`).

use std::fmt;
use std::str::FromStr;

use crate::error::SluiceError;

/// What each epoch emits.
///
/// ```
/// use sluice_engine::OutputMode;
/// let mode: OutputMode = "update".parse()?;
/// assert_eq!(mode, OutputMode::Update);
/// assert_eq!(mode.to_string(), "update");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputMode {
    /// Rows that will never change again.
    #[default]
    Append,
    /// Rows whose value changed this epoch (an upsert stream).
    Update,
    /// The whole result table, every epoch.
    Complete,
}

impl fmt::Display for OutputMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Append => "append",
            Self::Update => "update",
            Self::Complete => "complete",
        })
    }
}

impl FromStr for OutputMode {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "append" => Ok(Self::Append),
            "update" => Ok(Self::Update),
            "complete" => Ok(Self::Complete),
            _ => Err(SluiceError::config(format!(
                "output mode '{s}' is not valid: expected 'append', 'update' or 'complete'"
            ))),
        }
    }
}
