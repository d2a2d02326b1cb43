//! Joins whose inputs change (Flink's regular join over retract streams):
//! an equi-join, inner, left, right or full, of two inputs either of which
//! may take rows back — an aggregation without an event-time window, a
//! Debezium stream, an upsert stream's changes — and outer joins of plain
//! streams without a time bound.
//!
//! ```sql
//! SELECT c.id, c.orders, p.payments
//! FROM (SELECT customer AS id, count(*) AS orders FROM orders GROUP BY customer) c
//! FULL JOIN (SELECT customer AS id, sum(amount) AS payments FROM payments GROUP BY customer) p
//!   ON c.id = p.id
//! ```
//!
//! Each side's live rows are kept, grouped by join key: the state is one
//! [`KeyedState`] keyed by `(side, key, slot)`, each entry one live row
//! (arrow-row encoded), the slots of a key numbered `1..=n` so that a
//! key's rows are read back by their keys alone (as `rank` reads a
//! partition). A row in the input `n` times holds `n` slots.
//!
//! Per epoch, with the epoch's signed rows of each side:
//! 1. the join keys they touch are found, and those keys' rows read back;
//! 2. the changes are applied to them: a row added takes a slot, a row
//!    taken back frees one (one taken back that the side does not hold is
//!    an error naming it: going on would be silently wrong);
//! 3. the join of the touched keys' rows before the epoch and the join of
//!    those after it are computed by DataFusion with the query's join type
//!    and condition, and what differs is emitted: the rows that only the
//!    join after has, added, and those that only the join before had,
//!    taken back ([`changelog::signed`]). So an outer join's row padded
//!    with nulls is taken back when its first partner arrives, and comes
//!    back when its last partner leaves.
//!
//! An epoch costs the rows of the keys it touches and their joined pairs,
//! whatever the size of the state, which holds every live row of both
//! sides: nothing tells when a row may be forgotten.
//!
//! What the join emits goes on as a changelog: to the operator above it
//! (an aggregation or a Top-N reads the signs, another join takes them in
//! as one of its sides), or to the query's output, in update mode keyed by
//! the columns that identify an output row (see the planner's `split`).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch, UInt64Array, UInt8Array,
};
use datafusion::arrow::compute::{concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{
    DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type, UInt8Type,
};
use datafusion::arrow::row::{RowConverter, Rows};
use datafusion::execution::SessionState;
use datafusion::physical_plan::collect;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::changelog::{retracted, signed, SIGN};
use super::join::{ChangelogSides, JoinConfig, JoinEmit};
use super::{row_text, Operator};
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::{row_converter, KeyedState, OneStore, StateTtl};

/// The sides' names, by their number in the state (`side` below).
const SIDE_NAMES: [&str; 2] = ["left", "right"];

/// The running operator (see the module's text).
#[derive(Debug)]
pub(crate) struct ChangelogJoinOperator {
    config: JoinConfig,
    sides: ChangelogSides,
    /// `(side, key, slot) → row`, made at the first epoch or restore.
    state: Option<KeyedState>,
    /// How many slots each join key fills on each side; rebuilt at
    /// restore.
    sizes: HashMap<Box<[u8]>, [u64; 2]>,
    /// Per side, the order its columns are encoded in: the identity
    /// columns first, then the others but the sign.
    order: [Vec<usize>; 2],
    /// Per side, the arrow-row encoding of its rows in `order`, which
    /// starts with the encoding of their identity columns.
    rows: [RowConverter; 2],
    /// Per side, the encoding of the identity columns alone.
    identities: [RowConverter; 2],
}

/// One side's rows of an epoch: their join keys and their rows (both
/// encoded), and their signs.
struct SideChanges {
    batch: RecordBatch,
    keys: Rows,
    rows: Rows,
    identities: Rows,
    signs: Vec<i64>,
}

/// A touched `(side, key)`: its rows before the epoch and after it
/// (encoded), in slot order.
struct Touched<'a> {
    side: u8,
    key: &'a [u8],
    before: Vec<&'a [u8]>,
    after: Vec<&'a [u8]>,
}

/// The state: a row of a side (0 left, 1 right), under its join key
/// (encoded) and its slot among the key's rows of that side.
fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("side", DataType::UInt8, false),
        Field::new("key", DataType::Binary, false),
        Field::new("slot", DataType::UInt64, false),
        Field::new("row", DataType::Binary, true),
    ]))
}

impl ChangelogJoinOperator {
    pub(crate) fn new(mut config: JoinConfig) -> Result<Self> {
        let sides = config.changelog.take().ok_or_else(|| {
            SluiceError::Internal("a join over changelogs planned without its sides".into())
        })?;
        let schemas = [config.left_in.schema_ref(), config.right_in.schema_ref()];
        let order: [Vec<usize>; 2] = std::array::from_fn(|side| {
            let identity = &sides.identity[side];
            let rest = (0..schemas[side].fields().len())
                .filter(|i| Some(*i) != sides.signs[side] && !identity.contains(i));
            identity.iter().copied().chain(rest).collect()
        });
        let converter = |side: usize, columns: &[usize]| {
            row_converter(columns.iter().map(|&i| schemas[side].field(i).data_type()))
        };
        let rows = [converter(0, &order[0])?, converter(1, &order[1])?];
        let identities = [
            converter(0, &sides.identity[0])?,
            converter(1, &sides.identity[1])?,
        ];
        Ok(Self {
            config,
            sides,
            state: None,
            sizes: HashMap::new(),
            order,
            rows,
            identities,
        })
    }

    /// The state, made at the first epoch or restore. With a state TTL, a
    /// join key's rows on one side leave together, once none of them was
    /// written for the TTL: its slots stay numbered from 1.
    fn open(&mut self, ctx: &SessionState) -> Result<&mut KeyedState> {
        if self.state.is_none() {
            self.state = Some(KeyedState::new(state_schema(), 3)?.expiring(StateTtl::of(ctx))?);
        }
        self.state()
    }

    fn state(&mut self) -> Result<&mut KeyedState> {
        self.state
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("the join's state vanished".into()))
    }

    /// Each key's slots per side, counted from the stored rows (after a
    /// restore, or keys expired).
    fn count_sizes(&mut self) -> Result<()> {
        let all = self.state()?.all()?;
        let sides = all.column(0).as_primitive::<UInt8Type>();
        let keys = all.column(1).as_binary::<i32>();
        let slots = all.column(2).as_primitive::<UInt64Type>();
        let mut sizes: HashMap<Box<[u8]>, [u64; 2]> = HashMap::new();
        for i in 0..all.num_rows() {
            let size =
                &mut sizes.entry(Box::from(keys.value(i))).or_default()[sides.value(i) as usize];
            *size = slots.value(i).max(*size);
        }
        self.sizes = sizes;
        Ok(())
    }

    /// The epoch's rows of `side`, with their keys and rows encoded.
    async fn read(&self, ctx: &SessionState, side: usize) -> Result<SideChanges> {
        let plan = [&self.config.left, &self.config.right][side];
        let physical = ctx.create_physical_plan(plan).await?;
        let schema = physical.schema();
        let batch = concat_batches(&schema, &collect(physical, ctx.task_ctx()).await?)?;
        let n = batch.num_rows();
        let mut keys = Vec::with_capacity(self.sides.keys[side].len());
        for e in &self.sides.keys[side] {
            let expr = ctx.create_physical_expr(e.clone(), plan.schema())?;
            keys.push(expr.evaluate(&batch)?.into_array(n)?);
        }
        // The key's types are the same on both sides: the join's keys are
        // coerced to one type each.
        let keys = row_converter(keys.iter().map(|k| k.data_type()))?.convert_columns(&keys)?;
        let sign = self.sides.signs[side];
        let signs = match sign {
            None => vec![1; n],
            Some(i) => batch
                .column(i)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| SluiceError::Internal("a join's sign column is not Int64".into()))?
                .values()
                .to_vec(),
        };
        let columns = |at: &[usize]| -> Vec<ArrayRef> {
            at.iter().map(|&i| Arc::clone(batch.column(i))).collect()
        };
        let rows = self.rows[side].convert_columns(&columns(&self.order[side]))?;
        let identities =
            self.identities[side].convert_columns(&columns(&self.sides.identity[side]))?;
        Ok(SideChanges {
            batch,
            keys,
            rows,
            identities,
            signs,
        })
    }

    /// The stored rows of join keys `keys`, both sides, in slot order.
    fn read_back(&mut self, keys: &[&[u8]]) -> Result<RecordBatch> {
        let mut probe = (Vec::new(), Vec::new(), Vec::new());
        for key in keys {
            let sizes = self.sizes.get(*key).copied().unwrap_or_default();
            for side in 0..2u8 {
                for slot in 1..=sizes[side as usize] {
                    probe.0.push(side);
                    probe.1.push(*key);
                    probe.2.push(slot);
                }
            }
        }
        let probe = RecordBatch::try_new(
            state_schema(),
            vec![
                Arc::new(UInt8Array::from(probe.0)),
                Arc::new(BinaryArray::from_iter_values(probe.1.iter())),
                Arc::new(UInt64Array::from(probe.2)),
                Arc::new(BinaryArray::new_null(probe.1.len())),
            ],
        )?;
        self.state()?.lookup(&[probe])
    }

    /// `rows` (encoded rows of `side`) as a batch of the side's scan,
    /// signed +1 where the side has a sign.
    fn decode(&self, side: usize, rows: &[&[u8]]) -> Result<RecordBatch> {
        let converter = &self.rows[side];
        let parser = converter.parser();
        let decoded = converter.convert_rows(rows.iter().map(|r| parser.parse(r)))?;
        let scan = [&self.config.left_in, &self.config.right_in][side].schema_ref();
        let mut columns: Vec<Option<ArrayRef>> = vec![None; scan.fields().len()];
        for (column, &at) in decoded.into_iter().zip(&self.order[side]) {
            columns[at] = Some(column);
        }
        if let Some(i) = self.sides.signs[side] {
            columns[i] = Some(Arc::new(Int64Array::from(vec![1; rows.len()])));
        }
        let columns = columns
            .into_iter()
            .map(|c| c.ok_or_else(|| SluiceError::Internal("a join column vanished".into())))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(scan, columns)?)
    }

    /// The join, of the query's type and condition, of `left` and `right`.
    async fn join(
        &self,
        ctx: &SessionState,
        left: RecordBatch,
        right: RecordBatch,
    ) -> Result<Vec<RecordBatch>> {
        if left.num_rows() == 0 && right.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let _left = self.config.left_in.with_input(vec![vec![left]]);
        let _right = self.config.right_in.with_input(vec![vec![right]]);
        let physical = ctx.create_physical_plan(&self.config.join).await?;
        let schema = self.config.output.schema_ref();
        collect(physical, ctx.task_ctx())
            .await?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| {
                Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    b.columns().to_vec(),
                )?)
            })
            .collect()
    }

    /// Stores the touched keys' rows after the epoch: the slots whose row
    /// changed, and frees those past the new end.
    fn store(&mut self, touched: &[Touched]) -> Result<()> {
        let (mut side, mut key, mut slot, mut row) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut gone_side, mut gone_key, mut gone_slot) = (Vec::new(), Vec::new(), Vec::new());
        for t in touched {
            for (i, r) in t.after.iter().enumerate() {
                if t.before.get(i) != Some(r) {
                    side.push(t.side);
                    key.push(t.key);
                    slot.push(i as u64 + 1);
                    row.push(*r);
                }
            }
            for i in t.after.len()..t.before.len() {
                gone_side.push(t.side);
                gone_key.push(t.key);
                gone_slot.push(i as u64 + 1);
            }
            let n = t.after.len() as u64;
            match self.sizes.get_mut(t.key) {
                Some(sizes) => {
                    sizes[t.side as usize] = n;
                    if *sizes == [0, 0] {
                        self.sizes.remove(t.key);
                    }
                }
                None if n > 0 => {
                    let mut sizes = [0, 0];
                    sizes[t.side as usize] = n;
                    self.sizes.insert(Box::from(t.key), sizes);
                }
                None => {}
            }
        }
        let batch = |side: Vec<u8>, key: Vec<&[u8]>, slot: Vec<u64>, row: Option<Vec<&[u8]>>| {
            let n = key.len();
            RecordBatch::try_new(
                state_schema(),
                vec![
                    Arc::new(UInt8Array::from(side)),
                    Arc::new(BinaryArray::from_iter_values(key)),
                    Arc::new(UInt64Array::from(slot)),
                    match row {
                        Some(r) => Arc::new(BinaryArray::from_iter_values(r)),
                        None => Arc::new(BinaryArray::new_null(n)),
                    },
                ],
            )
        };
        let upserts = batch(side, key, slot, Some(row))?;
        let gone = batch(gone_side, gone_key, gone_slot, None)?;
        let state = self.state()?;
        state.remove_keys(&gone)?;
        state.upsert(&[upserts])
    }

    /// The epoch's `changes` (signed rows of the join's output, [`SIGN`]
    /// last) through the tail, as [`JoinEmit`] says.
    async fn emit(&self, ctx: &SessionState, changes: Vec<RecordBatch>) -> Result<EpochOutput> {
        let schema = self.config.output.schema_ref();
        let (mut added, mut taken) = (Vec::new(), Vec::new());
        for b in &changes {
            let last = b.num_columns() - 1;
            let signs = b.column(last).as_primitive::<Int64Type>();
            let unsigned = RecordBatch::try_new(Arc::clone(&schema), b.columns()[..last].to_vec())?;
            let plus: datafusion::arrow::array::BooleanArray =
                signs.iter().map(|s| Some(s.unwrap_or(0) > 0)).collect();
            let minus = datafusion::arrow::compute::not(&plus)?;
            added.push(filter_record_batch(&unsigned, &plus)?);
            taken.push(filter_record_batch(&unsigned, &minus)?);
        }
        // The inputs' signs, which a `*` selects, are not the output's.
        let unsigned = |batches: Vec<RecordBatch>| {
            batches
                .iter()
                .map(without_signs)
                .collect::<Result<Vec<_>>>()
        };
        let added = unsigned(self.through_tail(ctx, added).await?)?;
        let taken = unsigned(self.through_tail(ctx, taken).await?)?;
        match &self.sides.emit {
            JoinEmit::Keyed(keys) => {
                let retracted = retracted(&taken, &added, keys)?;
                Ok(EpochOutput {
                    rows: added,
                    retracted,
                })
            }
            JoinEmit::Signed => {
                let mut rows = Vec::with_capacity(added.len() + taken.len());
                for (batches, sign) in [(added, 1i64), (taken, -1)] {
                    for b in batches {
                        let mut fields: Vec<Field> = b
                            .schema()
                            .fields()
                            .iter()
                            .map(|f| f.as_ref().clone())
                            .collect();
                        fields.push(Field::new(SIGN, DataType::Int64, false));
                        let mut columns = b.columns().to_vec();
                        columns.push(Arc::new(Int64Array::from(vec![sign; b.num_rows()])));
                        rows.push(RecordBatch::try_new(
                            Arc::new(Schema::new(fields)),
                            columns,
                        )?);
                    }
                }
                Ok(EpochOutput {
                    rows,
                    retracted: None,
                })
            }
        }
    }

    async fn through_tail(
        &self,
        ctx: &SessionState,
        rows: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        if rows.iter().all(|b| b.num_rows() == 0) {
            return Ok(Vec::new());
        }
        let _input = self.config.output.with_input(vec![rows]);
        let tail = ctx.create_physical_plan(&self.config.tail).await?;
        let out = collect(tail, ctx.task_ctx()).await?;
        Ok(out.into_iter().filter(|b| b.num_rows() > 0).collect())
    }
}

/// `batch` without its columns named [`SIGN`].
fn without_signs(batch: &RecordBatch) -> Result<RecordBatch> {
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| batch.schema().field(i).name() != SIGN)
        .collect();
    Ok(batch.project(&keep)?)
}

/// The join keys `changes` (left, right) touch, in the order first seen.
fn touched_keys(changes: &[SideChanges; 2]) -> Vec<&[u8]> {
    let mut order = Vec::new();
    let mut seen: HashSet<&[u8]> = HashSet::new();
    for c in changes {
        for k in c.keys.iter() {
            if seen.insert(k.data()) {
                order.push(k.data());
            }
        }
    }
    order
}

/// The touched `(side, key)`s of `keys`, with their rows before the epoch
/// (`stored`, see [`ChangelogJoinOperator::read_back`]) and after its
/// `changes`.
fn apply<'a>(
    keys: &[&'a [u8]],
    stored: &'a RecordBatch,
    changes: &'a [SideChanges; 2],
) -> Result<Vec<Touched<'a>>> {
    let mut touched: HashMap<(u8, &[u8]), Touched<'a>> = HashMap::with_capacity(keys.len() * 2);
    for &key in keys {
        for side in 0..2u8 {
            touched.insert(
                (side, key),
                Touched {
                    side,
                    key,
                    before: Vec::new(),
                    after: Vec::new(),
                },
            );
        }
    }
    // Stored rows in slot order (the lookup keeps the probe's order).
    let (s_side, s_key, s_row) = (
        stored.column(0).as_primitive::<UInt8Type>(),
        stored.column(1).as_binary::<i32>(),
        stored.column(3).as_binary::<i32>(),
    );
    for i in 0..stored.num_rows() {
        if let Some(t) = touched.get_mut(&(s_side.value(i), s_key.value(i))) {
            t.before.push(s_row.value(i));
        }
    }
    for t in touched.values_mut() {
        t.after = t.before.clone();
    }
    for (side, c) in changes.iter().enumerate() {
        for i in 0..c.batch.num_rows() {
            let t = touched
                .get_mut(&(side as u8, c.keys.row(i).data()))
                .ok_or_else(|| SluiceError::Internal("a touched join key vanished".into()))?;
            apply_change(t, c, i)?;
        }
    }
    let mut out = Vec::with_capacity(touched.len());
    for &key in keys {
        for side in 0..2u8 {
            if let Some(t) = touched.remove(&(side, key)) {
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// Applies row `i` of `c` (its side's change) to `t`, its key's rows: an
/// added row takes the next slot, a row taken back frees the slot of one
/// of equal identity (the last slot's row moves into it, so slots stay
/// `1..=n`). A row's encoding starts with its identity's, which ends
/// where it ends (arrow's row format is self-delimiting).
fn apply_change<'a>(t: &mut Touched<'a>, c: &'a SideChanges, i: usize) -> Result<()> {
    if c.signs[i] > 0 {
        t.after.push(c.rows.row(i).data());
        return Ok(());
    }
    // The equal row if there is one, else one the query cannot tell from it.
    let (row, identity) = (c.rows.row(i), c.identities.row(i));
    let found = t
        .after
        .iter()
        .rposition(|r| *r == row.data())
        .or_else(|| t.after.iter().rposition(|r| r.starts_with(identity.data())));
    match found {
        Some(at) => {
            t.after.swap_remove(at);
            Ok(())
        }
        // Its input took back a row it never gave: joining on would be
        // silently wrong.
        None => Err(SluiceError::Internal(format!(
            "the {} input of a join took back a row it does not hold (a change event whose \
             'before' row differs from the row inserted, or a table changed before the \
             stream's start):\n{}",
            SIDE_NAMES[t.side as usize],
            row_text(&c.batch, i)
        ))),
    }
}

#[async_trait]
impl Operator for ChangelogJoinOperator {
    fn name(&self) -> &'static str {
        "join"
    }

    fn drops_late(&self) -> bool {
        false
    }

    async fn process(
        &mut self,
        ctx: &SessionState,
        _watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        if self.open(ctx)?.expire(2)?.num_rows() > 0 {
            self.count_sizes()?;
        }
        let changes = [self.read(ctx, 0).await?, self.read(ctx, 1).await?];
        if changes.iter().all(|c| c.batch.num_rows() == 0) {
            return Ok(EpochOutput::default());
        }
        let keys = touched_keys(&changes);
        let stored = self.read_back(&keys)?;
        let touched = apply(&keys, &stored, &changes)?;
        let mut rows: [[Vec<&[u8]>; 2]; 2] = Default::default();
        for t in &touched {
            let side = t.side as usize;
            rows[0][side].extend(&t.before);
            rows[1][side].extend(&t.after);
        }
        let before = self
            .join(
                ctx,
                self.decode(0, &rows[0][0])?,
                self.decode(1, &rows[0][1])?,
            )
            .await?;
        let after = self
            .join(
                ctx,
                self.decode(0, &rows[1][0])?,
                self.decode(1, &rows[1][1])?,
            )
            .await?;
        let changes = signed(&before, &after)?;
        drop(rows);
        self.store(&touched)?;
        self.emit(ctx, changes).await
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        self.state.stage(snapshot_due)
    }

    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        self.state.write_snapshot(w)
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        self.state = None;
        self.open(ctx)?.restore_chain(chain)?;
        self.count_sizes()
    }

    fn after_commit(&mut self) {
        self.state.after_commit();
    }

    fn state_size(&self) -> crate::state::StateSize {
        self.state.size()
    }
}
