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

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, BooleanBufferBuilder, RecordBatch, UInt32Array,
};
use datafusion::arrow::compute::kernels::boolean::or;
use datafusion::arrow::compute::{concat_batches, filter_record_batch, not, take_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use foldhash::fast::RandomState;
use foldhash::{HashSet, HashSetExt};
use hashbrown::HashTable;

mod keys;
mod locate;
mod slices;
mod spill;
mod ttl;

use super::chain::{ChainReader, Images, Staged};
use super::codec::{
    is_ipc_file, read_ipc, read_ipc_owned, split_two_parts, two_parts_with, write_ipc,
    write_ipc_parts,
};
use super::columns::{compact_views, Placement};
use super::StateSize;
use crate::error::{Result, SluiceError};
use keys::{keyed_by_word, KeyBytes, KeyRef, ProbeKeys, StoredKeys, StoredView, Words};
pub(crate) use locate::Located;
pub(crate) use ttl::StateTtl;

/// The lifecycle steps of an operator whose whole state is one store,
/// made at its first epoch or restore (`None` before): what its
/// `Operator::stage`, `write_snapshot`, `after_commit` and `state_size` do.
pub(crate) trait OneStore {
    /// Nothing without a store; else [`KeyedState::stage`].
    fn stage(&self, snapshot_due: bool) -> Result<Staged>;
    /// The store's snapshot, streamed into `w`.
    fn write_snapshot(&self, w: &mut dyn std::io::Write) -> Result<()>;
    /// The staged epoch committed: changes are counted anew.
    fn after_commit(&mut self);
    /// Rows and bytes held.
    fn size(&self) -> StateSize;
}

impl OneStore for Option<KeyedState> {
    fn stage(&self, snapshot_due: bool) -> Result<Staged> {
        match self {
            None => Ok(Staged::Nothing),
            Some(state) => state.stage(snapshot_due),
        }
    }

    fn write_snapshot(&self, w: &mut dyn std::io::Write) -> Result<()> {
        match self {
            Some(state) => state.snapshot_to(w),
            None => Ok(()),
        }
    }

    fn after_commit(&mut self) {
        if let Some(state) = self {
            state.clear_changes();
        }
    }

    fn size(&self) -> StateSize {
        self.as_ref().map_or(StateSize::default(), |s| StateSize {
            rows: s.num_rows(),
            memory_bytes: s.num_bytes(),
            disk_bytes: s.disk_bytes(),
        })
    }
}

/// One operator's keyed state.
///
/// Memory per key is the row itself, a 4-byte slot in a hash table of row
/// positions and a change bit, plus, unless the key is one 8-byte integer
/// column (compared in the rows' own column), its arrow-row encoding in
/// one buffer: no allocation per key (`keys`). Upserts keep existing keys
/// at their positions and append new ones, so the index only grows;
/// removals (closed windows, merged sessions, evictions) compact the rows
/// and rebuild it.
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
    /// The key of each row of `rows`: encoded, or the rows' own column.
    keys: StoredKeys,
    /// Positions in `rows`, found by the hash of the key.
    index: HashTable<u32>,
    /// foldhash, as hashbrown's own default: several times faster than
    /// std's SipHash over short keys, and an epoch hashes each key once.
    hasher: RandomState,
    /// Per row, one bit: upserted since the last flush (snapshot or delta).
    changed: BooleanBufferBuilder,
    /// Rows removed since the last flush (for their keys).
    removed: Vec<RecordBatch>,
    /// Within a memory limit: the keys on local disk ([`within`](Self::within)).
    spill: Option<spill::Spill>,
    /// With a TTL, the clock its stamps are read by; `schema`'s last
    /// column is then the stamp ([`expiring`](Self::expiring)).
    ttl: Option<Arc<StateTtl>>,
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
        let key_types: Vec<&DataType> = schema.fields()[..key_columns]
            .iter()
            .map(|f| f.data_type())
            .collect();
        let keys = if keyed_by_word(&key_types) {
            StoredKeys::Column
        } else {
            StoredKeys::Encoded(KeyBytes::default())
        };
        // A global aggregate has one key, the empty one: encode a constant.
        let converter = if key_columns == 0 {
            row_converter([&DataType::Boolean])?
        } else {
            row_converter(key_types)?
        };
        Ok(Self {
            rows: RecordBatch::new_empty(Arc::clone(&schema)),
            keys,
            schema,
            key_columns,
            converter,
            index: HashTable::new(),
            hasher: RandomState::default(),
            changed: BooleanBufferBuilder::new(0),
            removed: Vec::new(),
            spill: None,
            ttl: None,
        })
    }

    /// The keys of `batch`, as the state compares them.
    fn keys_of(&self, batch: &RecordBatch) -> Result<ProbeKeys> {
        if let StoredKeys::Column = self.keys {
            return Ok(ProbeKeys::Words(Words::of(batch.column(0))));
        }
        if self.key_columns == 0 {
            let constant: ArrayRef = Arc::new(BooleanArray::from(vec![true; batch.num_rows()]));
            return Ok(ProbeKeys::Encoded(
                self.converter.convert_columns(&[constant])?,
            ));
        }
        let columns = &batch.columns()[..self.key_columns];
        Ok(ProbeKeys::Encoded(self.converter.convert_columns(columns)?))
    }

    /// The stored keys, readable by position.
    fn view(&self) -> StoredView<'_> {
        self.keys.view(&self.rows)
    }

    /// The position of the stored row with key `key` (its hash given),
    /// `stored` being [`view`](Self::view).
    fn find(&self, stored: &StoredView<'_>, hash: u64, key: KeyRef<'_>) -> Option<u32> {
        self.index
            .find(hash, |&i| stored.get(i as usize) == key)
            .copied()
    }

    /// Rebuilds `keys` and `index` for `rows`.
    fn set_rows(&mut self, rows: RecordBatch) -> Result<()> {
        let mut keys = match self.keys {
            StoredKeys::Encoded(_) => StoredKeys::Encoded(KeyBytes::default()),
            StoredKeys::Column => StoredKeys::Column,
        };
        // Encoded a slice at a time: arrow-row's whole encoding of a large
        // state would be the largest thing in memory while it is rebuilt.
        for start in (0..rows.num_rows()).step_by(ENCODE_SLICE_ROWS) {
            let slice = rows.slice(start, ENCODE_SLICE_ROWS.min(rows.num_rows() - start));
            let slice_keys = self.keys_of(&slice)?;
            for r in 0..slice_keys.len() {
                keys.push(slice_keys.get(r));
            }
        }
        let mut index = HashTable::with_capacity(rows.num_rows());
        let stored = keys.view(&rows);
        for i in 0..rows.num_rows() {
            let key = stored.get(i);
            let hash = key.hash(&self.hasher);
            if index
                .find(hash, |&j: &u32| stored.get(j as usize) == key)
                .is_some()
            {
                return Err(SluiceError::Internal(
                    "a key appears twice in operator state".into(),
                ));
            }
            let hasher = &self.hasher;
            index.insert_unique(hash, i as u32, |&j| stored.get(j as usize).hash(hasher));
        }
        drop(stored);
        self.rows = rows;
        self.keys = keys;
        self.index = index;
        Ok(())
    }

    /// Adds `rows` (of keys not stored) as they are, not as changes: rows
    /// read back from disk.
    fn insert_unchanged(&mut self, rows: &RecordBatch) -> Result<()> {
        let start = self.rows.num_rows();
        self.upsert_stored(rows.clone())?;
        for i in start..self.rows.num_rows() {
            self.changed.set_bit(i, false);
        }
        Ok(())
    }

    /// The stored rows of the keys that appear in `probe`.
    pub fn lookup(&self, probe: &[RecordBatch]) -> Result<RecordBatch> {
        let stored = self.view();
        let mut wanted = Vec::new();
        let mut seen = HashSet::new();
        for batch in probe {
            let keys = self.keys_of(batch)?;
            for r in 0..keys.len() {
                let key = keys.get(r);
                if let Some(row) = self.find(&stored, key.hash(&self.hasher), key) {
                    if seen.insert(row) {
                        wanted.push(row);
                    }
                }
            }
        }
        self.outer(take_record_batch(&self.rows, &UInt32Array::from(wanted))?)
    }

    /// True for each row of `batch` whose key is not stored.
    pub(crate) fn unseen(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let stored = self.view();
        let keys = self.keys_of(batch)?;
        Ok((0..keys.len())
            .map(|r| {
                let key = keys.get(r);
                Some(self.find(&stored, key.hash(&self.hasher), key).is_none())
            })
            .collect())
    }

    /// Replaces the rows of the keys in `new` (one row per key) and adds
    /// the keys not yet stored: stored keys keep their positions, new keys
    /// go to the end.
    pub fn upsert(&mut self, new: &[RecordBatch]) -> Result<()> {
        let schema = match new.first() {
            Some(first) => first.schema(),
            None => return Ok(()),
        };
        let new = self.stamped(concat_batches(&schema, new)?)?;
        self.upsert_stored(new)
    }

    /// [`upsert`](Self::upsert) of rows as the store keeps them (stamped,
    /// with a TTL): read from a checkpoint or from disk.
    fn upsert_stored(&mut self, new: RecordBatch) -> Result<()> {
        if new.num_rows() == 0 {
            return Ok(());
        }
        let stored = self.view();
        let new_keys = self.keys_of(&new)?;
        let mut placement = Placement::default();
        let mut appended_keys = KeyBytes::default();
        let mut appended_hashes = Vec::new();
        for j in 0..new_keys.len() {
            let key = new_keys.get(j);
            let hash = key.hash(&self.hasher);
            match self.find(&stored, hash, key) {
                Some(i) => placement.updates.push((i, j as u32)),
                None => {
                    placement.appended.push(j as u32);
                    if let KeyRef::Bytes(bytes) = key {
                        appended_keys.push(bytes);
                    }
                    appended_hashes.push(hash);
                }
            }
        }
        drop(stored);
        self.place(&placement, &new, &appended_keys, &appended_hashes)
    }

    /// Writes the rows of `new` where `placement` says, and indexes the
    /// appended ones under their hashes, `appended_keys` being their
    /// encoded keys, in order (none when the key is the rows' own column).
    fn place(
        &mut self,
        placement: &Placement,
        new: &RecordBatch,
        appended_keys: &KeyBytes,
        appended_hashes: &[u64],
    ) -> Result<()> {
        let old_len = self.rows.num_rows();
        for &(i, _) in &placement.updates {
            self.changed.set_bit(i as usize, true);
        }
        if let Some(spill) = &mut self.spill {
            spill.touch(placement.updates.iter().map(|&(i, _)| i));
            spill.appended(appended_hashes.len());
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
        for k in 0..appended_keys.len() {
            self.keys.push(KeyRef::Bytes(appended_keys.get(k)));
        }
        let (stored, hasher) = (self.keys.view(&self.rows), &self.hasher);
        self.index.reserve(appended_hashes.len(), |&i| {
            stored.get(i as usize).hash(hasher)
        });
        for (k, &hash) in appended_hashes.iter().enumerate() {
            self.index.insert_unique(hash, (old_len + k) as u32, |&i| {
                stored.get(i as usize).hash(hasher)
            });
        }
        self.changed.append_n(appended_hashes.len(), true);
        Ok(())
    }

    /// Removes and returns the rows where `mask` is true.
    fn remove(&mut self, mask: &BooleanArray) -> Result<RecordBatch> {
        if mask.true_count() == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let taken = filter_record_batch(&self.rows, mask)?;
        let kept = filter_record_batch(&self.rows, &not(mask)?)?;
        let mut changed = BooleanBufferBuilder::new(kept.num_rows());
        for (i, gone) in mask.values().iter().enumerate() {
            if !gone {
                changed.append(self.changed.get_bit(i));
            }
        }
        self.set_rows(kept)?;
        self.changed = changed;
        if let Some(spill) = &mut self.spill {
            spill.kept(&not(mask)?);
        }
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
        let (stored, keys) = (self.view(), self.keys_of(batch)?);
        for r in 0..keys.len() {
            let key = keys.get(r);
            if let Some(i) = self.find(&stored, key.hash(&self.hasher), key) {
                gone[i as usize] = true;
            }
        }
        drop(stored);
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
        let taken = self.remove(&hit)?;
        self.outer(taken)
    }

    /// Removes and returns the rows for which `mask` (one value per stored
    /// row, in [`all`](Self::all)'s order) says so.
    pub(crate) fn remove_where(
        &mut self,
        mask: impl FnOnce(&RecordBatch) -> Result<BooleanArray>,
    ) -> Result<RecordBatch> {
        let mask = mask(&self.rows)?;
        let taken = self.remove(&mask)?;
        self.outer(taken)
    }

    /// What an operator whose state is this store writes for an epoch's
    /// commit (see `Operator::stage`): a snapshot when due, else what
    /// changed since the last commit.
    pub(crate) fn stage(&self, snapshot_due: bool) -> Result<Staged> {
        Ok(if snapshot_due {
            Staged::Snapshot
        } else if self.has_changes() {
            Staged::Delta(self.pending_delta()?)
        } else {
            Staged::Unchanged
        })
    }

    /// Replaces the state with a committed chain: a snapshot and the deltas
    /// after it; an empty chain leaves the state as it is (empty, for a
    /// store just made).
    ///
    /// A sliced chain starts with a delta (`state::chain`) and is read
    /// newest file first: each key takes its value from the newest file
    /// that names it, and older files' rows of it are skipped. Read oldest
    /// first, every row of a file would first be read back from local disk
    /// (where an older file's row of it had gone) to be overwritten: 100 M
    /// keys under 1 GB took 18 minutes so, 6 newest first.
    pub(crate) fn restore_chain(&mut self, chain: ChainReader<'_>) -> Result<()> {
        let Some(first) = chain.next() else {
            return Ok(());
        };
        let first = first?;
        if is_ipc_file(&first) {
            self.restore(first)?;
            for delta in chain {
                self.apply_delta(&delta?)?;
            }
            return Ok(());
        }
        self.restore_rows(RecordBatch::new_empty(Arc::clone(&self.schema)))?;
        let mut gone = HashSet::default();
        while let Some(file) = chain.next_back() {
            self.apply_unless_named(&file?, &mut gone)?;
        }
        self.apply_unless_named(&first, &mut gone)
    }

    /// Whether anything changed since the last flush.
    pub(crate) fn has_changes(&self) -> bool {
        !self.removed.is_empty() || self.changed.finish_cloned().count_set_bits() > 0
    }

    /// Forgets the changes since the last flush (after a snapshot).
    pub(crate) fn clear_changes(&mut self) {
        self.changed = BooleanBufferBuilder::new(self.rows.num_rows());
        self.changed.append_n(self.rows.num_rows(), false);
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
        self.delta_with(None)
    }

    /// [`pending_delta`](Self::pending_delta), its rows with every row of
    /// the slices `images` names, in memory and on disk (`slices`).
    fn delta_with(&self, images: Option<Images>) -> Result<Vec<u8>> {
        let changed = BooleanArray::new(self.changed.finish_cloned(), None);
        let key_columns: Vec<usize> = (0..self.key_columns).collect();
        let mut gone = Vec::new();
        let stored = self.view();
        let removed_keys = self
            .removed
            .iter()
            .map(|b| self.keys_of(b))
            .collect::<Result<Vec<_>>>()?;
        let mut seen = HashSet::new();
        for (batch, keys) in self.removed.iter().zip(&removed_keys) {
            let mask: BooleanArray = (0..keys.len())
                .map(|r| {
                    let key = keys.get(r);
                    let here = self.find(&stored, key.hash(&self.hasher), key).is_some();
                    Some(!here && seen.insert(key))
                })
                .collect();
            gone.push(filter_record_batch(batch, &mask)?.project(&key_columns)?);
        }
        let key_schema = Arc::new(self.schema.project(&key_columns)?);
        let gone = concat_batches(&key_schema, &gone)?;
        let mut out = Vec::new();
        let in_memory = (0..self.rows.num_rows()).step_by(ENCODE_SLICE_ROWS).map(
            |start| -> Result<RecordBatch> {
                let slice = self
                    .rows
                    .slice(start, ENCODE_SLICE_ROWS.min(self.rows.num_rows() - start));
                let mut kept = changed.slice(start, slice.num_rows());
                if let Some(images) = images {
                    kept = or(&kept, &self.in_images(&slice, images)?)?;
                }
                Ok(filter_record_batch(&slice, &kept)?)
            },
        );
        let on_disk = images.into_iter().flat_map(|i| self.cold_images(i));
        two_parts_with(
            &mut out,
            |w| write_ipc_parts(w, &self.schema, in_memory.chain(on_disk)),
            |w| write_ipc(w, &gone),
        )?;
        Ok(out)
    }

    /// A [`delta`](Self::delta)'s rows and removed keys.
    fn read_delta(&self, bytes: &[u8]) -> Result<(RecordBatch, RecordBatch)> {
        let (upserts, gone) = split_two_parts(bytes, "the state delta")?;
        let upserts = read_ipc(upserts, &self.schema)?;
        let key_columns: Vec<usize> = (0..self.key_columns).collect();
        let key_schema = Arc::new(self.schema.project(&key_columns)?);
        Ok((upserts, read_ipc(gone, &key_schema)?))
    }

    /// Applies a [`delta`](Self::delta): removes its keys, then upserts
    /// its rows.
    pub fn apply_delta(&mut self, bytes: &[u8]) -> Result<()> {
        let (upserts, gone) = self.read_delta(bytes)?;
        self.fault_in(&[gone.clone(), upserts.clone()])?;
        self.remove_keys(&gone)?;
        self.upsert_stored(upserts)?;
        self.clear_changes();
        self.settle()
    }

    /// Every row in memory (every row, without a memory limit).
    pub fn all(&self) -> Result<RecordBatch> {
        self.outer(self.rows.clone())
    }

    /// Number of keys held, in memory and on disk.
    pub fn num_rows(&self) -> u64 {
        self.rows.num_rows() as u64 + self.cold_rows()
    }

    /// Bytes held in memory: the rows, the encoded keys and the index,
    /// and past the memory limit what the disk's store keeps in memory.
    pub fn num_bytes(&self) -> u64 {
        self.rows_bytes() + self.disk_memory_bytes()
    }

    /// Bytes of the rows in memory: the rows, the encoded keys and the
    /// index.
    fn rows_bytes(&self) -> u64 {
        let changed = self.changed.capacity() / 8;
        let touched = self.spill.as_ref().map_or(0, |s| s.touched_bytes());
        let held = self.rows.get_array_memory_size() + self.keys.size() + changed + touched;
        (held + self.index_bytes()) as u64
    }

    /// Bytes of the index's table: a row position and a control byte per
    /// bucket.
    fn index_bytes(&self) -> usize {
        self.index.num_buckets() * (std::mem::size_of::<u32>() + 1)
    }

    /// The whole state as Arrow IPC file bytes.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Result<Vec<u8>> {
        super::codec::ipc_bytes(&self.rows)
    }

    /// Writes the whole state into `w` as an Arrow IPC file: the rows in
    /// memory, then those on disk.
    pub fn snapshot_to(&self, w: &mut dyn std::io::Write) -> Result<()> {
        if self.cold_rows() == 0 {
            return write_ipc(w, &self.rows);
        }
        write_ipc_parts(
            w,
            &self.schema,
            std::iter::once(Ok(self.rows.clone())).chain(self.cold_batches(1 << 16)),
        )
    }

    /// Replaces the state with a snapshot's.
    pub fn restore(&mut self, bytes: Vec<u8>) -> Result<()> {
        self.restore_rows(read_ipc_owned(bytes, &self.schema)?)
    }

    /// Replaces the state with `rows`.
    fn restore_rows(&mut self, rows: RecordBatch) -> Result<()> {
        self.clear_cold()?;
        self.set_rows(rows)?;
        if let Some(spill) = &mut self.spill {
            spill.reset(self.rows.num_rows());
        }
        self.clear_changes();
        self.settle()
    }
}

/// Rows whose keys [`KeyedState::set_rows`] encodes at a time.
const ENCODE_SLICE_ROWS: usize = 1 << 16;

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
        let mut restored = KeyedState::new(s.all().unwrap().schema(), 1).unwrap();
        restored.restore(bytes).unwrap();
        let all = restored
            .lookup(&[batch(&["a", "b", "c"], &[0, 0, 0])])
            .unwrap();
        let n = all.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(n, vec![1, 20, 30]);
    }

    #[test]
    fn bigint_keys_are_the_rows_own_column_null_key_included() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let rows = |keys: Vec<Option<i64>>, counts: Vec<i64>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(keys)),
                    Arc::new(Int64Array::from(counts)),
                ],
            )
            .unwrap()
        };
        let counts = |b: &RecordBatch| b.column(1).as_primitive::<Int64Type>().values().to_vec();
        let mut s = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        assert!(matches!(s.keys, StoredKeys::Column));
        s.upsert(&[rows(vec![Some(1), None, Some(0)], vec![10, 20, 30])])
            .unwrap();
        let snapshot = s.snapshot().unwrap();
        s.clear_changes();
        // A null key is one key, distinct from 0 (which its slot holds).
        s.upsert(&[rows(vec![None, Some(2)], vec![21, 40])])
            .unwrap();
        assert_eq!(s.num_rows(), 4);
        let probe = [rows(
            vec![Some(0), None, Some(7), Some(2), Some(1)],
            vec![0; 5],
        )];
        assert_eq!(counts(&s.lookup(&probe).unwrap()), vec![30, 21, 40, 10]);
        s.remove_keys(&rows(vec![Some(1), Some(9)], vec![0, 0]))
            .unwrap();
        assert_eq!(counts(&s.lookup(&probe).unwrap()), vec![30, 21, 40]);
        // The snapshot and the delta give the same state back.
        let mut r = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        r.restore(snapshot).unwrap();
        r.apply_delta(&s.delta().unwrap()).unwrap();
        assert_eq!(r.num_rows(), 3);
        assert_eq!(counts(&r.lookup(&probe).unwrap()), vec![30, 21, 40]);
        assert_eq!(
            r.unseen(&probe[0]).unwrap(),
            BooleanArray::from(vec![false, false, true, false, true])
        );
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

        let mut r = KeyedState::new(s.all().unwrap().schema(), 1).unwrap();
        r.restore(snapshot).unwrap();
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
