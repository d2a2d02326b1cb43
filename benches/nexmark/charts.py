"""PNG charts of a Nexmark run: one image per metric, Sluice beside Spark.

    python charts.py RUNS_JSON OUT_DIR

RUNS_JSON is the `runs.json` that run.py writes (one object per engine,
query and round); the charts show each query's median over the rounds of
events per second, CPU-seconds per million events (engine and broker), and
epoch latency p50/p99. run-nexmark.sh calls this with the Spark venv's
python, which has matplotlib (benches/spark/setup.sh installs it).
"""

import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ENGINES = ("sluice", "spark")
COLORS = {"sluice": "#1f77b4", "spark": "#ff7f0e"}
# Tick labels of queries Spark refused to stream (set by main).
LABELS = {}


def median_of(runs, engine, query, key):
    values = [r[key] for r in runs if r["engine"] == engine and r["query"] == query and key in r]
    return statistics.median(values) if values else 0.0


def bars(path, title, ylabel, queries, series):
    """series: {label: [value per query]}; one group of bars per query."""
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [q + (i - (len(series) - 1) / 2) * width for q in range(len(queries))]
        engine = label.split()[0].lower()
        ax.bar(xs, values, width, label=label, color=COLORS.get(engine),
               alpha=1.0 if i % 2 == 0 or len(series) == 2 else 0.55)
    ax.set_xticks(range(len(queries)), [LABELS.get(q, q) for q in queries])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    runs_path, out = sys.argv[1], sys.argv[2]
    runs = json.load(open(runs_path))
    queries = sorted({r["query"] for r in runs})
    # A query Spark ran as one batch job is no streaming comparison: say so
    # under its bars.
    LABELS.update({r["query"]: f"{r['query']}\n(Spark: batch job)"
                   for r in runs if r["engine"] == "spark" and r.get("mode") == "batch"})
    os.makedirs(out, exist_ok=True)
    def per_m(e, q, key):
        rows = median_of(runs, e, q, "input_rows")
        return median_of(runs, e, q, key) / (rows / 1e6) if rows else 0.0

    written = [
        bars(os.path.join(out, "events_per_second.png"),
             "Nexmark over Kafka: events/s (Sluice exactly-once, Spark at-least-once)",
             "events per second", queries,
             {e.capitalize(): [median_of(runs, e, q, "steady_rows_per_s") for q in queries]
              for e in ENGINES}),
        bars(os.path.join(out, "cpu_per_million_events.png"),
             "CPU-seconds per million events", "CPU-s", queries,
             {f"{e.capitalize()} {what}": [per_m(e, q, key) for q in queries]
              for e in ENGINES for what, key in (("engine", "cpu_s"), ("broker", "broker_cpu_s"))}),
        bars(os.path.join(out, "epoch_latency.png"),
             "Epoch duration", "ms", queries,
             {f"{e.capitalize()} {p}": [median_of(runs, e, q, key) for q in queries]
              for e in ENGINES for p, key in (("p50", "median_epoch_ms"), ("p99", "p99_epoch_ms"))}),
    ]
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
