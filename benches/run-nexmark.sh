#!/usr/bin/env bash
# Nexmark over Kafka, Sluice vs Spark Structured Streaming, side by side.
#
# Loads N Nexmark events into fresh topics on the local broker
# (`sluice nexmark load`), then drains them with each query
# (benches/nexmark/q*.sql) on both engines, alternating, ROUNDS times, and
# prints a Markdown table (benches/nexmark/run.py says what is measured) and
# writes PNG charts to $OUT/charts (benches/nexmark/charts.py).
#
# Env:
#   N        events to load (1/50 people, 3/50 auctions, 46/50 bids)  (default 4000000)
#   CAP      records per epoch and stream on both sides                (default 500000)
#   CAP_Q3, CAP_Q8  the same for q3 and q8, which read only people and
#            auctions                                                  (default CAP/10)
#   QUERIES  which queries                                              (default "q0 q1 q2 q3 q4 q5 q7 q8")
#   ROUNDS   rounds                                                     (default 2)
#   OUT      directory for raw JSON + logs  (default target/bench-results/nexmark-<time>)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export N="${N:-4000000}" CAP="${CAP:-500000}" QUERIES="${QUERIES:-q0 q1 q2 q3 q4 q5 q7 q8}" ROUNDS="${ROUNDS:-2}"
export OUT="${OUT:-$ROOT/target/bench-results/nexmark-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
log() { echo "[run-nexmark] $*" >&2; }

log "building sluice (release; not timed)"
# Through `cargo bench`: it builds the binary with the same features as the
# other benches, so their build is reused.
cargo bench --no-run >&2
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
export SLUICE_BIN="$TARGET/release/sluice"

log "starting the broker"
export BOOTSTRAP="$(scripts/kafka start | tail -n 1)"
BROKER_PID="$(scripts/kafka status | sed -n 's/.*pid \([0-9]*\).*/\1/p' | head -n 1)"
export BROKER_PID

log "setting up Spark and its Kafka connector"
export SPARK_PY="$(bash benches/spark/setup.sh | tail -n 1)"
export SPARK_KAFKA_JARS="$(bash benches/spark/kafka-jars.sh | tail -n 1)"

export PREFIX="nexmark-$N-$(date +%s)"
log "loading $N events into $PREFIX-{person,auction,bid}"
"$SLUICE_BIN" nexmark load --events "$N" --prefix "$PREFIX" --bootstrap "$BOOTSTRAP" >&2
# For what runs on the same topics afterwards (run-suite.sh: q0 vs a raw copy).
echo "$PREFIX" >"$OUT/prefix"

python3 benches/nexmark/run.py

log "charts (PNG) in $OUT/charts"
"$SPARK_PY" benches/nexmark/charts.py "$OUT/runs.json" "$OUT/charts" >&2
