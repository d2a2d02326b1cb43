#!/usr/bin/env bash
# The whole benchmark suite in one command: every kind of result in
# benches/README.md, measured on this machine in one run, written to
# $OUT/suite.md (Markdown tables, with the machine and versions) and
# $OUT/nexmark/charts/*.png.
#
# Sections, in order (each is a script or bench that also runs alone):
#   0. the stateless pipeline (rate -> filter -> projection) vs Spark and vs
#      DataFusion alone (run-stateless.sh)
#   1. Nexmark q0-q8 over Kafka, Sluice exactly-once vs Spark (run-nexmark.sh)
#   2. the seed pipeline (examples/seed.sql) at R rows/s into Kafka, vs Spark
#      (run-aggregate.sh SEED=1)
#   3. GROUP BY over 1 M and over 10 M keys in epochs of 1 M rows (1 s
#      trigger), state checkpointed every epoch, vs Spark (at 10 M keys once
#      on Spark's default state store and once on RocksDB with changelog
#      checkpointing) and vs DataFusion's batch GROUP BY over the same rows
#      (run-aggregate.sh B=...)
#   4. the state store alone at 10 M keys: memory, snapshot, restore
#      (cargo bench --bench state_memory)
#   5. the physical limit: Kafka -> Kafka exactly-once vs a raw librdkafka
#      copy, of plain records and of Nexmark q0 over section 1's bid topic
#      (cargo bench --bench kafka_copy)
#   6. end-to-end latency at 10 000 events/s, 100 ms epochs and back to
#      back, and at 100 000 events/s back to back (cargo bench --bench
#      latency)
#   7. criterion micro-benchmarks of the hot paths (cargo bench --bench micro)
#   8. scale-out: a query divided into tasks, with 1 and 2 task threads and
#      in task groups of 1, 2 and 3 processes, and the repartition hop
#      (scaleout.sh)
#   9. scale-out: a task group's hand-over after SIGKILL and after SIGTERM
#      (handover.sh)
#  10. keeping rows per key: deduplication vs Spark's dropDuplicates, the
#      Top-Ns (ROW_NUMBER, RANK, the first row by event time) and an OVER
#      aggregation Spark cannot stream (run-topn.sh)
#  11. joins: the interval join vs Spark, a join over changes (as of two CDC
#      streams) Spark cannot stream (run-joins.sh)
#  12. a join of two CDC streams through Kafka: Debezium topics, a keyed
#      copy, a GROUP BY and the full join of both changelogs (run-cdc-join.sh)
#
# Env:
#   SCALE  full (default; about 1.5 h on 2 vCPUs) or smoke (every section
#          briefly, a few minutes: checks the command end to end; its numbers
#          are not for reporting)
#   OUT    directory for everything (default target/bench-results/suite-<time>)
# A section's own variables are set per section from SCALE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCALE="${SCALE:-full}"
OUT="${OUT:-$ROOT/target/bench-results/suite-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
SUITE="$OUT/suite.md"
log() { echo "[run-suite] $(date +%H:%M:%S) $*" >&2; }

case "$SCALE" in
  full)
    STATELESS=(R=4000000 N=20 ROUNDS=2)
    NEXMARK=(N=2000000 CAP=250000 ROUNDS=2)
    SEED_LOAD=(R=4000000 N=20 WARMUP=5 ROUNDS=2)
    K1M=(B=1000000 N=10 WARMUP=3 ROUNDS=2 K=1000000)
    K10M=(B=1000000 N=5 WARMUP=10 ROUNDS=1 K=10000000 SPARK_DRIVER_MEMORY=6g)
    STATE=(--keys 10000000 --batch 1000000 --updates 5)
    COPY=(--records 2000000 --rounds 3)
    LATENCY=(--rate 10000 --seconds 30)
    LATENCY_HIGH=(--rate 100000 --seconds 30)
    MICRO=()
    SCALEOUT=(N=2000000 ROUNDS=2)
    TOPN=(N=10 ROUNDS=2)
    JOINS=(N=10 ROUNDS=2 SPARK_DRIVER_MEMORY=6g)
    CDC=(ROUNDS=2)
    ;;
  smoke)
    STATELESS=(R=200000 N=3 WARMUP=2 ROUNDS=1)
    NEXMARK=(N=100000 CAP=20000 ROUNDS=1)
    SEED_LOAD=(R=200000 N=3 WARMUP=2 ROUNDS=1)
    K1M=(B=200000 N=3 WARMUP=2 ROUNDS=1 K=1000000)
    K10M=(B=200000 N=2 WARMUP=1 ROUNDS=1 K=10000000)
    STATE=(--keys 1000000 --batch 500000 --updates 1)
    COPY=(--records 100000 --rounds 1)
    LATENCY=(--rate 1000 --seconds 5 --warmup-seconds 2)
    LATENCY_HIGH=(--rate 10000 --seconds 5 --warmup-seconds 2)
    MICRO=(-- --sample-size 10 --warm-up-time 1 --measurement-time 2)
    SCALEOUT=(N=200000 ROUNDS=1 "CASES='one tasks-t2 group-2'")
    TOPN=(B=100000 N=2 WARMUP=1 ROUNDS=1 K=10000)
    JOINS=(B=50000 R=50000 N=2 WARMUP=1 ROUNDS=1 K=10000)
    CDC=(K=10000 U=3 E=20000 ROUNDS=1)
    ;;
  *) echo "SCALE is full or smoke, not '$SCALE'" >&2; exit 2 ;;
esac

log "building the benchmarks (release; not timed)"
cargo bench --no-run >&2

{
  echo "# Sluice benchmark suite ($SCALE)"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%MZ); $(nproc) vCPU, $(free -g | awk '/Mem:/ {print $2}') GiB;" \
       "$(. /etc/os-release && echo "$PRETTY_NAME"); $(rustc --version);" \
       "$(java -version 2>&1 | head -n 1); Sluice $(git rev-parse --short HEAD)"
  echo
} >"$SUITE"

# Runs section $1 (a title), whose command is the rest, with its stdout (a
# Markdown table) appended to the suite under the title.
section() {
  local title="$1"
  shift
  log "$title"
  local file="$OUT/$(echo "$title" | tr -c 'a-zA-Z0-9\n' '-' | tr -s '-' | cut -c1-40).md"
  # A failed section is reported in its place; the others still run.
  if ! "$@" >"$file"; then
    log "$title FAILED (its logs are under $OUT)"
    echo "**Failed**: see the logs under \`$OUT\`." >>"$file"
  fi
  { echo "## $title"; echo; cat "$file"; echo; } >>"$SUITE"
}

# The JSON a bench printed last, as a table of its fields.
json_table() {
  python3 -c '
import json, sys
lines = [l for l in sys.stdin.read().splitlines() if l.strip()]
obj = json.loads(lines[-1])
print("| field | value |\n|---|---:|")
def rows(prefix, obj):
    for k, v in obj.items():
        if isinstance(v, dict):
            yield from rows(f"{prefix}{k}.", v)
        else:
            yield f"{prefix}{k}", (f"{v:,.1f}" if isinstance(v, float) else v)
for k, v in rows("", obj):
    print(f"| {k} | {v} |")
'
}
export -f json_table

section "0. The stateless pipeline, Sluice vs Spark" \
  env "${STATELESS[@]}" OUT="$OUT/stateless" benches/run-stateless.sh
section "1. Nexmark over Kafka, Sluice vs Spark" \
  env "${NEXMARK[@]}" OUT="$OUT/nexmark" benches/run-nexmark.sh
section "2. The seed pipeline into Kafka, Sluice vs Spark" \
  env "${SEED_LOAD[@]}" SEED=1 OUT="$OUT/seed" benches/run-aggregate.sh
section "3a. GROUP BY over 1 M keys, Sluice vs Spark" \
  env "${K1M[@]}" OUT="$OUT/groupby-1m" benches/run-aggregate.sh
section "3b. GROUP BY over 10 M keys, Sluice vs Spark (Spark's default state store)" \
  env "${K10M[@]}" SPARK_STATE_STORE=hdfs OUT="$OUT/groupby-10m-hdfs" benches/run-aggregate.sh
section "3c. GROUP BY over 10 M keys, Sluice vs Spark (RocksDB, changelog checkpointing)" \
  env "${K10M[@]}" SPARK_STATE_STORE=rocksdb-changelog OUT="$OUT/groupby-10m-rocksdb" \
  benches/run-aggregate.sh
section "4. The state store at 10 M keys (Sluice alone)" \
  bash -c "cargo bench --bench state_memory -- ${STATE[*]} 2>'$OUT/state_memory.err' | json_table"
section "5. Kafka -> Kafka exactly-once vs a raw librdkafka copy" \
  bash -c "cargo bench --bench kafka_copy -- ${COPY[*]} 2>'$OUT/kafka_copy.err' | grep '^|'"
section "5b. Nexmark q0 exactly-once vs a raw librdkafka copy of the same bid topic" \
  bash -c "cargo bench --bench kafka_copy -- --nexmark-prefix \$(cat '$OUT/nexmark/prefix') \
    ${COPY[*]} 2>'$OUT/kafka_copy_q0.err' | grep '^|'"
section "6a. End-to-end latency, 100 ms epochs" \
  bash -c "cargo bench --bench latency -- ${LATENCY[*]} --interval-ms 100 2>'$OUT/latency-100.err' | json_table"
section "6b. End-to-end latency, epochs back to back" \
  bash -c "cargo bench --bench latency -- ${LATENCY[*]} --interval-ms 0 2>'$OUT/latency-0.err' | json_table"
section "6c. End-to-end latency, epochs back to back, ten times the rate" \
  bash -c "cargo bench --bench latency -- ${LATENCY_HIGH[*]} --interval-ms 0 2>'$OUT/latency-0-high.err' | json_table"
section "7. Micro-benchmarks (criterion)" \
  bash -c "cargo bench --bench micro ${MICRO[*]} 2>&1 | grep -E '^[a-z_]+/|time:|thrpt:' | grep -v '%' | sed 's/^/    /'"

# The JSON lines of scaleout.sh as one table.
scaleout_table() {
  python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print("| shape | case | round | records/s | CPU-s per M records | first commit (s) |")
print("|---|---|---:|---:|---:|---:|")
keys = ("shape", "case", "round", "records_per_s", "cpu_s_per_m", "first_commit_s")
for r in rows:
    print("| " + " | ".join(str(r[k]) for k in keys) + " |")
'
}
export -f scaleout_table
SLUICE_RELEASE="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice"
section "8. Scale-out: tasks, threads, processes and the repartition hop" \
  bash -c "export SLUICE_KAFKA_BOOTSTRAP=\$(scripts/kafka start | tail -n 1) SLUICE='$SLUICE_RELEASE'; \
    env ${SCALEOUT[*]} benches/scaleout.sh 2>'$OUT/scaleout.err' | scaleout_table"
section "9. Scale-out: a task group's hand-over after SIGKILL and SIGTERM" \
  bash -c "export SLUICE_KAFKA_BOOTSTRAP=\$(scripts/kafka start | tail -n 1) SLUICE='$SLUICE_RELEASE'; \
    echo '\`\`\`'; benches/handover.sh kill 2>'$OUT/handover-kill.err' | grep -E 'stopped|given|hand-over'; \
    benches/handover.sh term 2>'$OUT/handover-term.err' | grep -E 'stopped|given|hand-over'; echo '\`\`\`'"

section "10. Keeping rows per key: deduplication, Top-N, OVER; Sluice vs Spark" \
  bash -c "env ${TOPN[*]} OUT='$OUT/topn' benches/run-topn.sh 2>'$OUT/topn.err' | grep '^|'"
section "11. Joins: interval join vs Spark, a join over changes" \
  bash -c "env ${JOINS[*]} OUT='$OUT/joins' benches/run-joins.sh 2>'$OUT/joins.err' | grep '^|'"
section "12. A join of two CDC streams through Kafka (Sluice alone)" \
  bash -c "env ${CDC[*]} OUT='$OUT/cdc-join' benches/run-cdc-join.sh 2>'$OUT/cdc-join.err' | grep '^|'"
log "done: $SUITE (charts in $OUT/nexmark/charts)"
cat "$SUITE"
