//! The keyed state store: one operator's state, in memory, indexed by key.
//!
//! State is an Arrow `RecordBatch` whose first `key_columns` columns are the
//! key and the rest the operator's per-key state (for aggregation:
//! DataFusion's accumulator state fields), plus a hash index from the key's
//! row encoding (arrow-row) to the row. Per epoch the operator looks up the
//! keys it saw ([`KeyedState::lookup`]) and replaces their rows
//! ([`KeyedState::upsert`]).
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

use std::collections::{HashMap, HashSet};
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, Scalar, UInt32Array,
};
use datafusion::arrow::compute::kernels::cmp::lt_eq;
use datafusion::arrow::compute::{
    concat_batches, filter_record_batch, not, prep_null_mask_filter, take_record_batch,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::row::{RowConverter, SortField};

use crate::error::{Result, SluiceError};
use crate::watermark::nanos;
use crate::window::WindowKey;

/// One operator's keyed state.
#[derive(Debug)]
pub(crate) struct KeyedState {
    schema: SchemaRef,
    key_columns: usize,
    converter: RowConverter,
    /// Every key's row.
    rows: RecordBatch,
    /// Key (row-encoded) → row of `rows`.
    index: HashMap<Box<[u8]>, u32>,
    /// Keys upserted or removed since the last flush (snapshot or delta).
    touched: HashSet<Box<[u8]>>,
    /// Rows removed since the last flush (for their keys).
    removed: Vec<RecordBatch>,
}

impl KeyedState {
    /// Empty state with `schema`, keyed by its first `key_columns` columns.
    pub(crate) fn new(schema: SchemaRef, key_columns: usize) -> Result<Self> {
        let converter = RowConverter::new(
            schema.fields()[..key_columns]
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        Ok(Self {
            rows: RecordBatch::new_empty(Arc::clone(&schema)),
            schema,
            key_columns,
            converter,
            index: HashMap::new(),
            touched: HashSet::new(),
            removed: Vec::new(),
        })
    }

    /// Encoded keys of `batch`.
    fn keys(&self, batch: &RecordBatch) -> Result<Vec<Box<[u8]>>> {
        if self.key_columns == 0 {
            // A global aggregate: one key, the empty one.
            return Ok(vec![Box::from(&[][..]); batch.num_rows()]);
        }
        let rows = self
            .converter
            .convert_columns(&batch.columns()[..self.key_columns])?;
        Ok(rows.iter().map(|r| Box::from(r.as_ref())).collect())
    }

    /// The stored rows of the keys that appear in `probe`.
    pub(crate) fn lookup(&self, probe: &[RecordBatch]) -> Result<RecordBatch> {
        let mut wanted = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for batch in probe {
            for key in self.keys(batch)? {
                if let Some(&row) = self.index.get(&key) {
                    if seen.insert(row) {
                        wanted.push(row);
                    }
                }
            }
        }
        Ok(take_record_batch(&self.rows, &UInt32Array::from(wanted))?)
    }

    /// Removes and returns the stored rows whose `columns` (a part of the
    /// key) equal those of some row in `probe`.
    pub(crate) fn take_matching(
        &mut self,
        probe: &[RecordBatch],
        columns: &[usize],
    ) -> Result<RecordBatch> {
        let converter = RowConverter::new(
            columns
                .iter()
                .map(|&c| SortField::new(self.schema.field(c).data_type().clone()))
                .collect(),
        )?;
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
        let mut wanted = std::collections::HashSet::new();
        for b in probe {
            wanted.extend(encode(b)?);
        }
        let hit: BooleanArray = encode(&self.rows)?
            .iter()
            .map(|k| Some(wanted.contains(k)))
            .collect();
        if hit.true_count() == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let taken = filter_record_batch(&self.rows, &hit)?;
        let kept = filter_record_batch(&self.rows, &not(&hit)?)?;
        self.set_rows(kept)?;
        self.note_removed(&taken)?;
        Ok(taken)
    }

    /// True for each row of `batch` whose key is not stored.
    pub(crate) fn unseen(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        Ok(self
            .keys(batch)?
            .iter()
            .map(|k| Some(!self.index.contains_key(k)))
            .collect())
    }

    /// Replaces the rows of the keys in `new` (one row per key) and adds
    /// the keys not yet stored.
    pub(crate) fn upsert(&mut self, new: &[RecordBatch]) -> Result<()> {
        let mut replaced = vec![true; self.rows.num_rows()];
        for batch in new {
            for key in self.keys(batch)? {
                if let Some(&row) = self.index.get(&key) {
                    replaced[row as usize] = false;
                }
                self.touched.insert(key);
            }
        }
        let kept = filter_record_batch(&self.rows, &BooleanArray::from(replaced))?;
        let mut parts = vec![kept];
        parts.extend(new.iter().cloned());
        let rows = concat_batches(&self.schema, &parts)?;
        self.set_rows(rows)
    }

    fn set_rows(&mut self, rows: RecordBatch) -> Result<()> {
        let keys = self.keys(&rows)?;
        let mut index = HashMap::with_capacity(keys.len());
        for (i, key) in keys.into_iter().enumerate() {
            if index.insert(key, i as u32).is_some() {
                return Err(SluiceError::Internal(
                    "a key appears twice in operator state".into(),
                ));
            }
        }
        self.rows = rows;
        self.index = index;
        Ok(())
    }

    /// Removes and returns the rows whose window (`key`) has closed: its
    /// end is at or before `watermark` (ns since the Unix epoch).
    pub(crate) fn take_closed(&mut self, key: &WindowKey, watermark: i64) -> Result<RecordBatch> {
        let bound = nanos(self.rows.column(key.column))?;
        let last_open = watermark.saturating_sub(key.to_end_ns);
        let closed = lt_eq(&bound, &Scalar::new(Int64Array::from(vec![last_open])))?;
        // A null bound (no event time) never closes.
        let closed = if closed.null_count() > 0 {
            prep_null_mask_filter(&closed)
        } else {
            closed
        };
        if closed.true_count() == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let taken = filter_record_batch(&self.rows, &closed)?;
        let kept = filter_record_batch(&self.rows, &not(&closed)?)?;
        self.set_rows(kept)?;
        self.note_removed(&taken)?;
        Ok(taken)
    }

    fn note_removed(&mut self, rows: &RecordBatch) -> Result<()> {
        self.touched.extend(self.keys(rows)?);
        self.removed.push(rows.clone());
        Ok(())
    }

    /// Whether anything changed since the last flush.
    pub(crate) fn has_changes(&self) -> bool {
        !self.touched.is_empty()
    }

    /// Forgets the changes since the last flush (after a snapshot).
    pub(crate) fn clear_changes(&mut self) {
        self.touched.clear();
        self.removed.clear();
    }

    /// The changes since the last flush, then forgets them: the current
    /// rows of the keys upserted, and the keys removed (and not back). As
    /// bytes: the first part's length (8 bytes, little endian), then two
    /// Arrow IPC files, upserted rows and removed keys.
    pub(crate) fn delta(&mut self) -> Result<Vec<u8>> {
        let present: Vec<u32> = self
            .touched
            .iter()
            .filter_map(|k| self.index.get(k).copied())
            .collect();
        let upserts = take_record_batch(&self.rows, &UInt32Array::from(present))?;
        let mut gone = Vec::new();
        let mut seen = HashSet::new();
        for batch in &self.removed {
            let keys = self.keys(batch)?;
            let mask: BooleanArray = keys
                .into_iter()
                .map(|k| Some(!self.index.contains_key(&k) && seen.insert(k)))
                .collect();
            let rows = filter_record_batch(batch, &mask)?;
            gone.push(rows.project(&(0..self.key_columns).collect::<Vec<_>>())?);
        }
        let key_schema = Arc::new(
            self.schema
                .project(&(0..self.key_columns).collect::<Vec<_>>())?,
        );
        let gone = concat_batches(&key_schema, &gone)?;
        let first = ipc_bytes(&upserts)?;
        let mut out = Vec::with_capacity(8 + first.len());
        out.extend_from_slice(&(first.len() as u64).to_le_bytes());
        out.extend(first);
        out.extend(ipc_bytes(&gone)?);
        self.clear_changes();
        Ok(out)
    }

    /// Applies a [`delta`](Self::delta): removes its keys, then upserts
    /// its rows.
    pub(crate) fn apply_delta(&mut self, bytes: &[u8]) -> Result<()> {
        let damaged = || SluiceError::Internal("the state delta is truncated".into());
        let len = bytes.get(..8).ok_or_else(damaged)?;
        let len = u64::from_le_bytes(len.try_into().map_err(|_| damaged())?) as usize;
        let upserts = read_ipc(bytes.get(8..8 + len).ok_or_else(damaged)?, &self.schema)?;
        let key_schema = Arc::new(
            self.schema
                .project(&(0..self.key_columns).collect::<Vec<_>>())?,
        );
        let gone = read_ipc(bytes.get(8 + len..).ok_or_else(damaged)?, &key_schema)?;
        if gone.num_rows() > 0 {
            let dead: HashSet<Box<[u8]>> =
                self.keys_of_columns(gone.columns())?.into_iter().collect();
            let keep: BooleanArray = self
                .keys(&self.rows)?
                .into_iter()
                .map(|k| Some(!dead.contains(&k)))
                .collect();
            let kept = filter_record_batch(&self.rows, &keep)?;
            self.set_rows(kept)?;
        }
        self.upsert(&[upserts])?;
        self.clear_changes();
        Ok(())
    }

    fn keys_of_columns(&self, columns: &[ArrayRef]) -> Result<Vec<Box<[u8]>>> {
        if self.key_columns == 0 {
            let n = columns.first().map_or(0, |c| c.len());
            return Ok(vec![Box::from(&[][..]); n]);
        }
        let rows = self.converter.convert_columns(columns)?;
        Ok(rows.iter().map(|r| Box::from(r.as_ref())).collect())
    }

    /// Every stored row.
    pub(crate) fn all(&self) -> &RecordBatch {
        &self.rows
    }

    /// Number of keys held.
    pub(crate) fn num_rows(&self) -> u64 {
        self.rows.num_rows() as u64
    }

    /// Bytes held (Arrow buffers and the index).
    pub(crate) fn num_bytes(&self) -> u64 {
        let index: usize = self
            .index
            .keys()
            .map(|k| k.len() + std::mem::size_of::<(Box<[u8]>, u32)>())
            .sum();
        (self.rows.get_array_memory_size() + index) as u64
    }

    /// The whole state as Arrow IPC file bytes.
    pub(crate) fn snapshot(&self) -> Result<Vec<u8>> {
        ipc_bytes(&self.rows)
    }

    /// Replaces the state with a snapshot's.
    pub(crate) fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let rows = read_ipc(bytes, &self.schema)?;
        self.clear_changes();
        self.set_rows(rows)
    }
}

/// `batch` as Arrow IPC file bytes.
fn ipc_bytes(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = FileWriter::try_new(&mut out, &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

/// Arrow IPC file bytes as one batch of `schema` (the stored schema may
/// differ in field metadata from the current plan's; the columns match).
fn read_ipc(bytes: &[u8], schema: &SchemaRef) -> Result<RecordBatch> {
    let reader = FileReader::try_new(Cursor::new(bytes), None)?;
    let batches = reader
        .map(|b| {
            let b = b?;
            RecordBatch::try_new(Arc::clone(schema), b.columns().to_vec())
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(concat_batches(schema, &batches)?)
}

#[cfg(test)]
mod tests {
    use super::*;
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
