//! The query's stateful operator, if it has one: the one interface the
//! epoch loop drives, whatever the operator is.

use datafusion::execution::SessionState;

use crate::aggregate::AggregateOperator;
use crate::error::Result;
use crate::join::JoinOperator;
use crate::sink::EpochOutput;

/// A committed chain of state files, read one at a time as it is applied
/// (a snapshot, then the deltas after it), so that restoring holds one
/// file's bytes at a time.
pub(crate) type StateChain<'a> = &'a mut (dyn Iterator<Item = Result<Vec<u8>>> + Send);

/// What an operator stages for one epoch's commit.
#[derive(Debug)]
pub(crate) enum Staged {
    /// No state exists yet.
    Nothing,
    /// Nothing changed since the last stage: the committed chain stands.
    Unchanged,
    /// The changes since the last stage, to append to the chain.
    Delta(Vec<u8>),
    /// The whole state is due: a new chain starts with what
    /// [`Operator::write_snapshot`] writes.
    Snapshot,
}

/// A running stateful operator.
#[derive(Debug)]
pub(crate) enum Operator {
    /// GROUP BY, windowed aggregation, deduplication.
    Aggregate(Box<AggregateOperator>),
    /// Stream–stream interval join.
    Join(Box<JoinOperator>),
}

impl Operator {
    /// The operator's folder under `state/` in the checkpoint.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Aggregate(_) => "aggregate",
            Self::Join(_) => "join",
        }
    }

    /// Whether rows behind the watermark must be dropped before it sees
    /// them: its state is bounded by event time.
    pub(crate) fn drops_late(&self) -> bool {
        match self {
            Self::Aggregate(a) => a.is_windowed(),
            Self::Join(j) => j.is_bounded(),
        }
    }

    /// Runs one epoch over the input set in the query's tables; returns
    /// what to emit. `watermark` is the query's, after this input.
    pub(crate) async fn run_epoch(
        &mut self,
        session: &SessionState,
        watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        match self {
            Self::Aggregate(a) => a.run_epoch(session, watermark).await,
            Self::Join(j) => Ok(EpochOutput {
                rows: j.run_epoch(session, watermark).await?,
                retracted: None,
            }),
        }
    }

    /// Stages the state for this epoch's commit: all of it when `full`,
    /// else (if the operator keeps deltas) what changed since the last
    /// stage.
    pub(crate) fn stage(&mut self, full: bool) -> Result<Staged> {
        match self {
            Self::Aggregate(a) => a.stage(full),
            // The join's buffers are bounded by the watermark: always whole.
            Self::Join(_) => Ok(Staged::Snapshot),
        }
    }

    /// Writes the whole state into `w` (streamed: a large state is never
    /// copied whole into memory first).
    pub(crate) fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        match self {
            Self::Aggregate(a) => a.write_snapshot(w),
            Self::Join(j) => w
                .write_all(&j.snapshot()?)
                .map_err(|e| crate::error::SluiceError::io("writing the join's state", e)),
        }
    }

    /// Replaces the state with a committed chain: a snapshot, then the
    /// deltas after it, in order (recovery); an empty chain empties it.
    pub(crate) async fn restore(
        &mut self,
        session: &SessionState,
        chain: StateChain<'_>,
    ) -> Result<()> {
        match self {
            Self::Aggregate(a) => a.restore(session, chain).await,
            Self::Join(j) => match (chain.next(), chain.next()) {
                (None, _) => {
                    j.clear();
                    Ok(())
                }
                (Some(snapshot), None) => j.restore(&snapshot?),
                (Some(_), Some(_)) => Err(crate::error::SluiceError::Internal(
                    "the join's state is committed as one snapshot, not a chain".into(),
                )),
            },
        }
    }

    /// Rows and bytes held in state.
    pub(crate) fn state_size(&self) -> (u64, u64) {
        match self {
            Self::Aggregate(a) => a.state_size(),
            Self::Join(j) => j.state_size(),
        }
    }
}
