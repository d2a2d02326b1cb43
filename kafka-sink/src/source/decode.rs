//! A Kafka source's records to rows: each partition's records decoded
//! in parallel, all at once on the fast path and one at a time when a
//! record is bad (to name it, skip it or dead-letter it, as
//! `format.on-error` says); the declared columns taken from the value or
//! the key; Debezium change events as signed rows; an upsert stream's
//! records as values and deletions; then the virtual columns.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, ArrayRef, BinaryArray, BooleanArray, Int32Array, Int64Array, RecordBatch,
    StringArray, TimestampNanosecondArray, UInt32Array,
};
use datafusion::arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use sluice_engine::{DeadLetter, Partitions, Result, SluiceError};

use super::columns::{KeyColumns, KeyFormat, SourceFormat};
use super::config::OnError;
use super::fetch::{Fetched, Record, Taken};
use super::{debezium, SourceInner};
use crate::format::json::decode_json;

impl SourceInner {
    /// Decodes each partition's records, a batch per chunk, in parallel
    /// (JSON decoding is most of a read) on at most one thread per core,
    /// whatever the number of partitions: a 2,000-partition topic gets a
    /// few threads, not 2,000, and one partition's chunks share the cores.
    /// An upsert stream's partition is decoded whole, in one batch.
    pub(super) fn decode_partitions(&self, partitions: Taken) -> Result<Partitions> {
        // (index in `partitions`, partition, the chunks that make one batch)
        let mut items: Vec<(usize, i32, &[Fetched])> = Vec::new();
        for (i, (p, chunks)) in partitions.iter().enumerate() {
            if self.config.upsert || chunks.len() <= 1 {
                items.push((i, *p, chunks));
            } else {
                items.extend(chunks.chunks(1).map(|c| (i, *p, c)));
            }
        }
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(items.len());
        if workers == 0 {
            return Ok(Vec::new());
        }
        let items = &items;
        let mut decoded = std::thread::scope(|scope| {
            let decoders: Vec<_> = (0..workers)
                .map(|w| {
                    scope.spawn(move || {
                        items
                            .iter()
                            .enumerate()
                            .skip(w)
                            .step_by(workers)
                            .map(|(n, &(i, p, chunks))| Ok((n, i, self.decode_chunks(p, chunks)?)))
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut decoded = Vec::with_capacity(items.len());
            for d in decoders {
                decoded.extend(d.join().map_err(|_| {
                    SluiceError::Internal("a Kafka decoder thread panicked".into())
                })??);
            }
            Ok::<_, SluiceError>(decoded)
        })?;
        decoded.sort_unstable_by_key(|(n, ..)| *n);
        let mut out: Partitions = vec![Vec::new(); partitions.len()];
        for (_, i, batch) in decoded {
            out[i].push(batch);
        }
        Ok(out)
    }

    /// One batch of partition `p`'s rows from `chunks`.
    pub(super) fn decode_chunks(&self, p: i32, chunks: &[Fetched]) -> Result<RecordBatch> {
        self.decode(p, &self.records(chunks))
    }

    /// The records of `chunks` that make rows: a tombstone (no value, as
    /// Kafka defines it) deletes a key in a compacted topic, so on an
    /// append stream it is no row, and is skipped and counted; an upsert
    /// stream keeps it to delete its key.
    fn records<'a>(&self, chunks: &'a [Fetched]) -> Vec<Record<'a>> {
        let mut records = Vec::with_capacity(chunks.iter().map(Fetched::len).sum());
        for chunk in chunks {
            records.extend(chunk.records());
        }
        if !self.config.upsert {
            let before = records.len();
            records.retain(|r| !r.tombstone);
            let tombstones = before - records.len();
            if tombstones > 0 {
                self.rejected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .skipped += tombstones as u64;
            }
        }
        records
    }

    fn decode(&self, partition: i32, records: &[Record]) -> Result<RecordBatch> {
        // A registry that cannot be asked stops the query; it must not make
        // every record look malformed.
        if let Some(confluent) = &self.config.confluent {
            confluent.resolve(records.iter().map(|r| r.value))?;
        }
        if let Some(protobuf) = &self.config.protobuf {
            protobuf.resolve(records.iter().map(|r| r.value))?;
        }
        if let Some(KeyColumns {
            format: KeyFormat::AvroConfluent(confluent),
            ..
        }) = &self.config.key
        {
            confluent.resolve(records.iter().filter_map(|r| r.key))?;
        }
        let (batch, from) = match self.decode_all(records) {
            Ok(decoded) => decoded,
            // Name the bad record, or drop it: decode one at a time.
            Err(_) => self.decode_each(partition, records)?,
        };
        let kept: Vec<&Record> = from.into_iter().map(|i| &records[i]).collect();
        let topic = self.config.topic.as_str();
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.push(Arc::new(StringArray::from_iter(
            kept.iter().map(|r| r.key.map(String::from_utf8_lossy)),
        )));
        columns.push(Arc::new(StringArray::new_repeated(topic, kept.len())));
        columns.push(Arc::new(Int32Array::from_iter_values(
            kept.iter().map(|_| partition),
        )));
        columns.push(Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|r| r.offset),
        )));
        columns.push(Arc::new(TimestampNanosecondArray::from_iter(
            kept.iter().map(|r| r.timestamp_ms.map(|t| t * 1_000_000)),
        )));
        Ok(RecordBatch::try_new(
            Arc::clone(&self.config.schema),
            columns,
        )?)
    }

    /// All records at once, the fast path: their rows, and the record each
    /// row came from (one row each, but a Debezium update's two).
    fn decode_all(&self, records: &[Record]) -> Result<(RecordBatch, Vec<usize>)> {
        if self.key_read.load(Ordering::Relaxed) {
            text_keys(records)?;
        }
        if self.config.upsert {
            return self.decode_upserts(records);
        }
        if self.config.format == SourceFormat::DebeziumJson {
            return debezium::decode(&self.config.value_schema, records.iter().map(|r| r.value));
        }
        let batch = self.decode_one_each(&records.iter().collect::<Vec<_>>())?;
        if batch.num_rows() != records.len() {
            return Err(SluiceError::plan(format!(
                "{} records decoded into {} rows",
                records.len(),
                batch.num_rows()
            )));
        }
        Ok((batch, (0..records.len()).collect()))
    }

    /// An upsert stream's records, every one in order: a value as its row
    /// marked not deleted, a tombstone as its key columns marked deleted.
    /// Every record is kept, not only each key's last: a temporal join
    /// reads each version (the engine keeps each key's last where it
    /// needs only that, `upsert::split` and `operator::normalize`).
    fn decode_upserts(&self, records: &[Record]) -> Result<(RecordBatch, Vec<usize>)> {
        let Some(key) = &self.config.key else {
            return Err(SluiceError::Internal(
                "an upsert stream without its key".into(),
            ));
        };
        if records.iter().any(|r| r.key.is_none()) {
            return Err(SluiceError::plan(
                "an upsert record without a key (the key says which row it is)",
            ));
        }
        let (dead, live): (Vec<usize>, Vec<usize>) =
            (0..records.len()).partition(|&i| records[i].tombstone);
        let pick = |idx: &[usize]| idx.iter().map(|&i| &records[i]).collect::<Vec<_>>();
        let schema = &self.config.value_schema;
        let marker = |n: usize, deleted: bool| -> ArrayRef {
            Arc::new(BooleanArray::from(vec![deleted; n]))
        };
        let mut batches = Vec::new();
        if !live.is_empty() {
            let values = self.decode_one_each(&pick(&live))?;
            let mut columns = values.columns().to_vec();
            columns.push(marker(live.len(), false));
            batches.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
        }
        if !dead.is_empty() {
            let keys = decode_keys(key, &pick(&dead))?;
            let mut columns: Vec<ArrayRef> = self
                .config
                .declared
                .fields()
                .iter()
                .map(|f| match keys.column_by_name(f.name()) {
                    Some(c) => Arc::clone(c),
                    None => new_null_array(f.data_type(), dead.len()),
                })
                .collect();
            columns.push(marker(dead.len(), true));
            batches.push(RecordBatch::try_new(Arc::clone(schema), columns)?);
        }
        let both = concat_batches(schema, &batches)?;
        if dead.is_empty() || live.is_empty() {
            return Ok((both, (0..records.len()).collect()));
        }
        // Back in the records' order: row `live.len() + j` is `dead[j]`.
        let mut at = vec![0u32; records.len()];
        for (row, &i) in live.iter().chain(&dead).enumerate() {
            at[i] = row as u32;
        }
        let ordered = take_record_batch(&both, &UInt32Array::from(at))?;
        Ok((ordered, (0..records.len()).collect()))
    }

    /// The rows of records that hold one each.
    fn decode_one_each(&self, records: &[&Record]) -> Result<RecordBatch> {
        let values = self.decode_values(records)?;
        let Some(key) = &self.config.key else {
            return Ok(values);
        };
        let keys = decode_keys(key, records)?;
        // The declared columns in order, each from the key or the value.
        let columns = self
            .config
            .declared
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let part = if key.fields.contains(&i) {
                    &keys
                } else {
                    &values
                };
                part.column_by_name(f.name()).cloned().ok_or_else(|| {
                    SluiceError::Internal(format!("decoded rows lack column '{}'", f.name()))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(
            Arc::clone(&self.config.declared),
            columns,
        )?)
    }

    /// The columns the records' values hold.
    fn decode_values(&self, records: &[&Record]) -> Result<RecordBatch> {
        // No JSON, Avro or Protobuf value is empty: an empty one is a bad
        // record (a tombstone has no value at all), as Flink's formats
        // find it.
        if self.config.format != SourceFormat::Raw && records.iter().any(|r| r.value.is_empty()) {
            return Err(SluiceError::plan(
                "an empty value, which no record of this format has (a tombstone has no value \
                 at all, and is skipped on a stream that is not upsert-kafka)",
            ));
        }
        match self.config.format {
            SourceFormat::Raw => Ok(RecordBatch::try_new(
                Arc::clone(&self.config.value_part),
                vec![Arc::new(raw_strings(records)?)],
            )?),
            SourceFormat::Json => {
                decode_json(&self.config.value_part, records.iter().map(|r| r.value))
            }
            SourceFormat::Avro => match &self.config.avro {
                Some(avro) => avro.decode(records.iter().map(|r| r.value)),
                None => Err(SluiceError::Internal(
                    "avro source without a decoder".into(),
                )),
            },
            SourceFormat::AvroConfluent => match &self.config.confluent {
                Some(c) => c.decode(records.iter().map(|r| r.value)),
                None => Err(SluiceError::Internal(
                    "avro-confluent source without a decoder".into(),
                )),
            },
            SourceFormat::ProtobufConfluent => match &self.config.protobuf {
                Some(p) => p.decode(records.iter().map(|r| r.value)),
                None => Err(SluiceError::Internal(
                    "protobuf-confluent source without a decoder".into(),
                )),
            },
            SourceFormat::DebeziumJson => Err(SluiceError::Internal(
                "Debezium events are changes, not values".into(),
            )),
        }
    }

    /// One record at a time: names the bad one, or skips it.
    /// Returns the rows and the indices of the records they came from.
    fn decode_each(&self, partition: i32, records: &[Record]) -> Result<(RecordBatch, Vec<usize>)> {
        let mut batches = Vec::new();
        let mut kept = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match self.decode_all(std::slice::from_ref(r)) {
                Ok((b, _)) => {
                    kept.extend(std::iter::repeat_n(i, b.num_rows()));
                    batches.push(b);
                }
                Err(e) => {
                    let problem = e.to_string();
                    match &self.config.on_error {
                        OnError::Skip => {
                            tracing::warn!(topic = %self.config.topic, partition, offset = r.offset, %problem, "skipping a malformed record");
                            self.rejected
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .skipped += 1;
                        }
                        OnError::DeadLetter(topic) => {
                            let headers = vec![
                                ("sluice.error".to_string(), problem),
                                ("sluice.source.topic".to_string(), self.config.topic.clone()),
                                ("sluice.source.partition".to_string(), partition.to_string()),
                                ("sluice.source.offset".to_string(), r.offset.to_string()),
                            ];
                            self.rejected
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .dead_letters
                                .push(DeadLetter {
                                    topic: topic.clone(),
                                    key: r.key.map(<[u8]>::to_vec),
                                    value: r.value.to_vec(),
                                    headers,
                                });
                        }
                        OnError::Fail => {
                            return Err(SluiceError::External {
                                what: format!(
                                "kafka source '{}': topic '{}', partition {partition}, offset {}",
                                self.config.stream, self.config.topic, r.offset
                            ),
                                message: format!("malformed record: {problem}"),
                                hint: Some(
                                    "fix the producer, or set 'format.on-error' = 'skip' to drop \
                                     such records ('dead-letter' to keep them in another topic)"
                                        .into(),
                                ),
                            })
                        }
                    }
                }
            }
        }
        Ok((concat_batches(&self.config.value_schema, &batches)?, kept))
    }
}

/// The records' values as one string column, built in one allocation
/// of the exact size (grown by doubling, a chunk's values were copied
/// twice more and faulted in anew), and checked to be UTF-8 at once.
fn raw_strings(records: &[&Record]) -> Result<StringArray> {
    let total: usize = records.iter().map(|r| r.value.len()).sum();
    let too_long = || SluiceError::Internal(format!("{total} bytes of values in one batch"));
    let mut values = Vec::with_capacity(total);
    let mut offsets = Vec::with_capacity(records.len() + 1);
    offsets.push(0i32);
    for r in records {
        values.extend_from_slice(r.value);
        offsets.push(i32::try_from(values.len()).map_err(|_| too_long())?);
    }
    StringArray::try_new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from(values),
        None,
    )
    .map_err(|e| SluiceError::plan(format!("the value is not UTF-8 text: {e}")))
}

/// Refuses a record whose key is not UTF-8 text where the query reads
/// `_key`, a VARCHAR: given with replacement characters, distinct binary
/// keys (Avro, a `LongSerializer`'s) would become one, and be grouped or
/// joined as one.
fn text_keys(records: &[Record]) -> Result<()> {
    for key in records.iter().filter_map(|r| r.key) {
        if let Err(e) = std::str::from_utf8(key) {
            return Err(SluiceError::plan(format!(
                "the record key is not UTF-8 text ({e}), and the query reads it as _key, a \
                 VARCHAR: read a binary key as a BYTES key column ('key.format' = 'raw', \
                 'key.fields', 'value.fields-include' = 'EXCEPT_KEY'), or leave _key out"
            )));
        }
    }
    Ok(())
}

/// The key columns of `records`, decoded from their keys.
fn decode_keys(key: &KeyColumns, records: &[&Record]) -> Result<RecordBatch> {
    let keys = records
        .iter()
        .map(|r| {
            r.key.ok_or_else(|| {
                SluiceError::plan(format!(
                    "the record has no key, but its columns {} come from the key",
                    sluice_engine::columns(&key.schema)
                ))
            })
        })
        .collect::<Result<Vec<&[u8]>>>()?;
    match &key.format {
        KeyFormat::Json => decode_json(&key.schema, keys),
        KeyFormat::Raw if key.schema.field(0).data_type().is_binary() => {
            let bytes = BinaryArray::from_iter_values(keys);
            let bytes = datafusion::arrow::compute::cast(&bytes, key.schema.field(0).data_type())?;
            Ok(RecordBatch::try_new(Arc::clone(&key.schema), vec![bytes])?)
        }
        KeyFormat::Raw => {
            let text = keys
                .into_iter()
                .map(|k| std::str::from_utf8(k).map(Some))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| SluiceError::plan(format!("the key is not UTF-8 text: {e}")))?;
            let text = datafusion::arrow::compute::cast(
                &StringArray::from(text),
                key.schema.field(0).data_type(),
            )?;
            Ok(RecordBatch::try_new(Arc::clone(&key.schema), vec![text])?)
        }
        KeyFormat::AvroConfluent(decoder) => decoder
            .decode(keys.into_iter())
            .map_err(|e| SluiceError::plan(format!("key: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value: &[u8]) -> Record<'_> {
        Record {
            key: None,
            value,
            tombstone: false,
            offset: 0,
            timestamp_ms: None,
        }
    }

    #[test]
    fn raw_values_become_one_exactly_sized_string_column_or_a_named_utf8_error() {
        let (a, b, empty) = (record(b"alpha"), record("bêta".as_bytes()), record(b""));
        let strings = raw_strings(&[&a, &b, &empty]).unwrap();
        assert_eq!(
            strings.iter().collect::<Vec<_>>(),
            [Some("alpha"), Some("bêta"), Some("")]
        );
        assert_eq!(strings.value_data().len(), "alphabêta".len());

        let bad = record(&[b'o', 0xff, b'k']);
        let e = raw_strings(&[&a, &bad]).unwrap_err().to_string();
        assert!(e.contains("the value is not UTF-8 text"), "{e}");
    }
}
