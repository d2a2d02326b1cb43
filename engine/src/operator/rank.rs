//! Top-N and deduplication: the rows ranked `1..=N` in each partition by
//! `ROW_NUMBER() OVER (PARTITION BY … ORDER BY …)`, kept as the input
//! arrives (Flink's Top-N; with `N = 1` its deduplication).
//!
//! The state is each partition's ranked rows, keyed by partition and rank
//! ([`KeyedState`]): `(p…, rn) → (order values…, row…)`. Per epoch, for
//! each partition the epoch's rows touch, the stored rows and the new ones
//! are ranked together; the rows whose rank changed are the partition's new
//! `(p…, rn)` entries, and those within `N` are emitted in update mode,
//! keyed by the partition and the rank.
//!
//! Over an append-only input a partition only grows, so every rank once
//! filled stays filled and nothing is retracted; rows pushed past `N` are
//! forgotten, so the state holds at most `N` rows per partition. Over a
//! changelog (an aggregation's changing rows, see `changelog`) a row taken
//! back leaves its partition and the rows after it move up, so every row is
//! kept; a rank left empty is retracted (its key deleted downstream).
//!
//! Ties in the ORDER BY keep the rows already ranked ahead of new ones, and
//! new rows in their arrival order, as Flink does.
//!
//! `RANK()` and `DENSE_RANK()` rank the same way, but ties share a rank, so
//! more than `N` rows may rank within `N`: the state keeps each row by its
//! position as above, every row within the bound is kept, and a
//! partition's stored rows are all read back. A row's output is the row
//! with its rank, and it is keyed by the whole output row: an epoch emits
//! the rows whose rank changed and takes back the rows at their old rank.
//!
//! Keeping each partition's first row by event time over an append-only
//! input (`rn = 1` ordered by a watermarked column ascending) runs in append
//! mode instead: the ranking is the same, but a partition's row is emitted
//! once, when the watermark passes it. Rows behind the watermark are late
//! and dropped, so no row can arrive ahead of it any more. Every row of the
//! state the watermark passed was emitted then: those between the
//! watermark the epoch's rows were judged by and the one they left are
//! emitted now.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::compute::{
    concat_batches, filter_record_batch, lexsort_to_indices, take, take_record_batch, SortColumn,
    SortOptions,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::arrow::row::{Row, Rows};
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::collect;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::{row_text, Operator};
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{row_converter, KeyedState, OneStore, StateTtl};
use crate::table::EpochBatches;
use crate::watermark::nanos;

/// The function that ranks a Top-N's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RankFunction {
    /// `ROW_NUMBER()`: 1, 2, 3, ... whatever the ties.
    RowNumber,
    /// `RANK()`: ties share the first one's rank, and leave a gap.
    Rank,
    /// `DENSE_RANK()`: ties share a rank, without gaps.
    DenseRank,
}

/// What does not change while the query runs.
#[derive(Debug)]
pub(crate) struct RankConfig {
    /// The rows to rank, over the query's per-epoch stream tables: the
    /// partition values (`partitions` columns), then the ORDER BY values
    /// (one per `order`), then the window's input row.
    pub input: LogicalPlan,
    /// How many leading columns of `input` are the partition.
    pub partitions: usize,
    /// The ORDER BY, one per order column of `input`.
    pub order: Vec<SortOptions>,
    /// The highest rank kept (`rn <= limit`).
    pub limit: u64,
    /// How ties rank.
    pub function: RankFunction,
    /// The column of `input` that signs its rows (+1 added, −1 taken back),
    /// when the input is a changelog.
    pub sign: Option<usize>,
    /// The columns of `input` that identify the row a change takes back.
    pub identity: Vec<usize>,
    /// The output columns that are its key: what a rank left empty is
    /// retracted as.
    pub key_columns: Vec<String>,
    /// The rest of the query, reading `output`: the window's input row and
    /// its rank.
    pub tail: LogicalPlan,
    /// Where the ranked rows are put for `tail`.
    pub output: Arc<EpochBatches>,
    /// Keeping the first row by event time in append mode (see the
    /// module's text): the one ORDER BY column is the watermarked one.
    pub first_at_watermark: bool,
}

/// The running Top-N operator (see the module's text).
#[derive(Debug)]
pub(crate) struct RankOperator {
    config: RankConfig,
    /// Created from the input plan's physical schema at the first epoch or
    /// restore.
    state: Option<KeyedState>,
    /// Over a changelog, how many rows each partition holds (by its
    /// arrow-row encoding), to read them all back; rebuilt from the state
    /// at restore.
    sizes: HashMap<Box<[u8]>, u64>,
    /// The watermark the epoch's rows are judged by (see
    /// [`Operator::judge_by`]).
    judged_by: Option<i64>,
}

/// What an epoch changed in the output, as rows of the state whose rank
/// column holds the row's rank (ROW_NUMBER: its position).
struct Ranked {
    /// The rows at a rank they did not hold before.
    emit: RecordBatch,
    /// The rows at their earlier rank, which they no longer hold: the
    /// output takes them back by key.
    gone: RecordBatch,
}

impl RankOperator {
    pub(crate) fn new(config: RankConfig) -> Self {
        Self {
            config,
            state: None,
            sizes: HashMap::new(),
            judged_by: None,
        }
    }

    /// The state, made for `input`'s columns (see [`RankConfig::input`]):
    /// `(p…, rn, o…, row…)`, keyed by the partition and the rank. With a
    /// state TTL a partition's rows leave together, once none of them was
    /// written for the TTL (a row keeps its rank, unwritten, while others
    /// move); the first row by event time leaves by the watermark instead.
    fn state_for(&mut self, ctx: &SessionState, input: &Schema) -> Result<&mut KeyedState> {
        if self.state.is_none() {
            let k = self.config.partitions;
            let mut fields: Vec<Field> = input.fields()[..k]
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new("rn", DataType::UInt64, false));
            fields.extend(input.fields()[k..].iter().map(|f| f.as_ref().clone()));
            let fields = fields
                .into_iter()
                .enumerate()
                .map(|(i, f)| f.with_name(format!("s{i}")))
                .collect::<Vec<_>>();
            let ttl = StateTtl::of(ctx).filter(|_| !self.config.first_at_watermark);
            self.state =
                Some(KeyedState::new(Arc::new(Schema::new(fields)), k + 1)?.expiring(ttl)?);
        }
        self.state
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("the Top-N state vanished".into()))
    }

    /// The epoch's rows to rank, as one batch.
    async fn read(&self, ctx: &SessionState) -> Result<RecordBatch> {
        let physical = ctx.create_physical_plan(&self.config.input).await?;
        let schema = physical.schema();
        let batches = collect(physical, ctx.task_ctx()).await?;
        Ok(concat_batches(&schema, &batches)?)
    }

    /// Whether every stored row of a partition is read back (not only the
    /// first `limit` positions): over a changelog, and where ties share a
    /// rank, so that more than `limit` rows may rank within it.
    fn reads_whole_partitions(&self) -> bool {
        self.config.sign.is_some() || self.config.function != RankFunction::RowNumber
    }

    /// Ranks the epoch's `rows` with the stored rows of their partitions,
    /// and stores the result.
    fn rank(&mut self, ctx: &SessionState, rows: &RecordBatch) -> Result<Ranked> {
        let (k, limit, sign) = (self.config.partitions, self.config.limit, self.config.sign);
        let (order, function) = (self.config.order.clone(), self.config.function);
        let identity = self.config.identity.clone();
        let whole = self.reads_whole_partitions();
        let partition_of = |batch: &RecordBatch| -> Result<Rows> {
            let converter =
                row_converter(batch.schema().fields()[..k].iter().map(|f| f.data_type()))?;
            Ok(converter.convert_columns(&batch.columns()[..k])?)
        };
        // The positions to read back: 1..=limit, or all of them.
        let touched = partition_of(rows)?;
        let mut probe: Vec<(u32, u64)> = Vec::new();
        let mut seen = HashSet::new();
        for i in 0..rows.num_rows() {
            let p = touched.row(i);
            if seen.insert(p.data()) {
                let bound = match whole {
                    false => limit,
                    true => self.sizes.get(p.as_ref()).copied().unwrap_or(0),
                };
                probe.extend((1..=bound).map(|r| (i as u32, r)));
            }
        }
        let state = self.state_for(ctx, &rows.schema())?;
        let state_schema = state.all()?.schema();
        let stored = state.lookup(&[probe_batch(rows, k, &probe, &state_schema)?])?;
        let candidates = Candidates::new(&stored, rows, k, order.len())?;
        // Each candidate's partition, encoded: the new rows' are `touched`.
        let stored_partitions = partition_of(&stored)?;
        let partition = |i: usize| match i.checked_sub(stored.num_rows()) {
            None => stored_partitions.row(i),
            Some(new) => touched.row(new),
        };
        let live = candidates.live(sign, &identity)?;
        let ranked = candidates.ranked(&live, &partition, k, &order)?;
        let in_order: Vec<usize> = ranked.iter().map(|(i, _)| *i).collect();
        let values = candidates.values(&in_order, &partition, function);
        // A row is kept while it ranks within the limit (over a changelog
        // always: the rows ahead of it may be taken back). The kept rows of
        // a partition are its first positions.
        let mut sizes: HashMap<&[u8], u64> = HashMap::new();
        let (mut changed, mut positions) = (Vec::new(), Vec::new());
        for (&(i, position), &value) in ranked.iter().zip(&values) {
            if sign.is_none() && value > limit {
                continue;
            }
            sizes.insert(partition(i).data(), position);
            if !candidates.holds(i, position) {
                changed.push(i);
                positions.push(position);
            }
        }
        let old_positions = stored.column(k).as_primitive::<UInt64Type>();
        let emptied: BooleanArray = (0..stored.num_rows())
            .map(|i| {
                let now = sizes.get(partition(i).data()).copied().unwrap_or(0);
                Some(old_positions.value(i) > now)
            })
            .collect();
        let emptied = filter_record_batch(&stored, &emptied)?;
        let changed = candidates.as_state(&state_schema, &changed, positions)?;
        let ranked = match function {
            // A row's rank is its position: what changed is what moved.
            RankFunction::RowNumber => Ranked {
                emit: changed.clone(),
                gone: emptied.clone(),
            },
            // Ties share a rank: compare each row's rank before and after.
            _ => {
                let within = |(i, value): (usize, u64)| (value <= limit).then_some((i, value));
                let after: HashSet<(usize, u64)> = in_order
                    .iter()
                    .copied()
                    .zip(values.iter().copied())
                    .filter_map(within)
                    .collect();
                let mut stored_order: Vec<usize> = (0..candidates.stored).collect();
                stored_order.sort_by(|&a, &b| {
                    (partition(a).data(), old_positions.value(a))
                        .cmp(&(partition(b).data(), old_positions.value(b)))
                });
                let old_values = candidates.values(&stored_order, &partition, function);
                let before: HashSet<(usize, u64)> = stored_order
                    .into_iter()
                    .zip(old_values)
                    .filter_map(within)
                    .collect();
                let state_rows = |mut rows: Vec<&(usize, u64)>| -> Result<RecordBatch> {
                    // In the order the rows were stored and arrived.
                    rows.sort_unstable();
                    let (at, value): (Vec<usize>, Vec<u64>) = rows.into_iter().copied().unzip();
                    candidates.as_state(&state_schema, &at, value)
                };
                Ranked {
                    emit: state_rows(after.difference(&before).collect())?,
                    gone: state_rows(before.difference(&after).collect())?,
                }
            }
        };
        state.remove_keys(&emptied)?;
        state.upsert(std::slice::from_ref(&changed))?;
        if whole {
            for i in 0..rows.num_rows() {
                let p = touched.row(i);
                match sizes.get(p.data()) {
                    Some(&n) => self.sizes.insert(p.data().into(), n),
                    None => self.sizes.remove(p.data()),
                };
            }
        }
        Ok(ranked)
    }

    /// The query's output for `ranked` rows of the state (their input row,
    /// then their rank): the window's rows through the tail, which keeps
    /// the ranks within the limit.
    async fn through_tail(
        &self,
        ctx: &SessionState,
        ranked: &RecordBatch,
    ) -> Result<Vec<RecordBatch>> {
        if ranked.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let k = self.config.partitions;
        let row_starts = k + 1 + self.config.order.len();
        let mut columns = ranked.columns()[row_starts..].to_vec();
        columns.push(Arc::clone(ranked.column(k)));
        let window_rows = RecordBatch::try_new(self.config.output.schema_ref(), columns)?;
        let _input = self.config.output.with_input(vec![vec![window_rows]]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// Keeping the first row by event time: the rows of the state the
    /// watermark passed this epoch, from the one the epoch's rows were
    /// judged by to `watermark`.
    fn passed(&self, watermark: Option<i64>) -> Result<Option<RecordBatch>> {
        let (Some(state), Some(watermark)) = (&self.state, watermark) else {
            return Ok(None);
        };
        let all = state.all()?;
        // The state's columns: the partition, the rank, then the time.
        let time = nanos(all.column(self.config.partitions + 1))?;
        let time = time.as_primitive::<Int64Type>();
        let from = self.judged_by.unwrap_or(i64::MIN);
        let passed: BooleanArray = (0..all.num_rows())
            .map(|i| Some(time.is_valid(i) && (from..watermark).contains(&time.value(i))))
            .collect();
        Ok(Some(filter_record_batch(&all, &passed)?))
    }

    /// The output keys of `rows` (the query's output rows).
    fn keys(&self, rows: &[RecordBatch]) -> Result<Option<RecordBatch>> {
        let keys = rows
            .iter()
            .map(|b| {
                let columns = self
                    .config
                    .key_columns
                    .iter()
                    .map(|c| b.schema().index_of(c))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok(b.project(&columns)?)
            })
            .collect::<Result<Vec<_>>>()?;
        match keys.first() {
            None => Ok(None),
            Some(first) => Ok(Some(concat_batches(&first.schema(), &keys)?)),
        }
    }

    /// Where whole partitions are read back, each one's size from the
    /// stored positions.
    fn count_sizes(&mut self) -> Result<()> {
        self.sizes.clear();
        let whole = self.reads_whole_partitions();
        let Some(state) = self.state.as_ref().filter(|_| whole) else {
            return Ok(());
        };
        let k = self.config.partitions;
        let all = state.all()?;
        let partition = row_converter(all.schema().fields()[..k].iter().map(|f| f.data_type()))?
            .convert_columns(&all.columns()[..k])?;
        let ranks = all.column(k).as_primitive::<UInt64Type>();
        for i in 0..all.num_rows() {
            let size = self
                .sizes
                .entry(partition.row(i).data().into())
                .or_default();
            *size = (*size).max(ranks.value(i));
        }
        Ok(())
    }
}

/// The state keys `(p, rn)` to read back: `probe` holds, per key, the row
/// of `rows` whose partition it is and the rank.
fn probe_batch(
    rows: &RecordBatch,
    k: usize,
    probe: &[(u32, u64)],
    state: &SchemaRef,
) -> Result<RecordBatch> {
    let at = UInt32Array::from_iter_values(probe.iter().map(|(i, _)| *i));
    let mut columns = rows.columns()[..k]
        .iter()
        .map(|c| Ok(take(c.as_ref(), &at, None)?))
        .collect::<Result<Vec<ArrayRef>>>()?;
    columns.push(Arc::new(UInt64Array::from_iter_values(
        probe.iter().map(|(_, r)| *r),
    )));
    let fields: Vec<Field> = state.fields()[..=k]
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// The stored rows of the touched partitions and the epoch's rows, side by
/// side as the input's columns (stored first).
struct Candidates {
    rows: RecordBatch,
    /// How many of `rows` come from the state.
    stored: usize,
    /// How many leading columns are the partition.
    partitions: usize,
    /// Per row, its ORDER BY values encoded, to tell ties.
    order: Rows,
    /// Per row, the tie-break after the ORDER BY: a stored row's rank, a
    /// new row's arrival.
    sequence: UInt64Array,
}

impl Candidates {
    fn new(stored: &RecordBatch, rows: &RecordBatch, k: usize, order: usize) -> Result<Self> {
        let columns: Vec<usize> = (0..stored.num_columns()).filter(|&c| c != k).collect();
        let stored_rows =
            RecordBatch::try_new(rows.schema(), stored.project(&columns)?.columns().to_vec())?;
        let sequence = UInt64Array::from_iter_values(
            stored
                .column(k)
                .as_primitive::<UInt64Type>()
                .values()
                .iter()
                .copied()
                .chain(0..rows.num_rows() as u64),
        );
        let rows = concat_batches(&rows.schema(), [&stored_rows, rows])?;
        let order_columns = &rows.columns()[k..k + order];
        let order = row_converter(order_columns.iter().map(|c| c.data_type()))?
            .convert_columns(order_columns)?;
        Ok(Self {
            rows,
            stored: stored.num_rows(),
            partitions: k,
            order,
            sequence,
        })
    }

    /// The ranks of rows `in_order` (grouped by partition, in rank order)
    /// by `function`: ROW_NUMBER counts them; RANK gives ties the rank of
    /// the first of them, DENSE_RANK numbers the distinct ORDER BY values.
    fn values<'p>(
        &self,
        in_order: &[usize],
        partition: &dyn Fn(usize) -> Row<'p>,
        function: RankFunction,
    ) -> Vec<u64> {
        let mut out = Vec::with_capacity(in_order.len());
        let (mut position, mut value) = (0u64, 0u64);
        let mut previous: Option<usize> = None;
        for &i in in_order {
            let same = previous.is_some_and(|p| partition(p) == partition(i));
            let tie = same && previous.is_some_and(|p| self.order.row(p) == self.order.row(i));
            position = if same { position + 1 } else { 1 };
            value = match function {
                RankFunction::RowNumber => position,
                RankFunction::Rank if tie => value,
                RankFunction::Rank => position,
                RankFunction::DenseRank if tie => value,
                RankFunction::DenseRank if same => value + 1,
                RankFunction::DenseRank => 1,
            };
            out.push(value);
            previous = Some(i);
        }
        out
    }

    /// Rows `at` as rows of the state (`schema`), with `ranks` in the rank
    /// column.
    fn as_state(&self, schema: &SchemaRef, at: &[usize], ranks: Vec<u64>) -> Result<RecordBatch> {
        let k = self.partitions;
        let taken = take_record_batch(
            &self.rows,
            &UInt32Array::from_iter_values(at.iter().map(|&i| i as u32)),
        )?;
        let mut columns = taken.columns()[..k].to_vec();
        columns.push(Arc::new(UInt64Array::from(ranks)));
        columns.extend(taken.columns()[k..].iter().cloned());
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    /// Whether row `i` is a stored row that held `rank` already.
    fn holds(&self, i: usize, rank: u64) -> bool {
        i < self.stored && self.sequence.value(i) == rank
    }

    /// The rows in their partitions after the epoch: the stored ones and
    /// the new ones, less, for each row taken back (−1 in column `sign`), one
    /// equal row (equal in the `identity` columns).
    fn live(&self, sign: Option<usize>, identity: &[usize]) -> Result<Vec<u32>> {
        let n = self.rows.num_rows();
        let Some(sign) = sign else {
            return Ok((0..n as u32).collect());
        };
        let signs = self
            .rows
            .column(sign)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| SluiceError::Internal("a Top-N's sign column is not Int64".into()))?;
        let identity: Vec<ArrayRef> = identity
            .iter()
            .map(|&c| Arc::clone(self.rows.column(c)))
            .collect();
        let converter = row_converter(identity.iter().map(|c| c.data_type()))?;
        let identity = converter.convert_columns(&identity)?;
        let added = |i: usize| i < self.stored || signs.value(i) > 0;
        let mut alive: Vec<bool> = (0..n).map(added).collect();
        let mut equal: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for i in (0..n).filter(|&i| added(i)) {
            equal.entry(identity.row(i).data()).or_default().push(i);
        }
        for i in (self.stored..n).filter(|&i| signs.value(i) < 0) {
            let Some(j) = equal.get_mut(identity.row(i).data()).and_then(Vec::pop) else {
                // Its input took back a row it never gave: ranking on
                // would be silently wrong.
                return Err(SluiceError::Internal(format!(
                    "a Top-N's input took back a row it does not hold (a change event whose \
                     'before' row differs from the row inserted: the row's Kafka columns such \
                     as _offset ranked with it, or a table changed before the stream's start):\n{}",
                    row_text(&self.rows, i)
                )));
            };
            alive[j] = false;
        }
        Ok((0..n as u32).filter(|&i| alive[i as usize]).collect())
    }

    /// The `live` rows in rank order, each with its rank in its partition
    /// (`partition`: a row's partition, encoded; `order` the ORDER BY of the
    /// columns after the `k` partition columns).
    fn ranked<'p>(
        &self,
        live: &[u32],
        partition: &dyn Fn(usize) -> Row<'p>,
        k: usize,
        order: &[SortOptions],
    ) -> Result<Vec<(usize, u64)>> {
        let live = UInt32Array::from(live.to_vec());
        let column = |c: &dyn Array| -> Result<ArrayRef> { Ok(take(c, &live, None)?) };
        let mut sort = Vec::with_capacity(k + order.len() + 2);
        for c in 0..k {
            sort.push(SortColumn {
                values: column(self.rows.column(c))?,
                options: None,
            });
        }
        for (i, options) in order.iter().enumerate() {
            sort.push(SortColumn {
                values: column(self.rows.column(k + i))?,
                options: Some(*options),
            });
        }
        let source = UInt8Array::from_iter_values(
            (0..self.rows.num_rows()).map(|i| u8::from(i >= self.stored)),
        );
        for tie_break in [&source as &dyn Array, &self.sequence] {
            sort.push(SortColumn {
                values: column(tie_break)?,
                options: None,
            });
        }
        let sorted = lexsort_to_indices(&sort, None)?;
        let mut out = Vec::with_capacity(sorted.len());
        let mut rank = 0u64;
        let mut previous: Option<usize> = None;
        for &at in sorted.values() {
            let i = live.value(at as usize) as usize;
            let same = previous.is_some_and(|p| partition(p) == partition(i));
            rank = if same { rank + 1 } else { 1 };
            out.push((i, rank));
            previous = Some(i);
        }
        Ok(out)
    }
}

#[async_trait]
impl Operator for RankOperator {
    fn name(&self) -> &'static str {
        "rank"
    }

    fn drops_late(&self) -> bool {
        self.config.first_at_watermark
    }

    fn judge_by(&mut self, watermark: Option<i64>) {
        self.judged_by = watermark;
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        let k = self.config.partitions;
        if let Some(state) = &mut self.state {
            if state.expire(k)?.num_rows() > 0 {
                self.count_sizes()?;
            }
        }
        let rows = self.read(ctx).await?;
        if self.config.first_at_watermark {
            if rows.num_rows() > 0 {
                self.rank(ctx, &rows)?;
            }
            let rows = match self.passed(watermark)? {
                Some(passed) => self.through_tail(ctx, &passed).await?,
                None => Vec::new(),
            };
            return Ok(EpochOutput {
                rows,
                retracted: None,
            });
        }
        if rows.num_rows() == 0 {
            return Ok(EpochOutput::default());
        }
        let Ranked { emit, gone } = self.rank(ctx, &rows)?;
        let gone = self.through_tail(ctx, &gone).await?;
        Ok(EpochOutput {
            rows: self.through_tail(ctx, &emit).await?,
            retracted: self.keys(&gone)?,
        })
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        self.state.stage(snapshot_due)
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        self.state.write_snapshot(w)
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        let schema = ctx.create_physical_plan(&self.config.input).await?.schema();
        self.state = None;
        let state = self.state_for(ctx, &schema)?;
        state.restore_chain(chain)?;
        self.count_sizes()
    }

    fn after_commit(&mut self) {
        self.state.after_commit();
    }

    fn state_size(&self) -> crate::state::StateSize {
        self.state.size()
    }
}
