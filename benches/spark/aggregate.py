#!/usr/bin/env python3
"""Spark Structured Streaming side of the stateful aggregation side-by-side benchmark.

Pipeline (the same shape as Sluice's `aggregate` bench):

    rate(rowsPerSecond=R, numPartitions=2, rampUpTime=0s)
      -> GROUP BY value % K AS k
         AGG count(*) AS n, max(timestamp) AS last
      -> update output mode, noop sink, processingTime trigger of 1 second

With --rows-per-batch B every micro-batch holds B rows (Spark's
rate-micro-batch source), however long the last one took: epochs of a
fixed size, which Sluice's rate source gives with rows_per_batch.

With --query first it keeps each key's first row instead
(dropDuplicates(["k"]) on k = value % K, append mode): streaming
deduplication, the one row-keeping query Spark streams (it refuses
ROW_NUMBER() over a stream, so it has no Top-N).

With --query join-interval it joins the stream with itself on value within
one second of event time (a stream-stream interval join with a 1 s
watermark, append mode): each row meets itself once. Spark reads the
source once per side, so its numInputRows counts every row twice; the
rates here are of source rows (numInputRows / 2), as Sluice's are (it
reads a stream once and hands it to both sides). Spark cannot stream a
join of two aggregations (it joins streams in append mode only, and an
aggregation without a watermark emits in update mode), so the changelog
join Sluice also measures has no Spark row.

With --seed-topic it runs the seed pipeline instead (examples/seed.sql:
GROUP BY value % 4 AS bucket with count(*), sum(value), max(timestamp)),
into that Kafka topic keyed by bucket (Spark's Kafka sink: at-least-once).

Spark runs as local[2] with spark.sql.shuffle.partitions=2 (so 2 state store
partitions) and the UI off. The state store is Spark's default
(HDFS-backed, checkpointed to a directory under /tmp), or RocksDB with
--state-store rocksdb, or RocksDB with changelog checkpointing (each
micro-batch uploads only the changed keys, as Sluice's deltas do) with
--state-store rocksdb-changelog; the provider class and the changelog
setting in effect are reported as "state_store_provider" and
"changelog_checkpointing".

The first --warmup epochs (micro-batches with input) are discarded; the next
--epochs are measured from the query's progress reports. For each measured
epoch, throughput = numInputRows / (durationMs.triggerExecution / 1000), i.e.
rows per second of epoch execution (not of wall-clock time, which the 1 s
trigger would cap at R).

The rate source's offsets have a granularity of one second, so an epoch
carries R rows for every whole second since the previous one: about R when
each epoch finishes within its 1 s trigger interval, a multiple of R when
Spark falls behind. median_input_rows shows which case applied.

The state holds one row per key, so after the first epoch or two
median_state_rows (stateOperators[0].numRowsTotal) should equal K.

The LAST line of stdout is one JSON object:
  {"engine":"spark","spark_version":...,"epochs":N,"median_rows_per_s":...,
   "p10":...,"p90":...,"median_epoch_ms":...,"p99_epoch_ms":...,
   "median_input_rows":...,"median_state_rows":..., ...}
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
    print(f"[spark-aggregate] {msg}", file=sys.stderr, flush=True)


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


STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "rocksdb-changelog":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def as_dict(progress):
    # PySpark < 4 returns dicts; PySpark 4 returns StreamingQueryProgress objects.
    if isinstance(progress, dict):
        return progress
    return json.loads(progress.json)


def state_op(d):
    ops = d.get("stateOperators") or []
    return ops[0] if ops else {}


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
    p.add_argument("--keys", "-k", type=int,
                   default=int(os.environ.get("K", 100_000)),
                   help="number of distinct grouping keys (value %% K)")
    p.add_argument("--driver-memory", default=os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    p.add_argument("--rows-per-batch", type=int, default=None,
                   help="fixed-size micro-batches of this many rows (the rate-micro-batch "
                        "source) instead of R rows per second")
    p.add_argument("--state-store", choices=tuple(STATE_STORES),
                   default=os.environ.get("SPARK_STATE_STORE", "hdfs"),
                   help="Spark's state store: the default HDFS-backed one (every key on the "
                        "JVM heap), RocksDB (for millions of keys), or RocksDB with "
                        "changelog checkpointing")
    p.add_argument("--query", choices=("group-by", "first", "join-interval"), default="group-by",
                   help="first: dropDuplicates on value %% K instead of the GROUP BY; "
                        "join-interval: the stream interval-joined with itself")
    p.add_argument("--seed-topic", default=None,
                   help="run the seed pipeline instead (examples/seed.sql: GROUP BY value %% 4 "
                        "with count, sum and max) into this Kafka topic, update mode")
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--jars", default="", help="spark-sql-kafka jars, comma-separated (--seed-topic)")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="give up after this many seconds (default: generous, from the epoch count)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.epochs < 1 or args.warmup < 0 or args.rows_per_second < 1 or args.keys < 1:
        sys.exit("need --epochs >= 1, --warmup >= 0, --rows-per-second >= 1, --keys >= 1")
    total = args.warmup + args.epochs
    # Fixed-size batches over millions of keys take Spark many seconds each.
    timeout_s = args.timeout_s or (60.0 + (60.0 if args.rows_per_batch else 10.0) * total)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession  # imported late: --help works without pyspark
    from pyspark.sql.functions import col, count, max as max_, struct, sum as sum_, to_json

    workdir = tempfile.mkdtemp(prefix="sluice-spark-aggregate-", dir="/tmp")
    checkpoint = os.path.join(workdir, "checkpoint")
    spark = None
    query = None
    try:
        spark = (
            SparkSession.builder
            .appName("sluice-bench-aggregate")
            .master("local[2]")
            .config("spark.driver.memory", args.driver_memory)
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.local.dir", os.path.join(workdir, "local"))
            .config("spark.sql.streaming.numRecentProgressUpdates", str(max(100, 4 * total)))
            .config("spark.jars", args.jars)
            .config("spark.sql.streaming.stateStore.providerClass", STATE_STORES[args.state_store])
            .config(CHANGELOG, str(args.state_store == "rocksdb-changelog").lower())
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        version = spark.version
        provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
        changelog = spark.conf.get(CHANGELOG)
        log(f"spark {version}: R={args.rows_per_second} K={args.keys} "
            f"warmup={args.warmup} epochs={args.epochs} state store={provider}")

        if args.rows_per_batch:
            src = (
                spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", args.rows_per_batch)
                .option("numPartitions", 2)
                .load()
            )
        else:
            src = (
                spark.readStream.format("rate")
                .option("rowsPerSecond", args.rows_per_second)
                .option("numPartitions", 2)
                .option("rampUpTime", "0s")
                .load()
            )
        if args.seed_topic:
            # The seed pipeline: its four buckets, keyed by bucket, into Kafka.
            out = (
                src.groupBy((col("value") % 4).alias("bucket"))
                .agg(count("*").alias("ticks"), sum_("value").alias("total"),
                     max_("timestamp").alias("last_tick"))
                .select(to_json(struct("bucket")).alias("key"),
                        to_json(struct("*")).alias("value"))
            )
            writer = (
                out.writeStream.outputMode("update").format("kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("topic", args.seed_topic)
            )
        elif args.query == "join-interval":
            from pyspark.sql.functions import expr
            s = src.withWatermark("timestamp", "1 second")
            out = (
                s.alias("a")
                .join(s.alias("b"), expr(
                    "a.value = b.value AND b.timestamp BETWEEN a.timestamp "
                    "AND a.timestamp + interval 1 second"))
                .select("a.value", "b.timestamp")
            )
            writer = out.writeStream.outputMode("append").format("noop")
        elif args.query == "first":
            out = src.withColumn("k", col("value") % args.keys).dropDuplicates(["k"])
            writer = out.writeStream.outputMode("append").format("noop")
        else:
            out = (
                src.groupBy((col("value") % args.keys).alias("k"))
                .agg(count("*").alias("n"), max_("timestamp").alias("last"))
            )
            writer = out.writeStream.outputMode("update").format("noop")
        query = (
            writer
            .queryName("sluice_bench_aggregate")
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
                    so = state_op(d)
                    log(f"batch {d['batchId']}: rows={d['numInputRows']} "
                        f"triggerExecution={dm.get('triggerExecution')}ms "
                        f"addBatch={dm.get('addBatch')}ms "
                        f"stateRows={so.get('numRowsTotal')} updated={so.get('numRowsUpdated')}")
            if len(epochs) >= total:
                break
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"only {len(epochs)}/{total} epochs after {timeout_s:.0f}s")
            time.sleep(0.25)

        measured = [epochs[b] for b in sorted(epochs)[args.warmup:total]]
        rates, add_rates, epoch_ms, input_rows = [], [], [], []
        state_rows, state_updated, state_mem = [], [], []
        breakdown = {}
        for d in measured:
            dm = d["durationMs"]
            te = dm["triggerExecution"]
            rows = d["numInputRows"]
            if args.query == "join-interval":
                rows = rows / 2  # each source row is read once per side
            rates.append(rows / (te / 1000.0) if te > 0 else float("inf"))
            ab = dm.get("addBatch", 0)
            add_rates.append(rows / (ab / 1000.0) if ab > 0 else float("inf"))
            epoch_ms.append(te)
            input_rows.append(rows)
            so = state_op(d)
            state_rows.append(so.get("numRowsTotal"))
            state_updated.append(so.get("numRowsUpdated"))
            state_mem.append(so.get("memoryUsedBytes"))
            for k, v in dm.items():
                breakdown.setdefault(k, []).append(v)

        dmed = {k: statistics.median(v) for k, v in sorted(breakdown.items())}
        result = {
            "engine": "spark",
            "spark_version": version,
            "epochs": len(measured),
            "median_rows_per_s": round(statistics.median(rates), 1),
            "p10": round(percentile(rates, 10), 1),
            "p90": round(percentile(rates, 90), 1),
            "median_epoch_ms": statistics.median(epoch_ms),
            "p99_epoch_ms": round(percentile(epoch_ms, 99), 1),
            "median_input_rows": statistics.median(input_rows),
            "median_state_rows": median_or_none(state_rows),
            "median_state_rows_updated": median_or_none(state_updated),
            "median_state_memory_bytes": median_or_none(state_mem),
            # Per-epoch phases: addBatch is the query itself (incl. state store
            # load/commit); walCommit / commitOffsets are the offset-log and
            # commit-log writes to the checkpoint.
            "median_addbatch_ms": dmed.get("addBatch"),
            "median_walcommit_ms": dmed.get("walCommit"),
            "median_commitoffsets_ms": dmed.get("commitOffsets"),
            # rows / addBatch: execution of the query alone, without Spark's
            # per-epoch offset-log/commit-log writes and planning.
            "median_addbatch_rows_per_s": round(statistics.median(add_rates), 1),
            "rows_per_second_target": args.rows_per_second,
            "rows_per_batch": args.rows_per_batch,
            "keys": 4 if args.seed_topic else args.keys,
            "pipeline": "seed" if args.seed_topic else args.query,
            "state_store_provider": provider,
            "changelog_checkpointing": changelog == "true",
            "warmup_epochs": args.warmup,
            "first_batch_id": measured[0]["batchId"],
            "duration_ms_median": dmed,
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
