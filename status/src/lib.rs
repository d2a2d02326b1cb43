//! Sluice's status page: a live page for every query of the process and
//! each of its tasks (state, epoch, last commit, sources' lag, watermark,
//! owners, charts of the last few hundred epochs), the same data as JSON
//! for scripts (`/api/queries`, `/api/queries/<id>`,
//! `/api/queries/<id>/progress`), and the Prometheus metrics at
//! `/metrics`.
//!
//! The [`StatusBoard`] reads the running queries' handles when asked; the
//! [`StatusServer`] serves it over HTTP on the queries' tokio runtime,
//! read-only, behind a token when one is set.
//!
//! ```no_run
//! # async fn demo(query: sluice_engine::StreamingQuery) -> Result<(), sluice_status::StatusError> {
//! use std::sync::Arc;
//! let board = Arc::new(sluice_status::StatusBoard::default());
//! board.watch(&query, "INSERT INTO out SELECT * FROM bids", &query.name());
//! let addr = sluice_status::StatusServer::new(board)
//!     .serve("127.0.0.1:0".parse().unwrap())
//!     .await?;
//! println!("the status page: http://{addr}/");
//! # Ok(()) }
//! ```

mod board;
mod page;
mod server;

pub use board::StatusBoard;
pub use server::{StatusError, StatusServer};
