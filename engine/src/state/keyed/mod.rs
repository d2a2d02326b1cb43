//! The keyed state store: one operator's state, in memory, indexed by key.
//!
//! State is an Arrow `RecordBatch` whose first `key_columns` columns are the
//! key and the rest the operator's per-key state (for aggregation:
//! DataFusion's accumulator state fields), plus a hash index from the key's
//! row encoding (arrow-row) to the row. Per epoch the operator looks up the
//! keys it saw ([`KeyedState::lookup`]) and replaces their rows
//! ([`KeyedState::upsert`]); an aggregation does both with one probe per
//! key ([`KeyedState::locate`], then [`KeyedState::upsert_located`]).
//!
//! Over a large state most of an epoch's time is those probes, each a few
//! cache misses: so keys are hashed with foldhash, each key once per epoch,
//! and a large probe's lookups run on two threads, as they only read the
//! index (with std's SipHash, on one thread, an epoch over 1 M keys took
//! four times as long; `benches/README.md`).
//!
//! `locate` holds that hot path; `state::columns` writes the rows.
//!
//! The store knows nothing of windows, joins or files: callers decide
//! which rows leave ([`KeyedState::remove_where`], [`KeyedState::take_matching`],
//! [`KeyedState::remove_keys`]), and `state::codec` gives the bytes of its
//! snapshot and delta their layout.

use std::hash::BuildHasher;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, not, take_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{Row, RowConverter, Rows, SortField};
use foldhash::fast::RandomState;
use foldhash::{HashSet, HashSetExt};
use hashbrown::HashTable;

mod locate;

use super::codec::{ipc_bytes, read_ipc, split_two_parts, two_parts, write_ipc};
use super::columns::{compact_views, Placement};
use crate::error::{Result, SluiceError};
pub(crate) use locate::Located;

/// One operator's keyed state.
///
/// Memory per key is the row itself plus its encoded key (arrow-row, in one
/// buffer) and a 4-byte slot in a hash table of row positions: no
/// allocation per key. Upserts keep existing keys at their positions and
/// append new ones, so the index only grows; removals (closed windows,
/// merged sessions, evictions) compact the rows and rebuild it.
///
/// Public so that its hot paths can be measured on their own
/// (`benches/micro.rs`); the engine's operators are its users.
///
/// ```
/// # use std::sync::Arc;
/// # use sluice_engine::arrow::array::{Int64Array, RecordBatch};
/// # use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// use sluice_engine::KeyedState;
///
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("auction", DataType::Int64, false),
///     Field::new("count", DataType::Int64, false),
/// ]));
/// let rows = |keys: Vec<i64>, counts: Vec<i64>| {
///     RecordBatch::try_new(Arc::clone(&schema), vec![
///         Arc::new(Int64Array::from(keys)), Arc::new(Int64Array::from(counts)),
///     ]).unwrap()
/// };
/// let mut state = KeyedState::new(Arc::clone(&schema), 1)?; // keyed by `auction`
/// state.upsert(&[rows(vec![1, 2], vec![10, 20])])?;
/// state.upsert(&[rows(vec![2, 3], vec![21, 30])])?; // 2 replaced, 3 added
/// assert_eq!(state.num_rows(), 3);
/// let stored = state.lookup(&[rows(vec![2], vec![0])])?;
/// assert_eq!(stored, rows(vec![2], vec![21]));
/// let delta = state.delta()?; // what changed, for the checkpoint
/// # assert!(!delta.is_empty());
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
pub struct KeyedState {
    schema: SchemaRef,
    key_columns: usize,
    converter: RowConverter,
    /// Every key's row.
    rows: RecordBatch,
    /// The encoded key of each row of `rows`, in order.
    keys: Rows,
    /// Positions in `rows`, found by the hash of the encoded key.
    index: HashTable<u32>,
    /// foldhash, as hashbrown's own default: several times faster than
    /// std's SipHash over short keys, and an epoch hashes each key once.
    hasher: RandomState,
    /// Per row: upserted since the last flush (snapshot or delta).
    changed: Vec<bool>,
    /// Rows removed since the last flush (for their keys).
    removed: Vec<RecordBatch>,
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedState")
            .field("rows", &self.rows.num_rows())
            .field("key_columns", &self.key_columns)
            .finish_non_exhaustive()
    }
}

impl KeyedState {
    /// Empty state with `schema`, keyed by its first `key_columns` columns.
    pub fn new(schema: SchemaRef, key_columns: usize) -> Result<Self> {
        // A global aggregate has one key, the empty one: encode a constant.
        let converter = if key_columns == 0 {
            row_converter([&DataType::Boolean])?
        } else {
            row_converter(schema.fields()[..key_columns].iter().map(|f| f.data_type()))?
        };
        Ok(Self {
            rows: RecordBatch::new_empty(Arc::clone(&schema)),
            keys: converter.empty_rows(0, 0),
            schema,
            key_columns,
            converter,
            index: HashTable::new(),
            hasher: RandomState::default(),
            changed: Vec::new(),
            removed: Vec::new(),
        })
    }

    /// The encoded keys of `batch`.
    fn encode(&self, batch: &RecordBatch) -> Result<Rows> {
        self.encode_columns(&batch.columns()[..self.key_columns], batch.num_rows())
    }

    fn encode_columns(&self, columns: &[ArrayRef], rows: usize) -> Result<Rows> {
        if self.key_columns == 0 {
            let constant: ArrayRef = Arc::new(BooleanArray::from(vec![true; rows]));
            return Ok(self.converter.convert_columns(&[constant])?);
        }
        Ok(self.converter.convert_columns(columns)?)
    }

    fn hash(&self, key: Row<'_>) -> u64 {
        self.hasher.hash_one(key.as_ref())
    }

    /// The position of the stored row with key `key`.
    fn find(&self, key: Row<'_>) -> Option<u32> {
        self.find_hashed(self.hash(key), key)
    }

    /// [`find`](Self::find) with the key's hash already computed.
    fn find_hashed(&self, hash: u64, key: Row<'_>) -> Option<u32> {
        self.index
            .find(hash, |&i| self.keys.row(i as usize) == key)
            .copied()
    }

    /// Rebuilds `keys` and `index` for `rows`.
    fn set_rows(&mut self, rows: RecordBatch) -> Result<()> {
        let keys = self.encode(&rows)?;
        let mut index = HashTable::with_capacity(rows.num_rows());
        for (i, key) in keys.iter().enumerate() {
            let hash = self.hasher.hash_one(key.as_ref());
            if index
                .find(hash, |&j: &u32| keys.row(j as usize) == key)
                .is_some()
            {
                return Err(SluiceError::Internal(
                    "a key appears twice in operator state".into(),
                ));
            }
            let hasher = &self.hasher;
            index.insert_unique(hash, i as u32, |&j| {
                hasher.hash_one(keys.row(j as usize).as_ref())
            });
        }
        self.rows = rows;
        self.keys = keys;
        self.index = index;
        Ok(())
    }

    /// The stored rows of the keys that appear in `probe`.
    pub fn lookup(&self, probe: &[RecordBatch]) -> Result<RecordBatch> {
        let mut wanted = Vec::new();
        let mut seen = HashSet::new();
        for batch in probe {
            for key in self.encode(batch)?.iter() {
                if let Some(row) = self.find(key) {
                    if seen.insert(row) {
                        wanted.push(row);
                    }
                }
            }
        }
        Ok(take_record_batch(&self.rows, &UInt32Array::from(wanted))?)
    }

    /// True for each row of `batch` whose key is not stored.
    pub(crate) fn unseen(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        Ok(self
            .encode(batch)?
            .iter()
            .map(|k| Some(self.find(k).is_none()))
            .collect())
    }

    /// Replaces the rows of the keys in `new` (one row per key) and adds
    /// the keys not yet stored: stored keys keep their positions, new keys
    /// go to the end.
    pub fn upsert(&mut self, new: &[RecordBatch]) -> Result<()> {
        let new = concat_batches(&self.schema, new)?;
        if new.num_rows() == 0 {
            return Ok(());
        }
        let new_keys = self.encode(&new)?;
        let mut placement = Placement::default();
        let mut appended_keys = self.converter.empty_rows(0, 0);
        let mut appended_hashes = Vec::new();
        for (j, key) in new_keys.iter().enumerate() {
            let hash = self.hash(key);
            match self.find_hashed(hash, key) {
                Some(i) => placement.updates.push((i as usize, j)),
                None => {
                    placement.appended.push(j);
                    appended_keys.push(key);
                    appended_hashes.push(hash);
                }
            }
        }
        self.place(&placement, &new, &appended_keys, &appended_hashes)
    }

    /// Writes the rows of `new` where `placement` says, and indexes the
    /// appended ones under `appended_keys` (their encoded keys, in order,
    /// with their hashes).
    fn place(
        &mut self,
        placement: &Placement,
        new: &RecordBatch,
        appended_keys: &Rows,
        appended_hashes: &[u64],
    ) -> Result<()> {
        let old_len = self.rows.num_rows();
        for &(i, _) in &placement.updates {
            self.changed[i] = true;
        }
        let rows = std::mem::replace(
            &mut self.rows,
            RecordBatch::new_empty(Arc::clone(&self.schema)),
        );
        let (_, old_columns, _) = rows.into_parts();
        let columns = old_columns
            .into_iter()
            .zip(new.columns())
            .map(|(old, new)| placement.apply(old, new))
            .collect::<Result<Vec<_>>>()?;
        self.rows = compact_views(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)?;
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index.reserve(appended_hashes.len(), |&i| {
            hasher.hash_one(keys.row(i as usize).as_ref())
        });
        for (k, (key, &hash)) in appended_keys.iter().zip(appended_hashes).enumerate() {
            self.keys.push(key);
            let (keys, hasher) = (&self.keys, &self.hasher);
            self.index.insert_unique(hash, (old_len + k) as u32, |&i| {
                hasher.hash_one(keys.row(i as usize).as_ref())
            });
            self.changed.push(true);
        }
        Ok(())
    }

    /// Removes and returns the rows where `mask` is true.
    fn remove(&mut self, mask: &BooleanArray) -> Result<RecordBatch> {
        if mask.true_count() == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let taken = filter_record_batch(&self.rows, mask)?;
        let kept = filter_record_batch(&self.rows, &not(mask)?)?;
        self.changed = self
            .changed
            .iter()
            .zip(mask.values().iter())
            .filter(|(_, gone)| !gone)
            .map(|(c, _)| *c)
            .collect();
        let changed = std::mem::take(&mut self.changed);
        self.set_rows(kept)?;
        self.changed = changed;
        self.removed.push(taken.clone());
        Ok(taken)
    }

    /// Removes the stored rows of the keys of `batch` (its first columns
    /// are the key's); keys not stored are ignored.
    pub(crate) fn remove_keys(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mut gone = vec![false; self.rows.num_rows()];
        for key in self.encode(batch)?.iter() {
            if let Some(i) = self.find(key) {
                gone[i as usize] = true;
            }
        }
        self.remove(&BooleanArray::from(gone))?;
        Ok(())
    }

    /// Removes and returns the stored rows whose `columns` (a part of the
    /// key) equal those of some row in `probe`.
    pub(crate) fn take_matching(
        &mut self,
        probe: &[RecordBatch],
        columns: &[usize],
    ) -> Result<RecordBatch> {
        let converter = row_converter(columns.iter().map(|&c| self.schema.field(c).data_type()))?;
        let encode = |b: &RecordBatch| -> Result<Vec<Box<[u8]>>> {
            if columns.is_empty() {
                return Ok(vec![Box::from(&[][..]); b.num_rows()]);
            }
            let cols: Vec<_> = columns.iter().map(|&c| Arc::clone(b.column(c))).collect();
            Ok(converter
                .convert_columns(&cols)?
                .iter()
                .map(|r| Box::from(r.as_ref()))
                .collect())
        };
        let mut wanted = HashSet::new();
        for b in probe {
            wanted.extend(encode(b)?);
        }
        let hit: BooleanArray = encode(&self.rows)?
            .iter()
            .map(|k| Some(wanted.contains(k)))
            .collect();
        self.remove(&hit)
    }

    /// Removes and returns the rows for which `mask` (one value per stored
    /// row, in [`all`](Self::all)'s order) says so.
    pub(crate) fn remove_where(
        &mut self,
        mask: impl FnOnce(&RecordBatch) -> Result<BooleanArray>,
    ) -> Result<RecordBatch> {
        let mask = mask(&self.rows)?;
        self.remove(&mask)
    }

    /// Whether anything changed since the last flush.
    pub(crate) fn has_changes(&self) -> bool {
        !self.removed.is_empty() || self.changed.iter().any(|c| *c)
    }

    /// Forgets the changes since the last flush (after a snapshot).
    pub(crate) fn clear_changes(&mut self) {
        self.changed = vec![false; self.rows.num_rows()];
        self.removed.clear();
    }

    /// The changes since the last flush, then forgets them (see
    /// [`pending_delta`](Self::pending_delta)).
    pub fn delta(&mut self) -> Result<Vec<u8>> {
        let out = self.pending_delta()?;
        self.clear_changes();
        Ok(out)
    }

    /// The changes since the last flush: the current rows of the keys
    /// upserted, and the keys removed (and not back), as the two parts of
    /// `codec::two_parts`, each an Arrow IPC file. They are kept until
    /// [`clear_changes`](Self::clear_changes), which the operator calls once
    /// the epoch that staged them has committed.
    pub(crate) fn pending_delta(&self) -> Result<Vec<u8>> {
        let upserts = filter_record_batch(&self.rows, &BooleanArray::from(self.changed.clone()))?;
        let key_columns: Vec<usize> = (0..self.key_columns).collect();
        let mut gone = Vec::new();
        let mut seen = HashSet::new();
        for batch in &self.removed {
            let keys = self.encode(batch)?;
            let mask: BooleanArray = keys
                .iter()
                .map(|k| Some(self.find(k).is_none() && seen.insert(k.as_ref().to_vec())))
                .collect();
            gone.push(filter_record_batch(batch, &mask)?.project(&key_columns)?);
        }
        let key_schema = Arc::new(self.schema.project(&key_columns)?);
        let gone = concat_batches(&key_schema, &gone)?;
        Ok(two_parts(&ipc_bytes(&upserts)?, &ipc_bytes(&gone)?))
    }

    /// Applies a [`delta`](Self::delta): removes its keys, then upserts
    /// its rows.
    pub fn apply_delta(&mut self, bytes: &[u8]) -> Result<()> {
        let (upserts, gone) = split_two_parts(bytes, "the state delta")?;
        let upserts = read_ipc(upserts, &self.schema)?;
        let key_columns: Vec<usize> = (0..self.key_columns).collect();
        let key_schema = Arc::new(self.schema.project(&key_columns)?);
        self.remove_keys(&read_ipc(gone, &key_schema)?)?;
        self.upsert(&[upserts])?;
        self.clear_changes();
        Ok(())
    }

    /// Every stored row.
    pub fn all(&self) -> &RecordBatch {
        &self.rows
    }

    /// Number of keys held.
    pub fn num_rows(&self) -> u64 {
        self.rows.num_rows() as u64
    }

    /// Bytes held: the rows, the encoded keys and the index.
    pub fn num_bytes(&self) -> u64 {
        let index = self.index.capacity() * (std::mem::size_of::<u32>() + 1);
        (self.rows.get_array_memory_size() + self.keys.size() + index) as u64
    }

    /// The whole state as Arrow IPC file bytes.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Result<Vec<u8>> {
        ipc_bytes(&self.rows)
    }

    /// Writes the whole state into `w` as an Arrow IPC file.
    pub fn snapshot_to(&self, w: &mut dyn std::io::Write) -> Result<()> {
        write_ipc(w, &self.rows)
    }

    /// Replaces the state with a snapshot's.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let rows = read_ipc(bytes, &self.schema)?;
        self.set_rows(rows)?;
        self.clear_changes();
        Ok(())
    }
}

/// A row converter for columns of these types: keys as comparable,
/// hashable bytes (arrow-row).
pub(crate) fn row_converter<'a>(
    types: impl IntoIterator<Item = &'a DataType>,
) -> Result<RowConverter> {
    Ok(RowConverter::new(
        types
            .into_iter()
            .map(|t| SortField::new(t.clone()))
            .collect(),
    )?)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use datafusion::arrow::array::{AsArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    /// A batch `(k VARCHAR, n BIGINT)` keyed by `k`.
    pub(crate) fn batch(keys: &[&str], counts: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(counts.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn upsert_replaces_and_adds_and_survives_a_snapshot() {
        let b = batch(&["a", "b"], &[1, 2]);
        let mut s = KeyedState::new(b.schema(), 1).unwrap();
        s.upsert(&[b]).unwrap();
        s.upsert(&[batch(&["b", "c"], &[20, 30])]).unwrap();
        assert_eq!(s.num_rows(), 3);
        let found = s.lookup(&[batch(&["c", "zz", "a"], &[0, 0, 0])]).unwrap();
        let n = found
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(n, vec![30, 1]);

        let bytes = s.snapshot().unwrap();
        let mut restored = KeyedState::new(s.all().schema(), 1).unwrap();
        restored.restore(&bytes).unwrap();
        let all = restored
            .lookup(&[batch(&["a", "b", "c"], &[0, 0, 0])])
            .unwrap();
        let n = all.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(n, vec![1, 20, 30]);
    }

    #[test]
    fn a_snapshot_and_deltas_rebuild_the_state() {
        let mut s = KeyedState::new(batch(&["a"], &[0]).schema(), 1).unwrap();
        s.upsert(&[batch(&["a", "b", "c"], &[1, 2, 3])]).unwrap();
        let snapshot = s.snapshot().unwrap();
        s.clear_changes();

        // Epoch 1: b changes, c leaves, d arrives. Epoch 2: c comes back,
        // a leaves, nothing else.
        s.upsert(&[batch(&["b", "d"], &[20, 4])]).unwrap();
        s.take_matching(&[batch(&["c"], &[0])], &[0]).unwrap();
        let d1 = s.delta().unwrap();
        s.upsert(&[batch(&["c"], &[30])]).unwrap();
        s.take_matching(&[batch(&["a"], &[0])], &[0]).unwrap();
        assert!(s.has_changes());
        let d2 = s.delta().unwrap();
        assert!(!s.has_changes());

        let mut r = KeyedState::new(s.all().schema(), 1).unwrap();
        r.restore(&snapshot).unwrap();
        r.apply_delta(&d1).unwrap();
        r.apply_delta(&d2).unwrap();
        let probe = [batch(&["a", "b", "c", "d"], &[0, 0, 0, 0])];
        let got = r.lookup(&probe).unwrap();
        let want = s.lookup(&probe).unwrap();
        assert_eq!(r.num_rows(), 3);
        assert_eq!(got, want);
        let n = got.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(n, vec![20, 30, 4]);
    }
}
