//! End-to-end tests: one binary, one module per area, so the build stays
//! small. Kafka tests run against a real broker started by `scripts/kafka`.

mod aggregate;
mod chain;
mod changelog;
mod cli;
mod compat;
mod engine;
mod exactly_once;
mod file_sink;
mod fuzz;
mod golden;
mod joins;
mod kafka;
mod kafka_options;
mod lookup;
mod nexmark;
mod no_silent_loss;
mod pipelines;
mod prefetch;
mod processing_time;
mod registry;
mod repartition;
mod secure;
mod send_ahead;
mod shape;
mod status;
mod tasks;
mod temporal;
mod top_n;
mod ttl;
mod util;
mod verify;
mod windows;
