#!/usr/bin/env bash
# benches/status-page.sh — what the status page costs a query: the same
# query over the same input, side by side, with the page off (no
# --ui-addr), on but unwatched (--ui-addr), and watched (the page open in
# headless Chromium for the whole run, polling its API every second as a
# user's browser would).
#
# `sluice nexmark load` writes N events (default 2,000,000; 92 % bids) into
# 2-partition topics once. Each case then drains the bids with a fresh
# pipeline name and checkpoint (`available-now`, epochs of at most 50,000
# records): a HOP count per auction (2 s slide, 10 s size), as
# scripts/ui-check runs. ROUNDS (default 3) alternates the cases.
# Reported per case and round: input rows/s (rows over the time from the
# first epoch's planning to the last one's commit, from the progress log),
# the sluice process's CPU seconds per million rows, and, watched, the
# browser's CPU over the run. The summary gives each case's median and
# its ratio to "off".
#
# Needs the broker on $SLUICE_KAFKA_BOOTSTRAP (default 127.0.0.1:19092,
# scripts/kafka start with SLUICE_KAFKA_PORT=19092), python3, Debian's
# chromium, and a sluice binary ($SLUICE, default the release build under
# ~/.cache/sluice/bench-target).
set -euo pipefail
B="${SLUICE_KAFKA_BOOTSTRAP:-127.0.0.1:19092}"
N="${N:-2000000}"
ROUNDS="${ROUNDS:-3}"
CASES="${CASES:-off on watched}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SLUICE="${SLUICE:-$HOME/.cache/sluice/bench-target/release/sluice}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
prefix="sp-$(date +%s)"
"$SLUICE" nexmark load --events "$N" --rate 100000 --partitions 2 --bootstrap "$B" \
  --prefix "$prefix" >"$WORK/load.log" 2>&1

cpu_of() {
  python3 -c "import os; f=open('/proc/$1/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12])+int(f[13])+int(f[14]))/os.sysconf('SC_CLK_TCK'))" 2>/dev/null || echo 0
}

run_case() { # case round
  local case=$1 round=$2 name="$prefix-$1-$2" port ui=() browser="" browser_cpu=0
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  {
    echo "SET 'trigger' = 'available-now';"
    echo "SET 'pipeline.name' = '$name';"
    echo "SET 'checkpoint.location' = '$WORK/$name';"
    sed -e "s/{prefix}/$prefix/g" -e "s/{bootstrap}/$B/g" \
        -e "s/{source_options}/, 'max-records-per-epoch' = '50000'/g" \
        "$ROOT/benches/nexmark/kafka-sources.sql"
    echo "CREATE STREAM counts WITH (connector = 'blackhole');"
    echo "INSERT INTO counts SELECT auction, window_start, count(*) AS bids"
    echo "  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))"
    echo "  GROUP BY auction, window_start, window_end;"
  } >"$WORK/$name.sql"
  [[ $case == off ]] || ui=(--ui-addr "127.0.0.1:$port")
  /usr/bin/time -f "%U %S" -o "$WORK/$name.time" \
    "$SLUICE" run "$WORK/$name.sql" "${ui[@]}" --progress-log "$WORK/$name.jsonl" \
    >/dev/null 2>"$WORK/$name.err" &
  local pid=$!
  if [[ $case == watched ]]; then
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/api/queries" >/dev/null && break; sleep 0.05; done
    chromium --headless --no-sandbox --disable-gpu --window-size=1400,2400 \
      --user-data-dir="$WORK/chromium-$name" "http://127.0.0.1:$port/" >/dev/null 2>&1 &
    browser=$!
  fi
  wait "$pid"
  if [[ -n $browser ]]; then
    browser_cpu=0
    for p in $(pgrep -f "chromium-$name" || true); do
      browser_cpu=$(python3 -c "print($browser_cpu + $(cpu_of "$p"))")
    done
    kill "$browser" 2>/dev/null || true
    pkill -f "chromium-$name" 2>/dev/null || true
    wait "$browser" 2>/dev/null || true
  fi
  python3 - "$WORK/$name.jsonl" "$WORK/$name.time" "$case" "$round" "$browser_cpu" <<'PY'
import json, sys
from datetime import datetime
log, timing, case, round_, browser = sys.argv[1:6]
lines = [json.loads(l) for l in open(log)]
rows = sum(l["input_rows"] for l in lines)
t = lambda l: datetime.fromisoformat(l["timestamp"].replace("Z", "+00:00")).timestamp()
span = t(lines[-1]) + lines[-1]["duration_ms"]["total"] / 1e3 - t(lines[0])
user, system = map(float, open(timing).read().split()[-2:])
print(json.dumps({"case": case, "round": int(round_), "rows": rows, "epochs": len(lines),
                  "rows_per_s": round(rows / span), "cpu_s_per_m": round((user + system) / rows * 1e6, 3),
                  "browser_cpu_s": float(browser)}))
PY
}

for round in $(seq "$ROUNDS"); do
  for case in $CASES; do
    run_case "$case" "$round"
  done
done | tee "$WORK/results.jsonl"

python3 - "$WORK/results.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in runs))
med = {c: statistics.median(r["rows_per_s"] for r in runs if r["case"] == c) for c in cases}
cpu = {c: statistics.median(r["cpu_s_per_m"] for r in runs if r["case"] == c) for c in cases}
print("| case | rows/s (median) | vs off | sluice CPU-s/M (median) | vs off |")
print("| --- | ---: | ---: | ---: | ---: |")
for c in cases:
    print(f"| {c} | {med[c]:,.0f} | {med[c] / med.get('off', med[c]):.3f} | {cpu[c]:.3f} | {cpu[c] / cpu.get('off', cpu[c]):.3f} |")
PY
