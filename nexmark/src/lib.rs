//! The Nexmark benchmark's data for Sluice: the reference generator's
//! people, auctions and bids ([`generator`]), read as streams through
//! `connector = 'nexmark'` ([`NexmarkConnector`]).
//!
//! ```sql
//! CREATE STREAM bid WITH (connector = 'nexmark', table = 'bid',
//!                         'events-per-second' = '100000');
//! INSERT INTO out SELECT auction, price FROM bid WHERE auction % 123 = 0;
//! ```
//!
//! The three streams share one sequence of events (1 person, 3 auctions,
//! 46 bids in every 50), so a person's id, an auction's seller and a
//! bid's auction agree across them, as in every Nexmark implementation.
//! Each event is a pure function of its number and the seed: an epoch
//! replayed after a crash reads the same rows.

mod connector;
pub mod generator;
mod random;
mod udf;

pub use connector::NexmarkConnector;
pub use udf::count_char;
