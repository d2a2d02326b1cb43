#!/usr/bin/env python3
"""Did Sluice and Spark compute the same Nexmark results?

Reads each pair of output topics a Nexmark run wrote (Sluice's and Spark's
for the same query and input), `read_committed`, with a Spark batch job,
parses their JSON values with the query's output schema and compares:

- append queries (q0-q3, q8): the two multisets of rows, whole;
- windowed append queries (q5, q7): the rows of the windows both engines
  closed (none when one of them closed none: "cutoff" is then "none"). Neither engine emits a window the final watermark has not passed,
  and the last epoch may leave the two watermarks at different windows, so
  the rows compared are those whose time is before a cut-off: for q5 the
  windows ending at or before the earlier of the two last window ends; for
  q7 the bids before the earlier of the two latest bid times rounded down
  to the 10-second window, less one window (every window such a bid can be
  joined with is then closed on both sides);
- q4 (update mode; Spark runs it as one batch job): each key's last value
  in Sluice's topic (the upsert stream's current value) against Spark's
  value, equal to within 1e-9 relative.

Doubles are rounded to 6 decimals before multisets are compared (q1's
price is a decimal in Spark and a float in Sluice).

    compare.py --bootstrap HOST:PORT --jars JARS --pairs PAIRS.json

PAIRS.json is a list of {"query", "sluice_topic", "spark_topic"}. The last
line of stdout is a JSON list with one object per pair: the rows compared
on each side, the rows only in Sluice's output, the rows only in Spark's,
and "same" (true when both of those are 0).
"""

import argparse
import json
import os
import sys

import teardown

# The columns each query writes (benches/nexmark/q*.sql).
SCHEMAS = {
    "q0": "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP, extra STRING",
    "q1": "auction BIGINT, bidder BIGINT, price DOUBLE, date_time TIMESTAMP, extra STRING",
    "q2": "auction BIGINT, price BIGINT",
    "q3": "name STRING, city STRING, state STRING, id BIGINT",
    "q4": "category BIGINT, avg_final DOUBLE",
    "q5": "auction BIGINT, num BIGINT, window_end TIMESTAMP",
    "q7": "auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP, extra STRING",
    "q8": "id BIGINT, name STRING, reserve BIGINT",
}
WINDOW_S = 10


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def read(spark, args, topic, schema):
    """The topic's records (committed ones only) as rows of `schema`, with
    each record's partition and offset; a null value (a deleted key) gives
    a row of nulls. A topic that does not exist (Spark's sink creates none
    when it writes nothing) reads as no rows."""
    from pyspark.sql.functions import col, from_json

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .select("partition", "offset",
                from_json(col("value").cast("string"), schema).alias("r"))
        .select("partition", "offset", "r.*")
    )
    try:
        df.limit(1).collect()
    except Exception as e:  # py4j's error, whose text names Kafka's
        if "UnknownTopicOrPartition" not in str(e):
            raise
        log(f"{topic} does not exist: no rows")
        return spark.createDataFrame([], df.schema)
    return df


def rounded(df):
    from pyspark.sql.functions import col, round as round_
    from pyspark.sql.types import DoubleType

    return df.select([
        round_(col(f.name), 6).alias(f.name) if isinstance(f.dataType, DoubleType)
        else col(f.name) for f in df.schema.fields
    ])


def cut(query, sluice, spark_):
    """The rows of windows both engines closed (q5, q7); all rows otherwise.
    Returns the two data frames and the cut-off (seconds since the epoch),
    if any."""
    from pyspark.sql.functions import col, max as max_

    column = {"q5": "window_end", "q7": "date_time"}.get(query)
    if column is None:
        return sluice, spark_, None
    # Seconds since the epoch, computed by Spark: no time zone in between.
    seconds = col(column).cast("double")
    last = [df.agg(max_(seconds)).first()[0] for df in (sluice, spark_)]
    if None in last:
        # One engine closed no window: no window is known closed on both.
        return sluice.where("false"), spark_.where("false"), "none"
    if query == "q5":
        cutoff = min(last)
        keep = seconds <= cutoff
    else:
        cutoff = int(min(last)) // WINDOW_S * WINDOW_S - WINDOW_S
        keep = seconds < cutoff
    return sluice.where(keep), spark_.where(keep), cutoff


def compare_multisets(query, sluice, spark_):
    columns = [c for c in sluice.columns if c not in ("partition", "offset")]
    sluice, spark_ = sluice.select(columns), spark_.select(columns)
    sluice, spark_, cutoff = cut(query, sluice, spark_)
    sluice, spark_ = rounded(sluice).cache(), rounded(spark_).cache()
    report = {
        "sluice_rows": sluice.count(),
        "spark_rows": spark_.count(),
        "only_in_sluice": sluice.exceptAll(spark_).count(),
        "only_in_spark": spark_.exceptAll(sluice).count(),
    }
    if cutoff is not None:
        report["cutoff"] = cutoff
    return report


def compare_final(sluice, spark_):
    """q4: Sluice's last value per key against Spark's batch answer."""
    from pyspark.sql import Window
    from pyspark.sql.functions import abs as abs_, col, greatest, lit, row_number

    # An upsert stream keeps a key on one partition: its last record there
    # is its current value.
    last = Window.partitionBy("category").orderBy(col("partition"), col("offset").desc())
    current = (sluice.where(col("category").isNotNull())
               .withColumn("n", row_number().over(last)).where("n = 1")
               .select("category", "avg_final"))
    theirs = spark_.select("category", "avg_final")
    joined = current.alias("a").join(theirs.alias("b"), "category", "full_outer")
    differ = joined.where(
        col("a.avg_final").isNull() | col("b.avg_final").isNull()
        | (abs_(col("a.avg_final") - col("b.avg_final"))
           > lit(1e-9) * greatest(lit(1.0), abs_(col("b.avg_final"))))
    )
    return {
        "sluice_rows": current.count(),
        "spark_rows": theirs.count(),
        "only_in_sluice": differ.where(col("a.avg_final").isNotNull()).count(),
        "only_in_spark": differ.where(col("b.avg_final").isNotNull()).count(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--jars", required=True, help="spark-sql-kafka jars, comma-separated")
    p.add_argument("--pairs", required=True, help="JSON file: [{query, sluice_topic, spark_topic}]")
    args = p.parse_args()
    with open(args.pairs) as f:
        pairs = json.load(f)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName("sluice-bench-nexmark-compare")
        .master("local[2]")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    reports = []
    try:
        for pair in pairs:
            query = pair["query"]
            schema = SCHEMAS[query]
            sluice = read(spark, args, pair["sluice_topic"], schema)
            spark_ = read(spark, args, pair["spark_topic"], schema)
            if query == "q4":
                report = compare_final(sluice, spark_)
            else:
                report = compare_multisets(query, sluice, spark_)
            report["query"] = query
            report["same"] = report["only_in_sluice"] == 0 and report["only_in_spark"] == 0
            log(json.dumps(report))
            reports.append(report)
    finally:
        teardown.stop(spark)
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
