#!/usr/bin/env bash
# Nexmark in Flink's forms through Kafka: benches/nexmark/flink/load.sql
# writes EVENTS events (Flink's generator) into one topic of nested JSON,
# then each query file of benches/nexmark/flink runs unchanged over it
# (ddl_kafka.sql, ddl_views.sql, the query's blackhole sink and INSERT),
# with 'available-now' and epochs of at most E records, alternating rounds.
# Metric: events read (the whole topic: Flink's and RisingWave's Nexmark
# figures count every event) / the epochs' execution time (the progress
# log's duration_ms.total summed), median over rounds; and that per core.
# Spark Structured Streaming runs the same queries in its dialect over the
# same topic (benches/spark/nexmark.py --layout flink, FLINK_QUERIES), each
# right after Sluice's run of it, micro-batches of E records, into its noop
# sink as Sluice's into the blackhole: the topic's events / the
# micro-batches' triggerExecution summed. A query Spark refuses to stream
# runs once as a Spark batch job (wall time), and the table says so.
# q14's count_char is the Rust UDF every Sluice session registers; q10
# writes its partitioned CSV files under a temporary directory; q13 looks
# bids up in a side-input file of 10 000 keys. q6 is RisingWave's form (an
# OVER window over each seller's closed auctions).
#
# Env: SPARK (1; 0 leaves Spark out), EVENTS (1000000), RATE (10000 events per second of event time, the
#      generator's default), E (250000), ROUNDS (2), QUERIES ("0 1 2 3 4 5 6 7
#      8 9 10 11 12 13 14 15 16 17 18 19 20 21 22"), OUT (target/bench-results/
#      nexmark-flink-<time>). Writes $OUT/nexmark-flink.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
EVENTS="${EVENTS:-1000000}"
RATE="${RATE:-10000}"
SPARK="${SPARK:-1}"
E="${E:-250000}"
ROUNDS="${ROUNDS:-2}"
QUERIES="${QUERIES:-0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22}"
OUT="${OUT:-$ROOT/target/bench-results/nexmark-flink-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
FLINK="$ROOT/benches/nexmark/flink"
# Checkpoints (a Top-N's state is hundreds of MB) stay out of $OUT.
CP="$(mktemp -d)"
trap 'rm -rf "$CP"' EXIT
CORES="$(nproc)"

log() { echo "[run-nexmark-flink] $*" >&2; }

log "building sluice (release; not timed)"
cargo build --release --bin sluice >&2
SLUICE="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice"
BOOT="$(scripts/kafka start | tail -n 1)"
if [[ "$SPARK" == 1 ]]; then
  log "setting up Spark and its Kafka connector"
  SPARK_PY="$(bash benches/spark/setup.sh | tail -n 1)"
  SPARK_KAFKA_JARS="$(bash benches/spark/kafka-jars.sh | tail -n 1)"
fi
TOPIC="nexmark-flink-$(date +%s)"

log "loading $EVENTS events into $TOPIC"
{
  echo "SET 'checkpoint.location' = '$CP/load';"
  sed -e "s/{topic}/$TOPIC/g; s/{bootstrap}/$BOOT/g; s/{events}/$EVENTS/g; s/{rate}/$RATE/g" "$FLINK/load.sql"
} > "$OUT/load.sql"
start=$(date +%s.%N)
"$SLUICE" run "$OUT/load.sql" > "$OUT/load.log" 2>&1
log "loaded in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"

# q13's side input, as Flink's nexmark makes it: keys 0 to 9 999 with a value.
seq 0 9999 | awk '{print $1 ",v" $1}' > "$CP/side.csv"

ddl() {
  sed -e "s/{topic}/$TOPIC/; s/{bootstrap}/$BOOT/" \
      -e "s/'format' = 'json'/'format' = 'json', 'max-records-per-epoch' = '$E'/" "$FLINK/ddl_kafka.sql"
  cat "$FLINK/ddl_views.sql"
}

for round in $(seq 1 "$ROUNDS"); do
  for q in $QUERIES; do
    file="$OUT/q$q-$round.sql"
    {
      echo "SET 'checkpoint.location' = '$CP/q$q-$round';"
      echo "SET 'trigger' = 'available-now';"
      ddl
      sed -e "s|{output}|$CP/out-q$q-$round|; s|{side_input}|$CP/side.csv|" "$FLINK/q$q.sql"
    } > "$file"
    log "round $round: q$q"
    if ! "$SLUICE" run "$file" --progress-log "$OUT/q$q-$round.jsonl" > "$OUT/q$q-$round.log" 2>&1; then
      log "q$q failed: see $OUT/q$q-$round.log"
    fi
    if [[ "$SPARK" == 1 ]]; then
      log "round $round: q$q on Spark"
      if ! "$SPARK_PY" benches/spark/nexmark.py --layout flink --bootstrap "$BOOT" \
          --topic "$TOPIC" --query "q$q" --max-offsets "$E" --jars "$SPARK_KAFKA_JARS" \
          --side-input "$CP/side.csv" \
          > "$OUT/spark-q$q-$round.json" 2> "$OUT/spark-q$q-$round.log"; then
        log "q$q failed on Spark: see $OUT/spark-q$q-$round.log"
      fi
    fi
  done
done

python3 - "$OUT" "$ROUNDS" "$CORES" "$EVENTS" $QUERIES > "$OUT/nexmark-flink.md" <<'PY'
import json, statistics, sys, platform
out, rounds, cores, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
queries = sys.argv[5:]


def sluice(q, r):
    """Events of the topic per second of epoch execution, and the rows the
    epochs dropped as late."""
    try:
        lines = [json.loads(l) for l in open(f"{out}/q{q}-{r}.jsonl")]
    except FileNotFoundError:
        return None
    ms = sum(l["duration_ms"]["total"] for l in lines)
    if ms <= 0 or not any(l.get("input_rows", 0) for l in lines):
        return None
    return events / ms * 1000, sum(l.get("late_rows", 0) for l in lines)


def spark(q, r):
    """Events of the topic per second of Spark's micro-batches (or of its
    batch job), and why it did not stream, if it did not."""
    try:
        report = json.loads(open(f"{out}/spark-q{q}-{r}.json").read().strip().splitlines()[-1])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    busy = report["busy_ms"]
    return (events / busy * 1000 if busy else None), report.get("unsupported")


def fmt(x):
    return "-" if x is None else f"{x:,.0f}"


print(f"Nexmark in Flink's forms, {events} events in one Kafka topic of nested JSON, "
      f"{rounds} round(s), {cores} cores ({platform.machine()}).\n")
print("| query | Sluice events/s (median) | per core | late rows | Spark events/s (median) "
      "| Sluice / Spark | Sluice rounds | Spark rounds |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
notes = {}
for q in queries:
    ours = [x for x in (sluice(q, r) for r in range(1, rounds + 1)) if x]
    theirs = [x for x in (spark(q, r) for r in range(1, rounds + 1)) if x and x[0]]
    m = statistics.median(x[0] for x in ours) if ours else None
    s = statistics.median(x[0] for x in theirs) if theirs else None
    batch = next((x[1] for x in theirs if x[1]), None)
    if batch:
        notes[q] = batch
    ratio = f"{m / s:.1f}x" if m and s else "-"
    print(f"| q{q} | {fmt(m)} | {fmt(m / cores if m else None)} | "
          f"{max((x[1] for x in ours), default='-')} | {fmt(s)}{' (batch)' if batch else ''} | "
          f"{ratio} | {', '.join(fmt(x[0]) for x in ours)} | "
          f"{', '.join(fmt(x[0]) for x in theirs)} |")
if notes:
    print("\n(batch): Spark refuses to stream the query, so it ran once as a batch job over "
          "the whole topic, timed by its wall time. Spark's reasons:\n")
    for q, why in notes.items():
        print(f"- q{q}: {why[:300]}")
PY
cat "$OUT/nexmark-flink.md"
