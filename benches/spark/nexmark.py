#!/usr/bin/env python3
"""Spark Structured Streaming side of the Nexmark benchmark.

Reads the topics `sluice nexmark load` filled (JSON) that the query needs,
runs one Nexmark query, and writes the result to a Kafka topic as JSON (or,
without --out-topic, to Spark's noop sink), draining the topic
with Trigger.AvailableNow and `maxOffsetsPerTrigger` records per
micro-batch -- the same input, broker and epoch size as the Sluice run.
Spark's Kafka sink is at-least-once (there is no transactional Kafka sink in
Spark); Sluice's runs exactly-once.

    q0: SELECT auction, bidder, price, date_time, extra FROM bid
    q1: SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid
    q2: SELECT auction, price FROM bid WHERE auction % 123 = 0
    q3: auctions in category 10 joined with their sellers in OR, ID or CA
        (a stream-stream inner join without watermark: unbounded state)
    q4: per category, the average of the auctions' highest bids (a join,
        an aggregation without a window, and an aggregation over it, in
        update mode): Spark refuses to stream it (a stream-stream join
        only appends), so it runs once as a batch job over the topics, and
        the report says so ("mode": "batch", "unsupported": why)
    q5: per 10-second window sliding by 2 seconds, the auctions with the
        most bids (two chained aggregations and a join)
    q7: per 10-second window the highest bid, joined back with the bids
        that have it (an aggregation feeding a join)
    q8: people joined with the auctions they opened in the same 10-second
        window (a join on equal windows, state bounded by the watermarks)

With --layout flink it reads instead the one topic of nested JSON that
benches/nexmark/flink/load.sql writes (--topic), as Flink's nexmark
repository lays it out: the `kafka` view computes `dateTime` from the
event's row, and the `person`, `auction` and `bid` views select each kind,
as benches/nexmark/flink/ddl_views.sql does; FLINK_QUERIES are the queries
of benches/nexmark/flink/ written as a Spark user would write them.

Spark runs as local[2], spark.sql.shuffle.partitions=2, UI off.

The LAST line of stdout is one JSON object:
  {"engine":"spark","query":...,"input_rows":...,"busy_ms":...,
   "rows_per_s":...,"steady_rows_per_s":...,"epochs":...,"median_epoch_ms":...,"p99_epoch_ms":...,
   "wall_s":...,"cpu_s":...,"peak_rss_bytes":...}
rows_per_s = input rows / the sum of the micro-batches' triggerExecution;
steady_rows_per_s leaves out the first micro-batch (connecting, JIT);
cpu_s and peak_rss_bytes are the Spark JVM's plus this Python process's.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import teardown


# Per query: the topics it reads (each a temp view of that name) and its SQL.
QUERIES = {
    "q0": (["bid"], "SELECT auction, bidder, price, date_time, extra FROM bid"),
    "q1": (["bid"], "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"),
    "q2": (["bid"], "SELECT auction, price FROM bid WHERE auction % 123 = 0"),
    "q3": (["auction", "person"],
           "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p ON a.seller = p.id "
           "WHERE a.category = 10 AND (p.state = 'OR' OR p.state = 'ID' OR p.state = 'CA')"),
    # Nexmark q4. Structured Streaming joins two streams only in append
    # mode and chains aggregations only over windows, so Spark refuses this
    # one when it starts; main() then times it as one batch job.
    "q4": (["auction", "bid"],
           "SELECT q.category, avg(q.final) AS avg_final "
           "FROM (SELECT a.id, a.category, max(b.price) AS final "
           "FROM auction a JOIN bid b ON a.id = b.auction "
           "WHERE b.date_time BETWEEN a.date_time AND a.expires "
           "GROUP BY a.id, a.category) q "
           "GROUP BY q.category"),
    # A join on equal event-time windows, which Spark bounds by the
    # watermarks (WATERMARKED below).
    "q8": (["person", "auction"],
           "SELECT p.id, p.name, a.reserve "
           "FROM (SELECT *, window(date_time, '10 seconds') AS w FROM person) p "
           "JOIN (SELECT *, window(date_time, '10 seconds') AS w FROM auction) a "
           "ON p.id = a.seller AND p.w = a.w"),
    # Counts per auction and sliding window, the highest count per window,
    # and the counts joined with it: Spark chains the aggregations on the
    # window column.
    "q5": (["bid"],
           "WITH c AS (SELECT auction, count(*) AS num, window FROM bid "
           "GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) "
           "SELECT c.auction, c.num, c.window.end AS window_end FROM c "
           "JOIN (SELECT window, max(num) AS maxn FROM c GROUP BY window) m "
           "ON c.window = m.window AND c.num >= m.maxn"),
    # A windowed aggregation joined back with its stream: Spark 3.4+
    # chains stateful operators in append mode when watermarks bound them.
    "q7": (["bid"],
           "SELECT b.auction, b.price, b.bidder, b.date_time, b.extra FROM bid b "
           "JOIN (SELECT window.end AS window_end, max(price) AS maxprice FROM bid "
           "GROUP BY window(date_time, '10 seconds')) m "
           "ON b.price = m.maxprice "
           "AND b.date_time BETWEEN m.window_end - INTERVAL 10 SECONDS AND m.window_end"),
}

# Queries whose state the watermark bounds: their streams get Nexmark's
# 4-second watermark delay, as in benches/nexmark/kafka-sources.sql.
WATERMARKED = {"q4", "q5", "q7", "q8"}

# Queries whose result changes per key (the rest append).
UPDATE_MODE = {"q4"}
FLINK_UPDATE_MODE = {"q4", "q12", "q15", "q16", "q17"}

# Flink's queries whose sink is partitioned files (q10's filesystem table):
# Spark's file sink, partitioned by the same columns, in CSV.
FLINK_FILES = {"q10": ["dt", "hm"]}

# q15's and q16's counts of bids, bidders and auctions, all and per price
# rank, after their `count(*) AS total_bids`.
BIDS_BIDDERS_AUCTIONS_BY_PRICE = (
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids, "
    "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
    "count(DISTINCT bidder) AS total_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, "
    "count(DISTINCT auction) AS total_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions "
)

# Flink's Nexmark queries (benches/nexmark/flink/q*.sql) in Spark's
# dialect, over the views of the Flink layout. What differs from Flink's
# text, and why: `session_window`, `window(...)` and `split(...)[i]` are
# Spark's spellings of SESSION, TUMBLE/HOP and SPLIT_INDEX; Spark's
# regexp_extract gives '' where Flink's gives NULL (q21); q5, q7 and q8
# take the window as Spark's struct; q14's count_char (a Rust UDF in
# Sluice) is Spark's built-in length arithmetic, not a Python UDF, so
# Spark pays no Python round trip for it; q12's processing time is
# current_timestamp(), one value per micro-batch as PROCTIME() is per
# epoch in Sluice, in update mode (Spark closes no window without a
# watermark); q10 writes Spark's partitioned CSV file sink; q13 joins the
# side-input CSV file (--side-input) as a static table, Spark's
# stream-static join, as FOR SYSTEM_TIME AS OF a processing time is in
# Sluice. Spark refuses to stream q4, q6, q9, q15,
# q16, q18 and q19 (a join feeding an aggregation, an OVER window,
# count(DISTINCT), ROW_NUMBER): they run once as batch jobs, and the report
# says why.
FLINK_QUERIES = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE mod(auction, 123) = 0",
    "q3": "SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id "
          "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
    "q4": "SELECT Q.category, avg(Q.final) AS avg_final FROM ("
          "SELECT max(B.price) AS final, A.category FROM auction A JOIN bid B "
          "ON A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires "
          "GROUP BY A.id, A.category) Q GROUP BY Q.category",
    "q5": "WITH c AS (SELECT auction, count(*) AS num, window FROM bid "
          "GROUP BY auction, window(dateTime, '10 seconds', '2 seconds')) "
          "SELECT c.auction, c.num FROM c "
          "JOIN (SELECT window, max(num) AS maxn FROM c GROUP BY window) m "
          "ON c.window = m.window AND c.num >= m.maxn",
    "q6": "SELECT Q.seller, avg(Q.final) OVER (PARTITION BY Q.seller ORDER BY Q.dateTime "
          "ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price FROM ("
          "SELECT max(B.price) AS final, A.seller, A.expires AS dateTime FROM auction A "
          "JOIN bid B ON A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires "
          "GROUP BY A.id, A.seller, A.expires) Q",
    "q7": "SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bid B "
          "JOIN (SELECT window.end AS window_end, max(price) AS maxprice FROM bid "
          "GROUP BY window(dateTime, '10 seconds')) B1 ON B.price = B1.maxprice "
          "AND B.dateTime BETWEEN B1.window_end - INTERVAL 10 SECONDS AND B1.window_end",
    "q8": "SELECT P.id, P.name, P.starttime FROM ("
          "SELECT id, name, window.start AS starttime, window.end AS endtime FROM person "
          "GROUP BY id, name, window(dateTime, '10 seconds')) P JOIN ("
          "SELECT seller, window.start AS starttime, window.end AS endtime FROM auction "
          "GROUP BY seller, window(dateTime, '10 seconds')) A "
          "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime",
    "q9": "SELECT * FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, "
          "B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id "
          "ORDER BY B.price DESC, B.dateTime ASC) AS rownum FROM auction A JOIN bid B "
          "ON A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires) "
          "WHERE rownum <= 1",
    "q10": "SELECT auction, bidder, price, dateTime, extra, "
           "date_format(dateTime, 'yyyy-MM-dd') AS dt, date_format(dateTime, 'HH:mm') AS hm "
           "FROM bid",
    "q11": "SELECT bidder, count(*) AS bid_count, session_window.start AS starttime, "
           "session_window.end AS endtime FROM bid "
           "GROUP BY bidder, session_window(dateTime, '10 seconds')",
    "q12": "SELECT bidder, count(*) AS bid_count, window.start AS starttime, "
           "window.end AS endtime FROM (SELECT *, current_timestamp() AS p_time FROM bid) "
           "GROUP BY bidder, window(p_time, '10 seconds')",
    "q13": "SELECT B.auction, B.bidder, B.price, B.dateTime, S.value FROM bid B "
           "JOIN side_input S ON mod(B.auction, 10000) = S.key",
    "q14": "SELECT auction, bidder, 0.908 * price AS price, CASE "
           "WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
           "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
           "ELSE 'otherTime' END AS bidTimeType, dateTime, extra, "
           "length(extra) - length(replace(extra, 'c', '')) AS c_counts FROM bid "
           "WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000",
    "q15": "SELECT date_format(dateTime, 'yyyy-MM-dd') AS day, count(*) AS total_bids, "
           + BIDS_BIDDERS_AUCTIONS_BY_PRICE +
           "FROM bid GROUP BY date_format(dateTime, 'yyyy-MM-dd')",
    "q16": "SELECT channel, date_format(dateTime, 'yyyy-MM-dd') AS day, "
           "max(date_format(dateTime, 'HH:mm')) AS minute, count(*) AS total_bids, "
           + BIDS_BIDDERS_AUCTIONS_BY_PRICE +
           "FROM bid GROUP BY channel, date_format(dateTime, 'yyyy-MM-dd')",
    "q17": "SELECT auction, date_format(dateTime, 'yyyy-MM-dd') AS day, count(*) AS total_bids, "
           "count(*) FILTER (WHERE price < 10000) AS rank1_bids, "
           "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
           "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
           "min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, "
           "sum(price) AS sum_price "
           "FROM bid GROUP BY auction, date_format(dateTime, 'yyyy-MM-dd')",
    "q18": "SELECT auction, bidder, price, channel, url, dateTime, extra FROM ("
           "SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC) "
           "AS rank_number FROM bid) WHERE rank_number <= 1",
    "q19": "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
           "ORDER BY price DESC) AS rank_number FROM bid) WHERE rank_number <= 10",
    "q20": "SELECT auction, bidder, price, channel, url, B.dateTime, B.extra, itemName, "
           "description, initialBid, reserve, A.dateTime AS auction_dateTime, expires, seller, "
           "category, A.extra AS auction_extra "
           "FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = 10",
    "q21": "SELECT auction, bidder, price, channel, CASE "
           "WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' "
           "WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' "
           "ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id FROM bid "
           "WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) <> '' "
           "OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')",
    "q22": "SELECT auction, bidder, price, channel, split(url, '/')[3] AS dir1, "
           "split(url, '/')[4] AS dir2, split(url, '/')[5] AS dir3 FROM bid",
}

# Flink's queries whose windows the watermark closes (the Flink layout's
# `kafka` table declares `dateTime - INTERVAL '4' SECOND` for all; Spark's
# watermark only matters to these, and only these get one).
FLINK_WATERMARKED = {"q5", "q7", "q8", "q11"}

# The Flink layout: one topic, event_type and a row per kind of event.
FLINK_SCHEMA = (
    "event_type INT, "
    "person STRUCT<id: BIGINT, name: STRING, emailAddress: STRING, creditCard: STRING, "
    "city: STRING, state: STRING, dateTime: TIMESTAMP, extra: STRING>, "
    "auction STRUCT<id: BIGINT, itemName: STRING, description: STRING, initialBid: BIGINT, "
    "reserve: BIGINT, dateTime: TIMESTAMP, expires: TIMESTAMP, seller: BIGINT, "
    "category: BIGINT, extra: STRING>, "
    "bid STRUCT<auction: BIGINT, bidder: BIGINT, price: BIGINT, channel: STRING, url: STRING, "
    "dateTime: TIMESTAMP, extra: STRING>"
)

# benches/nexmark/flink/ddl_views.sql in Spark's dialect.
FLINK_VIEWS = {
    "person": "SELECT person.id, person.name, person.emailAddress, person.creditCard, "
              "person.city, person.state, dateTime, person.extra FROM kafka WHERE event_type = 0",
    "auction": "SELECT auction.id, auction.itemName, auction.description, auction.initialBid, "
               "auction.reserve, dateTime, auction.expires, auction.seller, auction.category, "
               "auction.extra FROM kafka WHERE event_type = 1",
    "bid": "SELECT bid.auction, bid.bidder, bid.price, bid.channel, bid.url, dateTime, "
           "bid.extra FROM kafka WHERE event_type = 2",
}

# The JSON schema of each topic, as `sluice nexmark load` writes it.
SCHEMAS = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
              "state STRING, date_time TIMESTAMP, extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
               "reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, "
               "category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP, extra STRING",
}


def log(msg):
    print(f"[spark-nexmark] {msg}", file=sys.stderr, flush=True)


def percentile(values, q):
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def proc_cpu_s(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_hwm_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def read_json(spark, args, topic, schema, stream):
    """`topic`'s committed JSON records as columns of `schema`: a stream
    capped at maxOffsetsPerTrigger per micro-batch (as Sluice caps each
    epoch), or, with stream=False, all of it as one batch."""
    from pyspark.sql.functions import col, from_json

    reader = (
        (spark.readStream if stream else spark.read).format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
    )
    if stream:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets))
    else:
        reader = reader.option("endingOffsets", "latest")
    return reader.load().select(
        from_json(col("value").cast("string"), schema).alias("r")).select("r.*")


def register_topics(spark, args, tables, stream):
    """One temp view per topic the query reads, named after its table, of
    its JSON records as columns: a stream capped at maxOffsetsPerTrigger per
    micro-batch (as Sluice caps each stream), with Nexmark's watermark where
    the query needs one; or, with stream=False, all of it as one batch."""
    for table in tables:
        rows = read_json(spark, args, f"{args.prefix}-{table}", SCHEMAS[table], stream)
        if stream and args.query in WATERMARKED:
            rows = rows.withWatermark("date_time", "4 seconds")
        rows.createOrReplaceTempView(table)


def register_flink_views(spark, args, stream):
    """The Flink layout's `kafka` view over --topic (capped at
    maxOffsetsPerTrigger per micro-batch, with the 4-second watermark where
    the query's windows need it; or all of it as one batch) and the
    `person`, `auction` and `bid` views over it."""
    events = read_json(spark, args, args.topic, FLINK_SCHEMA, stream).selectExpr(
        "*", "CASE WHEN event_type = 0 THEN person.dateTime WHEN event_type = 1 "
             "THEN auction.dateTime ELSE bid.dateTime END AS dateTime")
    if stream and args.query in FLINK_WATERMARKED:
        events = events.withWatermark("dateTime", "4 seconds")
    events.createOrReplaceTempView("kafka")
    for view, sql in FLINK_VIEWS.items():
        spark.sql(sql).createOrReplaceTempView(view)


def register(spark, args, tables, stream):
    """The views the query reads, in the layout --layout names."""
    if args.layout == "flink":
        register_flink_views(spark, args, stream)
    else:
        register_topics(spark, args, tables, stream)


def batch_instead(spark, args, tables, sql, jvm_pid, why):
    """Runs `sql` once as a Spark batch job over all of the topics, writing
    to the output topic: the report of a query Spark refuses to stream."""
    from pyspark.sql.functions import struct, to_json

    register(spark, args, tables, stream=False)
    cpu_before = proc_cpu_s(jvm_pid) + sum(os.times()[:2])
    started = time.monotonic()
    writer = spark.sql(sql).select(to_json(struct("*")).alias("value")).write
    if args.out_topic is None:
        writer.format("noop").mode("overwrite").save()
    else:
        (writer.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
         .option("topic", args.out_topic).save())
    wall_s = time.monotonic() - started
    return {
        "engine": "spark",
        "spark_version": spark.version,
        "query": args.query,
        "delivery": "at-least-once",
        "mode": "batch",
        "unsupported": why,
        "busy_ms": wall_s * 1000.0,
        "epochs": 1,
        "median_epoch_ms": wall_s * 1000.0,
        "p99_epoch_ms": wall_s * 1000.0,
        "wall_s": wall_s,
        "cpu_s": proc_cpu_s(jvm_pid) + sum(os.times()[:2]) - cpu_before,
        "peak_rss_bytes": proc_hwm_bytes(jvm_pid) + proc_hwm_bytes(os.getpid()),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--layout", choices=["beam", "flink"], default="beam",
                   help="beam: a topic per table (sluice nexmark load); flink: one topic of "
                        "nested JSON (benches/nexmark/flink/load.sql)")
    p.add_argument("--prefix", help="topic prefix given to sluice nexmark load (beam)")
    p.add_argument("--topic", help="the events' topic (flink)")
    p.add_argument("--query", required=True,
                   choices=sorted(set(QUERIES) | set(FLINK_QUERIES)))
    p.add_argument("--out-topic",
                   help="the output topic; without one the output goes to Spark's noop sink, "
                        "as Flink's Nexmark writes to its blackhole")
    p.add_argument("--max-offsets", type=int, default=500_000,
                   help="records per micro-batch (maxOffsetsPerTrigger)")
    p.add_argument("--jars", required=True, help="spark-sql-kafka jars, comma-separated")
    p.add_argument("--side-input", help="q13's side-input CSV file (key,value lines)")
    p.add_argument("--driver-memory", default=os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    args = p.parse_args()
    queries = FLINK_QUERIES if args.layout == "flink" else QUERIES
    updating = FLINK_UPDATE_MODE if args.layout == "flink" else UPDATE_MODE
    if args.query not in queries or (args.prefix if args.layout == "beam" else args.topic) is None:
        p.error(f"--layout {args.layout} needs --{'prefix' if args.layout == 'beam' else 'topic'} "
                f"and one of {', '.join(sorted(queries))}")

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import struct, to_json
    from pyspark.errors import AnalysisException

    workdir = tempfile.mkdtemp(prefix="sluice-spark-nexmark-", dir="/tmp")
    spark = (
        SparkSession.builder
        .appName(f"sluice-bench-nexmark-{args.query}")
        .master("local[2]")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    try:
        if args.layout == "flink":
            tables, sql = [], FLINK_QUERIES[args.query]
        else:
            tables, sql = QUERIES[args.query]
        register(spark, args, tables, stream=True)
        if args.side_input:
            (spark.read.schema("key BIGINT, value STRING").csv(args.side_input)
             .createOrReplaceTempView("side_input"))
        result = spark.sql(sql)
        cpu_before = proc_cpu_s(jvm_pid) + sum(os.times()[:2])
        started = time.monotonic()
        try:
            files = FLINK_FILES.get(args.query) if args.layout == "flink" else None
            rows = result if files else result.select(to_json(struct("*")).alias("value"))
            writer = (
                rows.writeStream
                .outputMode("update" if args.query in updating else "append")
                .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
                .trigger(availableNow=True)
            )
            if files:
                writer = (writer.format("csv").partitionBy(*files)
                          .option("path", os.path.join(workdir, "files")))
            elif args.out_topic is None:
                writer = writer.format("noop")
            else:
                writer = (writer.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                          .option("topic", args.out_topic))
            query = writer.start()
        except AnalysisException as e:
            # Spark checks a streaming plan when it starts, and refuses what
            # it cannot run incrementally. What a Spark user can do instead
            # is one batch job over the topics: it is timed in its place.
            why = " ".join(str(e).split(";")[0].split())
            log(f"{args.query}: Spark refuses it as a stream: {why}")
            print(json.dumps(batch_instead(spark, args, tables, sql, jvm_pid, why)))
            return
        query.awaitTermination()
        wall_s = time.monotonic() - started
        cpu_s = proc_cpu_s(jvm_pid) + sum(os.times()[:2]) - cpu_before
        progress = [json.loads(p.json) if hasattr(p, "json") else p for p in query.recentProgress]
        batches = [p for p in progress if p.get("numInputRows", 0) > 0]
        input_rows = sum(p["numInputRows"] for p in batches)
        durations = [p["durationMs"]["triggerExecution"] for p in batches]
        busy_ms = sum(durations)
        # The first batch also connects, fetches metadata and warms the
        # JIT: left out of the steady rate when there are others.
        rows = [p["numInputRows"] for p in batches]
        steady = (sum(rows[1:]), sum(durations[1:])) if len(batches) > 1 else (input_rows, busy_ms)
        report = {
            "engine": "spark",
            "spark_version": spark.version,
            "query": args.query,
            "delivery": "at-least-once",
            "input_rows": input_rows,
            "busy_ms": busy_ms,
            "rows_per_s": input_rows / (busy_ms / 1000.0) if busy_ms else None,
            "steady_rows_per_s": steady[0] / (steady[1] / 1000.0) if steady[1] else None,
            "epochs": len(batches),
            "median_epoch_ms": percentile(durations, 50),
            "p99_epoch_ms": percentile(durations, 99),
            "wall_s": wall_s,
            "cpu_s": cpu_s,
            "peak_rss_bytes": proc_hwm_bytes(jvm_pid) + proc_hwm_bytes(os.getpid()),
        }
        log(f"{args.query}: {input_rows} rows in {len(batches)} batches, busy {busy_ms} ms")
        print(json.dumps(report))
    finally:
        teardown.stop(spark)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
