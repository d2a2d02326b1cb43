//! Stateful operators and the one lifecycle the epoch loop drives them by.
//!
//! ```text
//!             ┌──────── one epoch ───────────────────┐
//! restore ──► process ──────────────► stage ──► after_commit ──► ...
//! (recovery)  (input in; close,       (state to   (the staged
//!              evict, emit)            the chain)  state is durable)
//! ```
//!
//! - [`aggregate`]: GROUP BY, windowed aggregation and deduplication, through
//!   DataFusion's accumulators, over a [`KeyedState`](crate::KeyedState);
//! - [`join`]: stream–stream joins, interval-bounded or not (the bound:
//!   [`time_bounds`]);
//! - [`changelog_join`]: joins whose inputs change (aggregations, Debezium
//!   and upsert streams) and outer joins without a time bound;
//! - [`normalize`]: an upsert stream's rows as a changelog (each key's
//!   previous value kept), for an aggregation or a Top-N over it;
//! - [`rank`]: Top-N and deduplication (`ROW_NUMBER() OVER (...)` bounded
//!   by `rn <= N`);
//! - [`over`]: OVER aggregations over event time, each row emitted once
//!   the watermark passes it;
//! - [`temporal_join`]: event-time temporal joins (`FOR SYSTEM_TIME AS
//!   OF`), each probe row joined with its key's version at its time once
//!   the watermark passes it;
//! - [`pipeline`]: several of those in one query, innermost first, each
//!   feeding the one above it;
//! - [`changelog`]: how an aggregation whose rows change feeds another;
//!   [`multiset`]: the functions that cannot take a value back (`min`,
//!   `max`, ...), over such rows.
//!
//! An operator reads its epoch's input from the scans of its plans, which
//! the statement has put in scope (`table::EpochBatches::with_input`) for
//! the duration of [`Operator::process`]; what it emits is returned as a
//! value.

use std::fmt::Debug;

use async_trait::async_trait;
use datafusion::arrow::compute::SortOptions;
use datafusion::execution::SessionState;
use datafusion::logical_expr::SortExpr as Sort;

use crate::error::Result;
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Slicing, Staged};
use crate::state::StateSize;

pub(crate) mod aggregate;
mod buffers;
pub(crate) mod changelog;
pub(crate) mod changelog_join;
pub(crate) mod join;
pub(crate) mod multiset;
pub(crate) mod normalize;
pub(crate) mod over;
pub(crate) mod pipeline;
pub(crate) mod rank;
pub(crate) mod temporal_join;
pub(crate) mod time_bounds;

/// Row `i` of `batch` as a table, for an error message.
pub(crate) fn row_text(batch: &datafusion::arrow::record_batch::RecordBatch, i: usize) -> String {
    let row = batch.slice(i, 1);
    datafusion::arrow::util::pretty::pretty_format_batches(&[row])
        .map(|t| t.to_string())
        .unwrap_or_else(|e| e.to_string())
}

/// The arrow sort order of a logical `ORDER BY` item.
pub(crate) fn sort_options(sort: &Sort) -> SortOptions {
    SortOptions {
        descending: !sort.asc,
        nulls_first: sort.nulls_first,
    }
}

/// A running stateful operator (Arroyo's and Flink's operator lifecycle,
/// at epoch granularity).
///
/// Per epoch the epoch loop calls, in order, [`process`](Self::process),
/// then [`stage`](Self::stage) (and [`write_snapshot`](Self::write_snapshot)
/// when it asks for a snapshot), and once the epoch's commit is durable
/// [`after_commit`](Self::after_commit). After a failure, recovery calls
/// [`restore`](Self::restore) with the last committed chain instead, and
/// the epoch runs again.
#[async_trait]
pub(crate) trait Operator: Send + Sync + Debug {
    /// The operator's folder under the checkpoint's `state/`.
    fn name(&self) -> &'static str;

    /// Whether rows behind the watermark must be dropped before it sees
    /// them: its state is bounded by event time.
    fn drops_late(&self) -> bool;

    /// The watermark this epoch's rows are judged late by: the one the
    /// previous epoch left (restored after a restart), told before
    /// [`process`](Self::process). An operator that emits what the
    /// watermark passes tells by it what it emitted before.
    fn judge_by(&mut self, _watermark: Option<i64>) {}

    /// Takes the epoch's input (read through its plans' scans) into its
    /// state, then moves to `watermark` (the query's, after this epoch's
    /// input): closes windows and evicts what no later row can change, and
    /// returns what the epoch emits.
    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput>;

    /// What to write for this epoch's commit: with `snapshot_due`, a
    /// snapshot (unless there is no state yet); else what changed since
    /// the last committed stage, or a snapshot when that is no larger.
    /// The changes are kept until [`after_commit`](Self::after_commit).
    fn stage(&mut self, snapshot_due: bool) -> Result<Staged>;

    /// For an operator whose state is written as a sliced chain (one store
    /// past the memory limit; see `state::chain`): what to write for this
    /// epoch's commit, `slicing` saying whose turn it is; never a
    /// snapshot. `None` for every other, which [`stage`](Self::stage)
    /// serves.
    fn stage_sliced(&mut self, _slicing: Slicing) -> Result<Option<Staged>> {
        Ok(None)
    }

    /// Writes the whole state into `w`, streamed (a large state is never
    /// copied whole into memory first). Called when
    /// [`stage`](Self::stage) returned [`Staged::Snapshot`].
    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()>;

    /// Replaces the state with a committed chain: a snapshot, then the
    /// deltas after it, in order; an empty chain empties it.
    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()>;

    /// The epoch whose state [`stage`](Self::stage) wrote has committed:
    /// changes are counted anew from here.
    fn after_commit(&mut self);

    /// Rows and bytes held in state.
    fn state_size(&self) -> StateSize;
}
