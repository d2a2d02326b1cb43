#!/usr/bin/env bash
# Side-by-side stateful aggregation benchmark: Sluice vs Spark Structured Streaming.
#
# Pipeline on both sides: rate source (R rows/s, 2 partitions)
#   -> GROUP BY value % K AS k: count(*) AS n, max(timestamp) AS last
#   -> update output mode, discarding sink, 1 s processing-time trigger.
# State: one row per key (K rows); Spark uses its default HDFS-backed state
# store with a checkpoint under /tmp, 2 shuffle partitions.
# Metric: median over N measured epochs of numInputRows / epoch execution time,
# plus median and p99 epoch execution time.
#
# Env:
#   R       target rows per second                 (default 4000000)
#   N       measured epochs per run                (default 20)
#   K       distinct grouping keys                 (default 100000)
#   WARMUP  Spark warm-up epochs discarded         (default 5)
#   ROUNDS  alternating sluice/spark rounds        (default 2)
#   OUT     directory for raw JSON + logs          (default target/bench-results/aggregate-<time>)
#   SLUICE_CACHE  where the Spark venv lives       (default ~/.cache/sluice)
#   SEED=1  run the seed pipeline instead (examples/seed.sql: GROUP BY value % 4
#           with count, sum, max) into a Kafka topic on the local broker
#           (started if none runs): Sluice exactly-once, Spark at-least-once
#   SPARK_STATE_STORE  hdfs (Spark's default), rocksdb (for millions of keys), or
#           rocksdb-changelog (RocksDB with changelog checkpointing)
#   B       fixed-size epochs of B rows on both sides (rate source
#           rows_per_batch; Spark's rate-micro-batch) instead of R rows/s: at
#           millions of keys an epoch outlasts its 1 s trigger, and time-driven
#           epochs then grow without bound
#
# Each side prints a JSON object as the last line of stdout with
# "engine", "median_rows_per_s", "median_epoch_ms" and "p99_epoch_ms"; this
# script collects them and prints a Markdown table to stdout (progress goes to
# stderr).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

R="${R:-4000000}"
N="${N:-20}"
K="${K:-100000}"
WARMUP="${WARMUP:-5}"
ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$ROOT/target/bench-results/aggregate-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

log() { echo "[run-aggregate] $*" >&2; }

# Last line of a file that parses as a JSON object, or fail loudly.
last_json() {
  python3 - "$1" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip()]
if not lines:
    sys.exit(f"{sys.argv[1]}: no output")
obj = json.loads(lines[-1])
assert isinstance(obj, dict) and "median_rows_per_s" in obj, obj
print(json.dumps(obj))
PY
}

log "setting up Spark"
SPARK_PY="$(bash "$ROOT/benches/spark/setup.sh" | tail -n 1)"

SEED="${SEED:-0}"
SLUICE_SEED=() SPARK_SEED=()
if [ -n "${B:-}" ]; then
  SLUICE_SEED=(--rows-per-batch "$B") SPARK_SEED=(--rows-per-batch "$B")
fi
if [ "$SEED" = 1 ]; then
  log "starting the broker and fetching Spark's Kafka connector (seed pipeline)"
  BOOTSTRAP="$(scripts/kafka start | tail -n 1)"
  JARS="$(bash "$ROOT/benches/spark/kafka-jars.sh" | tail -n 1)"
  STAMP="$(date +%s)"
  SLUICE_SEED+=(--seed-topic "seed-bench-sluice-$STAMP" --bootstrap "$BOOTSTRAP")
  SPARK_SEED+=(--seed-topic "seed-bench-spark-$STAMP" --bootstrap "$BOOTSTRAP" --jars "$JARS")
fi

log "building the Sluice bench (not timed)"
cargo bench --bench aggregate --no-run >&2

run_sluice() {
  local i="$1" f="$OUT/sluice-$1"
  log "round $i: sluice (R=$R B=${B:-} N=$N K=$K warmup=$WARMUP)"
  cargo bench --bench aggregate -- --rows-per-second "$R" --epochs "$N" --keys "$K" \
      --warmup "$WARMUP" \
      ${SLUICE_SEED[@]+"${SLUICE_SEED[@]}"} >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "sluice run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

run_spark() {
  local i="$1" f="$OUT/spark-$1"
  log "round $i: spark (R=$R B=${B:-} N=$N K=$K warmup=$WARMUP)"
  "$SPARK_PY" "$ROOT/benches/spark/aggregate.py" \
      --rows-per-second "$R" --epochs "$N" --warmup "$WARMUP" --keys "$K" \
      ${SPARK_SEED[@]+"${SPARK_SEED[@]}"} >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "spark run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

# Alternate so that background noise on this shared machine hits both sides.
for i in $(seq 1 "$ROUNDS"); do
  run_sluice "$i"
  run_spark "$i"
done

python3 - "$OUT" "$ROUNDS" "$R" "$N" "$K" "${B:-}" <<'PY'
import json, os, statistics, sys
out, rounds, r, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
b = int(sys.argv[6]) if sys.argv[6] else None
load_text = f"epochs of {b:,} rows" if b else f"R = {r:,} rows/s"
load = lambda name: json.load(open(os.path.join(out, name)))
rows = []
for i in range(1, rounds + 1):
    rows.append((i, load(f"sluice-{i}.json"), load(f"spark-{i}.json")))

def fmt(x):
    return f"{x / 1e6:,.2f} M" if x is not None else "n/a"

def ms(d, key="median_epoch_ms"):
    v = d.get(key)
    return f"{v:,.0f}" if v is not None else "n/a"

def num(d, key):
    v = d.get(key)
    return f"{v:,.0f}" if v is not None else "n/a"

spark_ver = rows[0][2].get("spark_version", "?")
store = rows[0][2].get("state_store_provider", "?").rsplit(".", 1)[-1]
if rows[0][2].get("changelog_checkpointing"):
    store += ", changelog checkpointing"
if rows[0][1].get("pipeline") == "seed":
    print(f"### The seed pipeline (examples/seed.sql: GROUP BY value % 4, count, sum, max "
          f"-> Kafka; Sluice exactly-once, Spark at-least-once), {load_text}, "
          f"{n} measured epochs, Spark {spark_ver}\n")
else:
    print(f"### Stateful aggregation (GROUP BY value % {k:,}: count, max(timestamp)), "
          f"{load_text}, {n} measured epochs, state checkpointed every epoch (1 s trigger), "
          f"Spark {spark_ver} ({store})\n")
print("| round | Sluice rows/s | Sluice epoch ms | Sluice p99 ms "
      "| Spark rows/s | Spark epoch ms | Spark p99 ms | Sluice / Spark |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for i, s, sp in rows:
    a, b = s["median_rows_per_s"], sp["median_rows_per_s"]
    print(f"| {i} | {fmt(a)} | {ms(s)} | {ms(s, 'p99_epoch_ms')} "
          f"| {fmt(b)} | {ms(sp)} | {ms(sp, 'p99_epoch_ms')} | {a / b:.2f}x |")
sa = statistics.median(s["median_rows_per_s"] for _, s, _ in rows)
sb = statistics.median(sp["median_rows_per_s"] for _, _, sp in rows)
print(f"| **median** | **{fmt(sa)}** | | | **{fmt(sb)}** | | | **{sa / sb:.2f}x** |")
print()
def mb(v):
    return f"{v / 1e6:,.0f} MB" if v is not None else "n/a"

for i, s, sp in rows:
    print(f"- round {i}: rows/epoch sluice {num(s, 'median_input_rows')}, "
          f"spark {num(sp, 'median_input_rows')}; "
          f"state rows sluice {num(s, 'median_state_rows')}, "
          f"spark {num(sp, 'median_state_rows')}; "
          f"checkpoint (state phase) per epoch sluice "
          f"{s.get('median_phase_ms', {}).get('state', float('nan')):,.0f} ms; "
          f"restore sluice {num(s, 'restore_ms')} ms; peak RSS sluice "
          f"{mb(s.get('peak_rss_bytes'))}; DataFusion alone (one batch GROUP BY over an "
          f"epoch's rows in memory) {fmt(s.get('datafusion_alone_median_rows_per_s'))}/s, "
          f"Sluice at {s['median_rows_per_s'] / s.get('datafusion_alone_median_rows_per_s', float('nan')):.2f} of it")
print(f"\nrows/s = numInputRows / epoch execution time, median over epochs; "
      f"p99 = 99th percentile of epoch execution time; raw JSON in {out}")
PY
