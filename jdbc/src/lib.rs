//! The `jdbc` connector: a table in a database that a stream looks its
//! rows up in, Flink's JDBC lookup source.
//!
//! ```sql
//! CREATE TABLE customers (id BIGINT, name VARCHAR) WITH (
//!   'connector' = 'jdbc',
//!   'url' = 'jdbc:postgresql://127.0.0.1:5432/shop',
//!   'table-name' = 'customers',
//!   'username' = 'sluice', 'password' = '...',
//!   'lookup.cache' = 'PARTIAL',
//!   'lookup.partial-cache.expire-after-write' = '10 s'
//! );
//! SELECT o.id, c.name FROM orders AS o
//!   JOIN customers FOR SYSTEM_TIME AS OF o.p_time AS c ON o.customer = c.id;
//! ```
//!
//! PostgreSQL is the database this connector speaks to, through
//! `tokio-postgres`; the engine's `lookup` module does the join and the
//! cache. Flink's options that only writing or scanning the table uses
//! (`sink.*`, `scan.*`) are ignored with a warning, since Sluice only looks
//! the table up.

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::{Connector, LookupArgs, LookupSource, Result, SluiceError};

mod postgres;

pub use postgres::PostgresTable;

/// The `jdbc` connector.
///
/// ```
/// use sluice_engine::Connector;
/// let jdbc = sluice_jdbc::JdbcConnector;
/// assert_eq!(jdbc.name(), "jdbc");
/// assert!(jdbc.is_lookup() && !jdbc.is_source());
/// ```
#[derive(Debug, Default)]
pub struct JdbcConnector;

/// How long reaching the database may take before a lookup fails.
/// Flink's default is 60 s; a misspelt host should fail sooner.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Options Flink's JDBC table has for what Sluice does not do with it.
const IGNORED_PREFIXES: &[&str] = &["sink.", "scan."];

impl Connector for JdbcConnector {
    fn name(&self) -> &str {
        "jdbc"
    }

    fn is_lookup(&self) -> bool {
        true
    }

    fn lookup(&self, args: LookupArgs) -> Result<Arc<dyn LookupSource>> {
        let LookupArgs {
            table,
            schema,
            mut options,
        } = args;
        let what = format!("jdbc table '{table}'");
        let url = options.take_required(
            &what,
            "url",
            "'url' = 'jdbc:postgresql://127.0.0.1:5432/shop'",
        )?;
        let table_name =
            options.take_required(&what, "table-name", "'table-name' = 'customers'")?;
        let user = options.take("username");
        let password = options.take("password");
        if let Some(p) = &password {
            sluice_engine::register_secret(p);
        }
        let timeout = options
            .take_duration("connection.max-retry-timeout")?
            .unwrap_or(DEFAULT_TIMEOUT);
        let retries = options
            .take_parsed::<u32>("lookup.max-retries", "a count")?
            .unwrap_or(3);
        // The driver is PostgreSQL's, whatever the class says.
        options.take("driver");
        for prefix in IGNORED_PREFIXES {
            for (key, _) in options.take_prefixed(prefix) {
                tracing::warn!(
                    table = %table,
                    option = %format!("{prefix}{key}"),
                    "Flink's option is not one Sluice uses for a lookup table; ignored"
                );
            }
        }
        options.finish_for(
            &what,
            &[
                "url",
                "table-name",
                "username",
                "password",
                "driver",
                "connection.max-retry-timeout",
                "lookup.max-retries",
            ],
        )?;
        let address = postgres::Address::parse(&url, user, password)
            .map_err(|e| SluiceError::config(format!("{what}: 'url' = '{url}' {e}")))?;
        Ok(Arc::new(PostgresTable::new(
            &table_name,
            schema,
            address,
            timeout,
            retries,
        )))
    }
}
