//! The `filesystem` sink: each epoch's rows as files under a directory,
//! partitioned as Hive and Flink lay them out (`dt=2026-12-06/hm=10%3A00/`),
//! exactly-once through a commit record of the sink's own.
//!
//! ```text
//! write_epoch(N):  rows ─► <partition>/.part-<id>-N.csv.inprogress   (hidden)
//!                  _sluice/<id>/commits/N    ◄── the commit: epoch N's record
//!                  .inprogress ─► <partition>/part-<id>-N.csv          (visible)
//!                  _SUCCESS in partitions the commit policy closes
//! recovery:        the newest commits/N decides: its files are published
//!                  (a crash may have come between record and renames), and
//!                  the staged files of later, uncommitted epochs are deleted
//! ```
//!
//! A file becomes visible (a name without a leading `.` or `_`, which
//! Flink, Spark, Hive and Sluice's `files` source all skip) only once its
//! epoch's commit record is written, and a re-run epoch writes the same
//! names, so it overwrites its own staged files. The sink records its
//! commits ([`Sink::records_commits`]): recovery resumes after the epoch
//! its record names, as with the transactional Kafka sink. One query
//! writes a directory: the record folder is named after the query's id
//! (and task), and a commit record another writer left for the same epoch
//! is refused.
//!
//! Each epoch writes one file per partition it has rows for (the rolling
//! policy is the epoch). Partition commit (Flink's `sink.partition-commit.*`
//! with the `success-file` policy) writes `_SUCCESS` into a partition once
//! the epoch's processing time (`process-time`) or watermark
//! (`partition-time`) passes the partition's time plus the delay.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, take_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

use super::{CommittedEpoch, EpochOutput, Sink};
use crate::checkpoint::{read_file, write_file, EpochCommit};
use crate::error::{Result, SluiceError};
use crate::fail_point::fail_point;
use crate::source::Handover;

/// The folder of the sink's own records, under the output path.
const RECORDS: &str = "_sluice";
/// Staged files end so, and start with a dot.
const IN_PROGRESS: &str = ".inprogress";
/// Flink's `partition.default-name`: the directory of a NULL value.
const NULL_PARTITION: &str = "__DEFAULT_PARTITION__";
/// How many commit records stay (the newest decides; the others help a
/// reader of the folder see the history).
const RECORDS_KEPT: usize = 3;

/// How the files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    /// Comma-separated, no header unless asked, as Flink's `csv` format.
    Csv {
        header: bool,
    },
    /// One JSON object per line.
    Json,
    Parquet,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            FileFormat::Csv { .. } => "csv",
            FileFormat::Json => "json",
            FileFormat::Parquet => "parquet",
        }
    }
}

/// When a partition is closed with a success file (Flink's
/// `sink.partition-commit.trigger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommitTrigger {
    /// Once the processing time passes the partition's creation plus the
    /// delay.
    ProcessTime,
    /// Once the watermark passes the time in the partition's values
    /// (`pattern`, as `'$dt $hm:00'`) plus the delay.
    PartitionTime { pattern: Option<String> },
}

/// Flink's `success-file` partition-commit policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionCommit {
    pub trigger: CommitTrigger,
    pub delay: Duration,
    /// The file written into a closed partition (`_SUCCESS`).
    pub success_file: String,
}

/// What the `filesystem` connector read from a table's options.
#[derive(Debug, Clone)]
pub(crate) struct FileSinkConfig {
    pub path: PathBuf,
    pub format: FileFormat,
    /// `PARTITIONED BY` columns, in directory order.
    pub partition_by: Vec<String>,
    pub commit: Option<PartitionCommit>,
}

/// The commit record of one epoch: the engine's record and the files that
/// make the epoch's output, relative to the output path.
#[derive(Debug, Serialize, Deserialize)]
struct CommitRecord {
    commit: EpochCommit,
    files: Vec<String>,
}

/// Writes each epoch's rows as files (see the module's text).
#[derive(Debug)]
pub(crate) struct FileSink {
    config: FileSinkConfig,
    schema: SchemaRef,
    /// Names this writer's files and record folder: the query id, and the
    /// task of a divided query.
    writer: String,
    /// Partitions not yet closed by the commit policy, with when they were
    /// first written (ms since the Unix epoch).
    open: Mutex<BTreeMap<String, i64>>,
}

impl FileSink {
    pub(crate) fn new(
        config: FileSinkConfig,
        schema: SchemaRef,
        query_id: &str,
        task: Option<u32>,
    ) -> Result<Self> {
        for column in &config.partition_by {
            if schema.field_with_name(column).is_err() {
                return Err(SluiceError::config(format!(
                    "PARTITIONED BY names '{column}', which the table does not have; its columns \
                     are {}",
                    crate::options::columns(&schema)
                )));
            }
        }
        if config.partition_by.len() == schema.fields().len() {
            return Err(SluiceError::config(
                "every column of the table is a partition column; a file needs one that is not",
            ));
        }
        let writer = match task {
            Some(t) => format!("{query_id}-{t}"),
            None => query_id.to_string(),
        };
        Ok(Self {
            config,
            schema,
            writer,
            open: Mutex::new(BTreeMap::new()),
        })
    }

    fn records_dir(&self) -> PathBuf {
        self.config
            .path
            .join(RECORDS)
            .join(&self.writer)
            .join("commits")
    }

    /// The final name of epoch `epoch`'s file in partition directory `dir`.
    fn file_name(&self, epoch: u64) -> String {
        format!(
            "part-{}-{epoch}.{}",
            self.writer,
            self.config.format.extension()
        )
    }

    /// Splits `rows` by partition: relative directory → rows without the
    /// partition columns.
    fn partition(&self, rows: &[RecordBatch]) -> Result<BTreeMap<String, Vec<RecordBatch>>> {
        let by = &self.config.partition_by;
        let kept: Vec<usize> = (0..self.schema.fields().len())
            .filter(|&i| !by.contains(self.schema.field(i).name()))
            .collect();
        let mut out: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
        for batch in rows.iter().filter(|b| b.num_rows() > 0) {
            let data = batch.project(&kept)?;
            if by.is_empty() {
                out.entry(String::new()).or_default().push(data);
                continue;
            }
            let values = by
                .iter()
                .map(|c| {
                    let column = batch.column_by_name(c).ok_or_else(|| {
                        SluiceError::Internal(format!("partition column '{c}' missing"))
                    })?;
                    Ok(cast(column, &DataType::Utf8)?)
                })
                .collect::<Result<Vec<_>>>()?;
            let mut rows_of: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            for row in 0..batch.num_rows() {
                let dir = by
                    .iter()
                    .zip(&values)
                    .map(|(name, v)| {
                        let v = v.as_string::<i32>();
                        let value = match v.is_null(row) {
                            true => NULL_PARTITION.to_string(),
                            false => escape(v.value(row)),
                        };
                        format!("{}={value}", escape(name))
                    })
                    .collect::<Vec<_>>()
                    .join("/");
                rows_of.entry(dir).or_default().push(row as u32);
            }
            for (dir, indices) in rows_of {
                let taken = take_record_batch(&data, &UInt32Array::from(indices))?;
                out.entry(dir).or_default().push(taken);
            }
        }
        Ok(out)
    }

    /// Writes `batches` to `path` in the sink's format, and syncs it.
    fn write_file(&self, path: &Path, batches: &[RecordBatch]) -> Result<()> {
        let io = |e: std::io::Error| SluiceError::io(format!("writing {}", path.display()), e);
        let file = fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::new(file);
        match self.config.format {
            FileFormat::Csv { header } => {
                let mut writer = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(header)
                    .with_timestamp_format("%Y-%m-%d %H:%M:%S%.3f".to_string())
                    .build(&mut w);
                for b in batches {
                    writer.write(b)?;
                }
            }
            FileFormat::Json => {
                let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(&mut w);
                for b in batches {
                    writer.write(b)?;
                }
                writer.finish()?;
            }
            FileFormat::Parquet => {
                let schema = batches[0].schema();
                let mut writer = ArrowWriter::try_new(&mut w, schema, None)
                    .map_err(|e| SluiceError::Internal(format!("{}: {e}", path.display())))?;
                for b in batches {
                    writer
                        .write(b)
                        .map_err(|e| SluiceError::Internal(format!("{}: {e}", path.display())))?;
                }
                writer
                    .close()
                    .map_err(|e| SluiceError::Internal(format!("{}: {e}", path.display())))?;
            }
        }
        w.flush().map_err(io)?;
        w.get_ref().sync_all().map_err(io)
    }

    /// Renames a committed epoch's staged files into place; a file already
    /// in place (published before a crash) is left as it is.
    fn publish(&self, files: &[String]) -> Result<()> {
        let mut dirs = BTreeSet::new();
        for file in files {
            let to = self.config.path.join(file);
            let from = staged(&to);
            if from.exists() {
                fs::rename(&from, &to)
                    .map_err(|e| SluiceError::io(format!("publishing {}", to.display()), e))?;
                dirs.extend(to.parent().map(Path::to_path_buf));
            }
        }
        for dir in dirs {
            sync_dir(&dir)?;
        }
        Ok(())
    }

    /// Deletes this writer's staged files, which only an uncommitted epoch
    /// leaves.
    fn discard_staged(&self) -> Result<()> {
        let prefix = format!(".part-{}-", self.writer);
        visit(&self.config.path, &mut |path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with(&prefix) && name.ends_with(IN_PROGRESS) {
                fs::remove_file(path)
                    .map_err(|e| SluiceError::io(format!("removing {}", path.display()), e))?;
            }
            Ok(())
        })
    }

    /// Writes the success file into each open partition the commit
    /// policy closes after epoch `commit`.
    fn close_partitions(&self, commit: &EpochCommit, touched: &[String]) -> Result<()> {
        let Some(policy) = &self.config.commit else {
            return Ok(());
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for dir in touched {
            open.entry(dir.clone()).or_insert(commit.plan.planned_at_ms);
        }
        let delay = i64::try_from(policy.delay.as_millis()).unwrap_or(i64::MAX);
        let watermark_ms = commit.watermark().map(|ns| ns.div_euclid(1_000_000));
        let mut closed = Vec::new();
        for (dir, created) in open.iter() {
            let due = match &policy.trigger {
                CommitTrigger::ProcessTime => Some(created.saturating_add(delay)),
                CommitTrigger::PartitionTime { pattern } => {
                    partition_time(dir, pattern.as_deref()).map(|t| t.saturating_add(delay))
                }
            };
            let now = match policy.trigger {
                CommitTrigger::ProcessTime => Some(commit.plan.planned_at_ms),
                CommitTrigger::PartitionTime { .. } => watermark_ms,
            };
            if let (Some(due), Some(now)) = (due, now) {
                if now >= due {
                    closed.push(dir.clone());
                }
            }
        }
        for dir in closed {
            let path = self.config.path.join(&dir).join(&policy.success_file);
            fs::write(&path, b"")
                .map_err(|e| SluiceError::io(format!("writing {}", path.display()), e))?;
            open.remove(&dir);
        }
        Ok(())
    }
}

#[async_trait]
impl Sink for FileSink {
    async fn open(&self) -> Result<()> {
        let dir = self.records_dir();
        fs::create_dir_all(&dir).map_err(|e| {
            SluiceError::io(
                format!(
                    "creating the filesystem sink's folder {} (is 'path' writable?)",
                    dir.display()
                ),
                e,
            )
        })?;
        // Partitions written before without their success file are still
        // open; their creation time is unknown, so it is now.
        if let Some(policy) = &self.config.commit {
            let now = chrono::Utc::now().timestamp_millis();
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let depth = self.config.partition_by.len();
            for dir in partition_dirs(&self.config.path, depth)? {
                if !self
                    .config
                    .path
                    .join(&dir)
                    .join(&policy.success_file)
                    .exists()
                {
                    open.insert(dir, now);
                }
            }
        }
        Ok(())
    }

    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        let dir = self.records_dir();
        let newest = record_epochs(&dir)?.last().copied();
        let Some(epoch) = newest else {
            self.discard_staged()?;
            return Ok(CommittedEpoch::Recorded(None));
        };
        let record: CommitRecord = read_file(&dir.join(epoch.to_string()))?;
        self.publish(&record.files)?;
        self.discard_staged()?;
        Ok(CommittedEpoch::Recorded(Some(record.commit)))
    }

    fn records_commits(&self) -> bool {
        true
    }

    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        _handover: &Handover,
    ) -> Result<()> {
        let n = epoch.epoch();
        if output.retracted.as_ref().is_some_and(|r| r.num_rows() > 0) {
            return Err(SluiceError::config(
                "the filesystem sink appends rows and cannot delete one; write a query whose \
                 rows do not change (append mode) to it",
            ));
        }
        let partitions = self.partition(&output.rows)?;
        let mut files = Vec::with_capacity(partitions.len());
        for (dir, batches) in &partitions {
            let folder = self.config.path.join(dir);
            fs::create_dir_all(&folder)
                .map_err(|e| SluiceError::io(format!("creating {}", folder.display()), e))?;
            let name = self.file_name(n);
            self.write_file(&staged(&folder.join(&name)), batches)?;
            files.push(match dir.is_empty() {
                true => name,
                false => format!("{dir}/{name}"),
            });
        }
        fail_point("files-before-commit-record", n);
        let records = self.records_dir();
        let path = records.join(n.to_string());
        if path.exists() {
            return Err(SluiceError::config(format!(
                "{} already holds a commit record of epoch {n}: another instance of this query \
                 writes the same directory; stop it (one writer per query and directory)",
                records.display()
            )));
        }
        write_file(
            &path,
            &CommitRecord {
                commit: epoch.clone(),
                files: files.clone(),
            },
        )?;
        fail_point("files-after-commit-record", n);
        self.publish(&files)?;
        for old in record_epochs(&records)?.iter().rev().skip(RECORDS_KEPT) {
            let _ = fs::remove_file(records.join(old.to_string()));
        }
        let touched: Vec<String> = partitions.into_keys().filter(|d| !d.is_empty()).collect();
        self.close_partitions(epoch, &touched)
    }

    fn describe(&self) -> String {
        format!(
            "filesystem({}, {})",
            self.config.path.display(),
            self.config.format.extension()
        )
    }
}

/// The staged name of final file `path`: hidden, and marked in progress.
fn staged(path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    path.with_file_name(format!(".{name}{IN_PROGRESS}"))
}

/// The epochs with a commit record in `dir`, in order.
fn record_epochs(dir: &Path) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(SluiceError::io(format!("reading {}", dir.display()), e)),
    };
    let mut epochs: Vec<u64> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    epochs.sort_unstable();
    Ok(epochs)
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SluiceError::io(format!("syncing {}", dir.display()), e))
}

/// Calls `f` on every file under `dir`, leaving out the sink's records.
fn visit(dir: &Path, f: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SluiceError::io(format!("reading {}", dir.display()), e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == RECORDS {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => visit(&path, f)?,
            Ok(_) => f(&path)?,
            Err(_) => {}
        }
    }
    Ok(())
}

/// The partition directories `depth` levels under `root`, relative to it.
fn partition_dirs(root: &Path, depth: usize) -> Result<Vec<String>> {
    let mut level = vec![String::new()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for rel in &level {
            let Ok(entries) = fs::read_dir(root.join(rel)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if entry.path().is_dir() && name.contains('=') {
                    next.push(match rel.is_empty() {
                        true => name,
                        false => format!("{rel}/{name}"),
                    });
                }
            }
        }
        level = next;
    }
    Ok(if depth == 0 { Vec::new() } else { level })
}

/// A partition value as a directory name, escaped as Hive and Flink escape
/// it (`10:00` is `10%3A00`).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_control()
            || matches!(
                c,
                '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '{' | '[' | ']' | '^'
            )
        {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// [`escape`] undone.
fn unescape(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => {
                let digit = |b: &u8| (*b as char).to_digit(16);
                digit(hi).zip(digit(lo)).map(|(h, l)| (h * 16 + l) as u8)
            }
            _ => None,
        };
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The time of partition `dir` (`dt=2026-12-06/hm=10%3A00`) in ms since
/// the Unix epoch, as Flink's default time extractor reads it: `pattern`
/// with each `$name` replaced by the partition's value (else the first
/// value), as `yyyy-MM-dd HH:mm:ss` or `yyyy-MM-dd`.
fn partition_time(dir: &str, pattern: Option<&str>) -> Option<i64> {
    let values: Vec<(String, String)> = dir
        .split('/')
        .filter_map(|part| {
            let (k, v) = part.split_once('=')?;
            Some((unescape(k), unescape(v)))
        })
        .collect();
    let text = match pattern {
        Some(p) => {
            // Longer names first, so `$dt` does not eat `$dtx`.
            let mut sorted = values.clone();
            sorted.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
            sorted
                .iter()
                .fold(p.to_string(), |t, (k, v)| t.replace(&format!("${k}"), v))
        }
        None => values.first()?.1.clone(),
    };
    let text = text.trim();
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .or_else(|_| {
            chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map(|d| d.and_hms_opt(0, 0, 0).unwrap_or_default())
        })
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_are_escaped_as_hive_does_and_read_back() {
        assert_eq!(escape("10:00"), "10%3A00");
        assert_eq!(escape("a/b=c"), "a%2Fb%3Dc");
        assert_eq!(escape("plain-value_1"), "plain-value_1");
        for v in ["10:00", "a/b=c", "100%", "ü:x"] {
            assert_eq!(unescape(&escape(v)), v);
        }
    }

    #[test]
    fn a_partitions_time_is_read_from_its_values_by_the_pattern() {
        let dir = "dt=2015-07-15/hm=10%3A05";
        let ms = |s: &str| {
            chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S")
                .unwrap()
                .and_utc()
                .timestamp_millis()
        };
        assert_eq!(
            partition_time(dir, Some("$dt $hm:00")),
            Some(ms("2015-07-15 10:05:00"))
        );
        assert_eq!(partition_time(dir, None), Some(ms("2015-07-15 00:00:00")));
        assert_eq!(partition_time("dt=not-a-date", None), None);
    }
}
