//! The query's stateful operator, if it has one: the one interface the
//! epoch loop drives, whatever the operator is.

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SessionState;

use crate::aggregate::AggregateOperator;
use crate::error::Result;
use crate::join::JoinOperator;

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
            Self::Join(_) => true,
        }
    }

    /// Runs one epoch over the input set in the query's tables; returns
    /// the rows to emit. `watermark` is the query's, after this input.
    pub(crate) async fn run_epoch(
        &mut self,
        session: &SessionState,
        watermark: Option<i64>,
    ) -> Result<Vec<RecordBatch>> {
        match self {
            Self::Aggregate(a) => a.run_epoch(session, watermark).await,
            Self::Join(j) => j.run_epoch(session, watermark).await,
        }
    }

    /// The state as snapshot bytes, if there is any state yet.
    pub(crate) fn snapshot(&self) -> Result<Option<Vec<u8>>> {
        match self {
            Self::Aggregate(a) => a.snapshot(),
            Self::Join(j) => j.snapshot().map(Some),
        }
    }

    /// Replaces the state with a snapshot (recovery).
    pub(crate) async fn restore(&mut self, session: &SessionState, bytes: &[u8]) -> Result<()> {
        match self {
            Self::Aggregate(a) => a.restore(session, bytes).await,
            Self::Join(j) => j.restore(bytes),
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
