//! A keyed store past the memory limit: its coldest keys on local disk.
//!
//! A store made [`within`](KeyedState::within) a [`StateBudget`] keeps the
//! keys it touched lately in memory, as every store does, and its other
//! keys in its partition of the budget's disk: key → row, each the
//! arrow-row encoding of its columns, the key's after its slice's byte
//! (`slices`), so that a slice's keys are one range.
//! A key lives in one of the two, never both.
//!
//! - Before an epoch's keys are looked up, [`fault_in`](KeyedState::fault_in)
//!   reads the ones on disk back into memory, all at once and in key
//!   order, as unchanged rows: the operator then sees one store.
//! - After each commit, [`settle`](KeyedState::settle) tells the budget
//!   what the store holds and sheds what it is told to, least recently
//!   touched first. Changes are counted anew at a commit, so what is shed
//!   is committed state: shedding writes nothing to the checkpoint, and
//!   the next delta holds only what the next epoch changes.
//!
//! Only stores read by key may spill: an operator that scans its rows
//! (windows closing, a session's partition, complete mode) keeps them in
//! memory, where they count against no limit.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{filter_record_batch, not, take};
use datafusion::arrow::row::{RowConverter, Rows};
use foldhash::HashSet;

use super::slices::disk_key;
use super::{row_converter, KeyedState};
use crate::error::Result;
use crate::state::budget::{Disk, StateBudget, TARGET};
use crate::state::chain::Images;

/// The disk side of a store within a budget.
pub(super) struct Spill {
    budget: Arc<StateBudget>,
    /// The store's number in the budget.
    id: u64,
    /// The store's disk, once it first shed.
    cold: Option<Disk>,
    /// Rows on disk, and their keys' and values' bytes.
    cold_rows: u64,
    cold_bytes: u64,
    /// Encodes the non-key columns of a row.
    values: RowConverter,
    /// Per row in memory, the commit count when it was last touched.
    touched: Vec<u32>,
    /// For a store whose rows leave by a bound (a window's): the least
    /// bound of some rows, and the least bound on disk (or below it).
    lowest_of: Option<LowestOf>,
    cold_lowest: Option<i64>,
    /// Commits so far.
    tick: u32,
    /// Rows appended since the last [`settle`](KeyedState::settle): how
    /// much the next epoch may grow the store.
    grown: usize,
    /// Rows changed and not yet paid for by images, times the slices
    /// (`slices`).
    pub(super) credit: u64,
}

impl std::fmt::Debug for Spill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spill")
            .field("id", &self.id)
            .field("cold_rows", &self.cold_rows)
            .finish_non_exhaustive()
    }
}

/// The least of some bound of a batch's rows (none without any).
pub(crate) type LowestOf = Box<dyn Fn(&RecordBatch) -> Result<Option<i64>> + Send + Sync>;

impl Drop for Spill {
    fn drop(&mut self) {
        self.budget.forget(self.id);
    }
}

impl Spill {
    /// Rows at these positions were written now.
    pub(super) fn touch(&mut self, rows: impl IntoIterator<Item = u32>) {
        for i in rows {
            if let Some(t) = self.touched.get_mut(i as usize) {
                *t = self.tick;
            }
        }
    }

    /// `n` rows were appended now.
    pub(super) fn appended(&mut self, n: usize) {
        self.touched.extend(std::iter::repeat_n(self.tick, n));
        self.grown += n;
    }

    /// The rows in memory are now those of `kept` (one flag per former
    /// row, true where it stays).
    pub(super) fn kept(&mut self, kept: &BooleanArray) {
        let mut i = 0;
        self.touched.retain(|_| {
            let keep = kept.value(i);
            i += 1;
            keep
        });
        self.touched.shrink_to_fit();
    }

    /// Bytes of the touch marks.
    pub(super) fn touched_bytes(&self) -> usize {
        self.touched.capacity() * std::mem::size_of::<u32>()
    }

    /// The store's rows were replaced by `n` rows, all touched now.
    pub(super) fn reset(&mut self, n: usize) {
        self.touched = vec![self.tick; n];
    }
}

impl KeyedState {
    /// This store within `budget` (none: as it is): past the budget's
    /// limit its least recently touched keys go to local disk. For stores
    /// read by key only: see the module.
    pub(crate) fn within(mut self, budget: Option<Arc<StateBudget>>) -> Result<Self> {
        let Some(budget) = budget else {
            return Ok(self);
        };
        if self.key_columns == 0 {
            // One row: nothing to shed.
            return Ok(self);
        }
        let values = row_converter(
            self.schema.fields()[self.key_columns..]
                .iter()
                .map(|f| f.data_type()),
        )?;
        self.spill = Some(Spill {
            id: budget.register(),
            budget,
            cold: None,
            cold_rows: 0,
            cold_bytes: 0,
            values,
            touched: vec![0; self.rows.num_rows()],
            tick: 0,
            grown: 0,
            lowest_of: self.lowest_stamp(),
            cold_lowest: None,
            credit: 0,
        });
        Ok(self)
    }

    /// A store whose rows leave by a bound (closed windows; a TTL's
    /// stamps, set by [`within`](Self::within)): `lowest_of`
    /// gives the least bound of some rows, so that
    /// [`cold_lowest`](Self::cold_lowest) can tell when rows on disk may
    /// leave.
    pub(crate) fn leaving_by(mut self, lowest_of: LowestOf) -> Self {
        if let Some(spill) = &mut self.spill {
            spill.lowest_of = Some(lowest_of);
        }
        self
    }

    /// The least bound among the rows on disk, or less; none when none
    /// is there (see [`leaving_by`](Self::leaving_by)).
    pub(crate) fn cold_lowest(&self) -> Option<i64> {
        self.spill
            .as_ref()
            .filter(|s| s.cold_rows > 0)
            .and_then(|s| s.cold_lowest)
    }

    /// Removes and returns the rows on disk for which `mask` says so, as
    /// [`remove_where`](Self::remove_where) does in memory: a scan of the
    /// disk, for when [`cold_lowest`](Self::cold_lowest) says some may.
    pub(crate) fn remove_cold_where(
        &mut self,
        mask: impl Fn(&RecordBatch) -> Result<BooleanArray>,
    ) -> Result<RecordBatch> {
        let mut taken = Vec::new();
        let mut lowest: Option<i64> = None;
        for batch in self.cold_batches(WRITE_ROWS) {
            let batch = batch?;
            let m = mask(&batch)?;
            let kept = filter_record_batch(&batch, &not(&m)?)?;
            if let Some(low) = self.spill.as_ref().and_then(|s| s.lowest_of.as_ref()) {
                lowest = min_of(lowest, low(&kept)?);
            }
            taken.push(filter_record_batch(&batch, &m)?);
        }
        let taken = datafusion::arrow::compute::concat_batches(&self.schema, &taken)?;
        let Some(spill) = &mut self.spill else {
            return Ok(taken);
        };
        spill.cold_lowest = lowest;
        if let (Some(disk), true) = (&spill.cold, taken.num_rows() > 0) {
            let (keys, values) = encode(&self.converter, spill, self.key_columns, &taken)?;
            let mut key = Vec::new();
            for start in (0..keys.num_rows()).step_by(WRITE_ROWS) {
                let mut batch = disk.batch();
                for r in start..keys.num_rows().min(start + WRITE_ROWS) {
                    key.clear();
                    disk_key(keys.row(r).as_ref(), &mut key);
                    batch.remove(disk.rows(), key.as_slice());
                    let bytes = key.len() + values.row(r).as_ref().len();
                    spill.cold_bytes = spill.cold_bytes.saturating_sub(bytes as u64);
                }
                disk.commit(batch)?;
            }
            spill.cold_rows = spill.cold_rows.saturating_sub(taken.num_rows() as u64);
            // Committed state that leaves: the next delta says so.
            self.removed.push(taken.clone());
        }
        self.outer(taken)
    }

    /// Reads the keys of `probe` (its first columns are the key's) that
    /// are on disk back into memory, unchanged, so that the store's
    /// lookups find every key in memory.
    pub(crate) fn fault_in(&mut self, probe: &[RecordBatch]) -> Result<()> {
        let Some(spill) = &self.spill else {
            return Ok(());
        };
        if spill.cold.is_none() || spill.cold_rows == 0 {
            return Ok(());
        }
        // Per probe batch, the keys not in memory, in the disk's encoding:
        // only they are encoded (a store keyed by one integer column
        // compares its keys as words, not encoded).
        let stored = self.view();
        let mut encoded = Vec::with_capacity(probe.len());
        for batch in probe {
            let keys = self.keys_of(batch)?;
            let absent: UInt32Array = (0..keys.len())
                .filter(|&r| {
                    let key = keys.get(r);
                    self.find(&stored, key.hash(&self.hasher), key).is_none()
                })
                .map(|r| r as u32)
                .collect();
            let columns = batch.columns()[..self.key_columns]
                .iter()
                .map(|c| take(c, &absent, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            encoded.push(self.converter.convert_columns(&columns)?);
        }
        drop(stored);
        let missing: HashSet<&[u8]> = encoded
            .iter()
            .flat_map(|e| e.iter().map(|r| r.data()))
            .collect();
        // As on disk, one buffer for all.
        let mut on_disk = Vec::new();
        let mut ends = Vec::with_capacity(missing.len());
        for key in missing {
            disk_key(key, &mut on_disk);
            ends.push(on_disk.len());
        }
        let mut missing: Vec<&[u8]> = ends
            .iter()
            .scan(0, |start, &end| {
                let key = &on_disk[*start..end];
                *start = end;
                Some(key)
            })
            .collect();
        // In key order: the reads walk the files forward. A chunk at a
        // time, each read, decoded and stored before the next: the values
        // read (an allocation each) and their decoding are then a chunk's,
        // not an epoch's (a million keys read back held 100+ MB at once).
        missing.sort_unstable();
        for chunk in missing.chunks(WRITE_ROWS) {
            self.fault_in_sorted(chunk)?;
        }
        Ok(())
    }

    /// Reads the rows of `keys` (sorted, as on disk) that the disk holds
    /// into memory, as unchanged rows, and removes them from the disk.
    fn fault_in_sorted(&mut self, keys: &[&[u8]]) -> Result<()> {
        let Some(disk) = self.spill.as_ref().and_then(|s| s.cold.as_ref()) else {
            return Ok(());
        };
        let found = read_rows(disk, keys)?;
        if found.is_empty() {
            return Ok(());
        }
        let mut batch = disk.batch();
        let mut bytes = 0;
        for (key, value) in &found {
            batch.remove(disk.rows(), *key);
            bytes += (key.len() + value.len()) as u64;
        }
        disk.commit(batch)?;
        let (keys, values): (Vec<&[u8]>, Vec<fjall::Slice>) = found.into_iter().unzip();
        let rows = self.decode(&keys, &values)?;
        if let Some(spill) = &mut self.spill {
            spill.cold_rows = spill.cold_rows.saturating_sub(keys.len() as u64);
            spill.cold_bytes = spill.cold_bytes.saturating_sub(bytes);
        }
        drop(values);
        self.insert_unchanged(&rows)
    }

    /// One file of a sliced chain read newest file first (see
    /// [`restore_chain`](KeyedState::restore_chain)): its rows of the keys
    /// no newer file named go in as they are, and its removals of such keys
    /// join `gone`; then the store sheds past the limit. A key's value is
    /// the one the newest file naming it gave it, so nothing is read back
    /// from disk to be overwritten: a key is looked for, not read.
    pub(super) fn apply_unless_named(
        &mut self,
        bytes: &[u8],
        gone: &mut HashSet<Box<[u8]>>,
    ) -> Result<()> {
        let (upserts, removed) = self.read_delta(bytes)?;
        // Within one file its rows win over its removals (`apply_delta`
        // removes first), so they are taken first.
        let (named, _) = self.named(&upserts, gone)?;
        self.insert_unchanged(&filter_record_batch(&upserts, &not(&named)?)?)?;
        let (named, encoded) = self.named(&removed, gone)?;
        for r in 0..removed.num_rows() {
            if !named.value(r) {
                gone.insert(Box::from(encoded.row(r).as_ref()));
            }
        }
        self.settle()
    }

    /// Per row of `batch` (its first columns the key's), whether its key
    /// is already stored, in memory or on disk, or in `gone`; and the keys
    /// encoded.
    fn named(
        &self,
        batch: &RecordBatch,
        gone: &HashSet<Box<[u8]>>,
    ) -> Result<(BooleanArray, Rows)> {
        let stored = self.view();
        let keys = self.keys_of(batch)?;
        let encoded = self
            .converter
            .convert_columns(&batch.columns()[..self.key_columns])?;
        let disk = self
            .spill
            .as_ref()
            .and_then(|s| s.cold.as_ref().filter(|_| s.cold_rows > 0));
        let mut on_disk = Vec::new();
        let mut named = Vec::with_capacity(batch.num_rows());
        for r in 0..batch.num_rows() {
            let key = keys.get(r);
            let mut here = self.find(&stored, key.hash(&self.hasher), key).is_some()
                || gone.contains(encoded.row(r).as_ref());
            if let (false, Some(disk)) = (here, disk) {
                on_disk.clear();
                disk_key(encoded.row(r).as_ref(), &mut on_disk);
                here = disk
                    .rows()
                    .contains_key(on_disk.as_slice())
                    .map_err(|e| disk.error(e))?;
            }
            named.push(here);
        }
        Ok((BooleanArray::from(named), encoded))
    }

    /// Rows from their keys as on disk (`slices::disk_key`) and values.
    fn decode<K: AsRef<[u8]>>(&self, keys: &[K], values: &[fjall::Slice]) -> Result<RecordBatch> {
        let Some(spill) = &self.spill else {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        };
        let key_parser = self.converter.parser();
        let value_parser = spill.values.parser();
        let mut columns: Vec<ArrayRef> = self
            .converter
            .convert_rows(keys.iter().map(|k| key_parser.parse(&k.as_ref()[1..])))?;
        columns.extend(
            spill
                .values
                .convert_rows(values.iter().map(|v| value_parser.parse(v)))?,
        );
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// After a commit: tells the budget what the store holds in memory,
    /// and sheds to disk what it says, least recently touched first.
    pub(crate) fn settle(&mut self) -> Result<()> {
        // Only committed state leaves: with changes pending, next time.
        if self.spill.is_none() || self.has_changes() {
            return Ok(());
        }
        let rows_bytes = self.rows_bytes();
        let rows = self.rows.num_rows();
        // Growing the index's table holds the old one and the new, twice
        // its size, at once: at 100 M keys a moment of 480 MB for a 160 MB
        // table. When an epoch growing as much as the last would outgrow
        // it, the store counts the new table too, and if that is past the
        // limit it sheds within the table instead, down to the target of
        // its capacity.
        let capacity = self.index.capacity();
        let table = self.index_bytes() as u64;
        let disk = self.disk_memory_bytes();
        let Some(spill) = &mut self.spill else {
            return Ok(());
        };
        let outgrows = rows + std::mem::take(&mut spill.grown) > capacity;
        let bytes = rows_bytes + disk + if outgrows { 2 * table } else { 0 };
        spill.tick = spill.tick.saturating_add(1);
        let shed = spill.budget.report(spill.id, bytes);
        if shed == 0 || rows == 0 {
            return Ok(());
        }
        // What the disk keeps in memory grows as rows go there (its bloom
        // filters): only the rows can leave to make room.
        let mut n = (rows as f64 * shed as f64 / rows_bytes.max(1) as f64).ceil() as usize;
        if outgrows {
            n = n.max(rows.saturating_sub((TARGET * capacity as f64) as usize));
        }
        let n = n.min(rows);
        // The n least recently touched: those before the tick where the
        // count reaches n, then as many of its ties as make n. Ticks are
        // commits, far fewer than rows: counted, not sorted.
        let mut per_tick: std::collections::BTreeMap<u32, usize> = Default::default();
        for &t in &spill.touched {
            *per_tick.entry(t).or_default() += 1;
        }
        let (mut below, mut nth) = (0, 0);
        for (&t, &count) in &per_tick {
            nth = t;
            if below + count >= n {
                break;
            }
            below += count;
        }
        let mut ties = n - below;
        let out: BooleanArray = spill
            .touched
            .iter()
            .map(|&t| {
                Some(
                    t < nth
                        || (t == nth && ties > 0 && {
                            ties -= 1;
                            true
                        }),
                )
            })
            .collect();
        self.shed(&out)
    }

    /// Writes the rows where `out` is true to disk and drops them from
    /// memory, holding at most a slice of them and one column of the kept
    /// rows more than the state at a time.
    fn shed(&mut self, out: &BooleanArray) -> Result<()> {
        let Some(spill) = &mut self.spill else {
            return Ok(());
        };
        if spill.cold.is_none() {
            spill.cold = Some(spill.budget.disk()?);
        }
        if let Some(disk) = &spill.cold {
            for start in (0..out.len()).step_by(WRITE_ROWS) {
                let len = WRITE_ROWS.min(out.len() - start);
                let leaving =
                    filter_record_batch(&self.rows.slice(start, len), &out.slice(start, len))?;
                if leaving.num_rows() == 0 {
                    continue;
                }
                let (keys, values) = encode(&self.converter, spill, self.key_columns, &leaving)?;
                let mut batch = disk.batch();
                let mut key = Vec::new();
                for (encoded, value) in keys.iter().zip(values.iter()) {
                    key.clear();
                    disk_key(encoded.as_ref(), &mut key);
                    spill.cold_bytes += (key.len() + value.as_ref().len()) as u64;
                    batch.insert(disk.rows(), key.as_slice(), value.as_ref());
                }
                disk.commit(batch)?;
                spill.cold_rows += leaving.num_rows() as u64;
                if let Some(low) = &spill.lowest_of {
                    spill.cold_lowest = min_of(spill.cold_lowest, low(&leaving)?);
                }
            }
        }
        let kept = not(out)?;
        spill.kept(&kept);
        // Column by column, each old one let go once copied; and the old
        // index before the new one is built.
        let rows = std::mem::replace(
            &mut self.rows,
            RecordBatch::new_empty(Arc::clone(&self.schema)),
        );
        self.index = hashbrown::HashTable::new();
        let (schema, columns, _) = rows.into_parts();
        let mut kept_columns = Vec::with_capacity(columns.len());
        for column in columns {
            kept_columns.push(datafusion::arrow::compute::filter(&column, &kept)?);
        }
        self.set_rows(RecordBatch::try_new(schema, kept_columns)?)?;
        self.clear_changes();
        Ok(())
    }

    /// The rows on disk, a batch of up to `rows` at a time.
    pub(super) fn cold_batches(
        &self,
        rows: usize,
    ) -> impl Iterator<Item = Result<RecordBatch>> + '_ {
        self.cold_batches_of(None, rows)
    }

    /// The rows on disk of one slice (all without one), a batch of up to
    /// `rows` at a time.
    pub(super) fn cold_batches_of(
        &self,
        slice: Option<u8>,
        rows: usize,
    ) -> impl Iterator<Item = Result<RecordBatch>> + '_ {
        let pairs = self
            .spill
            .as_ref()
            .and_then(|s| s.cold.as_ref())
            .map(|disk| {
                let all: Box<dyn Iterator<Item = _>> = match slice {
                    Some(s) => Box::new(disk.rows().prefix([s])),
                    None => Box::new(disk.rows().iter()),
                };
                (disk, all)
            });
        let mut pairs = pairs
            .into_iter()
            .flat_map(|(disk, iter)| iter.map(move |kv| kv.map_err(|e| disk.error(e))));
        std::iter::from_fn(move || {
            let mut keys = Vec::with_capacity(rows);
            let mut values = Vec::with_capacity(rows);
            for kv in pairs.by_ref() {
                match kv {
                    Ok((k, v)) => {
                        keys.push(Box::from(k.as_ref()));
                        values.push(v);
                    }
                    Err(e) => return Some(Err(e)),
                }
                if keys.len() == rows {
                    break;
                }
            }
            (!keys.is_empty()).then(|| self.decode(&keys, &values))
        })
    }

    /// The rows on disk of `images`' slices, a batch at a time.
    pub(super) fn cold_images(
        &self,
        images: Images,
    ) -> impl Iterator<Item = Result<RecordBatch>> + '_ {
        images
            .iter()
            .flat_map(move |s| self.cold_batches_of(Some(s as u8), WRITE_ROWS))
    }

    /// Rows on disk.
    pub(crate) fn cold_rows(&self) -> u64 {
        self.spill.as_ref().map_or(0, |s| s.cold_rows)
    }

    /// Bytes the disk keeps in memory as it grows (its bloom filters);
    /// none before the store first shed.
    pub(super) fn disk_memory_bytes(&self) -> u64 {
        self.spill
            .as_ref()
            .and_then(|s| s.cold.as_ref())
            .map_or(0, Disk::memory_bytes)
    }

    /// Bytes on disk: the rows' encoded keys and values, before the
    /// store compresses them (its files lag behind what it holds in its
    /// journal and memtable).
    pub fn disk_bytes(&self) -> u64 {
        self.spill.as_ref().map_or(0, |s| s.cold_bytes)
    }

    /// Empties the disk side (the store is being replaced whole).
    pub(super) fn clear_cold(&mut self) -> Result<()> {
        if let Some(spill) = &mut self.spill {
            // Closed and its directory removed.
            spill.cold = None;
            spill.cold_rows = 0;
            spill.cold_lowest = None;
            spill.cold_bytes = 0;
        }
        Ok(())
    }
}

/// The disk's form of `rows`: their keys and their other columns, each
/// encoded with arrow-row (by `keys`, the store's key converter, and the
/// spill's converter of the rest; the key's columns are the first
/// `key_columns`).
fn encode(
    keys: &RowConverter,
    spill: &Spill,
    key_columns: usize,
    rows: &RecordBatch,
) -> Result<(Rows, Rows)> {
    Ok((
        keys.convert_columns(&rows.columns()[..key_columns])?,
        spill
            .values
            .convert_columns(&rows.columns()[key_columns..])?,
    ))
}

/// The lesser of two, either may be missing.
fn min_of(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Rows written to (or removed from) disk per batch: a batch holds its
/// writes in memory until it commits. Fewer in tests, so that theirs
/// take several.
const WRITE_ROWS: usize = if cfg!(test) { 1 << 10 } else { 1 << 16 };

/// Reads from more keys than this are split across two threads: each
/// read walks the LSM's levels (a few microseconds), and they only read.
const PARALLEL_READS: usize = 1 << 14;

/// The rows on `disk` of those of `keys` (sorted) it holds, in key order.
fn read_rows<'k>(disk: &Disk, keys: &[&'k [u8]]) -> Result<Vec<(&'k [u8], fjall::Slice)>> {
    let read = |keys: &[&'k [u8]]| -> Result<Vec<(&'k [u8], fjall::Slice)>> {
        let mut found = Vec::new();
        for &key in keys {
            if let Some(value) = disk.rows().get(key).map_err(|e| disk.error(e))? {
                found.push((key, value));
            }
        }
        Ok(found)
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if keys.len() < PARALLEL_READS || cores < 2 {
        return read(keys);
    }
    let (first, second) = keys.split_at(keys.len() / 2);
    let (found, rest) = std::thread::scope(|scope| {
        let rest = scope.spawn(|| read(second));
        (read(first), rest.join())
    });
    let rest =
        rest.map_err(|_| crate::SluiceError::Internal("a state read thread panicked".into()))?;
    let mut found = found?;
    found.extend(rest?);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::{AsArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};

    use super::*;

    /// `(k, n)` rows, `k` a BIGINT or text.
    fn rows(schema: &SchemaRef, keys: &[i64], counts: &[i64]) -> RecordBatch {
        let keys: ArrayRef = match schema.field(0).data_type() {
            DataType::Int64 => Arc::new(Int64Array::from(keys.to_vec())),
            _ => Arc::new(StringArray::from_iter_values(
                keys.iter().map(|k| format!("key-{k}")),
            )),
        };
        RecordBatch::try_new(
            Arc::clone(schema),
            vec![keys, Arc::new(Int64Array::from(counts.to_vec()))],
        )
        .unwrap()
    }

    /// Every row of `batch` as key text → count.
    fn contents(batch: &RecordBatch) -> BTreeMap<String, i64> {
        let keys = datafusion::arrow::compute::cast(batch.column(0), &DataType::Utf8).unwrap();
        let keys = keys.as_string::<i32>();
        let counts = batch.column(1).as_primitive::<Int64Type>();
        (0..batch.num_rows())
            .map(|i| (keys.value(i).to_string(), counts.value(i)))
            .collect()
    }

    /// Everything `state` holds, read by key as an operator reads it.
    fn read_all(state: &mut KeyedState, schema: &SchemaRef, keys: i64) -> BTreeMap<String, i64> {
        let every: Vec<i64> = (0..keys).collect();
        let probe = rows(schema, &every, &vec![0; every.len()]);
        state.fault_in(std::slice::from_ref(&probe)).unwrap();
        contents(&state.lookup(&[probe]).unwrap())
    }

    /// A store within a small budget, updated epoch after epoch by a
    /// read-modify-write of random keys (some removed), reads the same as
    /// one wholly in memory; its deltas and snapshots rebuild it.
    fn spills_and_reads_as_in_memory(key: DataType) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", key, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let keys = 20_000;
        let budget = StateBudget::new(96 << 10, None);
        let mut spilling = KeyedState::new(Arc::clone(&schema), 1)
            .unwrap()
            .within(Some(Arc::clone(&budget)))
            .unwrap();
        let mut plain = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        // Rebuilt from the checkpoint spilling writes: a snapshot, deltas.
        let mut snapshot = Vec::new();
        let mut deltas: Vec<Vec<u8>> = Vec::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as i64
        };
        let mut most_cold = 0;
        for epoch in 0..30 {
            let mut epoch_keys: Vec<i64> = (0..1_500).map(|_| next(keys as u64)).collect();
            epoch_keys.sort_unstable();
            epoch_keys.dedup();
            let adds: Vec<i64> = epoch_keys.iter().map(|k| k % 7 + 1).collect();
            let probe = rows(&schema, &epoch_keys, &adds);
            spilling.settle().unwrap();
            spilling.fault_in(std::slice::from_ref(&probe)).unwrap();
            let before = contents(&spilling.lookup(std::slice::from_ref(&probe)).unwrap());
            assert_eq!(
                before,
                contents(&plain.lookup(std::slice::from_ref(&probe)).unwrap()),
                "epoch {epoch}"
            );
            let counts: Vec<i64> = epoch_keys
                .iter()
                .zip(&adds)
                .map(|(k, a)| {
                    let text = contents(&rows(&schema, &[*k], &[0])).into_keys().next();
                    text.and_then(|t| before.get(&t)).copied().unwrap_or(0) + a
                })
                .collect();
            let new = rows(&schema, &epoch_keys, &counts);
            spilling.upsert(std::slice::from_ref(&new)).unwrap();
            plain.upsert(&[new]).unwrap();
            if epoch % 4 == 3 {
                let gone: Vec<i64> = (0..200).map(|_| next(keys as u64)).collect();
                let gone = rows(&schema, &gone, &vec![0; gone.len()]);
                spilling.fault_in(std::slice::from_ref(&gone)).unwrap();
                spilling.remove_keys(&gone).unwrap();
                plain.remove_keys(&gone).unwrap();
            }
            if epoch % 10 == 0 {
                snapshot.clear();
                spilling.snapshot_to(&mut snapshot).unwrap();
                spilling.clear_changes();
                deltas.clear();
            } else {
                deltas.push(spilling.delta().unwrap());
            }
            most_cold = most_cold.max(spilling.cold_rows());
            assert_eq!(spilling.num_rows(), plain.num_rows(), "epoch {epoch}");
        }
        spilling.settle().unwrap();
        assert!(most_cold > 1_000, "nothing went to disk: {most_cold}");
        assert!(spilling.disk_bytes() > spilling.cold_rows() * 8);
        assert!(
            spilling.num_bytes() < budget.limit(),
            "{} bytes in memory",
            spilling.num_bytes()
        );
        let want = read_all(&mut plain, &schema, keys);
        assert_eq!(read_all(&mut spilling, &schema, keys), want);
        // The checkpoint gives it back, into a store within the budget too.
        let mut restored = KeyedState::new(Arc::clone(&schema), 1)
            .unwrap()
            .within(Some(Arc::clone(&budget)))
            .unwrap();
        restored.restore(snapshot).unwrap();
        for d in &deltas {
            restored.apply_delta(d).unwrap();
        }
        assert!(restored.cold_rows() > 0);
        assert_eq!(read_all(&mut restored, &schema, keys), want);
    }

    /// A store within a budget writes a sliced chain (`slices`): no
    /// snapshot, no epoch writing the whole state, a chain that leaves its
    /// first files behind, and old files deleted; the chain rebuilds it.
    #[test]
    fn a_sliced_chain_rebuilds_the_store_and_carries_only_what_changed() {
        use crate::state::chain::{Chain, Staged};

        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let keys = 10_000;
        let budget = StateBudget::new(64 << 10, None);
        let within = || {
            KeyedState::new(Arc::clone(&schema), 1)
                .unwrap()
                .within(Some(Arc::clone(&budget)))
                .unwrap()
        };
        let mut spilling = within();
        let mut plain = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut chain = Chain::new("0.aggregate".into());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as i64
        };
        let mut update_bytes = Vec::new();
        for epoch in 1..=60u64 {
            let (epoch_keys, gone): (Vec<i64>, Vec<i64>) = if epoch <= 10 {
                (
                    ((epoch as i64 - 1) * 1_000..epoch as i64 * 1_000).collect(),
                    vec![],
                )
            } else {
                let mut k: Vec<i64> = (0..300).map(|_| next(keys)).collect();
                k.sort_unstable();
                k.dedup();
                let gone = match epoch % 7 {
                    0 => (0..20).map(|_| next(keys)).collect(),
                    _ => vec![],
                };
                (k, gone)
            };
            let new = rows(&schema, &epoch_keys, &vec![epoch as i64; epoch_keys.len()]);
            spilling.fault_in(std::slice::from_ref(&new)).unwrap();
            spilling.upsert(std::slice::from_ref(&new)).unwrap();
            plain.upsert(&[new]).unwrap();
            let gone = rows(&schema, &gone, &vec![0; gone.len()]);
            spilling.fault_in(std::slice::from_ref(&gone)).unwrap();
            spilling.remove_keys(&gone).unwrap();
            plain.remove_keys(&gone).unwrap();

            let staged = spilling.stage_sliced(chain.slicing()).unwrap().unwrap();
            assert!(!matches!(staged, Staged::Snapshot), "epoch {epoch}");
            let before = chain.files().to_vec();
            let files = chain
                .write(dir.path(), epoch, "r", staged, &mut |_| {
                    panic!("a sliced chain wrote a snapshot")
                })
                .unwrap();
            let written: u64 = files
                .iter()
                .filter(|f| !before.contains(f))
                .map(|f| std::fs::metadata(dir.path().join(f)).unwrap().len())
                .sum();
            if epoch > 10 {
                update_bytes.push(written);
            }
            chain.committed(dir.path(), files, 1).unwrap();
            spilling.clear_changes();
            spilling.settle().unwrap();
        }
        assert!(spilling.cold_rows() > 1_000, "{}", spilling.cold_rows());
        // The whole state's snapshot, to compare an epoch's bytes with.
        let mut whole = Vec::new();
        plain.snapshot_to(&mut whole).unwrap();
        let most = update_bytes.iter().max().copied().unwrap_or(0);
        assert!(
            most < whole.len() as u64 / 4,
            "an update epoch wrote {most} bytes, the whole state is {}",
            whole.len()
        );
        // The first files left the chain and the checkpoint.
        let first = chain.files().first().cloned().unwrap_or_default();
        assert!(!first.starts_with("state/0.aggregate/1."), "{first}");
        let on_disk = std::fs::read_dir(dir.path().join("state/0.aggregate"))
            .unwrap()
            .count();
        assert_eq!(on_disk, chain.files().len(), "{:?}", chain.files());

        let want = read_all(&mut plain, &schema, keys as i64);
        let mut restored = within();
        restored.restore_chain(&mut chain.read(dir.path())).unwrap();
        assert_eq!(read_all(&mut restored, &schema, keys as i64), want);
    }

    /// Rows leaving by a bound (closed windows) are found on disk once its
    /// least bound says so, and leave through the delta.
    #[test]
    fn rows_leaving_by_their_bound_are_taken_from_disk_too() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let budget = StateBudget::new(16 << 10, None);
        let lowest: LowestOf = Box::new(|rows| {
            Ok(datafusion::arrow::compute::min(
                rows.column(0).as_primitive::<Int64Type>(),
            ))
        });
        let mut s = KeyedState::new(Arc::clone(&schema), 1)
            .unwrap()
            .within(Some(budget))
            .unwrap()
            .leaving_by(lowest);
        let keys: Vec<i64> = (0..2_000).collect();
        s.upsert(&[rows(&schema, &keys, &keys)]).unwrap();
        let mut snapshot = Vec::new();
        s.snapshot_to(&mut snapshot).unwrap();
        s.clear_changes();
        s.settle().unwrap();
        assert!(s.cold_rows() > 1_000, "{}", s.cold_rows());
        // The least recently touched went first: all of them at once here.
        let low = s.cold_lowest().unwrap();
        assert!(low < 2_000);
        let below = |rows: &RecordBatch| -> Result<BooleanArray> {
            Ok(rows
                .column(0)
                .as_primitive::<Int64Type>()
                .iter()
                .map(|k| k.map(|k| k < 500))
                .collect())
        };
        let mut gone = contents(&s.remove_where(below).unwrap());
        gone.extend(contents(&s.remove_cold_where(below).unwrap()));
        assert_eq!(gone.len(), 500);
        assert!(gone.keys().all(|k| k.parse::<i64>().unwrap() < 500));
        assert_eq!(s.num_rows(), 1_500);
        assert!(s.cold_lowest().is_none_or(|low| low >= 500));
        // Nothing below is found again, on disk or through the checkpoint.
        assert!(s.remove_cold_where(below).unwrap().num_rows() == 0);
        let mut replica = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        replica.restore(snapshot).unwrap();
        replica.apply_delta(&s.delta().unwrap()).unwrap();
        assert_eq!(
            read_all(&mut replica, &schema, 2_000),
            read_all(&mut s, &schema, 2_000)
        );
        assert_eq!(replica.num_rows(), 1_500);
    }

    #[test]
    fn a_store_of_bigint_keys_spills_and_reads_as_in_memory() {
        spills_and_reads_as_in_memory(DataType::Int64);
    }

    #[test]
    fn a_store_of_text_keys_spills_and_reads_as_in_memory() {
        spills_and_reads_as_in_memory(DataType::Utf8);
    }

    /// Past the limit a store keeps within its index's table: an epoch
    /// that would outgrow it (and so hold the table and one twice as large
    /// at once) sheds instead, so the table stops growing once the store
    /// has shed, whatever the keys to come.
    #[test]
    fn past_the_limit_a_store_sheds_within_its_index_rather_than_grow_it() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let budget = StateBudget::new(256 << 10, None);
        let mut state = KeyedState::new(Arc::clone(&schema), 1)
            .unwrap()
            .within(Some(budget))
            .unwrap();
        let mut table = None;
        for epoch in 0..60 {
            state.settle().unwrap();
            let keys: Vec<i64> = (epoch * 1_000..(epoch + 1) * 1_000).collect();
            state
                .upsert(&[rows(&schema, &keys, &vec![1; keys.len()])])
                .unwrap();
            state.clear_changes();
            let buckets = state.index.num_buckets();
            match table {
                None if state.cold_rows() > 0 => table = Some(buckets),
                Some(first) => assert!(buckets <= first, "epoch {epoch}: {buckets} > {first}"),
                None => {}
            }
        }
        assert!(table.is_some(), "the store never shed");
        assert_eq!(state.num_rows(), 60_000);
    }
}
