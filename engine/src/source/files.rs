//! The `files` source: new files in a directory become new rows.
//!
//! Each epoch lists the directory and reads the files it has not read before
//! (oldest modification time first, at most `max_files_per_epoch`). The
//! offset is the sorted list of every file read so far, so a replayed epoch
//! reads exactly the files it read the first time. Files whose names start
//! with `.` or `_` are ignored: write a file under such a name and rename it
//! into place, so a half-written file is never read.
//!
//! Decoding is vectorised (arrow-json, arrow-csv, the parquet reader).

use std::collections::BTreeSet;
use std::fs;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::csv;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::json;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::{Offset, Partitions, Source, SourceFactory};
use crate::error::{Result, SluiceError};

const BATCH_ROWS: usize = 8192;

/// How the files are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Json,
    Csv { header: bool },
    Parquet,
}

/// Creates the sources of a stream over the files in `dir`.
#[derive(Debug)]
pub(crate) struct FilesFactory {
    dir: PathBuf,
    format: Format,
    schema: SchemaRef,
    max_files: usize,
}

impl FilesFactory {
    /// A factory over the directory `dir`, whose files have `format` and,
    /// when not `declared`, the columns inferred from the files there.
    pub(crate) fn new(
        dir: PathBuf,
        format: Format,
        declared: Option<SchemaRef>,
        max_files: usize,
    ) -> Result<Self> {
        if !dir.is_dir() {
            return Err(SluiceError::config(format!(
                "files source: '{}' is not a directory; create it or fix 'path'",
                dir.display()
            )));
        }
        let schema = match declared {
            Some(s) => s,
            None => infer_schema(&dir, format)?,
        };
        Ok(Self {
            dir,
            format,
            schema,
            max_files,
        })
    }
}

impl SourceFactory for FilesFactory {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(FilesSource {
            dir: self.dir.clone(),
            format: self.format,
            schema: Arc::clone(&self.schema),
            max_files: self.max_files,
            cap: Mutex::new(None),
        }))
    }

    fn describe(&self) -> String {
        format!("files({}, {:?})", self.dir.display(), self.format)
    }

    fn identity(&self) -> Option<String> {
        Some(format!("files {}", self.dir.display()))
    }
}

#[derive(Debug)]
struct FilesSource {
    dir: PathBuf,
    format: Format,
    schema: SchemaRef,
    max_files: usize,
    /// Files present when prepared for available-now; later ones wait.
    cap: Mutex<Option<BTreeSet<String>>>,
}

/// Visible files of `dir`, oldest first (name breaks ties).
fn list(dir: &Path) -> Result<Vec<String>> {
    let io = |e| SluiceError::io(format!("listing {}", dir.display()), e);
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let meta = entry.metadata().map_err(io)?;
        if meta.is_file() {
            files.push((meta.modified().ok(), name));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, n)| n).collect())
}

fn seen(offset: Option<&Offset>) -> Result<BTreeSet<String>> {
    match offset {
        None => Ok(BTreeSet::new()),
        Some(o) => serde_json::from_value(o.get("files").cloned().unwrap_or_default())
            .map_err(|e| SluiceError::Internal(format!("files source offset: {e}"))),
    }
}

fn infer_schema(dir: &Path, format: Format) -> Result<SchemaRef> {
    let first = list(dir)?.into_iter().next().ok_or_else(|| {
        SluiceError::config(format!(
            "files source: cannot infer columns, '{}' has no files yet; declare the columns \
             (CREATE STREAM s (a BIGINT, ...) or .schema(..)) or add a file first",
            dir.display()
        ))
    })?;
    let path = dir.join(first);
    let open = || {
        fs::File::open(&path).map_err(|e| SluiceError::io(format!("opening {}", path.display()), e))
    };
    let schema = match format {
        Format::Json => {
            let (schema, _) = json::reader::infer_json_schema(BufReader::new(open()?), Some(1000))?;
            schema
        }
        Format::Csv { header } => {
            let (schema, _) = csv::reader::Format::default()
                .with_header(header)
                .infer_schema(BufReader::new(open()?), Some(1000))?;
            schema
        }
        Format::Parquet => ParquetRecordBatchReaderBuilder::try_new(open()?)
            .map_err(|e| SluiceError::config(format!("{}: {e}", path.display())))?
            .schema()
            .as_ref()
            .clone(),
    };
    Ok(Arc::new(schema))
}

fn decode(path: &Path, format: Format, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let file = fs::File::open(path)
        .map_err(|e| SluiceError::io(format!("opening {}", path.display()), e))?;
    let bad = |e: String| SluiceError::External {
        what: format!("files source, file {}", path.display()),
        message: e,
        hint: Some("fix or remove the file; the query stops rather than skip it".into()),
    };
    match format {
        Format::Json => json::ReaderBuilder::new(Arc::clone(schema))
            .with_batch_size(BATCH_ROWS)
            .build(BufReader::new(file))
            .map_err(|e| bad(e.to_string()))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string())),
        Format::Csv { header } => csv::ReaderBuilder::new(Arc::clone(schema))
            .with_header(header)
            .with_batch_size(BATCH_ROWS)
            .build(file)
            .map_err(|e| bad(e.to_string()))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string())),
        Format::Parquet => {
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| bad(e.to_string()))?
                .with_batch_size(BATCH_ROWS)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let batches = reader
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))?;
            batches
                .iter()
                .map(|b| conform(b, schema).map_err(|e| bad(e.to_string())))
                .collect()
        }
    }
}

/// `batch` with the columns of `schema`, picked by name and cast to the
/// declared types.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let col = batch
                .column_by_name(f.name())
                .ok_or_else(|| SluiceError::plan(format!("file has no column '{}'", f.name())))?;
            Ok(datafusion::arrow::compute::cast(col, f.data_type())?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

#[async_trait]
impl Source for FilesSource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let mut all = seen(start)?;
        let cap = self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let new: Vec<String> = list(&self.dir)?
            .into_iter()
            .filter(|f| !all.contains(f))
            .filter(|f| cap.as_ref().is_none_or(|c| c.contains(f)))
            .take(self.max_files)
            .collect();
        if new.is_empty() {
            return Ok(None);
        }
        all.extend(new);
        Ok(Some(serde_json::json!({ "files": all })))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let before = seen(start)?;
        let files: Vec<PathBuf> = seen(Some(end))?
            .difference(&before)
            .map(|f| self.dir.join(f))
            .collect();
        let (format, schema) = (self.format, Arc::clone(&self.schema));
        tokio::task::spawn_blocking(move || {
            files
                .iter()
                .map(|f| decode(f, format, &schema))
                .collect::<Result<Vec<_>>>()
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("files reader task: {e}")))?
    }

    async fn prepare_available_now(&self) -> Result<()> {
        let now: BTreeSet<String> = list(&self.dir)?.into_iter().collect();
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
        Ok(())
    }
}
