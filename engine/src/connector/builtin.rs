//! The connectors the engine has without any other crate: `rate` and
//! `files` (sources), `console` and `blackhole` (sinks). Each reads and
//! checks its options here and builds the source or sink that `source/`
//! or `sink/` implements, as the Kafka crate's connector builds its own.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Connector, SinkArgs, SourceArgs};
use crate::error::Result;
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
