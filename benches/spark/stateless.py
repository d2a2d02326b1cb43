#!/usr/bin/env python3
"""Spark Structured Streaming side of the stateless side-by-side benchmark.

Pipeline (the same shape as Sluice's `stateless` bench):

    rate(rowsPerSecond=R, numPartitions=2, rampUpTime=0s)
      -> WHERE value % 3 <> 0
      -> SELECT value * 2 AS doubled, timestamp
      -> noop sink, processingTime trigger of 1 second

Spark runs as local[2] with spark.sql.shuffle.partitions=2 and the UI off.
The first --warmup epochs (micro-batches with input) are discarded; the next
--epochs are measured from the query's progress reports. For each measured
epoch, throughput = numInputRows / (durationMs.triggerExecution / 1000), i.e.
rows per second of epoch execution (not of wall-clock time, which the 1 s
trigger would cap at R).

The rate source's offsets have a granularity of one second, so an epoch
carries R rows for every whole second since the previous one: about R when
each epoch finishes within its 1 s trigger interval, a multiple of R when
Spark falls behind. median_input_rows shows which case applied.

The LAST line of stdout is one JSON object:
  {"engine":"spark","spark_version":...,"epochs":N,"median_rows_per_s":...,
   "p10":...,"p90":...,"median_epoch_ms":...,"median_input_rows":..., ...}
Everything else (per-epoch lines, Spark's own logging) goes to stderr.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import teardown


def log(msg):
    print(f"[spark-stateless] {msg}", file=sys.stderr, flush=True)


def percentile(values, q):
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


def as_dict(progress):
    # PySpark < 4 returns dicts; PySpark 4 returns StreamingQueryProgress objects.
    if isinstance(progress, dict):
        return progress
    return json.loads(progress.json)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-second", "-r", type=int,
                   default=int(os.environ.get("R", 4_000_000)))
    p.add_argument("--epochs", "-n", type=int,
                   default=int(os.environ.get("N", 20)),
                   help="measured epochs (after warm-up)")
    p.add_argument("--warmup", "-w", type=int,
                   default=int(os.environ.get("WARMUP", 5)),
                   help="epochs with input discarded before measuring")
    p.add_argument("--driver-memory", default=os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    p.add_argument("--timeout-s", type=float, default=None,
                   help="give up after this many seconds (default: generous, from the epoch count)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.epochs < 1 or args.warmup < 0 or args.rows_per_second < 1:
        sys.exit("need --epochs >= 1, --warmup >= 0, --rows-per-second >= 1")
    total = args.warmup + args.epochs
    timeout_s = args.timeout_s or (60.0 + 10.0 * total)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession  # imported late: --help works without pyspark

    workdir = tempfile.mkdtemp(prefix="sluice-spark-stateless-", dir="/tmp")
    checkpoint = os.path.join(workdir, "checkpoint")
    spark = None
    query = None
    try:
        spark = (
            SparkSession.builder
            .appName("sluice-bench-stateless")
            .master("local[2]")
            .config("spark.driver.memory", args.driver_memory)
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.local.dir", os.path.join(workdir, "local"))
            .config("spark.sql.streaming.numRecentProgressUpdates", str(max(100, 4 * total)))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        version = spark.version
        log(f"spark {version}: R={args.rows_per_second} warmup={args.warmup} epochs={args.epochs}")

        src = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rows_per_second)
            .option("numPartitions", 2)
            .option("rampUpTime", "0s")
            .load()
        )
        out = src.where("value % 3 <> 0").selectExpr("value * 2 AS doubled", "timestamp")
        query = (
            out.writeStream.format("noop")
            .queryName("sluice_bench_stateless")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )

        # Poll progress; keep one report per batchId that had input.
        epochs = {}
        started = time.monotonic()
        while True:
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            for p in query.recentProgress or []:
                d = as_dict(p)
                if d.get("numInputRows", 0) > 0 and d["batchId"] not in epochs:
                    epochs[d["batchId"]] = d
                    dm = d.get("durationMs", {})
                    log(f"batch {d['batchId']}: rows={d['numInputRows']} "
                        f"triggerExecution={dm.get('triggerExecution')}ms")
            if len(epochs) >= total:
                break
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"only {len(epochs)}/{total} epochs after {timeout_s:.0f}s")
            time.sleep(0.25)

        measured = [epochs[b] for b in sorted(epochs)[args.warmup:total]]
        rates, add_rates, epoch_ms, input_rows = [], [], [], []
        breakdown = {}
        for d in measured:
            dm = d["durationMs"]
            te = dm["triggerExecution"]
            rows = d["numInputRows"]
            rates.append(rows / (te / 1000.0) if te > 0 else float("inf"))
            ab = dm.get("addBatch", 0)
            add_rates.append(rows / (ab / 1000.0) if ab > 0 else float("inf"))
            epoch_ms.append(te)
            input_rows.append(rows)
            for k, v in dm.items():
                breakdown.setdefault(k, []).append(v)

        result = {
            "engine": "spark",
            "spark_version": version,
            "epochs": len(measured),
            "median_rows_per_s": round(statistics.median(rates), 1),
            "p10": round(percentile(rates, 10), 1),
            "p90": round(percentile(rates, 90), 1),
            "median_epoch_ms": statistics.median(epoch_ms),
            "median_input_rows": statistics.median(input_rows),
            # rows / addBatch: execution of the query alone, without Spark's
            # per-epoch offset-log/commit-log writes and planning.
            "median_addbatch_rows_per_s": round(statistics.median(add_rates), 1),
            "rows_per_second_target": args.rows_per_second,
            "warmup_epochs": args.warmup,
            "first_batch_id": measured[0]["batchId"],
            "duration_ms_median": {k: statistics.median(v) for k, v in sorted(breakdown.items())},
        }
    finally:
        if query is not None:
            try:
                query.stop()
            except Exception as e:  # noqa: BLE001 - best effort on teardown
                log(f"query.stop failed: {e}")
        if spark is not None:
            teardown.stop(spark)
        shutil.rmtree(workdir, ignore_errors=True)

    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
