//! A PostgreSQL table looked up by key.
//!
//! A lookup is one query for all the keys an epoch's partition asks:
//! `SELECT cols FROM t WHERE (k) IN (SELECT * FROM unnest($1::text[]::int8[]))`.
//! Keys travel and values come back as text, each cast by PostgreSQL to
//! the column's own type on the way in (so the table's index on the key
//! serves) and by Arrow to the declared type on the way out: one path for
//! every type both sides can write as text.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::compute::{cast, cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{LookupSource, Result, SluiceError};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls};

/// Where the database is, from a `jdbc:postgresql://` URL.
#[derive(Debug, Clone)]
pub(crate) struct Address {
    config: Config,
    /// `host:port/database`, for messages.
    shown: String,
}

impl Address {
    /// `url` (`jdbc:postgresql://host[:port]/database[?user=..&password=..]`)
    /// with the table's `username` and `password`, which win over the
    /// URL's.
    pub(crate) fn parse(
        url: &str,
        user: Option<String>,
        password: Option<String>,
    ) -> std::result::Result<Self, String> {
        let rest = url.trim().strip_prefix("jdbc:").unwrap_or(url.trim());
        let rest = rest.strip_prefix("postgresql://").ok_or_else(|| {
            "is not a PostgreSQL URL: the jdbc connector speaks to PostgreSQL \
             (jdbc:postgresql://host:port/database)"
                .to_string()
        })?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (host_port, database) = location.split_once('/').unwrap_or((location, ""));
        let (host, port) = match host_port.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("has port '{p}', which is not a port number"))?,
            ),
            None => (host_port, 5432),
        };
        if host.is_empty() {
            return Err("names no host (jdbc:postgresql://host:port/database)".into());
        }
        let database = if database.is_empty() {
            "postgres"
        } else {
            database
        };
        let mut config = Config::new();
        config
            .host(host)
            .port(port)
            .dbname(database)
            .application_name("sluice");
        let mut url_user = None;
        let mut url_password = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("user", v)) => url_user = Some(v.to_string()),
                Some(("password", v)) => url_password = Some(v.to_string()),
                _ => {}
            }
        }
        if let Some(user) = user.or(url_user) {
            config.user(&user);
        }
        if let Some(password) = password.or(url_password) {
            config.password(password);
        }
        Ok(Self {
            config,
            shown: format!("{host}:{port}/{database}"),
        })
    }
}

/// A PostgreSQL table that answers lookups (see the module documentation).
#[derive(Debug)]
pub struct PostgresTable {
    /// The table as `'table-name'` gives it, and quoted for SQL.
    name: String,
    quoted: String,
    schema: SchemaRef,
    address: Address,
    timeout: Duration,
    retries: u32,
    connection: Mutex<Option<Connection>>,
}

/// An open connection, and the table's column types it found.
#[derive(Debug, Clone)]
struct Connection {
    client: Arc<Client>,
    /// PostgreSQL's name of each declared column's type (`int8`).
    types: Arc<Vec<String>>,
}

impl PostgresTable {
    pub(crate) fn new(
        name: &str,
        schema: SchemaRef,
        address: Address,
        timeout: Duration,
        retries: u32,
    ) -> Self {
        let quoted = name.split('.').map(quote).collect::<Vec<_>>().join(".");
        Self {
            name: name.to_string(),
            quoted,
            schema,
            address,
            timeout,
            retries,
            connection: Mutex::new(None),
        }
    }

    fn what(&self) -> String {
        format!("PostgreSQL table '{}' at {}", self.name, self.address.shown)
    }

    /// The open connection, or a new one: tried until the timeout while
    /// the server cannot be reached; a refusal by the server (a wrong
    /// password, no such database or table) fails at once.
    async fn connection(&self) -> Result<Connection> {
        let mut held = self.connection.lock().await;
        if let Some(c) = held.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(c.clone());
        }
        let deadline = Instant::now() + self.timeout;
        let last = loop {
            let problem =
                match tokio::time::timeout_at(deadline, self.address.config.connect(NoTls)).await {
                    Ok(Ok((client, connection))) => {
                        tokio::spawn(async move {
                            if let Err(e) = connection.await {
                                tracing::debug!(error = %e, "PostgreSQL connection ended");
                            }
                        });
                        let types = self.column_types(&client).await?;
                        let c = Connection {
                            client: Arc::new(client),
                            types: Arc::new(types),
                        };
                        *held = Some(c.clone());
                        return Ok(c);
                    }
                    Ok(Err(e)) if e.as_db_error().is_some() => {
                        return Err(SluiceError::config(format!(
                            "{}: the server refused: {}",
                            self.what(),
                            db_message(&e)
                        )));
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "no answer".to_string(),
                };
            let pause = Duration::from_millis(200);
            if Instant::now() + pause >= deadline {
                break problem;
            }
            tokio::time::sleep(pause).await;
        };
        Err(SluiceError::Unreachable {
            what: self.what(),
            message: format!("cannot connect within {:?}: {last}", self.timeout),
            hint: Some(
                "check 'url' and that the database is up and listening; \
                 'connection.max-retry-timeout' sets how long to try"
                    .into(),
            ),
        })
    }

    /// The PostgreSQL type of each declared column, which checks that the
    /// table and the columns exist.
    async fn column_types(&self, client: &Client) -> Result<Vec<String>> {
        let sql = format!("SELECT {} FROM {}", self.columns(false), self.quoted);
        let statement = client.prepare(&sql).await.map_err(|e| {
            SluiceError::config(format!(
                "{}: {} (the table declares {})",
                self.what(),
                db_message(&e),
                sluice_engine::columns(&self.schema)
            ))
        })?;
        Ok(statement
            .columns()
            .iter()
            .map(|c| c.type_().name().to_string())
            .collect())
    }

    /// The declared columns, quoted; `as_text`: each as text.
    fn columns(&self, as_text: bool) -> String {
        let cast = if as_text { "::text" } else { "" };
        self.schema
            .fields()
            .iter()
            .map(|f| format!("{}{cast}", quote(f.name())))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One lookup, on `connection`.
    async fn query(
        &self,
        connection: &Connection,
        columns: &[usize],
        keys: &[ArrayRef],
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let key_columns: Vec<String> = columns
            .iter()
            .map(|&c| quote(self.schema.field(c).name()))
            .collect();
        let unnest: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, &c)| format!("${}::text[]::{}[]", i + 1, connection.types[c]))
            .collect();
        let sql = format!(
            "SELECT {} FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))",
            self.columns(true),
            self.quoted,
            key_columns.join(", "),
            unnest.join(", ")
        );
        let texts: Vec<Vec<Option<String>>> = keys.iter().map(as_text).collect();
        let params: Vec<&(dyn ToSql + Sync)> =
            texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        connection.client.query(&sql, &params).await
    }

    /// The rows as a batch of the declared columns.
    fn to_batch(&self, rows: &[tokio_postgres::Row]) -> Result<RecordBatch> {
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for (i, field) in self.schema.fields().iter().enumerate() {
            let mut text = StringBuilder::new();
            for row in rows {
                text.append_option(row.get::<_, Option<&str>>(i));
            }
            let text: ArrayRef = Arc::new(text.finish());
            let strict = CastOptions {
                safe: false,
                ..Default::default()
            };
            let typed = match field.data_type() {
                DataType::Utf8 => text,
                t => cast_with_options(&text, t, &strict).map_err(|e| {
                    SluiceError::config(format!(
                        "{}: column '{}' holds a value that is not {t}: {e}",
                        self.what(),
                        field.name()
                    ))
                })?,
            };
            columns.push(typed);
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

#[async_trait]
impl LookupSource for PostgresTable {
    fn describe(&self) -> String {
        self.what()
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    async fn check(&self) -> Result<()> {
        self.connection().await.map(|_| ())
    }

    async fn lookup(&self, columns: &[usize], keys: &[ArrayRef]) -> Result<RecordBatch> {
        let mut attempt = 0;
        loop {
            let connection = self.connection().await?;
            let answer =
                tokio::time::timeout(self.timeout, self.query(&connection, columns, keys)).await;
            let problem = match answer {
                Ok(Ok(rows)) => return self.to_batch(&rows),
                Ok(Err(e)) if e.as_db_error().is_some() => {
                    return Err(SluiceError::External {
                        what: self.what(),
                        message: format!("the lookup failed: {}", db_message(&e)),
                        hint: None,
                    })
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            // The connection is in doubt: the next try opens another.
            *self.connection.lock().await = None;
            attempt += 1;
            if attempt > self.retries {
                return Err(SluiceError::Unreachable {
                    what: self.what(),
                    message: format!("the lookup failed {attempt} times; last: {problem}"),
                    hint: Some("'lookup.max-retries' sets how often to try again".into()),
                });
            }
            tracing::warn!(table = %self.name, %problem, attempt, "lookup failed; trying again");
        }
    }
}

/// `name` as a quoted SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The server's message of `e`, or `e` itself.
fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => e.to_string(),
    }
}

/// `keys` as text, as PostgreSQL reads them back into the key's type.
fn as_text(keys: &ArrayRef) -> Vec<Option<String>> {
    match cast(keys, &DataType::Utf8) {
        Ok(text) => text
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        Err(_) => vec![None; keys.len()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jdbc_url_gives_host_port_database_and_credentials() {
        let a = Address::parse(
            "jdbc:postgresql://db.example:6543/shop?user=u&password=p",
            None,
            None,
        )
        .unwrap();
        assert_eq!(a.shown, "db.example:6543/shop");
        assert_eq!(a.config.get_user(), Some("u"));
        let a = Address::parse("jdbc:postgresql://h/shop", Some("me".into()), None).unwrap();
        assert_eq!(
            (a.shown.as_str(), a.config.get_user()),
            ("h:5432/shop", Some("me"))
        );
        let err = Address::parse("jdbc:mysql://h:3306/shop", None, None).unwrap_err();
        assert!(err.contains("not a PostgreSQL URL"), "{err}");
        let err = Address::parse("jdbc:postgresql://h:x/shop", None, None).unwrap_err();
        assert!(err.contains("not a port number"), "{err}");
    }

    #[test]
    fn identifiers_are_quoted_as_postgres_reads_them() {
        assert_eq!(quote("Customers"), "\"Customers\"");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
