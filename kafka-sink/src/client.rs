//! How Sluice reaches a Kafka cluster: one [`ClientOptions`] per stream or
//! command — the brokers, how long to wait for them, and the user's
//! librdkafka properties (TLS, SASL, tuning) — from which every client
//! Sluice makes is created: the source consumer, the producers, the
//! progress-topic reader, the admin and consumer-group clients. So a
//! secured cluster is described once, and a property that would undo a
//! guarantee is refused in one place.
//!
//! Secrets stay secret: the values of sensitive properties
//! ([`sluice_engine::is_sensitive`]) never appear in what this module
//! formats. Its `Debug` redacts them, and a client librdkafka refuses to
//! create is reported by the property's name and librdkafka's reason, never
//! its value (librdkafka's own message echoes the value).

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::FromClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};
use sluice_engine::{is_sensitive, register_secret, Options, Result, SluiceError, REDACTED};

/// Options of every Kafka stream, read or written: where the topic is, how
/// its records are encoded, and the client's own properties.
pub(crate) const STREAM_OPTIONS: &[&str] = &[
    "topic",
    "bootstrap.servers",
    "properties.bootstrap.servers",
    "format",
    "key.format",
    "key.fields",
    "value.fields-include",
    "connect.timeout",
    "dead-letter.topic",
    "kafka.*",
    "properties.*",
];

/// Options only a Kafka source reads, besides the `STREAM_OPTIONS` every
/// stream has.
pub(crate) const SOURCE_OPTIONS: &[&str] = &[
    "scan.startup.mode",
    "scan.startup.timestamp-millis",
    "scan.startup.specific-offsets",
    "max-records-per-epoch",
    "max-bytes-per-epoch",
    "format.on-error",
    "group.id",
    "fail-on-data-loss",
    "purge-committed",
];

/// Options only a Kafka sink reads, besides the `STREAM_OPTIONS` every
/// stream has.
pub(crate) const SINK_OPTIONS: &[&str] = &[
    "topic.partitions",
    "sink.delivery",
    "transaction.timeout",
    "progress.topic",
    "sink.transactional-id-prefix",
    "sink.epoch-headers",
    "sink.partition-field",
];

/// Leaves out of `o` the options of the stream's other use, as Flink
/// ignores an option that does not apply to how a table is used: reading
/// leaves out `other` (the sink's options) and Flink's other `sink.*`
/// options, writing the source's options and Flink's other `scan.*`
/// options and `sink.partitioner`. An option Sluice has no use for either
/// way is named in a warning, so that a file written for Flink runs.
pub(crate) fn leave_out_other_use(stream: &str, o: &mut Options, other: &[&str], flink: &[&str]) {
    let keys: Vec<String> = o.iter().map(|(k, _)| k.to_string()).collect();
    for key in keys {
        if other.contains(&key.as_str()) {
            o.take(&key);
        } else if flink.iter().any(|f| match f.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == *f,
        }) {
            o.take(&key);
            tracing::warn!(
                stream,
                option = %key,
                "Flink's option is not one Sluice uses for this stream; ignored"
            );
        }
    }
}

/// How long to wait for the brokers unless `connect.timeout` says otherwise.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The connection every Kafka client of one stream or command shares.
///
/// ```
/// use std::time::Duration;
/// use sluice_kafka::ClientOptions;
/// let options = ClientOptions::new("broker-1:9093")
///     .connect_timeout(Duration::from_secs(10))
///     .property("security.protocol", "SASL_SSL")
///     .property("sasl.mechanism", "SCRAM-SHA-512")
///     .property("sasl.username", "sluice")
///     .property("sasl.password", "hunter2");
/// assert_eq!(options.bootstrap(), "broker-1:9093");
/// assert!(!format!("{options:?}").contains("hunter2"));
/// assert_eq!(options.redact("login as hunter2 failed"), "login as [redacted] failed");
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClientOptions {
    bootstrap: String,
    connect_timeout: Duration,
    /// librdkafka properties, in the order given; a later one wins.
    properties: Vec<(String, String)>,
}

/// A Kafka client dropped on a thread of its own, so that whoever lets go
/// of it does not wait: rdkafka's admin client joins a polling thread that
/// sleeps up to 100 ms per poll, and a consumer of a group polls until it
/// has left; a query's start and end each waited for several of them in
/// turn.
pub(crate) struct Detached<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Detached<T> {
    pub(crate) fn new(client: T) -> Self {
        Self(Some(client))
    }
}

impl<T: Send + 'static> std::ops::Deref for Detached<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Only `drop` takes it.
        self.0.as_ref().expect("a client until dropped")
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            std::thread::spawn(move || drop(client));
        }
    }
}

/// An admin client.
pub(crate) type Admin = Detached<AdminClient<DefaultClientContext>>;

/// Which kind of client a configuration is for: librdkafka warns about
/// (and ignores) properties of the other kind, so those are left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Consumer,
    Producer,
    Admin,
}

/// Properties only producers read.
const PRODUCER_ONLY: &[&str] = &[
    "acks",
    "request.required.acks",
    "compression.",
    "linger.ms",
    "queue.buffering.",
    "batch.",
    "sticky.partitioning.linger.ms",
    "message.timeout.ms",
    "delivery.",
    "partitioner",
    "enable.idempotence",
    "transactional.id",
    "transaction.timeout.ms",
    "retries",
    "message.send.max.retries",
];

/// Properties only consumers read.
const CONSUMER_ONLY: &[&str] = &[
    "fetch.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "queued.",
    "partition.assignment.strategy",
    "check.crcs",
    "group.instance.id",
    "group.protocol",
    "isolation.level",
    "enable.auto.",
    "auto.",
];

fn listed(key: &str, list: &[&str]) -> bool {
    list.iter()
        .any(|p| key == *p || p.ends_with('.') && key.starts_with(p))
}

impl ClientOptions {
    /// Options for the brokers at `bootstrap`, waited for up to 30 s.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            properties: Vec::new(),
        }
    }

    /// How long to wait for the brokers before failing.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Adds a librdkafka property (`security.protocol`, `sasl.username`,
    /// ...); a later value of the same key wins.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into().trim().to_ascii_lowercase();
        let value = value.into();
        if is_sensitive(&key) {
            register_secret(&value);
        }
        self.properties.retain(|(k, _)| *k != key);
        self.properties.push((key, value));
        self
    }

    /// Adds the properties of a Java-style properties file: `key=value`
    /// (or `key: value`) lines, `#` and `!` comments. A `sasl.jaas.config`
    /// with `username="..."` and `password="..."`, as Java clients write
    /// it, becomes librdkafka's `sasl.username` and `sasl.password`.
    pub fn properties_file(mut self, path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SluiceError::io(format!("reading {}", path.display()), e))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((key, value)) = line.split_once(['=', ':']) else {
                return Err(SluiceError::config(format!(
                    "{}:{}: expected 'key=value', found a line without '='",
                    path.display(),
                    n + 1
                )));
            };
            self = self.with_pair(key.trim(), value.trim());
        }
        Ok(self)
    }

    /// Adds `key=value` (one `--kafka-property` of the command line).
    pub fn property_pair(self, pair: &str) -> Result<Self> {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok(self.with_pair(key.trim(), value.trim()))
            }
            _ => Err(SluiceError::config(format!(
                "--kafka-property takes key=value, e.g. security.protocol=SASL_SSL; found '{}'",
                if is_sensitive(pair) { REDACTED } else { pair }
            ))),
        }
    }

    fn with_pair(self, key: &str, value: &str) -> Self {
        if key.eq_ignore_ascii_case("sasl.jaas.config") {
            let field = |name: &str| {
                let start = value.find(&format!("{name}=\""))? + name.len() + 2;
                let len = value[start..].find('"')?;
                Some(value[start..start + len].to_string())
            };
            if let (Some(user), Some(password)) = (field("username"), field("password")) {
                return self
                    .property("sasl.username", user)
                    .property("sasl.password", password);
            }
        }
        if key.eq_ignore_ascii_case("bootstrap.servers") {
            let mut s = self;
            s.bootstrap = value.to_string();
            return s;
        }
        self.property(key, value)
    }

    /// Reads a stream's connection options: `bootstrap.servers` (or
    /// Flink's `properties.bootstrap.servers`), `connect.timeout`, and the
    /// `kafka.*` / `properties.*` pass-through properties, prefix removed.
    /// A property of `refused` fails, named as written, with its reason.
    pub(crate) fn from_options(
        o: &mut Options,
        what: &str,
        default_timeout: Duration,
        refused: &[(&str, &str)],
    ) -> Result<Self> {
        let mut properties = Vec::new();
        for prefix in ["kafka.", "properties."] {
            for (key, value) in o.take_prefixed(prefix) {
                if let Some((_, why)) = refused.iter().find(|(k, _)| *k == key) {
                    return Err(SluiceError::config(format!(
                        "{what}: '{prefix}{key}' cannot be set: {why}"
                    )));
                }
                if properties.iter().any(|(k, _)| *k == key) {
                    return Err(SluiceError::config(format!(
                        "{what}: 'kafka.{key}' and 'properties.{key}' are the same property; \
                         give it once"
                    )));
                }
                properties.push((key, value));
            }
        }
        let given = properties
            .iter()
            .position(|(k, _)| k == "bootstrap.servers")
            .map(|i| properties.remove(i).1);
        let bootstrap = match (o.take("bootstrap.servers"), given) {
            (Some(b), _) | (None, Some(b)) => b,
            (None, None) => o.take_required("kafka", "bootstrap.servers", "localhost:9092")?,
        };
        let connect_timeout = o
            .take_duration("connect.timeout")?
            .unwrap_or(default_timeout);
        let mut options = Self::new(bootstrap).connect_timeout(connect_timeout);
        for (k, v) in properties {
            options = options.property(k, v);
        }
        Ok(options)
    }

    /// The brokers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// How long to wait for the brokers.
    pub fn timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The properties, in the order given.
    pub fn properties(&self) -> impl Iterator<Item = (&str, &str)> {
        self.properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The value of property `key`, if given.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Removes property `key` and returns its value.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let i = self.properties.iter().position(|(k, _)| k == key)?;
        Some(self.properties.remove(i).1)
    }

    /// The configuration of a client of `role`: the brokers, the connect
    /// timeout and the user's properties that apply to it. Callers then
    /// set what their client needs.
    pub(crate) fn config(&self, role: Role) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap).set(
            "socket.connection.setup.timeout.ms",
            self.connect_timeout.as_millis().to_string(),
        );
        for (k, v) in &self.properties {
            let skip = match role {
                Role::Consumer => listed(k, PRODUCER_ONLY),
                Role::Producer => listed(k, CONSUMER_ONLY),
                Role::Admin => listed(k, PRODUCER_ONLY) || listed(k, CONSUMER_ONLY),
            };
            if !skip {
                config.set(k, v);
            }
        }
        config
    }

    /// Creates a client from `config` (made by [`config`](Self::config)).
    /// A property librdkafka refuses is named with its reason; its value,
    /// which librdkafka's message repeats, is left out.
    pub(crate) fn create<T: FromClientConfig>(
        &self,
        config: &ClientConfig,
        what: &str,
    ) -> Result<T> {
        config.create().map_err(|e| self.creation_error(what, &e))
    }

    /// An admin client with this configuration (`what` names it in errors).
    pub(crate) fn admin(&self, what: &str) -> Result<Admin> {
        self.create(&self.config(Role::Admin), what)
            .map(Detached::new)
    }

    /// The error for a client librdkafka would not create: a refused
    /// property by its name and librdkafka's reason, never its value.
    pub(crate) fn creation_error(&self, what: &str, e: &KafkaError) -> SluiceError {
        let message = match e {
            KafkaError::ClientConfig(_, reason, key, _) => {
                let given = self.properties.iter().any(|(k, _)| k == key);
                format!(
                    "librdkafka refuses property '{}{key}': {}",
                    if given { "kafka." } else { "" },
                    self.redact(reason)
                )
            }
            other => self.redact(&other.to_string()),
        };
        SluiceError::config(format!("{what}: {message}"))
    }

    /// Checks, once per process for these options, that the brokers
    /// answer and accept the client's credentials and certificates. A
    /// refused login or TLS handshake fails at once, saying so; librdkafka
    /// itself would retry it until every request timed out as "no
    /// answer". Brokers that do not answer fail after the connect timeout.
    pub(crate) fn check_connection(&self, what: &str) -> Result<()> {
        static CHECKED: Mutex<BTreeSet<ClientOptions>> = Mutex::new(BTreeSet::new());
        let checked = || CHECKED.lock().unwrap_or_else(|p| p.into_inner());
        if checked().contains(self) {
            return Ok(());
        }
        let probe: BaseConsumer<Probe> = self
            .config(Role::Admin)
            .create_with_context(Probe::default())
            .map_err(|e| self.creation_error(what, &e))?;
        let deadline = Instant::now() + self.connect_timeout;
        loop {
            let answer = probe.fetch_metadata(None, Duration::from_millis(500));
            // Serves the client's queue, where its log lines and errors wait.
            if answer.is_err() {
                let _ = probe.poll(Duration::from_millis(100));
            }
            if let Some(refused) = probe.context().refused() {
                return Err(self.refused(what, refused));
            }
            match answer {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(SluiceError::Unreachable {
                        what: format!("{what}, brokers '{}'", self.bootstrap),
                        message: format!(
                            "no answer within {:?}: {}",
                            self.connect_timeout,
                            self.redact(&e.to_string())
                        ),
                        hint: Some(format!(
                            "check that Kafka runs there (for a local one: scripts/kafka start), \
                             that 'bootstrap.servers' is right and that \
                             'kafka.security.protocol' ({}) is the listener's; the wait is set by \
                             'connect.timeout'",
                            self.get("security.protocol").unwrap_or("plaintext")
                        )),
                    });
                }
                Err(_) => {}
            }
        }
        checked().insert(self.clone());
        Ok(())
    }

    fn refused(&self, what: &str, refused: Refused) -> SluiceError {
        let oauthbearer = self
            .get("sasl.mechanism")
            .is_some_and(|m| m.eq_ignore_ascii_case("OAUTHBEARER"));
        let (message, hint) = match refused {
            Refused::Authentication(reason) => (
                format!("authentication failed: {reason}"),
                if oauthbearer {
                    "check 'kafka.sasl.oauthbearer.client.id', \
                     'kafka.sasl.oauthbearer.client.secret' and \
                     'kafka.sasl.oauthbearer.token.endpoint.url' against the identity provider, \
                     and that the brokers accept its tokens (issuer, audience, scope)"
                } else {
                    "check 'kafka.sasl.mechanism', 'kafka.sasl.username' and 'kafka.sasl.password' \
                     (or the client certificate) against the cluster's users"
                },
            ),
            Refused::Tls(reason) => (
                format!("the TLS handshake failed: {reason}"),
                "check 'kafka.ssl.ca.location' (the CA that signed the brokers' certificates), \
                 that 'bootstrap.servers' names a host the certificates are for, and any client \
                 certificate ('kafka.ssl.certificate.location', 'kafka.ssl.key.location')",
            ),
        };
        SluiceError::Unreachable {
            what: format!("{what}, brokers '{}'", self.bootstrap),
            message: self.redact(&message),
            hint: Some(hint.into()),
        }
    }

    /// `text` with the value of every sensitive property replaced by
    /// [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (k, v) in &self.properties {
            if is_sensitive(k) && !v.is_empty() {
                out = out.replace(v.as_str(), REDACTED);
            }
        }
        out
    }
}

/// Why brokers refused a client, as librdkafka reported it.
#[derive(Debug, Clone)]
enum Refused {
    Authentication(String),
    Tls(String),
}

/// A client context keeping the first login or TLS failure librdkafka
/// reports (it logs them and retries; the log lines and error events
/// reach the context when the client's queue is polled).
#[derive(Default)]
struct Probe(Mutex<Option<Refused>>);

impl Probe {
    fn refused(&self) -> Option<Refused> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn note(&self, code: Option<RDKafkaErrorCode>, message: &str) {
        let refused = if code == Some(RDKafkaErrorCode::Authentication)
            || message.contains("SASL authentication error")
            || message.contains("Authentication failed")
        {
            Refused::Authentication(message.to_string())
        } else if code == Some(RDKafkaErrorCode::SSL) || message.contains("SSL handshake failed") {
            Refused::Tls(message.to_string())
        } else {
            return;
        };
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(refused);
    }
}

impl ClientContext for Probe {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.note(None, message);
        DefaultClientContext.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.note(error.rdkafka_error_code(), reason);
    }
}

impl rdkafka::consumer::ConsumerContext for Probe {}

impl From<&str> for ClientOptions {
    fn from(bootstrap: &str) -> Self {
        Self::new(bootstrap)
    }
}

impl From<&String> for ClientOptions {
    fn from(bootstrap: &String) -> Self {
        Self::new(bootstrap.as_str())
    }
}

impl From<&ClientOptions> for ClientOptions {
    fn from(options: &ClientOptions) -> Self {
        options.clone()
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: Vec<(&str, &str)> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let v = if is_sensitive(k) {
                    REDACTED
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect();
        f.debug_struct("ClientOptions")
            .field("bootstrap", &self.bootstrap)
            .field("connect_timeout", &self.connect_timeout)
            .field("properties", &properties)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_gets_the_properties_of_its_kind() {
        let o = ClientOptions::new("b:1")
            .property("security.protocol", "SSL")
            .property("compression.type", "zstd")
            .property("fetch.min.bytes", "10");
        let get = |role| {
            let c = o.config(role);
            (
                c.get("security.protocol").is_some(),
                c.get("compression.type").is_some(),
                c.get("fetch.min.bytes").is_some(),
            )
        };
        assert_eq!(get(Role::Producer), (true, true, false));
        assert_eq!(get(Role::Consumer), (true, false, true));
        assert_eq!(get(Role::Admin), (true, false, false));
    }

    #[test]
    fn a_refused_property_is_named_without_its_value() {
        let o = ClientOptions::new("b:1").property("sasl.pasword", "s3cret-value");
        let made =
            o.create::<rdkafka::consumer::BaseConsumer>(&o.config(Role::Consumer), "stream 's'");
        let err = made.err().expect("refused").to_string();
        assert!(err.contains("'kafka.sasl.pasword'"), "{err}");
        assert!(!err.contains("s3cret-value"), "{err}");
    }

    #[test]
    fn java_properties_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.properties");
        std::fs::write(
            &path,
            "# a Java client's file\nbootstrap.servers=b:9093\nsecurity.protocol = SASL_SSL\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"alice\" password=\"pw\";\n",
        )
        .unwrap();
        let o = ClientOptions::new("x:1").properties_file(&path).unwrap();
        assert_eq!(o.bootstrap(), "b:9093");
        assert_eq!(o.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(o.get("sasl.username"), Some("alice"));
        assert_eq!(o.get("sasl.password"), Some("pw"));
        assert!(ClientOptions::new("x:1").property_pair("novalue").is_err());
    }
}
