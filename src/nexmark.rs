//! `sluice nexmark load`: fills Kafka topics `<prefix>-person`,
//! `<prefix>-auction` and `<prefix>-bid` with the first N Nexmark events as
//! JSON, before a timed run reads them.
//!
//! The loader is three Sluice queries, one per stream, from the `nexmark`
//! connector (unpaced, N events) to a Kafka sink: the rows in the topics
//! are exactly what `connector = 'nexmark'` gives for the same events,
//! seed and rate.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sluice::Prepared;
use sluice::{QueryProgress, StreamingQueryListener};

/// What to load.
#[derive(clap::Args)]
pub(crate) struct Load {
    /// How many events (people, auctions and bids together).
    #[arg(long, default_value = "1000000")]
    pub events: u64,
    /// Kafka brokers.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    #[command(flatten)]
    pub kafka: crate::KafkaProperties,
    /// Topic name prefix.
    #[arg(long, default_value = "nexmark")]
    pub prefix: String,
    /// Partitions per topic.
    #[arg(long, default_value = "2")]
    pub partitions: i32,
    /// Events per second of event time (spaces the events' timestamps).
    #[arg(long, default_value = "10000")]
    pub rate: u64,
    /// Generator seed (0: the reference generator's events).
    #[arg(long, default_value = "0")]
    pub seed: u64,
}

const TABLES: [&str; 3] = ["person", "auction", "bid"];

/// Creates the topics (refusing ones that exist, so two loads never mix)
/// and writes the events; returns a summary line per topic.
pub(crate) async fn load(l: &Load) -> anyhow::Result<Vec<String>> {
    let client = l.kafka.client(&l.bootstrap)?;
    for table in TABLES {
        let topic = format!("{}-{table}", l.prefix);
        if let Err(e) = sluice::broker::create_topic(&client, &topic, l.partitions).await {
            if e.to_string().contains("already exists") {
                bail!("topic '{topic}' already exists: delete it, or load under another --prefix");
            }
            return Err(e).with_context(|| format!("creating topic '{topic}'"));
        }
    }
    // The loader's own progress is of no use after it ends.
    let checkpoint =
        std::env::temp_dir().join(format!("sluice-nexmark-load-{}", std::process::id()));
    let mut sql = "SET 'trigger' = 'available-now';\n".to_string();
    // The command's client properties, for every stream's clients.
    let quote = |s: &str| s.replace('\'', "''").replace("${", "$${");
    for (key, value) in client.properties() {
        sql.push_str(&format!(
            "SET 'kafka.{}' = '{}';\n",
            quote(key),
            quote(value)
        ));
    }
    // One generator partition: the events then reach each topic partition
    // in event-time order. With several, the sink would write one
    // partition's events (every time) before the next one's, so a reader
    // would meet times going back, and any watermark would call most rows
    // late. And no sticky partitioning: each message picks its partition,
    // so the partitions stay even, and a reader taking the same number of
    // records from each stays at the same event time in all of them.
    for table in TABLES {
        sql.push_str(&format!(
            "SET 'checkpoint.location' = '{checkpoint}';\n\
             CREATE STREAM nexmark_{table} WITH (connector = 'nexmark', table = '{table}', \
               pace = 'none', 'num-partitions' = '1', 'max-events' = '{events}', \
               'events-per-second' = '{rate}', \
               seed = '{seed}');\n\
             CREATE STREAM kafka_{table} WITH (connector = 'kafka', topic = '{prefix}-{table}', \
               'bootstrap.servers' = '{bootstrap}', format = 'json', \
               'sink.delivery' = 'at-least-once', \
               'kafka.sticky.partitioning.linger.ms' = '0');\n\
             INSERT INTO kafka_{table} SELECT * FROM nexmark_{table};\n",
            checkpoint = checkpoint.join(table).display(),
            events = l.events,
            rate = l.rate,
            seed = l.seed,
            prefix = l.prefix,
            bootstrap = client.bootstrap(),
        ));
    }
    let session = sluice::Session::new();
    let written = Arc::new(Written::default());
    session.add_listener(Arc::clone(&written) as Arc<dyn StreamingQueryListener>);
    let mut runner = session.sql_runner("<nexmark load>");
    let started = Instant::now();
    let mut queries = Vec::new();
    for p in runner.prepare(&sql).await? {
        if let Prepared::Query(q) = p {
            queries.push(q.start().await?);
        }
    }
    let mut lines = Vec::new();
    for (q, table) in queries.iter().zip(TABLES) {
        q.await_termination()
            .await
            .with_context(|| format!("loading {table}s"))?;
        let rows = written.rows(q.name());
        lines.push(format!("{}-{table}: {rows} records", l.prefix));
    }
    let _ = std::fs::remove_dir_all(&checkpoint);
    let seconds = started
        .elapsed()
        .max(Duration::from_millis(1))
        .as_secs_f64();
    lines.push(format!(
        "{} events in {seconds:.1} s ({:.0} events/s)",
        l.events,
        l.events as f64 / seconds
    ));
    Ok(lines)
}

/// Rows written per query, summed over its epochs.
#[derive(Default)]
struct Written(Mutex<BTreeMap<String, u64>>);

impl Written {
    fn rows(&self, query: &str) -> u64 {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(query).copied().unwrap_or(0)
    }
}

impl StreamingQueryListener for Written {
    fn on_query_progress(&self, progress: &QueryProgress) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(progress.name.clone()).or_default() += progress.num_input_rows;
    }
}
