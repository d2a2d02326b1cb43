//! A real local Kafka broker for tests, examples, benchmarks and the demo.
//!
//! [`ensure_broker`] returns a bootstrap address, starting the project's
//! `scripts/kafka` (Apache Kafka from Maven Central, KRaft, loopback) when
//! nothing listens on `SLUICE_KAFKA_PORT` (default 9092);
//! [`ensure_broker_on`] does the same on a port of the caller's (the tests
//! keep a broker of their own, away from one the user runs on 9092). The
//! script is also compiled into the binary, so `sluice demo` works outside
//! the repository.
//! [`ensure_secure_broker_on`] starts one with TLS and SASL listeners, and
//! [`ensure_oidc_broker_on`] one that also takes OAUTHBEARER tokens of a
//! real OpenID Connect provider (`scripts/keycloak`, Keycloak).
//! Tests get unique topics from [`fresh_topic`] and read them back with
//! [`read_topic`].

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use sluice_engine::{Result, SluiceError};

use crate::client::{ClientOptions, Role};

/// The scripts themselves live in this crate (so a published crate
/// carries them); the repository's `scripts/` holds links to them.
const KAFKA_SCRIPT: Script = Script {
    name: "kafka",
    text: include_str!("../scripts/kafka"),
};
const KEYCLOAK_SCRIPT: Script = Script {
    name: "keycloak",
    text: include_str!("../scripts/keycloak"),
};

/// One of the crate's scripts that start real servers.
#[derive(Clone, Copy)]
struct Script {
    name: &'static str,
    text: &'static str,
}

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

impl Script {
    /// The script's path: the repository's own when present, else the
    /// copy compiled into this binary, written to the user's cache
    /// directory — or, with neither `SLUICE_CACHE` nor `HOME`, to a new
    /// directory of a random name (a fixed path in the shared temporary
    /// directory could be planted by another user).
    fn path(self) -> Result<PathBuf> {
        let in_repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("scripts")
            .join(self.name);
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
        let path = bin.join(self.name);
        let io = |e| SluiceError::io(format!("writing {}", path.display()), e);
        std::fs::write(&path, self.text).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
        }
        Ok(path)
    }

    /// Runs `scripts/<name> <command>` with `env`; its stdout.
    fn run(self, command: &str, env: &[(&str, String)]) -> Result<String> {
        let script = self.path()?;
        let out = Command::new("bash")
            .arg(&script)
            .arg(command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(|e| SluiceError::io(format!("running {}", script.display()), e))?;
        if !out.status.success() {
            let vars: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
            return Err(SluiceError::External {
                what: format!("scripts/{} {command} ({})", self.name, script.display()),
                message: format!(
                    "exit status {}\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                hint: Some(format!(
                    "run `{vars}scripts/{} {command}` by hand to see what fails",
                    self.name
                )),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The `KEY=value` lines a script printed, looked up by key.
fn env_value(script: &str, env: &str, key: &str) -> Result<String> {
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .ok_or_else(|| SluiceError::Internal(format!("scripts/{script}: no {key} in {env}")))
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
    tracing::info!("starting a local Kafka broker");
    KAFKA_SCRIPT.run("start", &kafka_env(port, false))?;
    Ok(address)
}

/// The environment of `scripts/kafka` for the broker on `port`.
fn kafka_env(port: u16, secure: bool) -> Vec<(&'static str, String)> {
    vec![
        ("SLUICE_KAFKA_PORT", port.to_string()),
        (
            "SLUICE_KAFKA_SECURE",
            if secure { "1" } else { "0" }.to_string(),
        ),
    ]
}

/// A local broker with TLS and SASL listeners (`SLUICE_KAFKA_SECURE=1
/// scripts/kafka start`): where each listens, and the CA, client
/// certificate and SCRAM user to reach them with.
#[derive(Debug, Clone)]
pub struct SecureBroker {
    /// PLAINTEXT listener (for tools that need no login).
    pub plaintext: String,
    /// SASL_SSL listener: SCRAM-SHA-256/512 and PLAIN.
    pub sasl_ssl: String,
    /// SSL listener that requires a client certificate.
    pub ssl: String,
    /// SASL_PLAINTEXT listener.
    pub sasl_plaintext: String,
    /// The CA that signed the broker's (and the client's) certificate.
    pub ca: PathBuf,
    /// A client certificate the SSL listener accepts, and its key.
    pub client_cert: PathBuf,
    /// The client certificate's private key (PEM, unencrypted).
    pub client_key: PathBuf,
    /// The SCRAM (and PLAIN) user.
    pub user: String,
    /// Its password, random per broker.
    pub password: String,
    /// The SASL_SSL listener for OAUTHBEARER, and the OpenID Connect
    /// provider whose tokens it accepts ([`ensure_oidc_broker_on`]).
    pub oauthbearer: Option<(String, OidcProvider)>,
}

/// A running OpenID Connect provider (`scripts/keycloak`) and the client
/// whose credentials it exchanges for tokens.
#[derive(Debug, Clone)]
pub struct OidcProvider {
    /// The issuer its tokens name.
    pub issuer: String,
    /// Where a client exchanges its id and secret for a token.
    pub token_url: String,
    /// Where brokers fetch the keys that check a token's signature.
    pub jwks_url: String,
    /// The client allowed the client-credentials grant.
    pub client_id: String,
    /// Its secret, random per provider installation.
    pub client_secret: String,
    /// The audience its tokens name, which the broker requires.
    pub audience: String,
}

impl SecureBroker {
    /// Client options for the SASL_SSL listener as the SCRAM-SHA-512 user.
    pub fn scram(&self) -> ClientOptions {
        ClientOptions::new(self.sasl_ssl.as_str())
            .property("security.protocol", "SASL_SSL")
            .property("sasl.mechanism", "SCRAM-SHA-512")
            .property("sasl.username", self.user.as_str())
            .property("sasl.password", self.password.as_str())
            .property("ssl.ca.location", self.ca.display().to_string())
    }

    /// Client options for the SSL listener with the client certificate.
    pub fn mtls(&self) -> ClientOptions {
        ClientOptions::new(self.ssl.as_str())
            .property("security.protocol", "SSL")
            .property("ssl.ca.location", self.ca.display().to_string())
            .property(
                "ssl.certificate.location",
                self.client_cert.display().to_string(),
            )
            .property("ssl.key.location", self.client_key.display().to_string())
    }

    /// Client options for the OAUTHBEARER listener, the token fetched
    /// from the provider with the client's id and secret (librdkafka's
    /// `sasl.oauthbearer.method=oidc`); `None` without that listener.
    pub fn oidc(&self) -> Option<ClientOptions> {
        let (listener, provider) = self.oauthbearer.as_ref()?;
        Some(
            ClientOptions::new(listener.as_str())
                .property("security.protocol", "SASL_SSL")
                .property("sasl.mechanism", "OAUTHBEARER")
                .property("sasl.oauthbearer.method", "oidc")
                .property("sasl.oauthbearer.client.id", provider.client_id.as_str())
                .property(
                    "sasl.oauthbearer.client.secret",
                    provider.client_secret.as_str(),
                )
                .property(
                    "sasl.oauthbearer.token.endpoint.url",
                    provider.token_url.as_str(),
                )
                .property("ssl.ca.location", self.ca.display().to_string()),
        )
    }
}

/// A running secured broker on `port` (listeners on `port`..`port + 4`,
/// see `scripts/kafka`), started when none runs there.
pub fn ensure_secure_broker_on(port: u16) -> Result<SecureBroker> {
    Ok(secure_broker(&kafka_env(port, true))?.0)
}

/// [`ensure_secure_broker_on`] with, on `port + 5`, a SASL_SSL listener
/// for OAUTHBEARER tokens of a real OpenID Connect provider (Keycloak,
/// `scripts/keycloak`) on `provider_port`, started first when it does
/// not run.
pub fn ensure_oidc_broker_on(port: u16, provider_port: u16) -> Result<SecureBroker> {
    let env = vec![("SLUICE_KEYCLOAK_PORT", provider_port.to_string())];
    KEYCLOAK_SCRIPT.run("start", &env)?;
    let printed = KEYCLOAK_SCRIPT.run("env", &env)?;
    let get = |key| env_value("keycloak", &printed, key);
    let provider = OidcProvider {
        issuer: get("ISSUER")?,
        token_url: get("TOKEN_URL")?,
        jwks_url: get("JWKS_URL")?,
        client_id: get("CLIENT_ID")?,
        client_secret: get("CLIENT_SECRET")?,
        audience: get("AUDIENCE")?,
    };
    let mut env = kafka_env(port, true);
    env.push(("SLUICE_KAFKA_OIDC_JWKS_URL", provider.jwks_url.clone()));
    env.push(("SLUICE_KAFKA_OIDC_ISSUER", provider.issuer.clone()));
    env.push(("SLUICE_KAFKA_OIDC_AUDIENCE", provider.audience.clone()));
    let (mut broker, printed) = secure_broker(&env)?;
    let listener = env_value("kafka", &printed, "OAUTHBEARER").map_err(|_| {
        SluiceError::config(format!(
            "the broker on port {port} runs without an OAUTHBEARER listener (started without \
             SLUICE_KAFKA_OIDC_JWKS_URL); stop it (SLUICE_KAFKA_PORT={port} scripts/kafka stop) \
             and it is started again with one"
        ))
    })?;
    broker.oauthbearer = Some((listener, provider));
    Ok(broker)
}

/// Starts the secured broker `env` describes; it, and what
/// `scripts/kafka secure-env` printed about it.
fn secure_broker(env: &[(&str, String)]) -> Result<(SecureBroker, String)> {
    KAFKA_SCRIPT.run("start", env)?;
    let printed = KAFKA_SCRIPT.run("secure-env", env)?;
    let get = |key| env_value("kafka", &printed, key);
    let broker = SecureBroker {
        plaintext: get("PLAINTEXT")?,
        sasl_ssl: get("SASL_SSL")?,
        ssl: get("SSL")?,
        sasl_plaintext: get("SASL_PLAINTEXT")?,
        ca: get("CA")?.into(),
        client_cert: get("CLIENT_CERT")?.into(),
        client_key: get("CLIENT_KEY")?.into(),
        user: get("SASL_USER")?,
        password: get("SASL_PASSWORD")?,
        oauthbearer: None,
    };
    Ok((broker, printed))
}

/// A topic name no earlier run has used: `<prefix>-<random>`.
pub fn fresh_topic(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn kafka_error(what: &str, client: &ClientOptions, e: impl std::fmt::Display) -> SluiceError {
    SluiceError::External {
        what: format!("kafka at {}: {what}", client.bootstrap()),
        message: client.redact(&e.to_string()),
        hint: None,
    }
}

/// Creates `topic` with `partitions` partitions (replication 1), on the
/// brokers `client` names (an address, or [`ClientOptions`]).
pub async fn create_topic(
    client: impl Into<ClientOptions>,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    let client = client.into();
    let bootstrap = &client;
    client.check_connection("admin client")?;
    let admin = client.admin("admin client")?;
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
    // The controller has made it; a broker learns of it a moment later,
    // and a client asking then is told the topic does not exist.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let known = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()
            .and_then(|m| {
                m.topics().first().map(|t| {
                    t.error().is_none()
                        && t.partitions().len() == partitions as usize
                        && t.partitions().iter().all(|p| p.leader() >= 0)
                })
            })
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(kafka_error(
                &format!("creating topic {topic}"),
                bootstrap,
                "the topic was created but its partitions had no leader within 30s",
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
/// now (the last stable offset when `read_committed`, given up to 5 s to
/// pass the markers of transactions committed just before), partition by
/// partition in offset order. Blocking: call from a blocking thread.
pub fn read_topic(
    client: impl Into<ClientOptions>,
    topic: &str,
    read_committed: bool,
    timeout: Duration,
) -> Result<Vec<ReadRecord>> {
    read_topic_from(client.into(), topic, read_committed, timeout, None)
}

/// How many committed records each of `starts`' partitions of `topic`
/// holds from its offset on (records deleted before it do not count);
/// only partitions that hold some. Blocking, as [`read_topic`].
pub(crate) fn count_committed_after(
    client: &ClientOptions,
    topic: &str,
    starts: &[(i32, i64)],
) -> Result<Vec<(i32, usize)>> {
    let starts: BTreeMap<i32, i64> = starts.iter().copied().collect();
    let records = read_topic_from(client.clone(), topic, true, client.timeout(), Some(&starts))?;
    let mut counts: BTreeMap<i32, usize> = BTreeMap::new();
    for r in records {
        *counts.entry(r.partition).or_default() += 1;
    }
    Ok(counts.into_iter().collect())
}

/// [`read_topic`], of the partitions `starts` names from their offsets
/// when given.
fn read_topic_from(
    client: ClientOptions,
    topic: &str,
    read_committed: bool,
    timeout: Duration,
    starts: Option<&BTreeMap<i32, i64>>,
) -> Result<Vec<ReadRecord>> {
    let bootstrap = &client;
    let mut config = client.config(Role::Consumer);
    config
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
        );
    client.check_connection("consumer")?;
    let consumer: BaseConsumer = client.create(&config, "consumer")?;
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
        let from = match starts {
            None => 0,
            Some(starts) => match starts.get(&p) {
                Some(&from) => from,
                None => continue,
            },
        };
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| kafka_error("fetching offsets", bootstrap, e))?;
        ranges.push((p, low.max(from), high));
    }
    if read_committed {
        config.set("isolation.level", "read_uncommitted");
        let uncommitted: BaseConsumer = client.create(&config, "consumer")?;
        let mut stable: Vec<(i32, i64)> = ranges.iter().map(|(p, _, s)| (*p, *s)).collect();
        crate::position::settle_stable_offsets(
            &consumer,
            &uncommitted,
            topic,
            &mut stable,
            Duration::from_secs(5).min(timeout),
            timeout,
        )
        .map_err(|e| kafka_error("fetching offsets", bootstrap, e))?;
        for ((_, _, high), (_, s)) in ranges.iter_mut().zip(stable) {
            *high = s;
        }
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
