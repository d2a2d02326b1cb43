#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Everything in Sluice that talks to Kafka.
//!
//! [`KafkaConnector`] plugs `connector = 'kafka'` into a session's connector
//! registry (the `sluice` facade registers it). Its sink is exactly-once by
//! default: each epoch's output and a progress record naming the epoch go
//! to Kafka in one transaction, and the query's progress topic, read
//! `read_committed` after `init_transactions`, decides after a crash which
//! epoch comes next.
//!
//! ```text
//!            ┌────────────── one Kafka transaction ──────────────┐
//! epoch N ─► │ output rows ─► topic   ·   {epoch N, offsets} ─► sluice-progress.<id> │ ─► commit ─► commits/N
//!            └───────────────────────────────────────────────────┘
//! ```
//!
//! `'sink.delivery' = 'at-least-once'` uses a plain idempotent producer
//! instead: nothing is lost, but an epoch whose output was acknowledged
//! just before a crash is produced again.
//!
//! [`broker`] runs a real local broker for tests, examples and `sluice demo`.
//!
//! ```no_run
//! # async fn f() -> sluice_engine::Result<()> {
//! use std::sync::Arc;
//! let bootstrap = sluice_kafka::broker::ensure_broker()?;
//! let session = sluice_engine::Session::new();
//! session.register_connector(Arc::new(sluice_kafka::KafkaConnector));
//! let query = session
//!     .read_stream().format("rate").option("rows_per_second", "5").load()?
//!     .write_stream()
//!     .format("kafka")
//!     .option("topic", "updates")
//!     .option("bootstrap.servers", bootstrap)
//!     .checkpoint_location("./checkpoints/updates")
//!     .start()
//!     .await?;
//! # Ok(()) }
//! ```

pub mod broker;
mod client;
mod connector;
mod format;
mod group;
mod position;
mod registry;
mod running;
mod sink;
mod source;
mod verify;

pub use client::ClientOptions;
pub use connector::{KafkaConnector, UpsertKafkaConnector};
pub use format::avro::{schema_json as avro_schema, AvroConfluentDecoder};
pub use format::json::decode_json;
pub use format::protobuf::{proto_schema, ProtobufConfluentDecoder};
pub use format::{Encoded, Format, Message, Messages};
pub use group::task_owners;
pub use running::partition_ends;
pub use sink::config::task_identity;
pub use sink::progress_topic::{default_topic as default_progress_topic, last_committed};
pub use verify::{verify, Verdict};

/// The librdkafka this build links and its compiled-in features (TLS, SASL,
/// compression codecs), as librdkafka reports them: what a bug report
/// needs to say.
///
/// ```
/// let (version, features) = sluice_kafka::client_library();
/// assert!(version.starts_with('2'));
/// // What secured clusters and compressed topics need, built in.
/// for feature in ["ssl", "sasl_scram", "sasl_oauthbearer", "oidc", "zstd", "lz4"] {
///     assert!(features.split(',').any(|f| f == feature), "{feature} in {features}");
/// }
/// ```
pub fn client_library() -> (String, String) {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    let features = rdkafka::ClientConfig::new()
        .create_native_config()
        .ok()
        .and_then(|c| c.get("builtin.features").ok())
        .unwrap_or_else(|| "unknown".into());
    (version, features)
}
