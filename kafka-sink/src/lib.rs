#![warn(missing_docs, unreachable_pub)]
#![deny(unused_must_use)]

//! Everything in Sluice that talks to Kafka.
//!
//! [`KafkaConnector`] plugs `connector = 'kafka'` into a session's connector
//! registry (the `sluice` facade registers it). In this version it writes
//! with a plain idempotent producer — **at-least-once**: an epoch whose
//! messages were acknowledged but whose commit record was not yet written
//! is produced again after a crash.
//!
//! ```text
//! epoch N: rows ──encode (json/csv/raw)──► produce (acks=all) ──► flush ──► commits/N
//! ```
//!
//! The exactly-once protocol of DESIGN §6 (output and progress record in
//! one transaction, `init_transactions` before recovery) replaces this
//! producer when the transactional sink lands; the Kafka source comes with it.
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
//!     .option("sink.delivery", "at-least-once")
//!     .checkpoint_location("./checkpoints/updates")
//!     .start()
//!     .await?;
//! # Ok(()) }
//! ```

pub mod broker;
mod encode;
mod sink;

pub use encode::Format;
pub use sink::KafkaConnector;
