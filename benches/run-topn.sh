#!/usr/bin/env bash
# Keeping rows per key, side by side: Top-N and deduplication against
# Sluice's append-only form and against Spark, which streams only the
# append-only form.
#
# Every run: rate source (2 partitions), epochs of B rows each (the rate
# source's rows_per_batch; Spark's rate-micro-batch), k = value % K,
# blackhole / noop sink, state checkpointed every epoch. Fixed-size epochs:
# with R rows per second, an engine slower than R falls behind, and its
# epochs grow until memory runs out (a Top-N over 4 M rows/s did, at 20 GB).
#   sluice group-by  GROUP BY k: count(*), max(timestamp)  (the aggregation, for scale)
#   sluice first     drop_duplicates(["k"])                (append-only deduplication)
#   spark  first     dropDuplicates(["k"])                 (the same in Spark)
#   sluice top1      ROW_NUMBER() OVER (PARTITION BY k ORDER BY timestamp) = 1
#                                                          (Flink's deduplication, a Top-N)
#   sluice top1-event-time  the same with a watermark on timestamp (1 s): append
#                    mode, each k's first row emitted once the watermark passes it
#   sluice top10     ROW_NUMBER() OVER (PARTITION BY k ORDER BY value DESC) <= 10
#   sluice rank10    RANK() OVER (PARTITION BY k ORDER BY value DESC) <= 10
#   sluice over      avg(value) OVER (PARTITION BY k ORDER BY timestamp ROWS
#                    BETWEEN 9 PRECEDING AND CURRENT ROW), append mode
# Spark refuses ROW_NUMBER() over a stream, so the Top-Ns have no Spark row.
# Metric: median over N measured epochs of input rows / epoch execution time;
# the state's bytes per key (Sluice: the state store's size / K).
#
# Env: B (1000000), R (4000000, the rate the source's timestamps advance at),
#      N (20), K (100000), WARMUP (5), ROUNDS (2),
#      OUT (target/bench-results/topn-<time>). Writes $OUT/topn.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

R="${R:-4000000}"
B="${B:-1000000}"
N="${N:-20}"
K="${K:-100000}"
WARMUP="${WARMUP:-5}"
ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$ROOT/target/bench-results/topn-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

log() { echo "[run-topn] $*" >&2; }

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
  local i="$1" f="$OUT/spark-first-$1"
  log "round $i: spark first (B=$B N=$N K=$K)"
  "$SPARK_PY" "$ROOT/benches/spark/aggregate.py" --query first \
      --rows-per-second "$R" --rows-per-batch "$B" --epochs "$N" --warmup "$WARMUP" \
      --keys "$K" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "spark run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

# Alternate so that background noise on this shared machine hits every row.
for i in $(seq 1 "$ROUNDS"); do
  run_sluice group-by "$i"
  run_sluice first "$i"
  run_spark "$i"
  run_sluice top1 "$i"
  run_sluice top1-event-time "$i"
  run_sluice top10 "$i"
  run_sluice rank10 "$i"
  run_sluice over "$i"
done

python3 - "$OUT" "$B" "$N" "$K" <<'PY' | tee "$OUT/topn.md"
import glob, json, os, statistics, sys
out, b, n, k = sys.argv[1:]
rows = [("sluice", "group-by"), ("sluice", "first"), ("spark", "first"),
        ("sluice", "top1"), ("sluice", "top1-event-time"), ("sluice", "top10"),
        ("sluice", "rank10"), ("sluice", "over")]
runs = {}
for engine, query in rows:
    files = sorted(glob.glob(os.path.join(out, f"{engine}-{query}-*.json")))
    runs[(engine, query)] = [json.load(open(f)) for f in files]
def med(engine, query, key):
    vals = [j.get(key) for j in runs[(engine, query)] if j.get(key) is not None]
    return statistics.median(vals) if vals else None
first = med("sluice", "first", "median_rows_per_s")
print(f"B={b} rows per epoch, N={n} measured epochs, K={k} keys; medians over "
      f"{len(runs[('sluice', 'first')])} alternating rounds\n")
print("| engine | query | rows/s (median) | epoch ms (median) | p99 epoch ms | of Sluice's `first` | state bytes per key |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for engine, query in rows:
    rate = med(engine, query, "median_rows_per_s")
    if rate is None:
        continue
    ratio = f"{rate / first:.2f}" if first else ""
    per_key = med(engine, query, "state_bytes_per_key")
    per_key = f"{per_key:.0f}" if per_key is not None else "n/a"
    print(f"| {engine} | {query} | {rate/1e6:.2f} M | {med(engine, query, 'median_epoch_ms'):.0f} "
          f"| {med(engine, query, 'p99_epoch_ms'):.0f} | {ratio} | {per_key} |")
PY
