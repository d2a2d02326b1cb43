//! The connectors the engine has without any other crate: `rate` and
//! `files` (sources), `console`, `blackhole` and `filesystem` (sinks). Each reads and
//! checks its options here and builds the source or sink that `source/`
//! or `sink/` implements, as the Kafka crate's connector builds its own.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Connector, SinkArgs, SourceArgs};
use crate::error::{Result, SluiceError};
use crate::sink::files::{CommitTrigger, FileFormat, FileSink, FileSinkConfig, PartitionCommit};
use crate::sink::{Blackhole, Console, Sink};
use crate::source::{FilesFactory, FilesFormat, RateFactory, SourceFactory};

/// The `rate` connector: Spark's rate source (see `source::rate`).
#[derive(Debug, Default)]
pub struct RateConnector;

impl RateConnector {
    const OPTIONS: &[&str] = &["rows_per_second", "num_partitions", "rows_per_batch"];
}

impl Connector for RateConnector {
    fn name(&self) -> &str {
        "rate"
    }

    fn is_source(&self) -> bool {
        true
    }

    fn source(&self, mut args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        let o = &mut args.options;
        let rows_per_second = o
            .take_parsed::<u64>("rows_per_second", "a whole number of rows per second")?
            .unwrap_or(1);
        let num_partitions = o
            .take_parsed::<usize>("num_partitions", "a whole number of partitions")?
            .unwrap_or(args.default_partitions);
        let rows_per_batch =
            o.take_parsed::<u64>("rows_per_batch", "a whole number of rows per epoch")?;
        o.finish("rate", Self::OPTIONS)?;
        Ok(Arc::new(RateFactory::new(
            rows_per_second,
            num_partitions,
            rows_per_batch,
            args.schema.as_ref(),
        )?))
    }
}

/// The `files` connector: new files in a directory (see `source::files`).
#[derive(Debug, Default)]
pub struct FilesConnector;

impl FilesConnector {
    const OPTIONS: &[&str] = &["path", "format", "header", "max_files_per_epoch"];
    const FORMATS: &[&str] = &["json", "csv", "parquet"];
}

impl Connector for FilesConnector {
    fn name(&self) -> &str {
        "files"
    }

    fn is_source(&self) -> bool {
        true
    }

    fn source(&self, mut args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        let o = &mut args.options;
        let path = PathBuf::from(o.take_required("files", "path", "./data/incoming")?);
        let format = match o.take_choice("format", Self::FORMATS)? {
            Some(f) => f,
            None => {
                return Err(o.missing(
                    "connector 'files'",
                    "format",
                    "'format' = 'json' (or 'csv', 'parquet')",
                ))
            }
        };
        let header = o
            .take_parsed::<bool>("header", "true or false")?
            .unwrap_or(true);
        let max_files = o
            .take_parsed::<usize>("max_files_per_epoch", "a whole number of files")?
            .unwrap_or(usize::MAX)
            .max(1);
        o.finish("files", Self::OPTIONS)?;
        let format = match format.as_str() {
            "json" => FilesFormat::Json,
            "csv" => FilesFormat::Csv { header },
            _ => FilesFormat::Parquet,
        };
        Ok(Arc::new(FilesFactory::new(
            path,
            format,
            args.schema,
            max_files,
        )?))
    }
}

/// The `console` connector: prints each epoch's rows.
#[derive(Debug, Default)]
pub struct ConsoleConnector;

impl Connector for ConsoleConnector {
    fn name(&self) -> &str {
        "console"
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn sink(&self, mut args: SinkArgs) -> Result<Arc<dyn Sink>> {
        let num_rows = args
            .options
            .take_parsed::<usize>("num_rows", "a whole number of rows")?
            .unwrap_or(20);
        args.options.finish("console", &["num_rows"])?;
        Ok(Arc::new(Console::new(num_rows, args.schema)))
    }
}

/// The `blackhole` connector: discards rows (benchmarks measure the engine
/// alone).
#[derive(Debug, Default)]
pub struct BlackholeConnector;

impl Connector for BlackholeConnector {
    fn name(&self) -> &str {
        "blackhole"
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn sink(&self, args: SinkArgs) -> Result<Arc<dyn Sink>> {
        args.options.finish("blackhole", &[])?;
        Ok(Arc::new(Blackhole))
    }
}

/// The `filesystem` connector: Flink's file sink, each epoch's rows as
/// partitioned files (see `sink::files`).
#[derive(Debug, Default)]
pub struct FilesystemConnector;

impl FilesystemConnector {
    const OPTIONS: &[&str] = &[
        "path",
        "format",
        "header",
        "partitioned-by",
        "sink.partition-commit.trigger",
        "sink.partition-commit.delay",
        "sink.partition-commit.policy.kind",
        "sink.partition-commit.success-file.name",
        "partition.time-extractor.kind",
        "partition.time-extractor.timestamp-pattern",
        "partition.time-extractor.timestamp-formatter",
    ];
    /// Flink's options that shape files Sluice cuts at each epoch: taken,
    /// and said to do nothing.
    const ROLLING: &[&str] = &[
        "sink.rolling-policy.file-size",
        "sink.rolling-policy.rollover-interval",
        "sink.rolling-policy.check-interval",
        "sink.rolling-policy.inactivity-interval",
        "sink.parallelism",
        "sink.shuffle-by-partition.enable",
        "auto-compaction",
        "compaction.file-size",
    ];
}

impl Connector for FilesystemConnector {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn is_sink(&self) -> bool {
        true
    }

    fn sink(&self, mut args: SinkArgs) -> Result<Arc<dyn Sink>> {
        let o = &mut args.options;
        let path = PathBuf::from(o.take_required("filesystem", "path", "./out/bids")?);
        let format = match o.take_choice("format", &["csv", "json", "parquet"])? {
            Some(f) => f,
            None => {
                return Err(o.missing(
                    "connector 'filesystem'",
                    "format",
                    "'format' = 'csv' (or 'json', 'parquet')",
                ))
            }
        };
        let header = o
            .take_parsed::<bool>("header", "true or false")?
            .unwrap_or(false);
        let partition_by: Vec<String> = o
            .take("partitioned-by")
            .map(|v| {
                v.split(',')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let trigger = o.take_choice(
            "sink.partition-commit.trigger",
            &["process-time", "partition-time"],
        )?;
        let delay = o
            .take_duration("sink.partition-commit.delay")?
            .unwrap_or_default();
        let policy = o.take("sink.partition-commit.policy.kind");
        let success_file = o
            .take("sink.partition-commit.success-file.name")
            .unwrap_or_else(|| "_SUCCESS".into());
        let pattern = o.take("partition.time-extractor.timestamp-pattern");
        if let Some(kind) = o.take("partition.time-extractor.kind") {
            if !kind.eq_ignore_ascii_case("default") {
                return Err(SluiceError::config(format!(
                    "'partition.time-extractor.kind' = '{kind}': Sluice has Flink's default \
                     extractor only ('default', with 'partition.time-extractor.timestamp-pattern')"
                )));
            }
        }
        if let Some(f) = o.take("partition.time-extractor.timestamp-formatter") {
            if f != "yyyy-MM-dd HH:mm:ss" {
                return Err(SluiceError::config(format!(
                    "'partition.time-extractor.timestamp-formatter' = '{f}': Sluice reads \
                     partition times as 'yyyy-MM-dd HH:mm:ss' (or a date), Flink's default"
                )));
            }
        }
        for key in Self::ROLLING {
            if o.take(key).is_some() {
                tracing::warn!(
                    "filesystem sink: '{key}' is ignored: Sluice writes one file per partition \
                     and epoch, cut when the epoch commits"
                );
            }
        }
        o.finish("filesystem", Self::OPTIONS)?;
        let commit = match policy.as_deref() {
            None => None,
            Some(p) if p.eq_ignore_ascii_case("success-file") => Some(PartitionCommit {
                trigger: match trigger.as_deref() {
                    Some("partition-time") => CommitTrigger::PartitionTime { pattern },
                    _ => CommitTrigger::ProcessTime,
                },
                delay,
                success_file,
            }),
            Some(p) => {
                return Err(SluiceError::config(format!(
                    "'sink.partition-commit.policy.kind' = '{p}': Sluice has the 'success-file' \
                     policy (there is no metastore to add partitions to)"
                )))
            }
        };
        if args.output_mode != crate::output_mode::OutputMode::Append {
            return Err(SluiceError::config(format!(
                "the filesystem sink appends rows, and this query's rows change ({} mode): \
                 write it to a sink with a key (upsert-kafka, or kafka with 'key.fields')",
                args.output_mode
            )));
        }
        let format = match format.as_str() {
            "csv" => FileFormat::Csv { header },
            "json" => FileFormat::Json,
            _ => FileFormat::Parquet,
        };
        let config = FileSinkConfig {
            path,
            format,
            partition_by,
            commit,
        };
        let task = args.task.map(|t| t.index);
        Ok(Arc::new(FileSink::new(
            config,
            args.schema,
            &args.query_id,
            task,
        )?))
    }
}
