//! The keyed state store: one operator's state, in memory, indexed by key.
//!
//! State is an Arrow `RecordBatch` whose first `key_columns` columns are the
//! key and the rest the operator's per-key state (for aggregation:
//! DataFusion's accumulator state fields), plus a hash index from the key's
//! row encoding (arrow-row) to the row. Per epoch the operator looks up the
//! keys it saw ([`KeyedState::lookup`]) and replaces their rows
//! ([`KeyedState::upsert`]).
//!
//! Durability: after every epoch the whole state is written to the
//! checkpoint as an Arrow IPC snapshot, `state/<operator>/<epoch>.<run>.snapshot`,
//! *before* the epoch commits; the commit record (and the Kafka progress
//! record) names the file, and recovery loads only a file a committed record
//! names. Files carry the writing run's id, so a zombie and its replacement
//! never write the same file. Snapshots of older epochs are deleted once
//! a newer one is committed.

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray, Int64Array, RecordBatch, Scalar, UInt32Array};
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
        Ok(taken)
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
        let mut out = Vec::new();
        let mut w = FileWriter::try_new(&mut out, &self.schema)?;
        w.write(&self.rows)?;
        w.finish()?;
        drop(w);
        Ok(out)
    }

    /// Replaces the state with a snapshot's.
    pub(crate) fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let reader = FileReader::try_new(Cursor::new(bytes), None)?;
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = concat_batches(&self.schema, &batches)?;
        self.set_rows(rows)
    }
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
}
