//! A client of a Confluent-compatible schema registry (Confluent Schema
//! Registry, Apicurio's `ccompat` API, Redpanda, Karapace): what
//! `format = 'avro-confluent'` and `'protobuf-confluent'` look schemas up
//! in and register them with.
//!
//! Three calls of the registry's REST API are used: a schema by its id
//! (`GET /schemas/ids/{id}`, for each record's writer schema), a subject's
//! latest version (`GET /subjects/{s}/versions/latest`, the reader schema)
//! and registering a schema under a subject (`POST /subjects/{s}/versions`,
//! what a sink writes with; the registry checks compatibility). Schemas by
//! id never change, so each is asked for once per process and then cached:
//! decoding a record never waits on the network.
//!
//! The calls block their caller: they are made when a stream or sink is
//! set up, and before a batch is decoded for ids not seen yet. They run on
//! the client's own runtime thread, so that they may be made from any
//! thread, inside the engine's runtime or not. A registry that does not
//! answer is retried with backoff until the stream's `connect.timeout`,
//! then the call fails naming the URL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use sluice_engine::{register_secret, url_userinfo, Options, Result, SluiceError, REDACTED};

/// How a stream or sink reaches its registry: the `<format>.url`,
/// `.subject`, `.basic-auth.user-info` and `.ssl.*` options
/// (`key.<format>.*` for the key's).
#[derive(Clone)]
pub(crate) struct RegistryOptions {
    /// What the options start with: `avro-confluent` or
    /// `key.avro-confluent`.
    prefix: String,
    pub(crate) url: String,
    /// The subject of the topic's values, `<topic>-value` unless set.
    pub(crate) subject: String,
    /// `user:password`, sent as HTTP basic authentication.
    user_info: Option<String>,
    /// PEM file of the CA certificates that sign the registry's
    /// certificate, beside the system's.
    ca_location: Option<String>,
    /// PEM files of a client certificate and its key, for mutual TLS.
    certificate_location: Option<String>,
    key_location: Option<String>,
    /// How long a call may keep retrying a registry that does not answer.
    pub(crate) timeout: Duration,
}

/// Everything but the user info's value.
impl std::fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryOptions")
            .field("prefix", &self.prefix)
            .field("url", &self.url)
            .field("subject", &self.subject)
            .field("user_info", &self.user_info.as_ref().map(|_| REDACTED))
            .field("ca_location", &self.ca_location)
            .field("certificate_location", &self.certificate_location)
            .field("key_location", &self.key_location)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The options [`RegistryOptions::take`] reads for `avro-confluent` and
/// `protobuf-confluent` values and `avro-confluent` keys.
pub(crate) const REGISTRY_OPTIONS: &[&str] = &[
    "protobuf-confluent.url",
    "protobuf-confluent.subject",
    "protobuf-confluent.basic-auth.user-info",
    "protobuf-confluent.ssl.ca.location",
    "protobuf-confluent.ssl.certificate.location",
    "protobuf-confluent.ssl.key.location",
    "avro-confluent.url",
    "avro-confluent.subject",
    "avro-confluent.basic-auth.user-info",
    "avro-confluent.ssl.ca.location",
    "avro-confluent.ssl.certificate.location",
    "avro-confluent.ssl.key.location",
    "key.avro-confluent.url",
    "key.avro-confluent.subject",
    "key.avro-confluent.basic-auth.user-info",
    "key.avro-confluent.ssl.ca.location",
    "key.avro-confluent.ssl.certificate.location",
    "key.avro-confluent.ssl.key.location",
];

/// The schema language of a registered schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaKind {
    Avro,
    Protobuf,
}

/// Which part of a message a registry's schema describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Key,
    Value,
}

impl RegistryOptions {
    /// Takes `<format>.url` and the other registry options of `format`
    /// for the `part` of `topic`'s messages (`key.<format>.url`, ... for
    /// keys) from `o`. `what` names the stream or sink for errors.
    pub(crate) fn take(
        o: &mut Options,
        format: &str,
        part: Part,
        topic: &str,
        what: &str,
        timeout: Duration,
    ) -> Result<Self> {
        let (prefix, suffix) = match part {
            Part::Value => (format.to_string(), "value"),
            Part::Key => (format!("key.{format}"), "key"),
        };
        let key = |name: &str| format!("{prefix}.{name}");
        let mut url = o
            .take(&key("url"))
            .ok_or_else(|| {
                SluiceError::config(format!(
                    "{what}: {suffix} format '{format}' needs the schema registry's address: \
                     '{prefix}.url' = 'http://registry:8081' (the API root, where /subjects is)"
                ))
            })?
            .trim_end_matches('/')
            .to_string();
        // Never the credentials a URL holds, whatever prints it.
        let shown = match url_userinfo(&url) {
            Some(info) => url.replacen(info, REDACTED, 1),
            None => url.clone(),
        };
        let mut parsed = Url::parse(&url).map_err(|e| {
            SluiceError::config(format!(
                "{what}: '{prefix}.url' = '{shown}' is not a URL: {e}"
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(SluiceError::config(format!(
                "{what}: '{prefix}.url' = '{shown}' must start with http:// or https://"
            )));
        }
        let mut user_info = o.take(&key("basic-auth.user-info"));
        // Credentials in the URL, as Confluent's clients take them, are the
        // basic-auth user info: sent as such, and kept out of the URL that
        // errors and logs name.
        if let Some(info) = url_userinfo(&url).map(str::to_string) {
            if user_info.is_some() {
                return Err(SluiceError::config(format!(
                    "{what}: '{prefix}.url' = '{shown}' holds credentials and \
                     '{prefix}.basic-auth.user-info' gives them too: give them once"
                )));
            }
            let info = if info.contains(':') {
                info
            } else {
                format!("{info}:")
            };
            register_secret(&info);
            if parsed.set_username("").is_err() || parsed.set_password(None).is_err() {
                return Err(SluiceError::config(format!(
                    "{what}: '{prefix}.url' = '{shown}' cannot hold credentials"
                )));
            }
            url = parsed.as_str().trim_end_matches('/').to_string();
            user_info = Some(info);
        }
        if let Some(info) = &user_info {
            if !info.contains(':') {
                return Err(SluiceError::config(format!(
                    "{what}: '{prefix}.basic-auth.user-info' must be 'user:password'"
                )));
            }
            register_secret(info);
            if let Some((_, password)) = info.split_once(':') {
                register_secret(password);
            }
        }
        let options = Self {
            url,
            subject: o
                .take(&key("subject"))
                .unwrap_or_else(|| format!("{topic}-{suffix}")),
            user_info,
            ca_location: o.take(&key("ssl.ca.location")),
            certificate_location: o.take(&key("ssl.certificate.location")),
            key_location: o.take(&key("ssl.key.location")),
            timeout,
            prefix,
        };
        if options.certificate_location.is_some() != options.key_location.is_some() {
            return Err(SluiceError::config(format!(
                "{what}: '{p}.ssl.certificate.location' and '{p}.ssl.key.location' go \
                 together (a client certificate and its key)",
                p = options.prefix
            )));
        }
        Ok(options)
    }

    /// Refuses registry options for the `part` of messages given to a
    /// stream or sink whose format for that part (`format`) uses none.
    pub(crate) fn refuse_unused(o: &Options, part: Part, format: &str, what: &str) -> Result<()> {
        let (prefix, part, formats): (&str, &str, &[&str]) = match part {
            Part::Value => ("", "format", &["avro-confluent", "protobuf-confluent"]),
            Part::Key => ("key.", "key.format", &["avro-confluent"]),
        };
        for registry_format in formats {
            let start = format!("{prefix}{registry_format}.");
            if let Some((key, _)) = o.iter().find(|(k, _)| k.starts_with(&start)) {
                return Err(SluiceError::config(format!(
                    "{what}: option '{key}' applies only with '{part}' = '{registry_format}', \
                     not '{format}'"
                )));
            }
        }
        Ok(())
    }
}

/// Where a decoder finds writer schemas by id.
#[derive(Debug)]
pub(crate) enum Writers {
    /// Asked once per id, then cached.
    Registry(Box<Registry>),
    /// A fixed set (benchmarks, tests).
    Fixed(std::collections::HashMap<u32, Arc<str>>),
}

impl Writers {
    pub(crate) fn schema_by_id(&self, id: u32) -> Result<Option<Arc<str>>> {
        match self {
            Self::Registry(r) => r.schema_by_id(id),
            Self::Fixed(schemas) => Ok(schemas.get(&id).cloned()),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Self::Registry(r) => format!("registry '{}'", r.options().url),
            Self::Fixed(_) => "the given schemas".into(),
        }
    }
}

/// A subject's schema as the registry has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubjectSchema {
    pub(crate) id: u32,
    pub(crate) version: i64,
    pub(crate) schema: String,
}

/// A connection to one registry, with the schemas it has given by id.
pub(crate) struct Registry {
    options: RegistryOptions,
    client: reqwest::Client,
    /// Owned so that calls work from any thread; shut down in the
    /// background on drop (dropping a runtime inside another one's task
    /// would panic).
    runtime: Option<tokio::runtime::Runtime>,
    /// Writer schemas by id; for an id the registry said it does not
    /// know, when it said so (asked again after [`MISS_KEPT`]: a replica
    /// may not have caught up).
    by_id: Mutex<HashMap<u32, Known>>,
}

/// What the registry said about a schema id.
#[derive(Clone)]
enum Known {
    Schema(Arc<str>),
    Missing(Instant),
}

/// How long the registry's "no such schema id" holds before it is asked
/// again.
const MISS_KEPT: Duration = Duration::from_secs(10);

/// The registry's own error codes for a subject, version or schema it does
/// not have (40401, 40402, 40403): a 404 without one (a proxy's page, the
/// wrong path) is not the registry's answer.
fn registry_not_found(code: i64) -> bool {
    (40401..=40403).contains(&code)
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("url", &self.options.url)
            .finish_non_exhaustive()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The registry's error body: `{"error_code": 40403, "message": "..."}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

enum Failure {
    /// No answer, a server error, or a 404 that is not the registry's
    /// own: worth retrying.
    Unreachable(String),
    /// An answer that will not change on retry.
    Refused {
        status: StatusCode,
        code: i64,
        message: String,
    },
}

impl Registry {
    pub(crate) fn new(options: RegistryOptions) -> Result<Self> {
        let what = format!("schema registry '{}'", options.url);
        let read = |path: &str| {
            std::fs::read(path).map_err(|e| SluiceError::External {
                what: what.clone(),
                message: format!("cannot read '{path}': {e}"),
                hint: None,
            })
        };
        let tls = |e: reqwest::Error, path: &str| {
            SluiceError::config(format!("{what}: '{path}' is not a usable PEM file: {e}"))
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(options.timeout.min(Duration::from_secs(10)))
            .timeout(options.timeout.max(Duration::from_secs(1)));
        if let Some(path) = &options.ca_location {
            for cert in
                reqwest::Certificate::from_pem_bundle(&read(path)?).map_err(|e| tls(e, path))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let (Some(cert), Some(key)) = (&options.certificate_location, &options.key_location) {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            builder =
                builder.identity(reqwest::Identity::from_pem(&pem).map_err(|e| tls(e, cert))?);
        }
        let client = builder
            .build()
            .map_err(|e| SluiceError::config(format!("{what}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-registry")
            .enable_all()
            .build()
            .map_err(|e| SluiceError::Internal(format!("registry client runtime: {e}")))?;
        Ok(Self {
            options,
            client,
            runtime: Some(runtime),
            by_id: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn options(&self) -> &RegistryOptions {
        &self.options
    }

    /// The schema with `id`, or `None` when the registry has none by
    /// that id (the record naming it is malformed, not the registry).
    pub(crate) fn schema_by_id(&self, id: u32) -> Result<Option<Arc<str>>> {
        match self.lock().get(&id) {
            Some(Known::Schema(schema)) => return Ok(Some(Arc::clone(schema))),
            Some(Known::Missing(at)) if at.elapsed() < MISS_KEPT => return Ok(None),
            _ => {}
        }
        #[derive(Deserialize)]
        struct ById {
            schema: String,
        }
        let found = match self.call::<ById>(
            reqwest::Method::GET,
            &["schemas", "ids", &id.to_string()],
            None,
        ) {
            Ok(body) => Some(Arc::<str>::from(body.schema)),
            Err(Failure::Refused { code: 40403, .. }) => None,
            Err(f) => return Err(self.error(&format!("looking up schema id {id}"), f)),
        };
        let known = match &found {
            Some(schema) => Known::Schema(Arc::clone(schema)),
            None => Known::Missing(Instant::now()),
        };
        self.lock().insert(id, known);
        Ok(found)
    }

    /// The latest version registered under `subject`, or `None` when the
    /// subject has none yet.
    pub(crate) fn latest(&self, subject: &str) -> Result<Option<SubjectSchema>> {
        #[derive(Deserialize)]
        struct Latest {
            id: u32,
            version: i64,
            schema: String,
        }
        match self.call::<Latest>(
            reqwest::Method::GET,
            &["subjects", subject, "versions", "latest"],
            None,
        ) {
            Ok(l) => {
                let schema = Known::Schema(Arc::from(l.schema.as_str()));
                self.lock().insert(l.id, schema);
                Ok(Some(SubjectSchema {
                    id: l.id,
                    version: l.version,
                    schema: l.schema,
                }))
            }
            Err(Failure::Refused { code, .. }) if registry_not_found(code) => Ok(None),
            Err(f) => Err(self.error(&format!("reading subject '{subject}'"), f)),
        }
    }

    /// Registers `schema` (Avro JSON) under `subject`, or finds it there,
    /// and returns its id. A schema the subject's compatibility rule
    /// refuses is an error quoting the registry's reason.
    pub(crate) fn register(&self, subject: &str, schema: &str, kind: SchemaKind) -> Result<u32> {
        #[derive(Deserialize)]
        struct Registered {
            id: u32,
        }
        let kind = match kind {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Protobuf => "PROTOBUF",
        };
        let body = serde_json::json!({ "schema": schema, "schemaType": kind });
        match self.call::<Registered>(
            reqwest::Method::POST,
            &["subjects", subject, "versions"],
            Some(body.to_string()),
        ) {
            Ok(r) => {
                self.lock().insert(r.id, Known::Schema(Arc::from(schema)));
                Ok(r.id)
            }
            Err(Failure::Refused {
                status, message, ..
            }) if status == StatusCode::CONFLICT || status == StatusCode::UNPROCESSABLE_ENTITY => {
                Err(SluiceError::config(format!(
                    "schema registry '{}' refused the sink's schema under subject '{subject}': \
                     {message}; the schema Sluice derives from the query's columns is \
                     {schema}. Change the query's columns to fit the subject, write to \
                     another subject ('{}.subject'), or relax the subject's compatibility rule",
                    self.options.url, self.options.prefix
                )))
            }
            Err(f) => Err(self.error(&format!("registering a schema under '{subject}'"), f)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Known>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn error(&self, doing: &str, failure: Failure) -> SluiceError {
        let what = format!("schema registry '{}'", self.options.url);
        match failure {
            // A running query retries its epoch, until 'outage.limit'.
            Failure::Unreachable(message) => SluiceError::Unreachable {
                what,
                message: format!(
                    "{doing}: no answer within {:?}: {message}",
                    self.options.timeout
                ),
                hint: Some(format!(
                    "check the registry's address ('{}.url') and that it runs; \
                     'connect.timeout' sets how long Sluice retries",
                    self.options.prefix
                )),
            },
            Failure::Refused {
                status,
                code,
                message,
            } => SluiceError::External {
                what,
                message: format!("{doing}: {status} (error code {code}): {message}"),
                hint: match status {
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Some(format!(
                        "check '{}.basic-auth.user-info' ('user:password')",
                        self.options.prefix
                    )),
                    _ => None,
                },
            },
        }
    }

    /// One call, retried with backoff while the registry does not answer
    /// or answers with a server error, until the timeout.
    fn call<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        method: reqwest::Method,
        path: &[&str],
        body: Option<String>,
    ) -> std::result::Result<T, Failure> {
        let mut url =
            Url::parse(&self.options.url).map_err(|e| Failure::Unreachable(e.to_string()))?;
        url.path_segments_mut()
            .map_err(|_| Failure::Unreachable("the URL cannot have a path".into()))?
            .pop_if_empty()
            .extend(path);
        let deadline = Instant::now() + self.options.timeout;
        let mut pause = Duration::from_millis(100);
        loop {
            let mut request = self.client.request(method.clone(), url.clone()).header(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
            if let Some(body) = &body {
                request = request
                    .header("Content-Type", "application/vnd.schemaregistry.v1+json")
                    .body(body.clone());
            }
            if let Some((user, password)) = self
                .options
                .user_info
                .as_deref()
                .and_then(|i| i.split_once(':'))
            {
                request = request.basic_auth(user, Some(password));
            }
            let outcome = self.block(async move {
                let response = request
                    .send()
                    .await
                    .map_err(|e| Failure::Unreachable(with_causes(&e)))?;
                let status = response.status();
                let bytes = response
                    .bytes()
                    .await
                    .map_err(|e| Failure::Unreachable(with_causes(&e)))?;
                if status.is_success() {
                    return serde_json::from_slice::<T>(&bytes).map_err(|e| Failure::Refused {
                        status,
                        code: 0,
                        message: format!(
                            "unexpected answer ({e}): {}",
                            String::from_utf8_lossy(&bytes)
                        ),
                    });
                }
                let error = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or(ErrorBody {
                    error_code: i64::from(status.as_u16()),
                    message: String::from_utf8_lossy(&bytes).into_owned(),
                });
                // A server error, or a 404 that is not the registry's own
                // (a proxy's page while the registry restarts): no answer.
                let foreign_404 =
                    status == StatusCode::NOT_FOUND && !registry_not_found(error.error_code);
                if status.is_server_error() || foreign_404 {
                    return Err(Failure::Unreachable(format!("{status}: {}", error.message)));
                }
                Err(Failure::Refused {
                    status,
                    code: error.error_code,
                    message: error.message,
                })
            });
            match outcome {
                Err(Failure::Unreachable(e)) if Instant::now() + pause < deadline => {
                    tracing::warn!(url = %self.options.url, error = %e, "schema registry did not answer; retrying");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// Runs `future` on the client's runtime and waits for it, from any
    /// thread.
    fn block<T: Send + 'static>(
        &self,
        future: impl std::future::Future<Output = std::result::Result<T, Failure>> + Send + 'static,
    ) -> std::result::Result<T, Failure> {
        let Some(runtime) = &self.runtime else {
            return Err(Failure::Unreachable("the client is shut down".into()));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv().unwrap_or_else(|_| {
            Err(Failure::Unreachable(
                "the registry call was cancelled".into(),
            ))
        })
    }
}

/// `e` and its causes: reqwest's own message leaves out why a request
/// failed ("connection refused", a certificate problem).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credentials in a registry URL become its basic-auth user info, and
    /// appear in nothing printed: not the URL, Debug, or a redacted error.
    #[test]
    fn credentials_in_the_url_are_the_user_info_and_never_printed() {
        let take = |url: &str, extra: &[(&str, &str)]| {
            let mut pairs = vec![("avro-confluent.url", url)];
            pairs.extend_from_slice(extra);
            let mut o = Options::from_pairs(pairs);
            RegistryOptions::take(
                &mut o,
                "avro-confluent",
                Part::Value,
                "t",
                "stream 's'",
                Duration::from_secs(1),
            )
        };
        let options = take("https://ann:Zq9-s3cret@registry:8081/apis/ccompat/v7/", &[]).unwrap();
        assert_eq!(options.url, "https://registry:8081/apis/ccompat/v7");
        assert_eq!(options.user_info.as_deref(), Some("ann:Zq9-s3cret"));
        assert!(!format!("{options:?}").contains("Zq9-s3cret"));
        let said = sluice_engine::redact_secrets("401 from https://ann:Zq9-s3cret@registry");
        assert!(!said.contains("Zq9-s3cret"), "{said}");

        let twice = take(
            "https://ann:Zq9-s3cret@registry:8081",
            &[("avro-confluent.basic-auth.user-info", "bob:other")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            twice.contains("give them once") && !twice.contains("Zq9-s3cret"),
            "{twice}"
        );
        let bad = take("ftp://ann:Zq9-s3cret@registry", &[])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("must start with http") && !bad.contains("Zq9-s3cret"),
            "{bad}"
        );
    }
}
