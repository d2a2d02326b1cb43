//! The engine's error type, split by who is at fault.
//!
//! A [`SluiceError`] tells its caller whether the *user* must change something
//! (a query, an option, a checkpoint location: [`SluiceError::is_user_error`])
//! or whether something failed while running (a file, a broker, a bug). The CLI
//! maps the first kind to exit status 2 and the second to 1.

use std::path::PathBuf;

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Result alias used throughout Sluice.
pub type Result<T, E = SluiceError> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum SluiceError {
    /// The query or pipeline cannot run as written; the message says why and
    /// what would work.
    #[error("{0}")]
    Plan(String),

    /// A connector option, format or setting is wrong. `message` names the
    /// option and what is expected.
    #[error("{message}")]
    Config {
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A checkpoint file is corrupt, truncated or from another format; the
    /// checkpoint is never silently reset.
    #[error("checkpoint file {}: {reason}", path.display())]
    Checkpoint {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A file or directory operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// An external system (a broker, a remote store) failed or timed out.
    #[error("{what}: {message}{}", hint.as_ref().map(|h| format!("\n  hint: {h}")).unwrap_or_default())]
    External {
        /// The system and operation, e.g. "kafka broker 127.0.0.1:9092".
        what: String,
        /// What happened.
        message: String,
        /// What the user can do about it.
        hint: Option<String>,
    },

    /// An external system could not be reached or did not answer in time.
    /// A running query retries the epoch (see `epoch`); at start it fails.
    #[error("{what}: {message}{}", hint.as_ref().map(|h| format!("\n  hint: {h}")).unwrap_or_default())]
    Unreachable {
        /// The system and operation, e.g. "kafka broker 127.0.0.1:9092".
        what: String,
        /// What happened.
        message: String,
        /// What the user can do about it.
        hint: Option<String>,
    },

    /// An epoch that can never commit, whatever the retries: an output
    /// record over the producer's size limit, a row that cannot be
    /// encoded, a transaction the broker aborted for outliving its
    /// timeout. The query stops with the reason and the way out; nothing
    /// of the epoch is visible.
    #[error("epoch {epoch} cannot commit: {reason}\n  hint: {way_out}")]
    Poison {
        /// The epoch.
        epoch: u64,
        /// Why it cannot commit.
        reason: String,
        /// What the user can change so that it can.
        way_out: String,
    },

    /// An error from DataFusion while planning or executing.
    #[error(transparent)]
    DataFusion(DataFusionError),

    /// An error from Arrow (decode, encode, kernels).
    #[error(transparent)]
    Arrow(#[from] ArrowError),

    /// The query was stopped by another instance or by the user.
    #[error("{0}")]
    Stopped(String),

    /// A bug in Sluice: an invariant did not hold.
    #[error("internal error: {0} (this is a bug in Sluice)")]
    Internal(String),
}

impl From<DataFusionError> for SluiceError {
    /// A source's error raised while a plan pulled its rows (an input read
    /// lazily) comes back as itself, so that it keeps its kind (an
    /// unreachable broker stays transient) and its message.
    fn from(e: DataFusionError) -> Self {
        match e {
            DataFusionError::External(inner) => match inner.downcast::<SluiceError>() {
                Ok(ours) => *ours,
                Err(other) => Self::DataFusion(DataFusionError::External(other)),
            },
            DataFusionError::Context(context, inner) => match Self::from(*inner) {
                Self::DataFusion(inner) => {
                    Self::DataFusion(DataFusionError::Context(context, Box::new(inner)))
                }
                ours => ours,
            },
            e => Self::DataFusion(e),
        }
    }
}

impl SluiceError {
    /// A [`SluiceError::Plan`] error.
    pub fn plan(message: impl Into<String>) -> Self {
        Self::Plan(message.into())
    }

    /// A [`SluiceError::Config`] error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::Config {
            message: message.into(),
        }
    }

    /// A [`SluiceError::Io`] error with `context` naming the operation and path.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// A [`SluiceError::Checkpoint`] error for `path`.
    pub fn checkpoint(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Checkpoint {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// This error, raised by one task of a query divided into tasks, naming
    /// the task where its text says what failed.
    pub fn in_task(self, task: impl std::fmt::Display) -> Self {
        match self {
            Self::External {
                what,
                message,
                hint,
            } => Self::External {
                what: format!("{task}, {what}"),
                message,
                hint,
            },
            Self::Unreachable {
                what,
                message,
                hint,
            } => Self::Unreachable {
                what: format!("{task}, {what}"),
                message,
                hint,
            },
            Self::Poison {
                epoch,
                reason,
                way_out,
            } => Self::Poison {
                epoch,
                reason: format!("{task}: {reason}"),
                way_out,
            },
            Self::Stopped(message) => Self::Stopped(format!("{task}: {message}")),
            other => other,
        }
    }

    /// True when retrying may succeed: an external system was unreachable.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }

    /// True when the user must change the query, an option or a setting: the
    /// CLI exits with status 2 for these.
    pub fn is_user_error(&self) -> bool {
        match self {
            Self::Plan(_) | Self::Config { .. } => true,
            Self::DataFusion(e) => matches!(
                e.find_root(),
                DataFusionError::Plan(_)
                    | DataFusionError::SchemaError(..)
                    | DataFusionError::SQL(..)
                    | DataFusionError::NotImplemented(_)
            ),
            _ => false,
        }
    }
}
