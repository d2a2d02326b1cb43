//! The `memory` source: batches a program appends while a query runs (tests).
//!
//! The offset is the number of batches: `{"batches": n}`. Batches are only
//! ever appended, so a replayed range reads the same batches.

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
    batches: Arc<Mutex<Vec<RecordBatch>>>,
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
        self.lock().push(batch);
        Ok(())
    }

    /// Number of batches appended so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing was appended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RecordBatch>> {
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
        Ok(vec![batches.to_vec()])
    }

    async fn prepare_available_now(&self) -> Result<()> {
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.stream.len());
        Ok(())
    }
}
