#!/usr/bin/env bash
# Side-by-side stateless benchmark: Sluice vs Spark Structured Streaming.
#
# Pipeline on both sides: rate source (R rows/s, 2 partitions)
#   -> WHERE value % 3 <> 0 -> SELECT value * 2 AS doubled, timestamp
#   -> discarding sink, 1 s processing-time trigger.
# Metric: median over N measured epochs of numInputRows / epoch execution time.
#
# Env:
#   R       target rows per second                 (default 4000000)
#   N       measured epochs per run                (default 20)
#   WARMUP  Spark warm-up epochs discarded         (default 5)
#   ROUNDS  alternating sluice/spark rounds        (default 2)
#   OUT     directory for raw JSON + logs          (default target/bench-results/stateless-<time>)
#   SLUICE_CACHE  where the Spark venv lives       (default ~/.cache/sluice)
#
# Each side prints a JSON object as the last line of stdout with
# "engine" and "median_rows_per_s"; this script collects them and prints a
# Markdown table to stdout (progress goes to stderr).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

R="${R:-4000000}"
N="${N:-20}"
WARMUP="${WARMUP:-5}"
ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$ROOT/target/bench-results/stateless-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

log() { echo "[run-stateless] $*" >&2; }

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

log "building the Sluice bench (not timed)"
cargo bench --bench stateless --no-run >&2

run_sluice() {
  local i="$1" f="$OUT/sluice-$1"
  log "round $i: sluice (R=$R N=$N)"
  cargo bench --bench stateless -- --rows-per-second "$R" --epochs "$N" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "sluice run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

run_spark() {
  local i="$1" f="$OUT/spark-$1"
  log "round $i: spark (R=$R N=$N warmup=$WARMUP)"
  "$SPARK_PY" "$ROOT/benches/spark/stateless.py" \
      --rows-per-second "$R" --epochs "$N" --warmup "$WARMUP" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "spark run $i failed"; exit 1; }
  last_json "$f.out" >"$f.json"
}

# Alternate so that background noise on this shared machine hits both sides.
for i in $(seq 1 "$ROUNDS"); do
  run_sluice "$i"
  run_spark "$i"
done

python3 - "$OUT" "$ROUNDS" "$R" "$N" <<'PY'
import json, os, statistics, sys
out, rounds, r, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
load = lambda name: json.load(open(os.path.join(out, name)))
rows = []
for i in range(1, rounds + 1):
    rows.append((i, load(f"sluice-{i}.json"), load(f"spark-{i}.json")))

def fmt(x):
    return f"{x / 1e6:,.2f} M" if x is not None else "n/a"

def ms(d):
    v = d.get("median_epoch_ms")
    return f"{v:,.0f}" if v is not None else "n/a"

spark_ver = rows[0][2].get("spark_version", "?")
print(f"### Stateless filter+project, R = {r:,} rows/s, {n} measured epochs, Spark {spark_ver}\n")
print("| round | Sluice rows/s | Sluice epoch ms | Spark rows/s | Spark epoch ms | Sluice / Spark |")
print("|---|---:|---:|---:|---:|---:|")
for i, s, k in rows:
    a, b = s["median_rows_per_s"], k["median_rows_per_s"]
    print(f"| {i} | {fmt(a)} | {ms(s)} | {fmt(b)} | {ms(k)} | {a / b:.2f}x |")
sa = statistics.median(s["median_rows_per_s"] for _, s, _ in rows)
sb = statistics.median(k["median_rows_per_s"] for _, _, k in rows)
print(f"| **median** | **{fmt(sa)}** | | **{fmt(sb)}** | | **{sa / sb:.2f}x** |")
print(f"\nrows/s = numInputRows / epoch execution time, median over epochs; raw JSON in {out}")
PY
