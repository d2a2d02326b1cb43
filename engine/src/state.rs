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
//! Durability: every epoch that changes the state writes, *before* the epoch
//! commits, either a delta (`state/<operator>/<epoch>.<run>.delta`: the
//! current rows of the keys it changed and the keys it removed) or, every
//! k epochs, a full snapshot (`<epoch>.<run>.snapshot`), both Arrow IPC in
//! checksummed checkpoint files. The commit record (and the Kafka progress
//! record) names the chain — the last snapshot and the deltas after it —
//! and recovery loads exactly that chain, in order. Files carry the writing
//! run's id, so a zombie and its replacement never write the same file.
//! Files older than the retained snapshots' chains are deleted once a newer
//! chain is committed.

use std::hash::BuildHasher;
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{
    downcast_primitive, Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray,
    GenericByteViewArray, RecordBatch, UInt32Array,
};
use datafusion::arrow::compute::{
    concat_batches, filter_record_batch, interleave, not, take_record_batch,
};
use datafusion::arrow::datatypes::ByteViewType;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::row::{Row, RowConverter, Rows, SortField};
use foldhash::fast::RandomState;
use foldhash::{HashSet, HashSetExt};
use hashbrown::HashTable;

use crate::error::{Result, SluiceError};
use crate::window::WindowKey;

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

    /// Groups the rows of `probe` by key in one pass over the index: the
    /// stored rows of the keys found, and for every probe row its group —
    /// the stored keys first, in the order met, then the new keys. What an
    /// aggregation needs to merge an epoch's partial states into the stored
    /// ones without hashing the keys again.
    pub(crate) fn locate(&self, probe: &[RecordBatch]) -> Result<Located> {
        const NEW: usize = 1 << (usize::BITS - 1);
        let encoded = probe
            .iter()
            .map(|b| self.encode(b))
            .collect::<Result<Vec<_>>>()?;
        let probed: usize = encoded.iter().map(|k| k.num_rows()).sum();
        let found = self.probe_index(&encoded, probed)?;
        let mut stored_group = StoredGroups::new(self.rows.num_rows(), probed);
        let mut wanted: Vec<u32> = Vec::new();
        // New keys with their hashes, which the index will take.
        let mut new_index: HashTable<usize> = HashTable::new();
        let mut new_rows: Vec<(usize, usize)> = Vec::new();
        let mut new_hashes: Vec<u64> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::with_capacity(probe.len());
        for (b, keys) in encoded.iter().enumerate() {
            let mut of_batch = Vec::with_capacity(keys.num_rows());
            for (r, (key, &(hash, pos))) in keys.iter().zip(&found[b]).enumerate() {
                let group = match (pos != NOT_STORED).then_some(pos) {
                    Some(pos) => stored_group.group_of(pos, || {
                        wanted.push(pos);
                        wanted.len() - 1
                    }),
                    None => {
                        let same = |&i: &usize| {
                            let (b2, r2) = new_rows[i];
                            encoded[b2].row(r2) == key
                        };
                        let id = match new_index.find(hash, same) {
                            Some(&i) => i,
                            None => {
                                new_rows.push((b, r));
                                new_hashes.push(hash);
                                new_index
                                    .insert_unique(hash, new_rows.len() - 1, |&i| new_hashes[i]);
                                new_rows.len() - 1
                            }
                        };
                        NEW | id
                    }
                };
                of_batch.push(group);
            }
            groups.push(of_batch);
        }
        // New keys follow the stored ones.
        let stored_count = wanted.len();
        for g in groups.iter_mut().flatten() {
            if *g & NEW != 0 {
                *g = stored_count + (*g & !NEW);
            }
        }
        let mut new_keys = self.converter.empty_rows(new_rows.len(), 0);
        for &(b, r) in &new_rows {
            new_keys.push(encoded[b].row(r));
        }
        Ok(Located {
            stored: take_record_batch(&self.rows, &UInt32Array::from(wanted.clone()))?,
            positions: wanted,
            groups,
            new_rows,
            new_keys,
            new_hashes,
        })
    }

    /// Per row of each of `encoded` (`probed` rows in all), its key's hash
    /// and stored position ([`NOT_STORED`] if none). The lookups are the
    /// bulk of an epoch over a large state (each misses the cache several
    /// times) and only read it, so a large probe is split across two
    /// threads.
    fn probe_index(&self, encoded: &[Rows], probed: usize) -> Result<Vec<Vec<(u64, u32)>>> {
        let lookup = |keys: &Rows, rows: std::ops::Range<usize>| -> Vec<(u64, u32)> {
            rows.map(|r| {
                let key = keys.row(r);
                let hash = self.hash(key);
                (hash, self.find_hashed(hash, key).unwrap_or(NOT_STORED))
            })
            .collect()
        };
        let half = |second: bool| -> Vec<Vec<(u64, u32)>> {
            encoded
                .iter()
                .map(|keys| {
                    let (n, mid) = (keys.num_rows(), keys.num_rows() / 2);
                    lookup(keys, if second { mid..n } else { 0..mid })
                })
                .collect()
        };
        if probed < PARALLEL_PROBE || cores() < 2 {
            return Ok(encoded.iter().map(|k| lookup(k, 0..k.num_rows())).collect());
        }
        let (mut first, second) = std::thread::scope(|scope| {
            let second = scope.spawn(|| half(true));
            (half(false), second.join())
        });
        let second =
            second.map_err(|_| SluiceError::Internal("a state lookup thread panicked".into()))?;
        for (f, s) in first.iter_mut().zip(second) {
            f.extend(s);
        }
        Ok(first)
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

    /// [`upsert`](Self::upsert) of the new states of the groups `located`
    /// found, in its group order: the keys are already placed, so they are
    /// not hashed again.
    pub(crate) fn upsert_located(&mut self, located: &Located, new: &RecordBatch) -> Result<()> {
        let stored = located.positions.len();
        let placement = Placement {
            updates: located
                .positions
                .iter()
                .enumerate()
                .map(|(g, &i)| (i as usize, g))
                .collect(),
            appended: (stored..new.num_rows()).collect(),
        };
        self.place(&placement, new, &located.new_keys, &located.new_hashes)
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

    /// Removes and returns the rows whose window (`key`) has closed: its
    /// end is at or before `watermark` (ns since the Unix epoch).
    pub(crate) fn take_closed(&mut self, key: &WindowKey, watermark: i64) -> Result<RecordBatch> {
        let closed = key.closed(self.rows.column(key.column), watermark)?;
        self.remove(&closed)
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

    /// The changes since the last flush, then forgets them: the current
    /// rows of the keys upserted, and the keys removed (and not back). As
    /// bytes: the first part's length (8 bytes, little endian), then two
    /// Arrow IPC files, upserted rows and removed keys.
    pub fn delta(&mut self) -> Result<Vec<u8>> {
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
        let out = two_parts(&ipc_bytes(&upserts)?, &ipc_bytes(&gone)?);
        self.clear_changes();
        Ok(out)
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
        let mut writer = FileWriter::try_new(w, &self.schema)?;
        writer.write(&self.rows)?;
        writer.finish()?;
        Ok(())
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

/// The rows of a probe grouped by key (see [`KeyedState::locate`]).
#[derive(Debug)]
pub(crate) struct Located {
    /// The stored rows of the keys found, in the order first met: groups
    /// `0..stored.num_rows()`.
    pub stored: RecordBatch,
    /// Per probe batch, each row's group.
    pub groups: Vec<Vec<usize>>,
    /// Per new key, in group order after the stored ones: the (batch, row)
    /// of the probe where it first appears.
    pub new_rows: Vec<(usize, usize)>,
    /// Where the stored rows are in the state, in group order.
    pub positions: Vec<u32>,
    /// The new keys, encoded, in group order.
    pub new_keys: Rows,
    /// Their hashes, for the index.
    pub new_hashes: Vec<u64>,
}

/// A probe row whose key is not stored (see [`KeyedState::probe_index`]).
const NOT_STORED: u32 = u32::MAX;

/// Probes of fewer rows are looked up on one thread: below this, starting
/// a second costs about what it saves.
const PARALLEL_PROBE: usize = 1 << 15;

/// The machine's cores, asked once.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Which group [`KeyedState::locate`] gave each stored position it met:
/// a slot per stored row when the probe is a good part of the state (no
/// hashing), else a map of the positions met.
enum StoredGroups {
    Dense(Vec<u32>),
    Sparse(hashbrown::HashMap<u32, usize, RandomState>),
}

impl StoredGroups {
    fn new(stored: usize, probed: usize) -> Self {
        if stored <= probed.saturating_mul(4) {
            Self::Dense(vec![u32::MAX; stored])
        } else {
            Self::Sparse(hashbrown::HashMap::default())
        }
    }

    /// The group of stored position `pos`, made by `add` the first time.
    fn group_of(&mut self, pos: u32, add: impl FnOnce() -> usize) -> usize {
        match self {
            Self::Dense(slots) => {
                let slot = &mut slots[pos as usize];
                if *slot == u32::MAX {
                    // Groups number at most the probe's rows, under u32::MAX.
                    *slot = add() as u32;
                }
                *slot as usize
            }
            Self::Sparse(map) => *map.entry(pos).or_insert_with(add),
        }
    }
}

/// `batch` with each string or binary view column that holds buffers of
/// much more than its values copied into buffers of its own. A view array
/// made by `filter`, `concat` or `interleave` still points into the
/// buffers of the arrays it came from, so state that keeps some rows of
/// every epoch (a join's buffers; stored groups with long string keys or
/// values) would otherwise hold every epoch's input in memory, and write it
/// to every snapshot.
pub(crate) fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    if !batch.columns().iter().any(pins_unused_bytes) {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View if pins_unused_bytes(c) => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView if pins_unused_bytes(c) => Arc::new(c.as_binary_view().gc()),
                _ => Arc::clone(c),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Whether `column` is a view array whose buffers hold more than twice
/// the bytes its values use (plus a little).
fn pins_unused_bytes(column: &ArrayRef) -> bool {
    fn held_and_used<T: ByteViewType + ?Sized>(a: &GenericByteViewArray<T>) -> (usize, usize) {
        let held = a.data_buffers().iter().map(|b| b.len()).sum();
        // Values of up to 12 bytes live in the view itself.
        let used = a
            .views()
            .iter()
            .map(|v| *v as u32 as usize)
            .filter(|&len| len > 12)
            .sum();
        (held, used)
    }
    let (held, used) = match column.data_type() {
        DataType::Utf8View => held_and_used(column.as_string_view()),
        DataType::BinaryView => held_and_used(column.as_binary_view()),
        _ => return false,
    };
    held > 2 * used + 4096
}

/// Two byte strings as one: the first's length (8 bytes, little endian),
/// the first, the second. (A delta's upserts and removals; a join's two
/// buffers.)
pub(crate) fn two_parts(first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + first.len() + second.len());
    out.extend_from_slice(&(first.len() as u64).to_le_bytes());
    out.extend_from_slice(first);
    out.extend_from_slice(second);
    out
}

/// The two parts of [`two_parts`]' bytes.
pub(crate) fn split_two_parts<'a>(bytes: &'a [u8], what: &str) -> Result<(&'a [u8], &'a [u8])> {
    let damaged = || SluiceError::Internal(format!("{what} is truncated"));
    let len = bytes.get(..8).ok_or_else(damaged)?;
    let len = u64::from_le_bytes(len.try_into().map_err(|_| damaged())?) as usize;
    let first = bytes.get(8..8 + len).ok_or_else(damaged)?;
    let second = bytes.get(8 + len..).ok_or_else(damaged)?;
    Ok((first, second))
}

/// `batch` as Arrow IPC file bytes.
pub(crate) fn ipc_bytes(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = FileWriter::try_new(&mut out, &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

/// Arrow IPC file bytes as one batch of `schema` (the stored schema may
/// differ in field metadata from the current plan's; the columns match).
pub(crate) fn read_ipc(bytes: &[u8], schema: &SchemaRef) -> Result<RecordBatch> {
    let reader = FileReader::try_new(Cursor::new(bytes), None)?;
    let batches = reader
        .map(|b| {
            let b = b?;
            RecordBatch::try_new(Arc::clone(schema), b.columns().to_vec())
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(concat_batches(schema, &batches)?)
}

/// Where the rows of an upsert go: over stored rows, or after them.
#[derive(Default)]
struct Placement {
    /// (stored position, row of the upsert).
    updates: Vec<(usize, usize)>,
    /// Rows of the upsert for new keys, in the order they are appended.
    appended: Vec<usize>,
}

impl Placement {
    /// `old` with the placed rows of `new` written over and after it.
    ///
    /// Fixed-width columns (every count, sum, min, max and the usual keys)
    /// are updated in their own buffers when nothing else holds them: the
    /// cost and the memory follow the rows that changed, not the whole
    /// state, which at 10M keys saves a full copy per epoch. Other columns,
    /// and buffers still shared (just restored, or handed out), are copied.
    fn apply(&self, old: ArrayRef, new: &ArrayRef) -> Result<ArrayRef> {
        macro_rules! in_place {
            ($t:ty) => {
                self.apply_primitive::<$t>(old, new)
            };
        }
        let data_type = old.data_type().clone();
        downcast_primitive! {
            &data_type => (in_place),
            _ => self.apply_by_copy(old, new)
        }
    }

    fn apply_primitive<T: ArrowPrimitiveType>(
        &self,
        old: ArrayRef,
        new: &ArrayRef,
    ) -> Result<ArrayRef> {
        let typed = old.as_primitive::<T>().clone();
        // Drop the only other handle on the buffers, so they can be reused.
        drop(old);
        let new_typed = new.as_primitive::<T>();
        let mut builder = match typed.into_builder() {
            Ok(b) => b,
            Err(shared) => return self.apply_by_copy(Arc::new(shared), new),
        };
        let new_nulls = new_typed.nulls().filter(|n| n.null_count() > 0);
        if let Some(nulls) = new_nulls {
            // A stored row becoming null needs a validity buffer to write
            // into; without one, copy.
            if builder.validity_slice_mut().is_none()
                && self.updates.iter().any(|&(_, j)| nulls.is_null(j))
            {
                let old: ArrayRef = Arc::new(builder.finish());
                return self.apply_by_copy(old, new);
            }
        }
        let (values, mut validity) = builder.slices_mut();
        for &(i, j) in &self.updates {
            values[i] = new_typed.value(j);
            if let Some(validity) = validity.as_deref_mut() {
                let valid = new_typed.is_valid(j);
                if valid {
                    validity[i / 8] |= 1 << (i % 8);
                } else {
                    validity[i / 8] &= !(1 << (i % 8));
                }
            }
        }
        for &j in &self.appended {
            if new_typed.is_valid(j) {
                builder.append_value(new_typed.value(j));
            } else {
                builder.append_null();
            }
        }
        Ok(Arc::new(builder.finish()))
    }

    fn apply_by_copy(&self, old: ArrayRef, new: &ArrayRef) -> Result<ArrayRef> {
        let mut from: Vec<(usize, usize)> = (0..old.len()).map(|i| (0, i)).collect();
        for &(i, j) in &self.updates {
            from[i] = (1, j);
        }
        from.extend(self.appended.iter().map(|&j| (1, j)));
        Ok(interleave(&[old.as_ref(), new.as_ref()], &from)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use datafusion::arrow::array::{AsArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    fn batch(keys: &[&str], counts: &[i64]) -> RecordBatch {
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
    fn locate_groups_probe_rows_by_key_stored_keys_first() {
        let mut s = KeyedState::new(batch(&[], &[]).schema(), 1).unwrap();
        s.upsert(&[batch(&["a", "b", "c"], &[1, 2, 3])]).unwrap();
        s.clear_changes();
        // Two probe batches (two partitions): keys repeat across them.
        let probe = [
            batch(&["x", "c", "a", "x"], &[0, 0, 0, 0]),
            batch(&["a", "y", "c"], &[0, 0, 0]),
        ];
        let located = s.locate(&probe).unwrap();
        let stored: Vec<i64> = located
            .stored
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        // c then a, as met; b was not probed.
        assert_eq!(stored, vec![3, 1]);
        // Groups: c = 0, a = 1 (stored), then x = 2, y = 3 (new).
        assert_eq!(located.groups, vec![vec![2, 0, 1, 2], vec![1, 3, 0]]);
        assert_eq!(located.new_rows, vec![(0, 0), (1, 1)]);

        // The groups' new rows, in group order, go where locate found them.
        s.upsert_located(&located, &batch(&["c", "a", "x", "y"], &[30, 10, 7, 8]))
            .unwrap();
        assert_eq!(s.num_rows(), 5);
        let all = s
            .lookup(&[batch(&["a", "b", "c", "x", "y"], &[0; 5])])
            .unwrap();
        let n = all.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(n, vec![10, 2, 30, 7, 8]);
        // The delta holds what changed: applied to the state before, it
        // gives the state after.
        let mut again = KeyedState::new(s.all().schema(), 1).unwrap();
        again
            .upsert(&[batch(&["a", "b", "c"], &[1, 2, 3])])
            .unwrap();
        again.apply_delta(&s.delta().unwrap()).unwrap();
        let n = again
            .lookup(&[batch(&["a", "b", "c", "x", "y"], &[0; 5])])
            .unwrap()
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(n, vec![10, 2, 30, 7, 8]);
    }

    #[test]
    fn a_large_probe_looked_up_on_two_threads_groups_like_a_map() {
        // Stored: even keys. Probe: every key of 0..n twice over two
        // batches, more rows than one thread looks up.
        let n = PARALLEL_PROBE;
        let names = |keys: &mut dyn Iterator<Item = usize>| -> Vec<String> {
            keys.map(|k| format!("k{k}")).collect()
        };
        let stored = names(&mut (0..n).step_by(2));
        let stored_refs: Vec<&str> = stored.iter().map(String::as_str).collect();
        let mut s = KeyedState::new(batch(&[], &[]).schema(), 1).unwrap();
        s.upsert(&[batch(&stored_refs, &vec![1; stored.len()])])
            .unwrap();
        let probe_keys = [names(&mut (0..n).rev()), names(&mut (0..n))];
        let probe: Vec<RecordBatch> = probe_keys
            .iter()
            .map(|keys| {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                batch(&refs, &vec![0; refs.len()])
            })
            .collect();
        let located = s.locate(&probe).unwrap();
        // Each key one group, the same in both batches; the stored keys'
        // groups come first.
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        for (keys, groups) in probe_keys.iter().zip(&located.groups) {
            for (k, &g) in keys.iter().zip(groups) {
                assert_eq!(*group_of.entry(k).or_insert(g), g, "{k}");
                let was_stored = k[1..].parse::<usize>().unwrap() % 2 == 0;
                assert_eq!(g < located.positions.len(), was_stored, "{k}");
            }
        }
        assert_eq!(group_of.len(), n);
        assert_eq!(located.positions.len(), stored.len());
        assert_eq!(located.new_rows.len(), n - stored.len());
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

    fn nullable(keys: &[i64], values: &[Option<i64>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn fixed_width_columns_are_updated_in_their_own_buffers_unless_shared() {
        let b = nullable(&[1, 2, 3], &[Some(10), None, Some(30)]);
        let mut s = KeyedState::new(b.schema(), 1).unwrap();
        s.upsert(&[b]).unwrap();
        let buffer = |s: &KeyedState| s.all().column(1).to_data().buffers()[0].as_ptr();
        let before = buffer(&s);
        s.upsert(&[nullable(&[3], &[Some(31)])]).unwrap();
        assert_eq!(buffer(&s), before, "an update copied the column");

        // Null to value, value to null, and a new key (which may move the
        // buffer as it grows).
        s.upsert(&[nullable(&[2, 1, 4], &[Some(20), None, Some(40)])])
            .unwrap();
        let got = s.lookup(&[nullable(&[1, 2, 3, 4], &[None; 4])]).unwrap();
        assert_eq!(
            got.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![None, Some(20), Some(31), Some(40)])
        );
        let before = buffer(&s);
        s.upsert(&[nullable(&[4], &[Some(41)])]).unwrap();
        assert_eq!(buffer(&s), before, "an update copied the column");

        // A handed-out copy of the state is never changed under its holder.
        let held = s.all().clone();
        s.upsert(&[nullable(&[1], &[Some(11)])]).unwrap();
        assert_eq!(
            held.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![None, Some(20), Some(31), Some(41)])
        );
        let got = s.lookup(&[nullable(&[1], &[None])]).unwrap();
        assert_eq!(
            got.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![Some(11)])
        );
    }

    #[test]
    fn compacted_views_stop_pointing_into_the_batches_they_came_from() {
        use datafusion::arrow::array::StringViewArray;
        let long: Vec<String> = (0..1000).map(|i| format!("{i:0>64}")).collect();
        let strings = StringViewArray::from_iter_values(long.iter());
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("s", DataType::Utf8View, false),
        ]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(strings)]).unwrap();
        let one = filter_record_batch(
            &batch,
            &BooleanArray::from_iter((0..1000).map(|i| Some(i == 7))),
        )
        .unwrap();
        // The filtered row still holds the whole input's 64 KB.
        assert!(one.get_array_memory_size() > 60_000);
        let compact = compact_views(one.clone()).unwrap();
        assert_eq!(compact, one);
        assert!(compact.get_array_memory_size() < 1_000);
    }

    #[test]
    fn stored_long_string_keys_do_not_pin_the_batches_they_came_from() {
        use datafusion::arrow::array::StringViewArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8View, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let hot: Vec<String> = (0..1000).map(|i| format!("{i:0>40}")).collect();
        let mut state = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        // Every epoch updates the same hot keys and adds one cold key that
        // never changes again: without compaction each cold key would keep
        // its whole batch's strings alive, one more batch per epoch.
        for epoch in 0..50usize {
            let mut keys = hot.clone();
            keys.push(format!("cold{epoch:0>40}"));
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringViewArray::from_iter_values(keys.iter())),
                    Arc::new(Int64Array::from(vec![epoch as i64; keys.len()])),
                ],
            )
            .unwrap();
            state.upsert(&[batch]).unwrap();
        }
        assert_eq!(state.num_rows(), 1050);
        let live = 1000 * 40 + 50 * 44;
        let held: usize = state
            .all()
            .column(0)
            .as_string_view()
            .data_buffers()
            .iter()
            .map(|b| b.len())
            .sum();
        assert!(
            held <= 2 * live + 4096,
            "{held} bytes held for {live} bytes of keys"
        );
    }
}
