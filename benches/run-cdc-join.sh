#!/usr/bin/env bash
# A join of two CDC streams through Kafka: two topics of Debezium change
# events (`format = 'debezium-json'`), each K rows inserted then updated
# U - 1 times (every update's `before` the row's previous value), read by
# Sluice from the local broker (scripts/kafka) with 'available-now' and
# epochs of at most E records per stream, state checkpointed every epoch,
# discarding sink. Alternating rounds of:
#   sluice copy        each change of one topic, kept as a keyed table
#                      ('key.fields' = 'id', update mode): the decoding alone
#   sluice group-by    per id % 1000 the count and sum over one topic's
#                      changelog (update mode)
#   sluice join-cdc    accounts FULL JOIN orders ON id, both changelogs
#                      (update mode: every update takes a joined row back)
# Spark cannot stream a join over changes (nor read Debezium's envelope as a
# changelog), so there is no Spark row.
# Metric: change events read (K * U per topic read) / the epochs' execution
# time (the progress log's duration_ms.total summed), median over rounds;
# an update is two signed rows (its before taken back, its after added),
# which the table shows too; the state's bytes per key at the end.
#
# Env: K (200000), U (5), E (200000), ROUNDS (2),
#      OUT (target/bench-results/cdc-join-<time>). Writes $OUT/cdc-join.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
K="${K:-200000}"
U="${U:-5}"
E="${E:-200000}"
ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$ROOT/target/bench-results/cdc-join-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

log() { echo "[run-cdc-join] $*" >&2; }

log "building sluice (release; not timed)"
cargo build --release --bin sluice >&2
SLUICE="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice"
BOOT="$(scripts/kafka start | tail -n 1)"
# Confluent's Python client (its own virtual environment, made once).
scripts/confluent-client --help >/dev/null
PY="${SLUICE_CACHE:-$HOME/.cache/sluice}/confluent-client-${SLUICE_CONFLUENT_KAFKA_VERSION:-2.16.1}-grpcio-tools-${SLUICE_GRPCIO_TOOLS_VERSION:-1.85.1}/bin/python"

PREFIX="cdc-$(date +%s)"
log "loading $PREFIX-accounts and $PREFIX-orders: $K rows x $U changes each"
"$PY" - "$BOOT" "$PREFIX" "$K" "$U" <<'PY'
import json, sys
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
boot, prefix, k, u = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
admin = AdminClient({"bootstrap.servers": boot})
topics = {f"{prefix}-accounts": "balance", f"{prefix}-orders": "total"}
for f in admin.create_topics([NewTopic(t, 2, 1) for t in topics]).values():
    f.result()
p = Producer({"bootstrap.servers": boot, "linger.ms": 50, "batch.size": 1 << 20,
              "queue.buffering.max.messages": 2_000_000, "compression.type": "lz4"})
for topic, column in topics.items():
    for r in range(u):
        for i in range(k):
            value = i * 7 + r
            after = {"id": i, column: value}
            before = None if r == 0 else {"id": i, column: value - 1}
            event = {"before": before, "after": after, "op": "c" if r == 0 else "u"}
            while True:
                try:
                    p.produce(topic, json.dumps(event).encode(), key=str(i).encode())
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
p.flush(120)
PY

# Writes query $1's SQL file for round $2 and runs it, with its progress log.
run_query() {
  local query="$1" i="$2" f="$OUT/sluice-$1-$2"
  local accounts="connector = 'kafka', topic = '$PREFIX-accounts', 'bootstrap.servers' = '$BOOT', format = 'debezium-json', 'max-records-per-epoch' = '$E'"
  local orders="connector = 'kafka', topic = '$PREFIX-orders', 'bootstrap.servers' = '$BOOT', format = 'debezium-json', 'max-records-per-epoch' = '$E'"
  local insert
  case "$query" in
    copy) insert="INSERT INTO out SELECT id, balance FROM accounts;" ;;
    group-by) insert="INSERT INTO out SELECT id % 1000 AS g, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 1000;" ;;
    join-cdc) insert="INSERT INTO out SELECT a.id AS aid, a.balance, o.id AS oid, o.total FROM accounts a FULL JOIN orders o ON a.id = o.id;" ;;
  esac
  cat >"$f.sql" <<SQL
SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
SET 'checkpoint.location' = '$f.cp';
CREATE STREAM accounts (id BIGINT NOT NULL, balance BIGINT) WITH ($accounts, 'key.fields' = 'id');
CREATE STREAM orders (id BIGINT NOT NULL, total BIGINT) WITH ($orders, 'key.fields' = 'id');
CREATE STREAM out WITH (connector = 'blackhole');
$insert
SQL
  log "round $i: sluice $query (K=$K U=$U E=$E)"
  rm -rf "$f.cp" "$f.progress.jsonl"
  "$SLUICE" run "$f.sql" --progress-log "$f.progress.jsonl" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "sluice $query run $i failed"; exit 1; }
}

for i in $(seq 1 "$ROUNDS"); do
  run_query copy "$i"
  run_query group-by "$i"
  run_query join-cdc "$i"
done

python3 - "$OUT" "$K" "$U" "$E" <<'PY' | tee "$OUT/cdc-join.md"
import glob, json, os, statistics, sys
out, k, u, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# Topics each query reads: its change events are K * U per topic.
topics = {"copy": 1, "group-by": 1, "join-cdc": 2}
# Keys each query's state holds: the copy none, the GROUP BY 1000 groups,
# the join K ids.
keys = {"copy": k, "group-by": 1000, "join-cdc": k}
def summary(query, path):
    epochs = [json.loads(l) for l in open(path) if l.strip()]
    ms = sum(p["duration_ms"]["total"] for p in epochs)
    events = topics[query] * k * u
    return {"rate": events / (ms / 1e3) if ms else 0.0,
            "epoch_ms": statistics.median(p["duration_ms"]["total"] for p in epochs),
            "state_bytes": epochs[-1].get("state_bytes", 0),
            "rows": sum(p["input_rows"] for p in epochs), "events": events}
runs = {q: [summary(q, f) for f in sorted(glob.glob(os.path.join(out, f"sluice-{q}-*.progress.jsonl")))]
        for q in topics}
med = lambda q, key: statistics.median(r[key] for r in runs[q])
copy = med("copy", "rate")
print(f"K={k} rows per topic, {u} changes per row ({k*u} change events per topic), epochs of "
      f"at most {e} records per stream; medians over {len(runs['copy'])} alternating rounds\n")
print("| engine | query | change events/s (median) | epoch ms (median) | of the copy | state bytes per key | events read | signed rows read |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for q in topics:
    print(f"| sluice | {q} | {med(q, 'rate')/1e6:.2f} M | {med(q, 'epoch_ms'):.0f} | "
          f"{med(q, 'rate')/copy:.2f} | {med(q, 'state_bytes')/keys[q]:.0f} | {med(q, 'events'):.0f} | "
          f"{med(q, 'rows'):.0f} |")
PY
