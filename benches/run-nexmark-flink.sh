#!/usr/bin/env bash
# Nexmark in Flink's forms through Kafka: benches/nexmark/flink/load.sql
# writes EVENTS events (Flink's generator) into one topic of nested JSON,
# then each query file of benches/nexmark/flink runs unchanged over it
# (ddl_kafka.sql, ddl_views.sql, the query's blackhole sink and INSERT),
# with 'available-now' and epochs of at most E records, alternating rounds.
# Metric: events read (the whole topic: Flink's and RisingWave's Nexmark
# figures count every event) / the epochs' execution time (the progress
# log's duration_ms.total summed), median over rounds; and that per core.
# q14 needs its Rust UDF (the binary has none), q6, q10, q12 and q13 do not
# run yet (docs/sql.md, *Flink's Nexmark queries*).
#
# Env: EVENTS (1000000), RATE (10000 events per second of event time, the
#      generator's default), E (250000), ROUNDS (2), QUERIES ("0 1 2 3 4 5 7 8
#      9 11 15 16 17 18 19 20 21 22"), OUT (target/bench-results/
#      nexmark-flink-<time>). Writes $OUT/nexmark-flink.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
EVENTS="${EVENTS:-1000000}"
RATE="${RATE:-10000}"
E="${E:-250000}"
ROUNDS="${ROUNDS:-2}"
QUERIES="${QUERIES:-0 1 2 3 4 5 7 8 9 11 15 16 17 18 19 20 21 22}"
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
TOPIC="nexmark-flink-$(date +%s)"

log "loading $EVENTS events into $TOPIC"
{
  echo "SET 'checkpoint.location' = '$CP/load';"
  sed -e "s/{topic}/$TOPIC/g; s/{bootstrap}/$BOOT/g; s/{events}/$EVENTS/g; s/{rate}/$RATE/g" "$FLINK/load.sql"
} > "$OUT/load.sql"
start=$(date +%s.%N)
"$SLUICE" run "$OUT/load.sql" > "$OUT/load.log" 2>&1
log "loaded in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"

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
      cat "$FLINK/q$q.sql"
    } > "$file"
    log "round $round: q$q"
    if ! "$SLUICE" run "$file" --progress-log "$OUT/q$q-$round.jsonl" > "$OUT/q$q-$round.log" 2>&1; then
      log "q$q failed: see $OUT/q$q-$round.log"
    fi
  done
done

python3 - "$OUT" "$ROUNDS" "$CORES" "$EVENTS" $QUERIES > "$OUT/nexmark-flink.md" <<'PY'
import json, statistics, sys, platform
out, rounds, cores, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
queries = sys.argv[5:]
print(f"Nexmark in Flink's forms, {events} events in one Kafka topic of nested JSON, "
      f"{rounds} round(s), {cores} cores ({platform.machine()}).\n")
print("| query | events read | events/s (median) | per core | rounds |")
print("| --- | ---: | ---: | ---: | --- |")
for q in queries:
    rates, read = [], 0
    for r in range(1, rounds + 1):
        try:
            lines = [json.loads(l) for l in open(f"{out}/q{q}-{r}.jsonl")]
        except FileNotFoundError:
            continue
        rows = sum(l.get("input_rows", 0) for l in lines)
        ms = sum(l["duration_ms"]["total"] for l in lines)
        if ms > 0 and rows > 0:
            rates.append(rows / ms * 1000)
            read = rows
    if not rates:
        print(f"| q{q} | - | failed | - | - |")
        continue
    m = statistics.median(rates)
    print(f"| q{q} | {read} | {m:,.0f} | {m / cores:,.0f} | "
          + ", ".join(f"{x:,.0f}" for x in rates) + " |")
PY
cat "$OUT/nexmark-flink.md"
