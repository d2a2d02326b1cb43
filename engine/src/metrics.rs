//! Prometheus metrics: a [`StreamingQueryListener`] that keeps per-query
//! counters, gauges and phase histograms from progress events, and writes
//! them in the Prometheus text format (the status page's server,
//! `sluice-status`, serves them at `/metrics`).
//!
//! The text is written here, from two tables of families (`PER_QUERY`,
//! `PER_TASK`), rather than by `prometheus-client`: that crate keeps live
//! metric objects where these values are read from the last progress
//! event at each scrape, and it writes a histogram bucket's `le` label
//! before the family's labels, which would change every bucket line
//! dashboards and tests already read (`{query="q",phase="commit",le="+Inf"}`).
//!
//! ```no_run
//! # async fn demo() -> sluice_engine::Result<()> {
//! use std::sync::Arc;
//! let session = sluice_engine::Session::new();
//! let metrics = Arc::new(sluice_engine::Metrics::default());
//! session.add_listener(metrics.clone());
//! // ... once queries have run:
//! let text = metrics.render();
//! assert!(text.contains("# TYPE sluice_epochs_committed_total counter"));
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::progress::{QueryProgress, QueryStartedEvent, StreamingQueryListener};

/// Upper bounds of the epoch phase histogram buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One histogram: cumulative bucket counts, sum and count.
#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; BUCKETS.len()];
        }
        for (b, bound) in self.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= *bound {
                *b += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// What is known about one query.
#[derive(Debug, Clone, Default)]
struct QueryMetrics {
    starts: u64,
    epochs: u64,
    input_rows: u64,
    output_rows: u64,
    late_rows: u64,
    skipped_records: u64,
    dead_lettered_records: u64,
    lost_records: u64,
    /// Per task (`None`: a query not divided into tasks), its latest.
    tasks: BTreeMap<Option<u32>, TaskGauges>,
    phases: BTreeMap<&'static str, Histogram>,
    /// (source, partition) → records behind.
    lag: BTreeMap<(String, String), i64>,
}

/// One task's latest gauges; a query's are the sum over its tasks (the
/// watermark: the minimum).
#[derive(Debug, Clone, Default)]
struct TaskGauges {
    /// The last committed epoch.
    epoch: u64,
    recoveries: u64,
    state_rows: u64,
    state_bytes: u64,
    state_disk_bytes: u64,
    /// Seconds since the Unix epoch.
    watermark: Option<f64>,
}

impl QueryMetrics {
    fn sum(&self, gauge: impl Fn(&TaskGauges) -> u64) -> u64 {
        self.tasks.values().map(gauge).sum()
    }

    fn watermark(&self) -> Option<f64> {
        self.tasks
            .values()
            .map(|t| t.watermark)
            .collect::<Option<Vec<f64>>>()?
            .into_iter()
            .reduce(f64::min)
    }
}

/// Per-query metrics from progress events; register it with
/// [`Session::add_listener`](crate::Session::add_listener) and serve it
/// with `sluice-status`'s server, or read [`Metrics::render`].
#[derive(Debug, Default)]
pub struct Metrics {
    queries: Mutex<BTreeMap<String, QueryMetrics>>,
}

impl StreamingQueryListener for Metrics {
    fn on_query_started(&self, event: &QueryStartedEvent) {
        self.with(&event.name, |q| q.starts += 1);
    }

    fn on_query_progress(&self, p: &QueryProgress) {
        self.with(&p.name, |q| {
            q.epochs += 1;
            q.input_rows += p.num_input_rows;
            q.output_rows += p.num_output_rows;
            q.late_rows += p.late_rows;
            for s in &p.sources {
                q.skipped_records += s.skipped_records;
                q.dead_lettered_records += s.dead_lettered_records;
                q.lost_records += s.lost_records;
            }
            let task = q.tasks.entry(p.task).or_default();
            task.epoch = p.epoch;
            task.recoveries = task.recoveries.max(p.recoveries);
            task.state_rows = p.state_rows;
            task.state_bytes = p.state_bytes;
            task.state_disk_bytes = p.state_disk_bytes;
            if let Some(w) = &p.watermark {
                task.watermark =
                    datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(w)
                        .ok()
                        .map(|ns| ns as f64 / 1e9);
            }
            let d = &p.duration_ms;
            for (phase, ms) in [
                ("plan", d.plan),
                ("read", d.read),
                ("compute", d.compute),
                ("state", d.state),
                ("commit", d.commit),
                ("total", d.total),
            ] {
                q.phases.entry(phase).or_default().observe(ms / 1e3);
            }
            for s in &p.sources {
                for (partition, lag) in &s.lag {
                    q.lag
                        .insert((s.description.clone(), partition.clone()), *lag);
                }
            }
        });
    }
}

impl Metrics {
    fn with(&self, query: &str, f: impl FnOnce(&mut QueryMetrics)) {
        let mut queries = self.queries.lock().unwrap_or_else(|p| p.into_inner());
        f(queries.entry(query.to_string()).or_default());
    }

    /// All metrics in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let queries = self
            .queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Scrape {
            queries: &queries,
            out: String::new(),
        }
        .write()
    }
}

/// A family with one value per query: its name, type, help, and the
/// query's value.
type PerQuery = (
    &'static str,
    &'static str,
    &'static str,
    fn(&QueryMetrics) -> Option<f64>,
);

/// Every family with one value per query, in the order scraped.
const PER_QUERY: &[PerQuery] = &[
    (
        "sluice_query_starts_total",
        "counter",
        "Times the query started (1 + restarts and recoveries in this process).",
        |q| Some(q.starts as f64),
    ),
    (
        "sluice_epochs_committed_total",
        "counter",
        "Epochs committed.",
        |q| Some(q.epochs as f64),
    ),
    (
        "sluice_input_rows_total",
        "counter",
        "Rows read by the query's sources.",
        |q| Some(q.input_rows as f64),
    ),
    (
        "sluice_output_rows_total",
        "counter",
        "Rows written to the sink.",
        |q| Some(q.output_rows as f64),
    ),
    (
        "sluice_late_rows_total",
        "counter",
        "Rows dropped for arriving behind the watermark.",
        |q| Some(q.late_rows as f64),
    ),
    (
        "sluice_recoveries_total",
        "counter",
        "In-process recoveries after an external system (a broker) failed an epoch.",
        |q| Some(q.sum(|t| t.recoveries) as f64),
    ),
    (
        "sluice_skipped_records_total",
        "counter",
        "Malformed input records dropped ('format.on-error' = 'skip').",
        |q| Some(q.skipped_records as f64),
    ),
    (
        "sluice_lost_records_total",
        "counter",
        "Input records deleted before they were read and skipped ('fail-on-data-loss' = 'false').",
        |q| Some(q.lost_records as f64),
    ),
    (
        "sluice_dead_lettered_records_total",
        "counter",
        "Malformed input records written to the dead-letter topic.",
        |q| Some(q.dead_lettered_records as f64),
    ),
    (
        "sluice_state_rows",
        "gauge",
        "Rows held in operator state.",
        |q| Some(q.sum(|t| t.state_rows) as f64),
    ),
    (
        "sluice_state_bytes",
        "gauge",
        "Bytes operator state holds in memory.",
        |q| Some(q.sum(|t| t.state_bytes) as f64),
    ),
    (
        "sluice_state_disk_bytes",
        "gauge",
        "Bytes operator state holds on local disk, past state.memory.limit.",
        |q| Some(q.sum(|t| t.state_disk_bytes) as f64),
    ),
    (
        "sluice_watermark_seconds",
        "gauge",
        "The query's event-time watermark, seconds since the Unix epoch.",
        QueryMetrics::watermark,
    ),
];

/// A gauge with one value per task of a divided query: its name, help,
/// and the task's value.
type PerTask = (&'static str, &'static str, fn(&TaskGauges) -> f64);

/// Every family with one value per task of a divided query.
const PER_TASK: &[PerTask] = &[
    (
        "sluice_task_epoch",
        "A task's last committed epoch (queries divided into tasks).",
        |t| t.epoch as f64,
    ),
    (
        "sluice_task_state_rows",
        "Rows held in a task's operator state (queries divided into tasks).",
        |t| t.state_rows as f64,
    ),
];

/// One scrape in the Prometheus text exposition format, written family
/// after family from the queries' metrics as they were.
struct Scrape<'a> {
    queries: &'a BTreeMap<String, QueryMetrics>,
    out: String,
}

impl Scrape<'_> {
    /// One family: its help and type, then a line per labelled value.
    fn family(&mut self, name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(self.out, "{name}{labels} {value}");
        }
    }

    /// `f` of each query, labelled with the query's name.
    fn per_query(&self, f: impl Fn(&QueryMetrics) -> Option<f64>) -> Vec<(String, f64)> {
        self.queries
            .iter()
            .filter_map(|(name, q)| Some((format!("{{query=\"{}\"}}", escape(name)), f(q)?)))
            .collect()
    }

    /// Every family, in order.
    fn write(mut self) -> String {
        for &(name, kind, help, of) in PER_QUERY {
            let rows = self.per_query(of);
            self.family(name, kind, help, rows);
        }
        let now = chrono::Utc::now().timestamp_millis() as f64 / 1e3;
        let rows = self.per_query(|q| q.watermark().map(|w| now - w));
        self.family(
            "sluice_watermark_lag_seconds",
            "gauge",
            "Wall-clock time minus the watermark.",
            rows,
        );
        let queries = self.queries;
        let lag = queries
            .iter()
            .flat_map(|(name, q)| {
                q.lag.iter().map(move |((source, partition), lag)| {
                    let labels = format!(
                        "{{query=\"{}\",source=\"{}\",partition=\"{}\"}}",
                        escape(name),
                        escape(source),
                        escape(partition)
                    );
                    (labels, *lag as f64)
                })
            })
            .collect();
        self.family(
            "sluice_source_lag_records",
            "gauge",
            "Records available beyond the last planned epoch, per source partition.",
            lag,
        );
        for &(name, help, of) in PER_TASK {
            let rows = queries
                .iter()
                .flat_map(|(query, q)| {
                    q.tasks.iter().filter_map(move |(task, t)| {
                        let labels =
                            format!("{{query=\"{}\",task=\"{}\"}}", escape(query), (*task)?);
                        Some((labels, of(t)))
                    })
                })
                .collect();
            self.family(name, "gauge", help, rows);
        }
        self.epoch_durations();
        let (cpu, rss) = process_usage();
        let unlabelled = |v: Option<f64>| v.map(|v| (String::new(), v)).into_iter().collect();
        self.family(
            "process_cpu_seconds_total",
            "counter",
            "CPU time of the process.",
            unlabelled(cpu),
        );
        self.family(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of the process.",
            unlabelled(rss),
        );
        self.out
    }

    /// Each query's epoch durations per phase, a histogram.
    fn epoch_durations(&mut self) {
        let mut histogram = Vec::new();
        for (name, q) in self.queries {
            for (phase, h) in &q.phases {
                let labels = format!("query=\"{}\",phase=\"{phase}\"", escape(name));
                for (bound, count) in BUCKETS.iter().zip(&h.buckets) {
                    histogram.push((format!("_bucket{{{labels},le=\"{bound}\"}}"), *count as f64));
                }
                histogram.push((format!("_bucket{{{labels},le=\"+Inf\"}}"), h.count as f64));
                histogram.push((format!("_sum{{{labels}}}"), h.sum));
                histogram.push((format!("_count{{{labels}}}"), h.count as f64));
            }
        }
        self.family(
            "sluice_epoch_duration_seconds",
            "histogram",
            "Epoch duration per phase (plan, read, compute, state, commit, total).",
            histogram,
        );
    }
}

/// A label value as the text format writes it: backslash, quote and
/// newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// CPU seconds and resident bytes of this process, from /proc (Linux).
fn process_usage() -> (Option<f64>, Option<f64>) {
    let ticks = 100.0; // USER_HZ on Linux
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = s.rsplit(')').next()?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let user: f64 = f.get(11)?.parse().ok()?;
            let system: f64 = f.get(12)?.parse().ok()?;
            Some((user + system) / ticks)
        });
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024.0)
        });
    (cpu, rss)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family is written, each once, label values escaped.
    #[test]
    fn a_query_s_progress_is_scraped_in_every_family() {
        let metrics = Metrics::default();
        let name = "orders \"eu\"";
        metrics.on_query_started(&QueryStartedEvent {
            id: "id".into(),
            run_id: "run".into(),
            name: name.into(),
        });
        let progress = QueryProgress {
            name: name.into(),
            epoch: 3,
            num_input_rows: 40,
            watermark: Some("2026-01-01T00:00:00Z".into()),
            ..QueryProgress::default()
        };
        metrics.on_query_progress(&progress);
        metrics.on_query_progress(&progress);
        let text = metrics.render();
        let q = r#"query="orders \"eu\"""#;
        for line in [
            format!("sluice_epochs_committed_total{{{q}}} 2"),
            format!("sluice_query_starts_total{{{q}}} 1"),
            format!("sluice_input_rows_total{{{q}}} 80"),
            format!("sluice_watermark_seconds{{{q}}} 1767225600"),
            format!("sluice_epoch_duration_seconds_count{{{q},phase=\"commit\"}} 2"),
            format!("sluice_epoch_duration_seconds_bucket{{{q},phase=\"commit\",le=\"+Inf\"}} 2"),
            "# TYPE sluice_epochs_committed_total counter".to_string(),
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&line)),
                "no line starts with {line}:\n{text}"
            );
        }
        assert_eq!(
            PER_QUERY.len() + PER_TASK.len() + 5,
            text.lines().filter(|l| l.starts_with("# TYPE")).count(),
            "{text}"
        );
    }
}
