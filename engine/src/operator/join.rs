//! Stream–stream joins of rows that never change: interval joins (inner,
//! left, right and full outer, bounded by event time) and unbounded inner
//! joins.
//!
//! ```sql
//! SELECT b.auction, b.price, a.seller
//! FROM bids b JOIN auctions a
//!   ON b.auction = a.id AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' HOUR
//! ```
//!
//! Each side keeps the rows it has read in a buffer. Per epoch, with ΔL and
//! ΔR the epoch's new rows of each side (the stateless segments under the
//! join, run by DataFusion):
//!
//! 1. output `ΔL ⋈ (L's partners: R ∪ ΔR)` and `L ⋈ ΔR`, each computed by
//!    DataFusion's own join over the buffers, so every pair is produced
//!    exactly once;
//! 2. append ΔL and ΔR to the buffers;
//! 3. evict what the watermark W rules out: the time condition bounds
//!    `left.ts - right.ts` to `[lo, hi]`, and every future row of either
//!    side has `ts ≥ W` (older rows are late and dropped), so a left row
//!    with `ts - lo < W` and a right row with `ts + hi < W` can meet no
//!    future partner. An outer join emits the evicted rows of its kept
//!    sides that never matched, padded with nulls — once, when no match
//!    can come.
//!    The two halves of the bound may use other columns: with `b.ts
//!    BETWEEN a.ts AND a.expires` an auction is kept until `a.expires < W`
//!    (see [`TimeBounds`]).
//!
//! Left rows carry a row id and a matched flag (and right rows too in a
//! right or full outer join, their ids drawn from the same counter), so
//! matches found in any epoch are remembered across restarts. The buffers are the operator's
//! snapshot; between snapshots each epoch's checkpoint holds a delta — the
//! rows appended to each side, the ids of left rows newly matched, and the
//! expiries of the last eviction — so that an unbounded join's growing
//! state is not written whole every epoch. Replaying deltas gives the same
//! buffers as the epochs did: expiries only grow with the watermark, so
//! evicting once at the last one removes what every eviction removed. When
//! an epoch appended at least as many rows as the buffers keep, a snapshot
//! is the smaller file and is written instead.
//!
//! An inner join without a time bound (Flink's "regular join", Nexmark q3)
//! runs the same steps without step 3: both buffers keep every row, so the
//! state grows with the input, and no row is late. An outer join without a
//! bound runs as `changelog_join`, since only eviction says that a row
//! stays unmatched.
//!
//! Under `state.ttl` the unbounded join forgets a row once the TTL has
//! passed since it was written (it arrived), as Flink's regular join does:
//! before each epoch joins, the rows written before `now - ttl` leave both
//! buffers. Rows are appended in the order they were written, so those are
//! a prefix of each buffer, and when each buffer's rows were written is a
//! short list of (time, rows), one entry per epoch ([`Written`]), kept in
//! the snapshot and in each delta's header.

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt64Array,
};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, not};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::common::JoinType;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_plan::collect;
use foldhash::{HashSet, HashSetExt};

use async_trait::async_trait;

use super::time_bounds::TimeBounds;
use super::Operator;
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{delta_outgrows, ChainReader, Staged};
use crate::state::codec::{ipc_bytes, read_ipc, split_two_parts, two_parts, JoinDelta};
use crate::state::{compact_views, StateTtl};
use crate::table::EpochBatches;
use crate::watermark::split_before;

/// Name of the row id column added to left rows.
pub(crate) const ROW_ID: &str = "__sluice_row";
/// Name of the matched flag column added to left rows.
pub(crate) const MATCHED: &str = "__sluice_matched";

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct JoinConfig {
    /// The stateless segment under the join's left side.
    pub left: LogicalPlan,
    /// The same for the right side.
    pub right: LogicalPlan,
    /// The join (inner, whatever the query's type) over `left_in`/`right_in`.
    pub join: LogicalPlan,
    pub left_in: Arc<EpochBatches>,
    pub right_in: Arc<EpochBatches>,
    /// The rest of the query, reading `output`.
    pub tail: LogicalPlan,
    pub output: Arc<EpochBatches>,
    pub join_type: JoinType,
    /// `None`: an unbounded inner join, whose buffers keep every row.
    pub bounds: Option<TimeBounds>,
    /// A join whose inputs change, or an outer join without a time bound:
    /// run by `changelog_join` instead, its scans without the left's row
    /// id and matched flag, and `join` of the query's type.
    pub changelog: Option<ChangelogSides>,
}

/// What a join over changing inputs (`changelog_join`) needs beside
/// [`JoinConfig`].
#[derive(Debug)]
pub(crate) struct ChangelogSides {
    /// Per side (left, right), the position of [`SIGN`](super::changelog::SIGN) in its rows, when
    /// the side is a changelog; a side without one only adds rows.
    pub signs: [Option<usize>; 2],
    /// Per side, the equi-join keys, over the side's columns.
    pub keys: [Vec<Expr>; 2],
    /// Per side, the columns that identify the row a change takes back:
    /// those the query reads (not a Kafka source's `_offset`, which
    /// differs between a row's insert and its delete).
    pub identity: [Vec<usize>; 2],
    /// Where the changes go.
    pub emit: JoinEmit,
}

/// Where a join over changing inputs sends its changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JoinEmit {
    /// To the operator above: the rows through the tail, without columns
    /// named [`SIGN`](super::changelog::SIGN) (the sides' own), then their sign.
    Signed,
    /// To the query's output, in update mode keyed by these columns: the
    /// rows added are upserts, and the keys of rows taken back that no
    /// row added replaces are deleted.
    Keyed(Vec<String>),
}

/// A running stream–stream join.
///
/// Per epoch: [`process`](Operator::process) joins the epoch's rows with
/// the buffers and appends them, then evicts what the watermark rules out
/// and emits. Per checkpoint: the
/// rows appended, the ids newly matched and the last eviction as a delta,
/// or both buffers as a snapshot.
#[derive(Debug)]
pub(crate) struct JoinOperator {
    config: JoinConfig,
    /// Left rows read so far and still able to match, with row id and
    /// matched flag.
    left: RecordBatch,
    /// Right rows read so far and still able to match.
    right: RecordBatch,
    next_row_id: u64,
    /// The columns compared with the expiries in the left and right
    /// buffers.
    time_columns: Option<(usize, usize)>,
    /// What changed since the last committed stage (see [`JoinDelta`]).
    changes: Changes,
    /// Under `state.ttl`, an unbounded join's: the TTL and when the rows of
    /// each buffer were written. Known at the first epoch or restore.
    expiry: Option<Expiry>,
}

/// An unbounded join's TTL, and when each buffer's rows were written.
#[derive(Debug)]
struct Expiry {
    ttl: Arc<StateTtl>,
    /// Left, right.
    written: [Written; 2],
}

/// When a buffer's rows were written, in buffer order: (processing time
/// in ms, rows), one entry per epoch that appended some.
#[derive(Debug, Default)]
struct Written(VecDeque<(i64, usize)>);

impl Written {
    /// `rows` more, written at `at`.
    fn push(&mut self, at: i64, rows: usize) {
        match self.0.back_mut() {
            _ if rows == 0 => {}
            Some((last, n)) if *last == at => *n += rows,
            _ => self.0.push_back((at, rows)),
        }
    }

    /// Forgets the rows written before `before`: how many, all at the
    /// front of the buffer.
    fn expire(&mut self, before: i64) -> usize {
        let mut gone = 0;
        while let Some(&(at, rows)) = self.0.front() {
            if at >= before {
                break;
            }
            gone += rows;
            self.0.pop_front();
        }
        gone
    }
}

/// The snapshot's part of a join under a TTL: per side (0 left, 1 right),
/// when its rows were written.
fn written_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("side", DataType::Int64, false),
        Field::new("written_ms", DataType::Int64, false),
        Field::new("rows", DataType::Int64, false),
    ]))
}

/// A join's changes since its last committed stage.
#[derive(Debug, Default)]
struct Changes {
    /// Rows appended to each side, as appended.
    left: Vec<RecordBatch>,
    right: Vec<RecordBatch>,
    /// Ids of the left rows marked matched.
    matched: HashSet<u64>,
    /// The last eviction's expiries, left and right (ns).
    evicted: Option<(i64, i64)>,
    /// Under a TTL: the expiry of the epoch, and when its rows were
    /// written (ms).
    written: Option<(i64, i64)>,
}

impl JoinOperator {
    pub(crate) fn new(config: JoinConfig) -> Result<Self> {
        let time_columns = match &config.bounds {
            Some(b) => Some((
                config.left.schema().index_of_column(&b.lower.left)?,
                config.right.schema().index_of_column(&b.upper.right)?,
            )),
            None => None,
        };
        Ok(Self {
            left: RecordBatch::new_empty(config.left_in.schema_ref()),
            right: RecordBatch::new_empty(config.right_in.schema_ref()),
            next_row_id: 0,
            time_columns,
            config,
            changes: Changes::default(),
            expiry: None,
        })
    }

    /// Takes the query's TTL, if it sets one and the join is unbounded (a
    /// bounded join's rows leave by the watermark).
    fn open(&mut self, ctx: &SessionState) {
        if self.expiry.is_none() && self.config.bounds.is_none() {
            self.expiry = StateTtl::of(ctx).map(|ttl| Expiry {
                ttl,
                written: Default::default(),
            });
        }
    }

    /// Under a TTL, drops the rows written before `before` from both
    /// buffers (a prefix of each).
    fn expire(&mut self, before: i64) {
        let Some(expiry) = &mut self.expiry else {
            return;
        };
        let [left, right] = &mut expiry.written;
        let tail = |rows: &RecordBatch, gone: usize| {
            let gone = gone.min(rows.num_rows());
            rows.slice(gone, rows.num_rows() - gone)
        };
        self.left = tail(&self.left, left.expire(before));
        self.right = tail(&self.right, right.expire(before));
    }

    /// Under a TTL, the epoch's (expiry, processing time), as a delta
    /// carries them.
    fn ttl_times(&self) -> Option<(i64, i64)> {
        self.expiry
            .as_ref()
            .map(|e| (e.ttl.expired_before(), e.ttl.now()))
    }

    /// Under a TTL, the epoch's step before it joins: expires what the
    /// TTL rules out, and says so in the delta.
    fn expire_now(&mut self) {
        let Some(times) = self.ttl_times() else {
            return;
        };
        let before = (self.left.num_rows(), self.right.num_rows());
        self.expire(times.0);
        if before != (self.left.num_rows(), self.right.num_rows()) {
            self.changes.written = Some(times);
        }
    }

    /// Whether anything changed since the last committed stage.
    fn has_changes(&self) -> bool {
        let c = &self.changes;
        !c.left.is_empty()
            || !c.right.is_empty()
            || !c.matched.is_empty()
            || c.evicted.is_some()
            || c.written.is_some()
    }

    /// Rows appended since the last committed stage.
    fn appended(&self) -> usize {
        let c = &self.changes;
        c.left.iter().chain(&c.right).map(|b| b.num_rows()).sum()
    }

    /// The changes since the last committed stage, as a [`JoinDelta`].
    fn delta(&self) -> Result<Vec<u8>> {
        let c = &self.changes;
        // Appended rows may still point into their epoch's input buffers.
        JoinDelta {
            evicted: c.evicted,
            written: c.written,
            left: compact_views(concat_batches(&self.config.left_in.schema_ref(), &c.left)?)?,
            right: compact_views(concat_batches(
                &self.config.right_in.schema_ref(),
                &c.right,
            )?)?,
            matched: c.matched.iter().copied().collect(),
        }
        .encode()
    }

    /// Applies a [`delta`](Self::delta): appends its rows, marks its
    /// matches, evicts at its expiries — the buffers' steps of the epoch
    /// that wrote it.
    fn apply_delta(&mut self, bytes: &[u8]) -> Result<()> {
        let delta = JoinDelta::decode(
            bytes,
            &self.config.left_in.schema_ref(),
            &self.config.right_in.schema_ref(),
        )?;
        if let Some(m) = max_row_id(&delta.left) {
            self.next_row_id = self.next_row_id.max(m + 1);
        }
        if let Some(m) = self
            .right_flags()
            .then(|| max_row_id(&delta.right))
            .flatten()
        {
            self.next_row_id = self.next_row_id.max(m + 1);
        }
        // The epoch expired by its TTL before it appended.
        if let Some((before, at)) = delta.written {
            self.expire(before);
            if let Some(expiry) = &mut self.expiry {
                expiry.written[0].push(at, delta.left.num_rows());
                expiry.written[1].push(at, delta.right.num_rows());
            }
        }
        let all_right = concat_batches(&self.right.schema(), [&self.right, &delta.right])?;
        let matched: HashSet<u64> = delta.matched.into_iter().collect();
        self.append(&delta.left, all_right, &matched)?;
        self.evict(delta.evicted)?;
        Ok(())
    }

    /// Whether right rows carry a row id and a matched flag: a right or
    /// full outer join emits those that never matched.
    fn right_flags(&self) -> bool {
        matches!(self.config.join_type, JoinType::Right | JoinType::Full)
    }

    /// The first of the buffers' steps of an epoch, which replaying a
    /// delta repeats: appends `new_left` (the right buffer is already
    /// `all_right`) and marks the rows `matched` (ids are unique across
    /// both sides).
    fn append(
        &mut self,
        new_left: &RecordBatch,
        mut all_right: RecordBatch,
        matched: &HashSet<u64>,
    ) -> Result<()> {
        let mut left = concat_batches(&self.left.schema(), [&self.left, new_left])?;
        if !matched.is_empty() {
            left = mark_matched(&left, matched)?;
            if self.right_flags() {
                all_right = mark_matched(&all_right, matched)?;
            }
        }
        self.left = left;
        self.right = all_right;
        Ok(())
    }

    /// The second: evicts at `limits` (left, right expiries), if any, and
    /// compacts what stays. Returns the rows evicted, left and right.
    fn evict(&mut self, limits: Option<(i64, i64)>) -> Result<(RecordBatch, RecordBatch)> {
        let mut gone = RecordBatch::new_empty(self.left.schema());
        let mut gone_right = RecordBatch::new_empty(self.right.schema());
        if let (Some((l, r)), Some((left_ts, right_ts))) = (limits, self.time_columns) {
            let (left, right);
            (gone, left) = split_before(&self.left, left_ts, l)?;
            (gone_right, right) = split_before(&self.right, right_ts, r)?;
            self.left = left;
            self.right = right;
        }
        self.left = compact_views(std::mem::replace(
            &mut self.left,
            RecordBatch::new_empty(self.config.left_in.schema_ref()),
        ))?;
        self.right = compact_views(std::mem::replace(
            &mut self.right,
            RecordBatch::new_empty(self.config.right_in.schema_ref()),
        ))?;
        Ok((gone, gone_right))
    }

    /// Empties the buffers (no state committed yet).
    fn clear(&mut self) {
        self.left = RecordBatch::new_empty(self.config.left_in.schema_ref());
        self.right = RecordBatch::new_empty(self.config.right_in.schema_ref());
        self.next_row_id = 0;
        self.changes = Changes::default();
        if let Some(expiry) = &mut self.expiry {
            expiry.written = Default::default();
        }
    }

    /// Replaces the buffers with a snapshot's.
    fn restore_snapshot(&mut self, bytes: &[u8]) -> Result<()> {
        let buffers = match &mut self.expiry {
            None => bytes,
            Some(expiry) => {
                let (buffers, written) = split_two_parts(bytes, "the join snapshot")?;
                expiry.written = read_written(&read_ipc(written, &written_schema())?)?;
                buffers
            }
        };
        let (left, right) = split_two_parts(buffers, "the join snapshot")?;
        self.left = read_ipc(left, &self.config.left_in.schema_ref())?;
        self.right = read_ipc(right, &self.config.right_in.schema_ref())?;
        let right = self
            .right_flags()
            .then(|| max_row_id(&self.right))
            .flatten();
        self.next_row_id = max_row_id(&self.left).max(right).map_or(0, |m| m + 1);
        self.changes = Changes::default();
        Ok(())
    }

    /// Joins the epoch's rows with the buffers (ΔL against everything on
    /// the right, then the old left against ΔR), and appends them.
    async fn join_epoch(&mut self, ctx: &SessionState) -> Result<Vec<RecordBatch>> {
        let task = ctx.task_ctx();
        let run = |plan: &LogicalPlan| {
            let plan = plan.clone();
            let task = Arc::clone(&task);
            async move {
                let physical = ctx.create_physical_plan(&plan).await?;
                Ok::<_, SluiceError>(collect(physical, task).await?)
            }
        };
        let left_schema = self.config.left_in.schema_ref();
        let right_schema = self.config.right_in.schema_ref();
        let new_left = run(&self.config.left).await?;
        let new_left = self.with_row_ids(&new_left, &left_schema)?;
        let new_right = run(&self.config.right).await?;
        let new_right = if self.right_flags() {
            self.with_row_ids(&new_right, &right_schema)?
        } else {
            concat_rebound(&right_schema, &new_right)?
        };

        let all_right = concat_batches(&self.right.schema(), [&self.right, &new_right])?;
        let mut joined = Vec::new();
        for (l, r) in [(&new_left, &all_right), (&self.left, &new_right)] {
            if l.num_rows() == 0 || r.num_rows() == 0 {
                continue;
            }
            let _left = self.config.left_in.with_input(vec![vec![l.clone()]]);
            let _right = self.config.right_in.with_input(vec![vec![r.clone()]]);
            joined.extend(run(&self.config.join).await?);
        }
        let left_width = left_schema.fields().len();
        let mut id_columns = vec![left_width - 2];
        if self.right_flags() {
            id_columns.push(left_width + right_schema.fields().len() - 2);
        }
        let mut matched = HashSet::new();
        for b in &joined {
            for &c in &id_columns {
                let ids = b.column(c).as_primitive::<UInt64Type>();
                matched.extend(ids.values().iter().copied());
            }
        }
        if new_left.num_rows() > 0 {
            self.changes.left.push(new_left.clone());
        }
        if new_right.num_rows() > 0 {
            self.changes.right.push(new_right.clone());
        }
        if let (Some(times), Some(expiry)) = (self.ttl_times(), &mut self.expiry) {
            expiry.written[0].push(times.1, new_left.num_rows());
            expiry.written[1].push(times.1, new_right.num_rows());
            if new_left.num_rows() + new_right.num_rows() > 0 {
                self.changes.written = Some(times);
            }
        }
        self.changes.matched.extend(matched.iter().copied());
        self.append(&new_left, all_right, &matched)?;
        Ok(joined)
    }

    /// Evicts at `watermark` and emits the epoch's `joined` pairs, and the
    /// evicted rows that never matched of an outer join's kept sides
    /// (padded with nulls), through the tail.
    async fn emit(
        &mut self,
        ctx: &SessionState,
        joined: Vec<RecordBatch>,
        watermark: Option<i64>,
    ) -> Result<Vec<RecordBatch>> {
        let limits = match (watermark, &self.config.bounds) {
            (Some(w), Some(b)) => Some((b.left_expiry(w), b.right_expiry(w))),
            _ => None,
        };
        if limits.is_some() {
            self.changes.evicted = limits;
        }
        let (gone_left, gone_right) = self.evict(limits)?;
        let unmatched = |gone: &RecordBatch, kept: bool| -> Result<Option<RecordBatch>> {
            if !kept || gone.num_rows() == 0 {
                return Ok(None);
            }
            let flag = not(gone.column(gone.num_columns() - 1).as_boolean())?;
            let rows = filter_record_batch(gone, &flag)?;
            Ok((rows.num_rows() > 0).then_some(rows))
        };
        let join_type = self.config.join_type;
        let outer_left = unmatched(
            &gone_left,
            matches!(join_type, JoinType::Left | JoinType::Full),
        )?;
        let outer_right = unmatched(&gone_right, self.right_flags())?;

        // Drop the bookkeeping columns; pad unmatched rows with nulls.
        let left_width = self.config.left_in.schema_ref().fields().len();
        let right_data = self.config.right_in.schema_ref().fields().len()
            - if self.right_flags() { 2 } else { 0 };
        let schema = &self.config.output.schema_ref();
        let nulls = |fields: &[datafusion::arrow::datatypes::FieldRef], n: usize| {
            fields
                .iter()
                .map(|f| new_null_array(f.data_type(), n))
                .collect::<Vec<ArrayRef>>()
        };
        let mut output = Vec::new();
        for b in &joined {
            let mut columns: Vec<ArrayRef> = b.columns()[..left_width - 2].to_vec();
            columns.extend(
                b.columns()[left_width..left_width + right_data]
                    .iter()
                    .cloned(),
            );
            output.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
        }
        if let Some(o) = outer_left {
            let mut columns: Vec<ArrayRef> = o.columns()[..left_width - 2].to_vec();
            columns.extend(nulls(&schema.fields()[left_width - 2..], o.num_rows()));
            output.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
        }
        if let Some(o) = outer_right {
            let mut columns = nulls(&schema.fields()[..left_width - 2], o.num_rows());
            columns.extend(o.columns()[..right_data].iter().cloned());
            output.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
        }
        if output.is_empty() {
            return Ok(Vec::new());
        }
        let _input = self.config.output.with_input(vec![output]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// The epoch's rows of a side with row ids (fresh, unique across both
    /// sides) and `matched = false`, as `schema`.
    fn with_row_ids(&mut self, batches: &[RecordBatch], schema: &SchemaRef) -> Result<RecordBatch> {
        let schema = Arc::clone(schema);
        let mut out = Vec::with_capacity(batches.len());
        for b in batches.iter().filter(|b| b.num_rows() > 0) {
            let n = b.num_rows() as u64;
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(UInt64Array::from_iter_values(
                self.next_row_id..self.next_row_id + n,
            )));
            columns.push(Arc::new(BooleanArray::from(vec![false; n as usize])));
            self.next_row_id += n;
            out.push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
        }
        Ok(concat_batches(&schema, &out)?)
    }
}

#[async_trait]
impl Operator for JoinOperator {
    fn name(&self) -> &'static str {
        "join"
    }

    /// A bounded join forgets rows by event time, so rows behind the
    /// watermark could miss partners already evicted.
    fn drops_late(&self) -> bool {
        self.config.bounds.is_some()
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        self.open(ctx);
        self.expire_now();
        let joined = self.join_epoch(ctx).await?;
        Ok(EpochOutput {
            rows: self.emit(ctx, joined, watermark).await?,
            retracted: None,
        })
    }

    /// A join whose rows leave within an epoch (Nexmark q7's bids, kept
    /// until their window closes) appends more than it keeps: its
    /// snapshot is then the smaller file.
    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        let kept = self.left.num_rows() + self.right.num_rows();
        if snapshot_due || delta_outgrows(self.appended(), kept) {
            Ok(Staged::Snapshot)
        } else if self.has_changes() {
            Ok(Staged::Delta(self.delta()?))
        } else {
            Ok(Staged::Unchanged)
        }
    }

    /// Both buffers, as the two parts of `codec::two_parts`; under a TTL,
    /// those two and when their rows were written.
    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        let mut bytes = two_parts(&ipc_bytes(&self.left)?, &ipc_bytes(&self.right)?);
        if let Some(expiry) = &self.expiry {
            bytes = two_parts(&bytes, &ipc_bytes(&written_batch(&expiry.written)?)?);
        }
        w.write_all(&bytes)
            .map_err(|e| SluiceError::io("writing the join's state", e))
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        self.open(ctx);
        match chain.next() {
            None => self.clear(),
            Some(snapshot) => self.restore_snapshot(&snapshot?)?,
        }
        for delta in chain {
            self.apply_delta(&delta?)?;
        }
        self.changes = Changes::default();
        Ok(())
    }

    fn after_commit(&mut self) {
        self.changes = Changes::default();
    }

    fn state_size(&self) -> crate::state::StateSize {
        crate::state::StateSize::in_memory(
            (self.left.num_rows() + self.right.num_rows()) as u64,
            (self.left.get_array_memory_size() + self.right.get_array_memory_size()) as u64,
        )
    }
}

/// The snapshot's part of [`Written`], per side.
fn written_batch(written: &[Written; 2]) -> Result<RecordBatch> {
    let entries = written.iter().enumerate().flat_map(|(side, w)| {
        w.0.iter()
            .map(move |&(at, rows)| (side as i64, at, rows as i64))
    });
    let (mut sides, mut ats, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    for (side, at, n) in entries {
        sides.push(side);
        ats.push(at);
        rows.push(n);
    }
    Ok(RecordBatch::try_new(
        written_schema(),
        vec![
            Arc::new(Int64Array::from(sides)),
            Arc::new(Int64Array::from(ats)),
            Arc::new(Int64Array::from(rows)),
        ],
    )?)
}

/// [`Written`] per side, from [`written_batch`]'s rows.
fn read_written(batch: &RecordBatch) -> Result<[Written; 2]> {
    let column = |i: usize| batch.column(i).as_primitive::<Int64Type>();
    let mut written: [Written; 2] = Default::default();
    for r in 0..batch.num_rows() {
        let side = usize::try_from(column(0).value(r))
            .ok()
            .and_then(|s| written.get_mut(s))
            .ok_or_else(|| SluiceError::Internal("the join snapshot names a third side".into()))?;
        let rows = usize::try_from(column(2).value(r))
            .map_err(|_| SluiceError::Internal("the join snapshot has negative rows".into()))?;
        side.push(column(1).value(r), rows);
    }
    Ok(written)
}

/// The highest row id among a buffer's rows (its next-to-last column).
fn max_row_id(rows: &RecordBatch) -> Option<u64> {
    let ids = rows.column(rows.num_columns() - 2);
    datafusion::arrow::compute::max(ids.as_primitive::<UInt64Type>())
}

/// `batches` as one batch of `schema` (same columns; DataFusion's output
/// may differ in field metadata or nullability).
fn concat_rebound(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let rebound = batches
        .iter()
        .map(|b| RecordBatch::try_new(Arc::clone(schema), b.columns().to_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(concat_batches(schema, &rebound)?)
}

/// Sets the matched flag (the last column) of the rows whose id (the one
/// before it) is in `ids`.
fn mark_matched(batch: &RecordBatch, ids: &HashSet<u64>) -> Result<RecordBatch> {
    let n = batch.num_columns();
    let row_ids = batch.column(n - 2).as_primitive::<UInt64Type>();
    let was = batch.column(n - 1).as_boolean();
    let now: BooleanArray = row_ids
        .values()
        .iter()
        .enumerate()
        .map(|(i, id)| Some(was.value(i) || ids.contains(id)))
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[n - 1] = Arc::new(now);
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The left side's columns plus the row id and matched flag.
pub(crate) fn left_state_fields() -> [Field; 2] {
    [
        Field::new(ROW_ID, DataType::UInt64, false),
        Field::new(MATCHED, DataType::Boolean, false),
    ]
}
