//! The `memory` source: batches a program appends while a query runs (tests).
//!
//! The offset is the number of batches: `{"batches": n}`. Batches are only
//! ever appended, so a replayed range reads the same batches, unless the
//! program released them ([`MemoryStream::release`]).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::{Offset, Partitions, Source, SourceFactory};
use crate::error::{Result, SluiceError};

/// An append-only in-memory stream, shared by the program that feeds it and
/// the queries that read it (Spark's `MemoryStream`).
///
/// ```
/// use std::sync::Arc;
/// use sluice_engine::arrow::array::Int64Array;
/// use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// use sluice_engine::arrow::record_batch::RecordBatch;
/// use sluice_engine::MemoryStream;
///
/// let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
/// let input = MemoryStream::new(schema.clone());
/// input.add_batch(RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))])?)?;
/// assert_eq!(input.len(), 1);
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStream {
    schema: SchemaRef,
    /// Every batch appended, `None` once released.
    batches: Arc<Mutex<Vec<Option<RecordBatch>>>>,
}

impl MemoryStream {
    /// An empty stream of rows with `schema`.
    pub fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            batches: Arc::default(),
        }
    }

    /// The rows' schema.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Appends one batch; it will be read by one epoch.
    pub fn add_batch(&self, batch: RecordBatch) -> Result<()> {
        if batch.schema().fields() != self.schema.fields() {
            return Err(SluiceError::plan(format!(
                "batch schema {:?} does not match the stream's schema {:?}",
                batch.schema(),
                self.schema
            )));
        }
        self.lock().push(Some(batch));
        Ok(())
    }

    /// Frees the first `count` batches, for a program that feeds a long
    /// run and knows every query reading the stream has committed them (a
    /// source such as Kafka holds nothing it has handed over either). A
    /// query that would read them again (a restart from an older
    /// checkpoint, a new query from the start) fails, naming the release.
    pub fn release(&self, count: usize) {
        for batch in self.lock().iter_mut().take(count) {
            *batch = None;
        }
    }

    /// Number of batches appended so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing was appended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<RecordBatch>>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reads a [`MemoryStream`]; every query gets its own position.
#[derive(Debug)]
pub struct MemorySourceFactory {
    stream: MemoryStream,
}

impl MemorySourceFactory {
    /// A factory over `stream`.
    pub fn new(stream: MemoryStream) -> Self {
        Self { stream }
    }
}

impl SourceFactory for MemorySourceFactory {
    fn schema(&self) -> SchemaRef {
        self.stream.schema()
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(MemorySource {
            stream: self.stream.clone(),
            cap: Mutex::new(None),
        }))
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

#[derive(Debug)]
struct MemorySource {
    stream: MemoryStream,
    cap: Mutex<Option<usize>>,
}

fn position(offset: Option<&Offset>) -> Result<usize> {
    match offset {
        None => Ok(0),
        Some(o) => o
            .get("batches")
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| SluiceError::Internal(format!("memory source offset {o}"))),
    }
}

#[async_trait]
impl Source for MemorySource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let start = position(start)?;
        let mut end = self.stream.len();
        if let Some(cap) = *self.cap.lock().unwrap_or_else(|p| p.into_inner()) {
            end = end.min(cap);
        }
        Ok((end > start).then(|| serde_json::json!({ "batches": end })))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let (start, end) = (position(start)?, position(Some(end))?);
        let all = self.stream.lock();
        let batches = all.get(start..end).ok_or_else(|| {
            SluiceError::plan(format!(
                "memory stream has {} batches but the checkpoint asks for batches {start}..{end}; \
                 a memory stream must be refilled with the same batches before a restart",
                all.len()
            ))
        })?;
        let batches = batches
            .iter()
            .cloned()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                SluiceError::plan(format!(
                    "memory stream batches {start}..{end} were released \
                 (MemoryStream::release) and cannot be read again"
                ))
            })?;
        Ok(vec![batches])
    }

    async fn prepare_available_now(&self) -> Result<()> {
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.stream.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[tokio::test]
    async fn released_batches_are_freed_and_reading_them_again_fails() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let stream = MemoryStream::new(Arc::clone(&schema));
        for x in 0..3 {
            let column = Arc::new(Int64Array::from(vec![x]));
            stream
                .add_batch(RecordBatch::try_new(Arc::clone(&schema), vec![column]).unwrap())
                .unwrap();
        }
        let source = MemorySourceFactory::new(stream.clone()).create().unwrap();
        let offset = |n: u64| serde_json::json!({ "batches": n });
        stream.release(2);
        assert_eq!(stream.len(), 3);
        assert!(stream.lock()[..2].iter().all(Option::is_none));
        let read = source.read(Some(&offset(2)), &offset(3)).await.unwrap();
        assert_eq!(read[0].len(), 1);
        assert_eq!(read[0][0].num_rows(), 1);
        let err = source.read(Some(&offset(1)), &offset(3)).await.unwrap_err();
        assert!(err.to_string().contains("released"), "{err}");
    }
}
