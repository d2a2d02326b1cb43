#!/usr/bin/env bash
# Joins over changes, side by side: a join of two changelogs (two
# aggregations whose rows change every epoch, full outer joined on their
# key, as a join of two CDC streams is) against Sluice's append-only form
# (the interval join) and against Spark, which streams only the append-only
# form.
#
# Every run: rate source (2 partitions), epochs of B rows each (the rate
# source's rows_per_batch; Spark's rate-micro-batch), blackhole / noop sink,
# state checkpointed every epoch.
#   sluice group-by       GROUP BY value % K: count(*), max(timestamp)  (for scale)
#   sluice join-interval  a JOIN b ON a.value = b.value AND b.timestamp BETWEEN
#                         a.timestamp AND a.timestamp + 1 s (1 s watermark; each
#                         row meets itself once; append mode)
#   spark  join-interval  the same in Spark (source rows/s: its numInputRows / 2)
#   sluice join-changes   (GROUP BY k: count(*)) FULL JOIN (even values, GROUP BY k:
#                         max(value)) ON k, k = value % K (update mode: every
#                         epoch changes every key on both sides)
#   sluice min-changes    per k % 100, min and max of the per-key counts of
#                         GROUP BY k (an aggregation over a changelog: multiset
#                         state; update mode)
# Spark refuses a stream-stream join in update mode (and an aggregation
# feeding a join without a watermark), so join-changes has no Spark row.
# Metric: median over N measured epochs of input rows / epoch execution time;
# the state's bytes per key (Sluice: the state store's size / K).
#
# Env: B (500000), R (500000, the rate the source's timestamps advance at: equal to B,
#      each epoch spans one second of event time, as Spark's rate-micro-batch does),
#      N (10), K (100000), WARMUP (3), ROUNDS (2),
#      OUT (target/bench-results/joins-<time>). Writes $OUT/joins.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

R="${R:-500000}"
B="${B:-500000}"
N="${N:-10}"
K="${K:-100000}"
WARMUP="${WARMUP:-3}"
ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$ROOT/target/bench-results/joins-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

log() { echo "[run-joins] $*" >&2; }

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
log "building the Sluice bench (not timed)"
# Run the built binary itself: a source edited while the rounds run must
# not rebuild it between them.
BENCH="$(cargo bench --bench aggregate --no-run 2>&1 | tee /dev/stderr \
  | sed -n 's/.*Executable benches\/aggregate.rs (\(.*\))$/\1/p' | tail -n 1)"
[ -x "$BENCH" ] || { log "no bench binary found"; exit 1; }

run_sluice() {
  local query="$1" i="$2" f="$OUT/sluice-$1-$2"
  local extra=()
  if [ "$query" != group-by ]; then extra=(--query "$query"); fi
  log "round $i: sluice $query (B=$B N=$N K=$K)"
  "$BENCH" --bench --rows-per-second "$R" --rows-per-batch "$B" --epochs "$N" --keys "$K" \
      --warmup "$WARMUP" "${extra[@]}" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "sluice $query run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

run_spark() {
  local i="$1" f="$OUT/spark-join-interval-$1"
  log "round $i: spark join-interval (B=$B N=$N K=$K)"
  "$SPARK_PY" "$ROOT/benches/spark/aggregate.py" --query join-interval \
      --rows-per-second "$R" --rows-per-batch "$B" --epochs "$N" --warmup "$WARMUP" \
      --keys "$K" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "spark run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

# Alternate so that background noise on this shared machine hits every row.
for i in $(seq 1 "$ROUNDS"); do
  run_sluice group-by "$i"
  run_sluice join-interval "$i"
  run_spark "$i"
  run_sluice join-changes "$i"
  run_sluice min-changes "$i"
done

python3 - "$OUT" "$B" "$N" "$K" <<'PY' | tee "$OUT/joins.md"
import glob, json, os, statistics, sys
out, b, n, k = sys.argv[1:]
rows = [("sluice", "group-by"), ("sluice", "join-interval"), ("spark", "join-interval"),
        ("sluice", "join-changes"), ("sluice", "min-changes")]
runs = {}
for engine, query in rows:
    files = sorted(glob.glob(os.path.join(out, f"{engine}-{query}-*.json")))
    runs[(engine, query)] = [json.load(open(f)) for f in files]
def med(engine, query, key):
    vals = [j.get(key) for j in runs[(engine, query)] if j.get(key) is not None]
    return statistics.median(vals) if vals else None
base = med("sluice", "join-interval", "median_rows_per_s")
print(f"B={b} rows per epoch, N={n} measured epochs, K={k} keys; medians over "
      f"{len(runs[('sluice', 'join-interval')])} alternating rounds\n")
print("| engine | query | rows/s (median) | epoch ms (median) | p99 epoch ms | of Sluice's `join-interval` | state bytes per key |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for engine, query in rows:
    rate = med(engine, query, "median_rows_per_s")
    if rate is None:
        continue
    ratio = f"{rate / base:.2f}" if base else ""
    per_key = med(engine, query, "state_bytes_per_key")
    per_key = f"{per_key:.0f}" if per_key is not None else "n/a"
    print(f"| {engine} | {query} | {rate/1e6:.2f} M | {med(engine, query, 'median_epoch_ms'):.0f} "
          f"| {med(engine, query, 'p99_epoch_ms'):.0f} | {ratio} | {per_key} |")
PY
