#!/usr/bin/env python3
"""Nexmark over Kafka, Sluice and Spark side by side (driven by
benches/run-nexmark.sh, which builds, starts the broker and sets up Spark).

For each query (benches/nexmark/q*.sql) and round: Sluice drains the loaded
topics the query reads (bid; q3, q8: auction and person) into a fresh
Kafka topic, exactly-once, epochs capped at CAP records per input stream
(q3: CAP_Q3, q8: CAP_Q8); then Spark does the same with Trigger.AvailableNow and
maxOffsetsPerTrigger = the same cap, at-least-once. Both read the same
topics on the same broker.

Per run: events/s = input records / the summed duration of the epochs
after the first (the first also connects and warms up; Spark: JIT), for
q4 of every epoch (Spark refuses to stream it and runs one batch job);
CPU-seconds per million events of the engine (Sluice: the process; Spark:
its JVM and the Python driver) and of the broker (its process, over the
run); epoch duration p50/p99; peak RSS. Prints a Markdown table; raw JSON
per run goes to OUT (`run.py --table OUT/runs.json` prints its table again).

After the runs, benches/spark/compare.py reads both engines' output topics
of each query and round and checks they hold the same results (it says
what "the same" is per query); the table's last column gives the verdict,
and OUT/compare.json the counts.
"""

import json
import os
import statistics
import subprocess
import sys
import time


def log(msg):
    print(f"[run-nexmark] {msg}", file=sys.stderr, flush=True)


def env(name, default):
    return os.environ.get(name, default)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = env("SLUICE_BIN", os.path.join(ROOT, "target/release/sluice"))
SPARK_PY = env("SPARK_PY", "")
JARS = env("SPARK_KAFKA_JARS", "")
BOOTSTRAP = env("BOOTSTRAP", "127.0.0.1:9092")
BROKER_PID = int(env("BROKER_PID", "0"))
PREFIX = env("PREFIX", "")
CAP = int(env("CAP", "500000"))
# q3 and q8 read only people and auctions (4 in 50 events): smaller
# epochs, so that their runs have several.
CAPS = {q: int(env("CAP_" + q.upper(), str(CAP // 10))) for q in ("q3", "q8")}
QUERIES = env("QUERIES", "q0 q1 q2 q3 q4 q5 q7 q8").split()
ROUNDS = int(env("ROUNDS", "1"))
OUT = env("OUT", "/tmp")


# The topics each query reads (the others read bid), and the records
# `sluice nexmark load` writes to each: 1, 3 and 46 in every 50 events.
TOPICS = {"q3": ("person", "auction"), "q4": ("auction", "bid"), "q8": ("person", "auction")}
SHARE = {"person": 1, "auction": 3, "bid": 46}
# Queries whose Sluice rate counts every epoch (see sluice_run).
EVERY_EPOCH = {"q4"}


def events(query):
    """The records the query's topics hold: each event counted once."""
    return sum(int(env("N", "0")) * SHARE[t] // 50 for t in TOPICS.get(query, ("bid",)))


def per_event(run):
    """`run` with rows counted as events. A query that reads a topic on two
    paths (q5, q7) may scan it twice (Sluice does; Spark shares one scan in
    q5, not in q7), and its input rows then count each event twice."""
    total = events(run["query"])
    scans = max(1, round(run["input_rows"] / total)) if total else 1
    if scans > 1:
        run = dict(run, scans=scans, input_rows=run["input_rows"] // scans,
                   steady_rows_per_s=run["steady_rows_per_s"] / scans)
    return run


def cap(query):
    """Records per epoch and input stream."""
    return CAPS.get(query, CAP)


def cpu_s(pid):
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values, q):
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def sluice_run(query, round_):
    tag = f"sluice-{query}-{round_}"
    work = os.path.join(OUT, tag)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(ROOT, "benches/nexmark/kafka-sources.sql")) as f:
        sources = f.read()
    sources = (
        sources.replace("{prefix}", PREFIX)
        .replace("{bootstrap}", BOOTSTRAP)
        .replace("{source_options}", f", 'max-records-per-epoch' = '{cap(query)}'")
    )
    with open(os.path.join(ROOT, f"benches/nexmark/{query}.sql")) as f:
        body = f.read()
    sql = (
        sources
        + "SET 'trigger' = 'available-now';\n"
        + f"SET 'checkpoint.location' = '{work}/checkpoint';\n"
        + f"CREATE STREAM nexmark_{query} WITH (connector = 'kafka', "
        + f"topic = '{PREFIX}-out-{tag}', 'bootstrap.servers' = '{BOOTSTRAP}');\n"
        + body
    )
    sql_file = os.path.join(work, "query.sql")
    with open(sql_file, "w") as f:
        f.write(sql)
    progress = os.path.join(work, "progress.jsonl")
    times = os.path.join(work, "time.txt")
    broker_before = cpu_s(BROKER_PID)
    started = time.monotonic()
    r = subprocess.run(
        ["/usr/bin/time", "-f", "%U %S %M", "-o", times, SLUICE, "run", sql_file,
         "--progress-log", progress],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    wall = time.monotonic() - started
    broker = cpu_s(BROKER_PID) - broker_before
    if r.returncode != 0:
        sys.exit(f"sluice {query} failed: {r.stderr[-2000:]}")
    with open(times) as f:
        user, system, max_kb = f.read().split()[-3:]
    epochs = [json.loads(line) for line in open(progress) if line.strip()]
    epochs = [e for e in epochs if e["input_rows"] > 0]
    rows = [e["input_rows"] for e in epochs]
    ms = [e["duration_ms"]["total"] for e in epochs]
    # The first epoch also connects and warms up, and is left out; but not
    # for q4, which Spark runs as one batch job timed whole: there Sluice
    # counts every epoch too, the heaviest (the first: all auctions so far)
    # included.
    counted = slice(0 if query in EVERY_EPOCH else 1, None)
    steady = (sum(rows[counted]), sum(ms[counted])) if len(epochs) > 1 else (sum(rows), sum(ms))
    return {
        "engine": "sluice",
        "query": query,
        "delivery": "exactly-once",
        "input_rows": sum(rows),
        "epochs": len(epochs),
        "steady_rows_per_s": steady[0] / (steady[1] / 1000.0),
        "median_epoch_ms": percentile(ms, 50),
        "p99_epoch_ms": percentile(ms, 99),
        "wall_s": wall,
        "cpu_s": float(user) + float(system),
        "broker_cpu_s": broker,
        "peak_rss_bytes": int(max_kb) * 1024,
    }


def spark_run(query, round_):
    tag = f"spark-{query}-{round_}"
    broker_before = cpu_s(BROKER_PID)
    r = subprocess.run(
        [SPARK_PY, os.path.join(ROOT, "benches/spark/nexmark.py"), "--bootstrap", BOOTSTRAP,
         "--prefix", PREFIX, "--query", query, "--out-topic", f"{PREFIX}-out-{tag}",
         "--max-offsets", str(cap(query)), "--jars", JARS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    broker = cpu_s(BROKER_PID) - broker_before
    with open(os.path.join(OUT, f"{tag}.err"), "w") as f:
        f.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"spark {query} failed: {r.stderr[-2000:]}")
    report = json.loads(r.stdout.strip().splitlines()[-1])
    report["broker_cpu_s"] = broker
    if report.get("mode") == "batch":
        # Spark refused to stream the query and ran it as one batch job
        # over every record of its topics.
        report["input_rows"] = events(query)
        report["steady_rows_per_s"] = report["input_rows"] / report["wall_s"]
    return report


def compare(rounds):
    """Checks each query's outputs, Sluice's against Spark's of the same
    round (benches/spark/compare.py); returns its reports."""
    pairs = [{"query": q, "sluice_topic": f"{PREFIX}-out-sluice-{q}-{r}",
              "spark_topic": f"{PREFIX}-out-spark-{q}-{r}", "round": r}
             for r in range(1, rounds + 1) for q in QUERIES]
    path = os.path.join(OUT, "compare-pairs.json")
    with open(path, "w") as f:
        json.dump(pairs, f)
    log("comparing the outputs of both engines")
    r = subprocess.run(
        [SPARK_PY, os.path.join(ROOT, "benches/spark/compare.py"), "--bootstrap", BOOTSTRAP,
         "--jars", JARS, "--pairs", path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    with open(os.path.join(OUT, "compare.err"), "w") as f:
        f.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"comparing the outputs failed: {r.stderr[-2000:]}")
    reports = json.loads(r.stdout.strip().splitlines()[-1])
    for pair, report in zip(pairs, reports):
        report["round"] = pair["round"]
    with open(os.path.join(OUT, "compare.json"), "w") as f:
        json.dump(reports, f, indent=1)
    return reports


def verdict(reports, query):
    """The table's cell for whether the two engines' outputs agreed."""
    mine = [r for r in reports if r["query"] == query]
    if not mine:
        return "not checked"
    if any(r.get("cutoff") == "none" for r in mine):
        return "not comparable (an engine closed no window)"
    if all(r["same"] for r in mine):
        rows = min(r["sluice_rows"] for r in mine)
        return f"same ({rows} rows{', windows both closed' if 'cutoff' in mine[0] else ''})"
    bad = next(r for r in mine if not r["same"])
    return (f"**differ** (round {bad['round']}: {bad['only_in_sluice']} rows only in Sluice's, "
            f"{bad['only_in_spark']} only in Spark's)")


def per_million(seconds, rows):
    return seconds / rows * 1e6 if rows else float("nan")


def main():
    if not PREFIX:
        sys.exit("PREFIX (the loaded topics' prefix) is required")
    runs = []
    for round_ in range(1, ROUNDS + 1):
        for query in QUERIES:
            # Alternate so that background noise hits both sides.
            for side in (sluice_run, spark_run):
                log(f"round {round_}: {side.__name__.split('_')[0]} {query}")
                run = per_event(side(query, round_))
                run["round"] = round_
                log(json.dumps(run))
                runs.append(run)
    with open(os.path.join(OUT, "runs.json"), "w") as f:
        json.dump(runs, f, indent=1)
    reports = compare(ROUNDS)
    table(runs, os.path.join(OUT, "runs.json"), reports)


def table(runs, path, reports):
    """Prints the Markdown table of `runs` (read from `path`) and the
    outputs' comparison `reports`."""
    queries = list(dict.fromkeys(r["query"] for r in runs))
    rounds = max(r["round"] for r in runs)

    def med(engine, query, key):
        xs = [r[key] for r in runs if r["engine"] == engine and r["query"] == query]
        return statistics.median(xs) if xs else float("nan")

    print(f"### Nexmark over Kafka, epochs of {CAP} records per stream "
          f"({', '.join(f'{q}: {c}' for q, c in CAPS.items())}), median of {rounds} round(s)\n")
    print("| query | Sluice events/s | Spark events/s | Sluice / Spark | CPU-s per M events, "
          "Sluice / Spark | broker CPU-s per M events, Sluice run / Spark run | "
          "epoch ms p50 / p99, Sluice | epoch ms p50 / p99, Spark | peak RSS MB, "
          "Sluice / Spark | outputs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    refused = {}
    for q in queries:
        s_rate, k_rate = med("sluice", q, "steady_rows_per_s"), med("spark", q, "steady_rows_per_s")
        rows = med("sluice", q, "input_rows")
        why = next((r["unsupported"] for r in runs
                    if r["engine"] == "spark" and r["query"] == q and "unsupported" in r), None)
        batch = ""
        if why:
            refused[q] = why
            batch = " (batch)"
        print(
            f"| {q} | {s_rate / 1e6:.2f} M | {k_rate / 1e6:.2f} M{batch} | {s_rate / k_rate:.2f}x "
            f"| {per_million(med('sluice', q, 'cpu_s'), rows):.2f} / "
            f"{per_million(med('spark', q, 'cpu_s'), rows):.2f} "
            f"| {per_million(med('sluice', q, 'broker_cpu_s'), rows):.2f} / "
            f"{per_million(med('spark', q, 'broker_cpu_s'), rows):.2f} "
            f"| {med('sluice', q, 'median_epoch_ms'):.0f} / {med('sluice', q, 'p99_epoch_ms'):.0f} "
            f"| {med('spark', q, 'median_epoch_ms'):.0f} / {med('spark', q, 'p99_epoch_ms'):.0f} "
            f"| {med('sluice', q, 'peak_rss_bytes') / 1e6:.0f} / "
            f"{med('spark', q, 'peak_rss_bytes') / 1e6:.0f} | {verdict(reports, q)} |"
        )
    for q, why in refused.items():
        print(f"\n{q}: Spark refuses to run it as a stream (\"{why}\"); its numbers are one "
              "Spark batch job over all of the query's topics, which computes the final answer "
              "once instead of keeping it up to date.")
    print("\nSluice writes exactly-once (Kafka transactions); Spark's Kafka sink is "
          "at-least-once. events/s leaves out each run's first epoch. Raw JSON: "
          f"{path}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        # Prints the table of an earlier run again: run.py --table OUT/runs.json
        # (with OUT/compare.json beside it when there is one).
        with open(sys.argv[2]) as f:
            runs = [per_event(r) for r in json.load(f)]
        compared = os.path.join(os.path.dirname(sys.argv[2]), "compare.json")
        reports = json.load(open(compared)) if os.path.exists(compared) else []
        table(runs, sys.argv[2], reports)
    else:
        main()
