//! The HTTP server: the page at `/`, its files under `/assets/`, the JSON
//! API under `/api/queries`, and the Prometheus text at `/metrics`, served
//! on the tokio runtime the queries run on. Read-only: every route is a
//! GET; anything else is refused by the router.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use sluice_engine::Metrics;

use crate::board::StatusBoard;
use crate::page;

/// Why the status page could not start.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The address could not be bound: in use, not this host's, or a
    /// privileged port.
    #[error(
        "cannot listen on {addr}: {source}; choose a free port on an address of this host \
         (127.0.0.1:0 picks one)"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// The status page and its API over a [`StatusBoard`], with the metrics
/// when given, protected by a token when given.
///
/// ```no_run
/// # async fn demo() -> Result<(), sluice_status::StatusError> {
/// use std::sync::Arc;
/// let board = Arc::new(sluice_status::StatusBoard::default());
/// let server = sluice_status::StatusServer::new(board).token(Some("s3cret".into()));
/// let addr = server.serve("127.0.0.1:8080".parse().unwrap()).await?;
/// println!("open http://{addr}/");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StatusServer {
    board: Arc<StatusBoard>,
    metrics: Option<Arc<Metrics>>,
    token: Option<Arc<str>>,
}

impl StatusServer {
    /// A server of `board`'s queries, without metrics or a token.
    pub fn new(board: Arc<StatusBoard>) -> Self {
        Self {
            board,
            metrics: None,
            token: None,
        }
    }

    /// Also serves `metrics` at `/metrics`.
    pub fn metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Asks every request for `token`: as `Authorization: Bearer <token>`,
    /// or as the password of HTTP basic authentication (any user name),
    /// which a browser prompts for. A request without it gets 401 and no
    /// data.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.map(Arc::from);
        self
    }

    /// Binds `addr` (port 0 picks one) and serves on the current tokio
    /// runtime until the process ends; returns the bound address.
    pub async fn serve(&self, addr: SocketAddr) -> Result<SocketAddr, StatusError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StatusError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| StatusError::Bind { addr, source })?;
        let app = self.router();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(%bound, error = %e, "the status page stopped serving");
            }
        });
        Ok(bound)
    }

    fn router(&self) -> Router {
        let state = Arc::new(self.clone());
        Router::new()
            .route("/", get(index))
            .route("/assets/{file}", get(asset))
            .route("/api/queries", get(queries))
            .route("/api/queries/{id}", get(query))
            .route("/api/queries/{id}/progress", get(progress))
            .route("/metrics", get(metrics))
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                authorize,
            ))
            .with_state(state)
    }
}

type Shared = State<Arc<StatusServer>>;

/// Lets a request through only with the token, when one is set.
async fn authorize(State(server): Shared, request: Request, next: Next) -> Response {
    match &server.token {
        Some(token) if !presents(request.headers(), token) => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\""),
            )],
            "401: this status page asks for its token (Authorization: Bearer <token>, or as \
             the password of basic authentication)\n",
        )
            .into_response(),
        _ => next.run(request).await,
    }
}

/// Whether `headers` carry `token`, as a bearer token or a basic password.
fn presents(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    if let Some(bearer) = given.strip_prefix("Bearer ") {
        return same(bearer.trim().as_bytes(), token.as_bytes());
    }
    given
        .strip_prefix("Basic ")
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|pair| {
            let colon = pair.iter().position(|&c| c == b':')?;
            Some(same(&pair[colon + 1..], token.as_bytes()))
        })
        .unwrap_or(false)
}

/// Compares in time independent of where the bytes first differ, so the
/// token cannot be guessed byte by byte from answer times.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

async fn index() -> Response {
    html(page::INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match page::asset(&file) {
        Some((kind, body)) => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
                (
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("max-age=3600"),
                ),
            ],
            body,
        )
            .into_response(),
        None => not_found().await,
    }
}

async fn queries(State(server): Shared) -> Response {
    json(Some(server.board.summaries()))
}

async fn query(State(server): Shared, Path(id): Path<String>) -> Response {
    json(server.board.detail(&id))
}

async fn progress(State(server): Shared, Path(id): Path<String>) -> Response {
    json(server.board.progress(&id))
}

async fn metrics(State(server): Shared) -> Response {
    match &server.metrics {
        Some(m) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            )],
            m.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "the metrics are served with --metrics-addr\n",
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: the page is at /, the API at /api/queries, the metrics at /metrics\n",
    )
        .into_response()
}

fn html(body: &'static str) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

/// `value` as JSON, never cached; `None` is a query this process does not
/// run: 404.
fn json(value: Option<serde_json::Value>) -> Response {
    match value {
        Some(v) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            v.to_string(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            r#"{"error":"no query of this process has that id; /api/queries lists them"}"#,
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    /// One GET over a fresh connection; the whole answer.
    async fn get(addr: SocketAddr, path: &str, auth: Option<&str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// A client that connects and says nothing holds up no other request;
    /// with a token, a request without it or with another gets 401 and no
    /// data, one with it the metrics.
    #[tokio::test]
    async fn a_silent_client_holds_up_nothing_and_a_wrong_token_gets_401() {
        let metrics = Arc::new(Metrics::default());
        let server = StatusServer::new(Arc::default())
            .metrics(Some(metrics))
            .token(Some("s3cret".into()));
        let addr = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            get(addr, "/metrics", Some("Bearer s3cret")),
        )
        .await
        .expect("answered behind the silent client");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.contains("process_resident_memory_bytes"), "{answer}");
        for auth in [None, Some("Bearer s3cre"), Some("Basic b3BzOnMzY3JldHg=")] {
            let answer = get(addr, "/api/queries", auth).await;
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
            assert!(answer.contains("www-authenticate: Basic"), "{answer}");
            assert!(!answer.contains('['), "{answer}");
        }
        // ops:s3cret
        let answer = get(addr, "/api/queries", Some("Basic b3BzOnMzY3JldA==")).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("[]"), "{answer}");
        let taken = server.serve(addr).await.unwrap_err().to_string();
        assert!(
            taken.contains(&format!("cannot listen on {addr}")),
            "{taken}"
        );
    }

    #[test]
    fn the_token_is_taken_as_a_bearer_token_or_a_basic_password_only() {
        let basic = |pair: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        };
        assert!(presents(&with("Bearer s3cret"), "s3cret"));
        assert!(presents(&with(&basic("ops:s3cret")), "s3cret"));
        assert!(presents(&with(&basic(":s3cret")), "s3cret"));
        assert!(!presents(&with("Bearer s3cre"), "s3cret"));
        assert!(!presents(&with("Bearer s3cretx"), "s3cret"));
        assert!(!presents(&with(&basic("s3cret:")), "s3cret"));
        assert!(!presents(&with(&basic("s3cret")), "s3cret"));
        assert!(!presents(&with("s3cret"), "s3cret"));
        assert!(!presents(&HeaderMap::new(), "s3cret"));
    }
}
