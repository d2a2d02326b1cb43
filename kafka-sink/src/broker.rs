//! A real local Kafka broker for tests, examples, benchmarks and the demo.
//!
//! [`ensure_broker`] returns a bootstrap address, starting the project's
//! `scripts/kafka` (Apache Kafka from Maven Central, KRaft, loopback) when
//! nothing listens on `SLUICE_KAFKA_PORT` (default 9092);
//! [`ensure_broker_on`] does the same on a port of the caller's (the tests
//! keep a broker of their own, away from one the user runs on 9092). The
//! script is also compiled into the binary, so `sluice demo` works outside
//! the repository.
//! Tests get unique topics from [`fresh_topic`] and read them back with
//! [`read_topic`].

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use sluice_engine::{Result, SluiceError};

const SCRIPT: &str = include_str!("../../scripts/kafka");

/// The port the local broker listens on: `SLUICE_KAFKA_PORT`, default 9092.
pub fn broker_port() -> u16 {
    std::env::var("SLUICE_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9092)
}

fn listening(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

/// The broker script: the repository's own when present, else the copy
/// compiled into this binary, written to the user's cache directory — or,
/// with neither `SLUICE_CACHE` nor `HOME`, to a new directory of a random
/// name (a fixed path in the shared temporary directory could be planted
/// by another user).
fn script_path() -> Result<PathBuf> {
    let in_repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka");
    if in_repo.is_file() {
        return Ok(in_repo);
    }
    let cache = std::env::var_os("SLUICE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice")));
    let bin = match cache {
        Some(cache) => {
            let bin = cache.join("bin");
            std::fs::create_dir_all(&bin)
                .map_err(|e| SluiceError::io(format!("creating {}", bin.display()), e))?;
            bin
        }
        None => {
            let bin =
                std::env::temp_dir().join(format!("sluice-{}", uuid::Uuid::new_v4().simple()));
            // create_dir, not create_dir_all: it must be new, and ours.
            std::fs::create_dir(&bin)
                .map_err(|e| SluiceError::io(format!("creating {}", bin.display()), e))?;
            bin
        }
    };
    let path = bin.join("kafka");
    let io = |e| SluiceError::io(format!("writing {}", path.display()), e);
    std::fs::write(&path, SCRIPT).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    }
    Ok(path)
}

/// A bootstrap address of a running local broker, started through
/// `scripts/kafka start` when nothing listens on [`broker_port`].
pub fn ensure_broker() -> Result<String> {
    ensure_broker_on(broker_port())
}

/// [`ensure_broker`] on 127.0.0.1:`port` (its KRaft controller on
/// `port + 1`).
pub fn ensure_broker_on(port: u16) -> Result<String> {
    let address = format!("127.0.0.1:{port}");
    if listening(port) {
        return Ok(address);
    }
    let script = script_path()?;
    tracing::info!(script = %script.display(), "starting a local Kafka broker");
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .env("SLUICE_KAFKA_PORT", port.to_string())
        .output()
        .map_err(|e| SluiceError::io(format!("running {}", script.display()), e))?;
    if !out.status.success() {
        return Err(SluiceError::External {
            what: format!("starting Kafka with {}", script.display()),
            message: format!(
                "exit status {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            hint: Some("run `scripts/kafka start` by hand to see what fails".into()),
        });
    }
    Ok(address)
}

/// A topic name no earlier run has used: `<prefix>-<random>`.
pub fn fresh_topic(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn kafka_error(what: &str, bootstrap: &str, e: impl std::fmt::Display) -> SluiceError {
    SluiceError::External {
        what: format!("kafka at {bootstrap}: {what}"),
        message: e.to_string(),
        hint: None,
    }
}

/// Creates `topic` with `partitions` partitions (replication 1).
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| kafka_error("creating admin client", bootstrap, e))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| kafka_error("creating topic", bootstrap, e))?;
    for r in results {
        r.map_err(|(t, e)| kafka_error(&format!("creating topic {t}"), bootstrap, e))?;
    }
    Ok(())
}

/// One record read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers as (name, value) pairs.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl ReadRecord {
    /// The value as UTF-8 text (lossy).
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }
}

/// Reads every record of `topic` from the beginning up to its end as seen
/// now (the last stable offset when `read_committed`), partition by
/// partition in offset order. Blocking: call from a blocking thread.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    read_committed: bool,
    timeout: Duration,
) -> Result<Vec<ReadRecord>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("sluice-reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create()
        .map_err(|e| kafka_error("creating consumer", bootstrap, e))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| kafka_error("fetching metadata", bootstrap, e))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut ranges = Vec::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| kafka_error("fetching offsets", bootstrap, e))?;
        ranges.push((p, low, high));
    }
    let mut records = Vec::new();
    crate::position::read_ranges(
        &consumer,
        topic,
        &ranges,
        timeout,
        &|what, e| kafka_error(&format!("{what} {topic}"), bootstrap, e),
        |m| {
            records.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
            Ok(())
        },
    )?;
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}
