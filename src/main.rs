//! The `sluice` command line: `run`, `explain`, `verify`, `checkpoint
//! inspect`, `nexmark load`, `demo`.
//!
//! Exit status: 0 success; 2 a mistake in the SQL or the command line (the
//! message names file:line:column); 1 a failure while running.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice::{Prepared, SluiceError, SqlError, StatementOutcome};
use sluice::{QueryProgress, StreamingQuery, StreamingQueryListener};
use sluice_kafka::ClientOptions;

mod inspect;
mod nexmark;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Streaming SQL over Arrow, with Kafka output"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every INSERT INTO of FILE until Ctrl-C / SIGTERM (or, with
    /// SET 'trigger' = 'available-now', until the input present at start is
    /// committed).
    Run {
        /// The .sql file.
        file: PathBuf,
        /// Append one JSON object per committed epoch to PATH.
        #[arg(long, value_name = "PATH")]
        progress_log: Option<PathBuf>,
        /// Serve Prometheus metrics at http://HOST:PORT/metrics (and the
        /// status page at /).
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<String>,
        /// Serve the status page of the queries and their tasks at
        /// http://HOST:PORT/ and its JSON at /api/queries (a PORT alone is
        /// on 127.0.0.1).
        #[arg(long, value_name = "HOST:PORT")]
        ui_addr: Option<String>,
        /// Ask every request to the page, its API and the metrics for the
        /// token in FILE (Authorization: Bearer, or the password of basic
        /// authentication); the environment's SLUICE_UI_TOKEN does too.
        #[arg(long, value_name = "FILE")]
        ui_token_file: Option<PathBuf>,
        /// On SIGINT/SIGTERM, how long the open epoch may take to commit
        /// before the process gives up on it (exit 1; the next start re-runs
        /// it).
        #[arg(long, value_name = "SECONDS", default_value = "30")]
        shutdown_timeout: u64,
    },
    /// Check each query of FILE that ran with an exactly-once Kafka sink:
    /// its committed output against DataFusion's batch answer to the same
    /// SQL over the input it committed. Exit 0 when all agree, 1 when not.
    Verify {
        /// The .sql file the queries run from.
        file: PathBuf,
    },
    /// Print the incremental plan of each query in FILE.
    Explain {
        /// The .sql file.
        file: PathBuf,
    },
    /// Checkpoint tools.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Nexmark benchmark tools.
    Nexmark {
        #[command(subcommand)]
        command: NexmarkCommand,
    },
    /// Start a local Kafka broker if none listens, run the seed example for
    /// a few seconds, and show what it committed to Kafka.
    Demo {
        /// How long to run the seed pipeline.
        #[arg(long, default_value = "6")]
        seconds: u64,
    },
    /// Print a completion script for SHELL, e.g.
    /// `sluice completions bash > ~/.local/share/bash-completion/completions/sluice`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Client properties for the Kafka a command talks to, as a stream's
/// `kafka.*` options give them to its clients.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct KafkaProperties {
    /// A librdkafka property for every Kafka client, e.g.
    /// security.protocol=SASL_SSL (repeatable).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    property: Vec<String>,
    /// A properties file (key=value lines, as Java clients take); the
    /// --kafka-property flags win over it.
    #[arg(long = "kafka-properties", value_name = "FILE")]
    file: Option<PathBuf>,
}

impl KafkaProperties {
    /// The connection to `bootstrap` with these properties.
    pub(crate) fn client(&self, bootstrap: &str) -> Result<ClientOptions, SluiceError> {
        let mut client = ClientOptions::new(bootstrap);
        if let Some(file) = &self.file {
            client = client.properties_file(file)?;
        }
        for pair in &self.property {
            client = client.property_pair(pair)?;
        }
        Ok(client)
    }
}

#[derive(Subcommand)]
enum NexmarkCommand {
    /// Write the first N Nexmark events as JSON to the topics
    /// PREFIX-person, PREFIX-auction and PREFIX-bid (created; existing ones
    /// are refused), for runs that read them from Kafka.
    Load(nexmark::Load),
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// What the checkpoint at DIR holds: query id, epochs, source offsets,
    /// watermark, state files; with --bootstrap, whether the Kafka progress
    /// topic agrees.
    Inspect {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Kafka brokers to compare with the query's progress topic.
        #[arg(long, value_name = "HOST:PORT")]
        bootstrap: Option<String>,
        /// The progress topic, if the query set 'progress.topic'.
        #[arg(long, value_name = "TOPIC")]
        progress_topic: Option<String>,
        #[command(flatten)]
        kafka: KafkaProperties,
    },
}

/// How the process ends.
enum Failure {
    /// The user must fix the SQL or the command line: exit 2.
    Usage(String),
    /// Something failed while running: exit 1.
    Runtime(String),
}

impl From<SqlError> for Failure {
    fn from(e: SqlError) -> Self {
        if e.user_error {
            Failure::Usage(e.to_string())
        } else {
            Failure::Runtime(e.to_string())
        }
    }
}

/// What `sluice --version` prints: the release, the commit it was built
/// from, and the librdkafka it links with its features, so that a bug
/// report says what ran.
fn long_version() -> String {
    let (librdkafka, features) = sluice_kafka::client_library();
    format!(
        "{} (commit {})\nlibrdkafka {librdkafka} ({features})",
        env!("CARGO_PKG_VERSION"),
        env!("SLUICE_GIT_COMMIT")
    )
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    // Built once per process; clap wants it for the process's life.
    let version: &'static str = Box::leak(long_version().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // SLUICE_LOG, else the RUST_LOG every Rust user knows, else warnings.
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RedactingStderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run {
                file,
                progress_log,
                metrics_addr,
                ui_addr,
                ui_token_file,
                shutdown_timeout,
            } => {
                let serving = Serving {
                    metrics_addr,
                    ui_addr,
                    token_file: ui_token_file,
                };
                run(
                    &file,
                    progress_log.as_deref(),
                    serving,
                    Duration::from_secs(shutdown_timeout),
                )
                .await
            }
            Command::Explain { file } => explain(&file).await,
            Command::Verify { file } => verify(&file).await,
            Command::Demo { seconds } => demo(Duration::from_secs(seconds)).await,
            Command::Completions { shell } => {
                use clap::CommandFactory;
                let mut command = Cli::command();
                clap_complete::generate(shell, &mut command, "sluice", &mut std::io::stdout());
                Ok(())
            }
            Command::Nexmark {
                command: NexmarkCommand::Load(load),
            } => match nexmark::load(&load).await {
                Ok(lines) => {
                    for line in lines {
                        println!("{line}");
                    }
                    Ok(())
                }
                Err(e) => Err(Failure::Runtime(format!("sluice nexmark load: {e:#}"))),
            },
            Command::Checkpoint {
                command:
                    CheckpointCommand::Inspect {
                        dir,
                        bootstrap,
                        progress_topic,
                        kafka,
                    },
            } => bootstrap
                .map(|b| kafka.client(&b))
                .transpose()
                .and_then(|client| inspect::inspect(&dir, client, progress_topic.as_deref()))
                .map(|report| print!("{}", sluice::redact_secrets(&report)))
                .map_err(|e| {
                    if e.is_user_error() {
                        Failure::Usage(format!("sluice: {e}"))
                    } else {
                        Failure::Runtime(format!("sluice: {e}"))
                    }
                }),
        }
    });
    // Every query has ended or was given up on (--shutdown-timeout): what
    // may still block (a commit to a broker that does not answer) must not
    // hold up the exit.
    runtime.shutdown_background();
    exit_now(match result {
        Ok(()) => 0,
        Err(Failure::Usage(m)) => {
            eprintln!("{}", sluice::redact_secrets(&m));
            2
        }
        Err(Failure::Runtime(m)) => {
            eprintln!("{}", sluice::redact_secrets(&m));
            1
        }
    })
}

/// Ends the process with `code` once its output is flushed, without the
/// C library's exit handlers. The Kafka clients of a query that failed or
/// was given up on may still be tearing down on librdkafka's threads, and
/// a process that had printed its error and was exiting 1 was seen killed
/// by a signal instead (once, in CI, under load). The exit handlers run
/// under those threads; without them there is nothing left to race.
fn exit_now(code: u8) -> ExitCode {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    {
        extern "C" {
            fn _exit(status: std::ffi::c_int) -> !;
        }
        // SAFETY: `_exit` takes a plain integer and never returns; every
        // buffer Sluice writes through is flushed above.
        unsafe { _exit(code.into()) }
    }
    #[cfg(not(unix))]
    ExitCode::from(code)
}

/// Standard error with every secret Sluice was given taken out: the log
/// formats each event into one write, so a secret is never split.
struct RedactingStderr;

impl std::io::Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = sluice::redact_secrets(&String::from_utf8_lossy(buf));
        std::io::stderr().write_all(text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn read_sql(file: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(file)
        .map_err(|e| Failure::Usage(format!("sluice: cannot read {}: {e}", file.display())))
}

/// Appends progress as JSON lines and, on a terminal, keeps one live
/// status line per query (redrawn in place).
struct ProgressReporter {
    log: Option<Mutex<std::fs::File>>,
    status: Option<Mutex<StatusLines>>,
}

#[derive(Default)]
struct StatusLines {
    lines: std::collections::BTreeMap<String, String>,
    /// Lines drawn last time, to move the cursor back over.
    drawn: usize,
}

impl StatusLines {
    fn update(&mut self, query: &str, line: String) {
        self.lines.insert(query.to_string(), line);
        let mut out = String::new();
        if self.drawn > 0 {
            out.push_str(&format!("\x1b[{}A", self.drawn));
        }
        for l in self.lines.values() {
            out.push_str("\r\x1b[2K");
            out.push_str(l);
            out.push('\n');
        }
        self.drawn = self.lines.len();
        eprint!("{out}");
    }
}

impl StreamingQueryListener for ProgressReporter {
    fn on_query_progress(&self, p: &QueryProgress) {
        if let Some(log) = &self.log {
            // One write per line: a reader polling the log never sees a
            // line without its end.
            let line = format!("{}\n", p.log_line());
            let mut f = log.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = f.write_all(line.as_bytes()) {
                tracing::error!(error = %e, "cannot append to the progress log");
            }
        }
        if let Some(status) = &self.status {
            let line = format!(
                "[{}] epoch {} · {} rows in {:.0} ms · {:.0} rows/s",
                p.name, p.epoch, p.num_input_rows, p.duration_ms.total, p.processed_rows_per_second
            );
            status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .update(&p.name, line);
        }
    }
}

/// What `sluice run` serves over HTTP: the metrics, the status page, both
/// from one server (each address serves everything), and its token.
struct Serving {
    metrics_addr: Option<String>,
    ui_addr: Option<String>,
    token_file: Option<PathBuf>,
}

impl Serving {
    /// Binds every address asked for, before any query starts: a port in
    /// use or an address not of this host is a usage error (exit 2).
    async fn start(
        self,
        session: &sluice::Session,
        board: &Arc<sluice_status::StatusBoard>,
    ) -> Result<(), Failure> {
        let addrs: Vec<(&str, &String)> = [
            ("--metrics-addr", self.metrics_addr.as_ref()),
            ("--ui-addr", self.ui_addr.as_ref()),
        ]
        .into_iter()
        .filter_map(|(flag, addr)| Some((flag, addr?)))
        .collect();
        if addrs.is_empty() {
            return Ok(());
        }
        let token = self.token()?;
        let metrics = Arc::new(sluice::Metrics::default());
        session.add_listener(metrics.clone());
        let server = sluice_status::StatusServer::new(Arc::clone(board))
            .metrics(Some(metrics))
            .token(token.clone());
        for (flag, addr) in addrs {
            use std::net::ToSocketAddrs;
            let bad = |why: String| Failure::Usage(format!("sluice: {flag} {addr}: {why}"));
            // A port alone is on loopback: nothing is served beyond this
            // host unless an address says so.
            let socket = match addr.parse::<u16>() {
                Ok(port) => format!("127.0.0.1:{port}"),
                Err(_) => addr.clone(),
            }
            .to_socket_addrs()
            .map_err(|e| bad(format!("expected HOST:PORT such as 127.0.0.1:9464 ({e})")))?
            .next()
            .ok_or_else(|| bad("the host has no address".into()))?;
            let bound = server.serve(socket).await.map_err(|e| bad(e.to_string()))?;
            if !bound.ip().is_loopback() && token.is_none() {
                tracing::warn!(%bound, "the status page and metrics are served beyond this host without a token; set one with --ui-token-file or SLUICE_UI_TOKEN");
            }
            eprintln!("sluice: status page at http://{bound}/ (metrics at /metrics)");
        }
        Ok(())
    }

    /// The token from `--ui-token-file`, else from `SLUICE_UI_TOKEN`.
    fn token(&self) -> Result<Option<String>, Failure> {
        let token = match &self.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        Failure::Usage(format!(
                            "sluice: --ui-token-file {}: cannot read it: {e}",
                            path.display()
                        ))
                    })?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("SLUICE_UI_TOKEN").ok(),
        };
        match token {
            Some(t) if t.is_empty() => Err(Failure::Usage(
                "sluice: the status page's token is empty; put the token in the file \
                 (--ui-token-file) or in SLUICE_UI_TOKEN, or set neither"
                    .into(),
            )),
            t => Ok(t),
        }
    }
}

async fn run(
    file: &Path,
    progress_log: Option<&Path>,
    serving: Serving,
    shutdown_timeout: Duration,
) -> Result<(), Failure> {
    // Listened for from here: a signal while the queries start is kept
    // and stops them once started, instead of killing the process.
    let mut shutdown = Shutdown::listen();
    let text = read_sql(file)?;
    let session = sluice::Session::new();
    let board = Arc::new(sluice_status::StatusBoard::default());
    serving.start(&session, &board).await?;
    let log = progress_log
        .map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map(Mutex::new)
                .map_err(|e| Failure::Usage(format!("sluice: cannot open {}: {e}", p.display())))
        })
        .transpose()?;
    session.add_listener(Arc::new(ProgressReporter {
        log,
        status: std::io::stderr()
            .is_terminal()
            .then(|| Mutex::new(StatusLines::default())),
    }));
    let mut runner = session.sql_runner(&file.display().to_string());
    // Everything is parsed and planned before anything starts.
    let prepared = runner.prepare(&text).await?;
    let mut queries = Vec::new();
    let mut answered = false;
    for p in prepared {
        match p {
            Prepared::Done(outcome) => {
                answered |= matches!(
                    outcome,
                    StatementOutcome::Explained { .. } | StatementOutcome::Streams(_)
                );
                print_outcome(&outcome)
            }
            Prepared::Query(q) => queries.push(q),
        }
    }
    // Declarations and settings alone run nothing: say so rather than exit
    // 0 as if a pipeline had run.
    if queries.is_empty() && !answered {
        return Err(Failure::Usage(format!(
            "sluice: {}: nothing to run: the file declares streams and settings but has no \
             INSERT INTO ... SELECT; add one, e.g. INSERT INTO <sink stream> SELECT * FROM \
             <source stream>",
            file.display()
        )));
    }
    let mut running: Vec<StreamingQuery> = Vec::new();
    for q in queries {
        let statement = q.statement().to_string();
        let plan = q.explain()?;
        match q.start().await {
            Ok(query) => {
                board.watch(&query, &statement, &plan);
                running.push(query)
            }
            Err(e) => {
                stop_all(&running).await;
                return Err(e.into());
            }
        }
    }
    if running.is_empty() {
        return Ok(());
    }
    wait_or_signal(&running, shutdown_timeout, &mut shutdown).await
}

/// `sluice verify FILE`: prints each query's verdict. Exit 1 when a
/// query's output differs from its batch answer, else 2 when a query could
/// not be checked (its shape, its sink), else 0.
async fn verify(file: &Path) -> Result<(), Failure> {
    let text = read_sql(file)?;
    let session = sluice::Session::new();
    let mut runner = session.sql_runner(&file.display().to_string());
    let (mut differ, mut unchecked) = (Vec::new(), Vec::new());
    for p in runner.prepare(&text).await? {
        let Prepared::Query(q) = p else { continue };
        // A statement set is checked statement by statement.
        for (name, mut query) in q.batch_queries()? {
            match sluice_kafka::verify(&mut query).await {
                Ok(verdict) => {
                    print!("{}", sluice::redact_secrets(&verdict.to_string()));
                    if !verdict.ok {
                        differ.push(name);
                    }
                }
                Err(e) if e.is_user_error() => {
                    println!(
                        "query '{name}'\nNOT CHECKED: {}",
                        sluice::redact_secrets(&e.to_string())
                    );
                    unchecked.push(name);
                }
                Err(e) => return Err(Failure::Runtime(format!("sluice: query '{name}': {e}"))),
            }
        }
    }
    if !differ.is_empty() {
        Err(Failure::Runtime(format!(
            "sluice verify: the committed output of {} differs from the batch answer",
            differ.join(", ")
        )))
    } else if !unchecked.is_empty() {
        Err(Failure::Usage(format!(
            "sluice verify: {} could not be checked (see above)",
            unchecked.join(", ")
        )))
    } else {
        Ok(())
    }
}

async fn stop_all(queries: &[StreamingQuery]) {
    for q in queries {
        let _ = q.stop().await;
    }
}

/// Waits until every query ends, or a signal asks them all to stop (each
/// finishes its open epoch first).
async fn wait_or_signal(
    queries: &[StreamingQuery],
    timeout: Duration,
    shutdown: &mut Shutdown,
) -> Result<(), Failure> {
    let all_done = async {
        let mut failures = Vec::new();
        for q in queries {
            if let Err(e) = q.await_termination().await {
                failures.push(format!("query '{}' failed: {e}", q.name()));
                stop_all(queries).await;
            }
        }
        failures
    };
    let failures = tokio::select! {
        f = all_done => f,
        _ = shutdown.signalled() => {
            eprintln!("\nsluice: stopping (finishing the open epoch)...");
            return match tokio::time::timeout(timeout, stop_all(queries)).await {
                // A query that could not finish its open epoch (its brokers
                // were gone) stopped without it: that is a failure.
                Ok(()) => {
                    let failures: Vec<String> = queries
                        .iter()
                        .filter_map(|q| {
                            q.exception().map(|e| format!("query '{}' failed: {e}", q.name()))
                        })
                        .collect();
                    if failures.is_empty() {
                        Ok(())
                    } else {
                        Err(Failure::Runtime(failures.join("\n")))
                    }
                }
                Err(_) => Err(Failure::Runtime(format!(
                    "sluice: the open epoch did not commit within {timeout:?} of the signal \
                     (--shutdown-timeout); stopping without it. Nothing of it is visible to \
                     read_committed readers: the next start aborts its transaction, if any, \
                     and re-runs the epoch"
                ))),
            };
        }
    };
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::Runtime(failures.join("\n")))
    }
}

/// SIGINT (Ctrl-C) and SIGTERM, their handlers installed when this is made.
struct Shutdown {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Shutdown {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Until one of them arrives (or has arrived since `listen`).
    async fn signalled(&mut self) {
        #[cfg(unix)]
        {
            async fn one(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            if self.interrupt.is_none() && self.terminate.is_none() {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
            tokio::select! {
                _ = one(&mut self.interrupt) => {}
                _ = one(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn print_outcome(outcome: &StatementOutcome) {
    match outcome {
        StatementOutcome::Explained { sink, plan } => {
            println!("INSERT INTO {sink}:\n{plan}");
        }
        StatementOutcome::Streams(lines) => {
            for l in lines {
                println!("{l}");
            }
        }
        _ => {}
    }
}

async fn explain(file: &Path) -> Result<(), Failure> {
    let text = read_sql(file)?;
    let session = sluice::Session::new();
    let mut runner = session.sql_runner(&file.display().to_string());
    for p in runner.prepare(&text).await? {
        match p {
            Prepared::Done(outcome) => print_outcome(&outcome),
            Prepared::Query(q) => println!("INSERT INTO {}:\n{}", q.name, q.explain()?),
        }
    }
    Ok(())
}

const SEED: &str = include_str!("../examples/seed.sql");

async fn demo(duration: Duration) -> Result<(), Failure> {
    println!("sluice demo: making sure a local Kafka broker runs (first time: fetches Kafka from Maven Central)...");
    let bootstrap = tokio::task::spawn_blocking(sluice::broker::ensure_broker)
        .await
        .map_err(|e| Failure::Runtime(format!("sluice demo: {e}")))?
        .map_err(|e| Failure::Runtime(format!("sluice demo: {e}")))?;
    println!("sluice demo: Kafka at {bootstrap}");
    // A new directory of a random name: nothing another user planted.
    let checkpoint_dir = tempfile::Builder::new()
        .prefix("sluice-demo-")
        .tempdir()
        .map_err(|e| Failure::Runtime(format!("sluice demo: creating a checkpoint: {e}")))?;
    let checkpoint = checkpoint_dir.path().to_path_buf();
    // Each demo is a new query: its own checkpoint, and its own identity.
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let text = SEED
        .replace("localhost:9092", &bootstrap)
        .replace("./checkpoints/seed", &checkpoint.display().to_string())
        .replace(
            "'pipeline.name' = 'seed'",
            &format!("'pipeline.name' = 'sluice-demo-{run}'"),
        );
    let session = sluice::Session::new();
    let mut runner = session.sql_runner("examples/seed.sql");
    let mut queries = Vec::new();
    let before = {
        let b = bootstrap.clone();
        tokio::task::spawn_blocking(move || {
            sluice::broker::read_topic(&b, "updates", true, Duration::from_secs(30))
        })
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?
        .map(|r| r.len())
        .unwrap_or(0)
    };
    println!(
        "sluice demo: running examples/seed.sql for {} s:\n",
        duration.as_secs()
    );
    for line in SEED
        .lines()
        .filter(|l| !l.starts_with("--") && !l.trim().is_empty())
    {
        println!("    {line}");
    }
    println!();
    for p in runner.prepare(&text).await? {
        if let Prepared::Query(q) = p {
            queries.push(q.start().await?);
        }
    }
    tokio::time::sleep(duration).await;
    stop_all(&queries).await;
    for q in &queries {
        if let Some(e) = q.exception() {
            return Err(Failure::Runtime(format!(
                "sluice demo: the query failed: {e}"
            )));
        }
        println!(
            "sluice demo: query '{}' committed {} epochs",
            q.name(),
            q.recent_progress().len()
        );
    }
    let broker = bootstrap.clone();
    let records = tokio::task::spawn_blocking(move || {
        sluice::broker::read_topic(&bootstrap, "updates", true, Duration::from_secs(30))
    })
    .await
    .map_err(|e| Failure::Runtime(e.to_string()))?
    .map_err(|e| Failure::Runtime(format!("sluice demo: reading back: {e}")))?;
    let new: Vec<_> = records.into_iter().skip(before).collect();
    println!(
        "sluice demo: read back {} records from Kafka topic 'updates' (read_committed):",
        new.len()
    );
    for r in &new {
        let key = r
            .key
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        println!(
            "  partition {} offset {:>6}  key {key:<14} {}",
            r.partition,
            r.offset,
            r.value_str()
        );
    }
    drop(checkpoint_dir);
    if new.is_empty() {
        return Err(Failure::Runtime(
            "sluice demo: no records came back from Kafka".into(),
        ));
    }
    println!(
        "sluice demo: the broker at {broker} keeps running for the next run; stop it with \
         scripts/kafka stop"
    );
    Ok(())
}
