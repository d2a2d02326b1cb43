#!/usr/bin/env bash
# benches/scaleout.sh — throughput of a query divided into tasks, by how
# it is spread: one task; tasks in one process with 1 and 2 task threads;
# a task group of 1, 2 and 3 processes.
#
# Kafka's ProducerPerformance loads N records (default 2,000,000, 100
# bytes of random capital letters, no key) into a 6-partition topic once.
# Each case then drains it from the beginning with a fresh pipeline name
# and checkpoint, for three shapes:
#   copy        SELECT value (stateless)
#   keyed       GROUP BY _partition, substr(value, 1, 2): co-partitioned
#   repartition GROUP BY substr(value, 1, 2): through a repartition topic
#   hop-keyed   a HOP window count (1 s slide, 2 s size, event time the
#               record's timestamp, 1 s watermark delay) per _partition
#               and substr(value, 1, 2): co-partitioned
#   hop         the same per substr(value, 1, 2): through a repartition
#               topic, every row crossing with its watermark
#   q5          Nexmark q5's query: per HOP window (1 s slide, 2 s size)
#               the first letters of the value with the most records
#               (counts per letter and window, the maximum per window, the
#               counts joined with it); divided, a chain of four
#               statements and five channels
#   join        an interval join of the topic with itself read as a
#               second stream, on the whole value (each record meets its
#               own copy), within 1 s either way of event time (the
#               record's timestamp): each side through a repartition
#               topic of its own
# (the GROUP BYs count 676 groups in update mode, the windows in append
# mode, exactly-once to Kafka).
# Rate = records read after the first committed epoch / the time from that
# commit to the last one (startup and the group's first join excluded);
# CPU = the processes' user+system CPU seconds, whole run, per million
# records; broker CPU the same of the broker's process (found by its
# port), over the case's run: with two cores, what sluice and the broker
# use together says whether the machine was the bound. A repartitioned query reads every record twice (input, then
# the repartition topic), or each record and then a partial row per group
# and epoch: its rate counts input records.
#
# Needs the broker on $SLUICE_KAFKA_BOOTSTRAP (default 127.0.0.1:19092,
# scripts/kafka start with SLUICE_KAFKA_PORT=19092), python3, and a sluice
# binary ($SLUICE, default the release build under ~/.cache/sluice/bench-target).
# ROUNDS (default 2) alternates the cases; SHAPES and CASES select some.
# The case `baseline` runs the query undivided with the binary $BASELINE
# (an older build, to compare one process with what it was);
# `tasks-t2-baseline` runs it as `tasks-t2` does, with $BASELINE (to
# compare a divided query, the repartition hop, with what it was);
# `tasks-t2-baseline2` the same with $BASELINE2 (a second older build).
set -euo pipefail
B="${SLUICE_KAFKA_BOOTSTRAP:-127.0.0.1:19092}"
N="${N:-2000000}"
ROUNDS="${ROUNDS:-2}"
SHAPES="${SHAPES:-copy keyed repartition}"
CASES="${CASES:-one tasks-t1 tasks-t2 group-1 group-2 group-3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SLUICE="${SLUICE:-$HOME/.cache/sluice/bench-target/release/sluice}"
LIBS="${SLUICE_CACHE:-$HOME/.cache/sluice}/kafka-4.4.0/libs/*"
WORK="$(mktemp -d)"
T=so-$(date +%s)
topic() {
  java -cp "$LIBS" org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --create \
    --topic "$1" --partitions "$2" --replication-factor 1 >/dev/null 2>&1 || true
}
topic "$T-in" 6
echo "loading $N records into $T-in" >&2
java -cp "$LIBS" org.apache.kafka.tools.ProducerPerformance --topic "$T-in" --num-records "$N" \
  --record-size 100 --throughput -1 \
  --producer-props bootstrap.servers="$B" linger.ms=20 batch.size=262144 >"$WORK/load.log" 2>&1

# cpu_of PID: its user+system CPU seconds so far (0 without one).
cpu_of() {
  [[ -n ${1:-} && -r /proc/$1/stat ]] || { echo 0; return; }
  python3 -c "import os; f=open('/proc/$1/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))"
}

# run SHAPE CASE ROUND: one measurement, a JSON line on stdout.
run() {
  local shape=$1 case=$2 round=$3 name="$T-$1-$2-$3"
  local dir="$WORK/$name" select settings procs=1
  mkdir -p "$dir"
  topic "$name-out" 6
  case $shape in
    copy) select="SELECT value FROM input" ;;
    keyed) select="SELECT _partition AS p, substr(value, 1, 2) AS g, count(*) AS n FROM input GROUP BY _partition, substr(value, 1, 2)" ;;
    repartition) select="SELECT substr(value, 1, 2) AS g, count(*) AS n FROM input GROUP BY substr(value, 1, 2)" ;;
    hop-keyed) select="SELECT _partition AS p, substr(value, 1, 2) AS g, window_start, count(*) AS n FROM TABLE(HOP(TABLE input, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '2' SECOND)) GROUP BY _partition, substr(value, 1, 2), window_start, window_end" ;;
    hop) select="SELECT substr(value, 1, 2) AS g, window_start, count(*) AS n FROM TABLE(HOP(TABLE input, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '2' SECOND)) GROUP BY substr(value, 1, 2), window_start, window_end" ;;
    join) select="SELECT substr(a.value, 1, 2) AS g, a.ts FROM input a JOIN other b ON a.value = b.value AND b.ts BETWEEN a.ts - INTERVAL '1' SECOND AND a.ts + INTERVAL '1' SECOND" ;;
    q5) local hop="TABLE(HOP(TABLE input, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '2' SECOND))"
      select="SELECT c.g, c.num, m.window_end FROM (SELECT substr(value, 1, 1) AS g, count(*) AS num, window_start, window_end FROM $hop GROUP BY substr(value, 1, 1), window_start, window_end) c JOIN (SELECT max(num) AS maxn, window_start, window_end FROM (SELECT count(*) AS num, window_start, window_end FROM $hop GROUP BY substr(value, 1, 1), window_start, window_end) GROUP BY window_start, window_end) m ON c.window_start = m.window_start AND c.window_end = m.window_end AND c.num >= m.maxn" ;;
  esac
  local columns=""
  [[ $shape == hop* || $shape == join || $shape == q5 ]] && columns="(value VARCHAR, ts TIMESTAMP(3) METADATA FROM 'timestamp', WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
  local sluice=$SLUICE
  case $case in
    baseline) settings=""; sluice=$BASELINE ;;
    one) settings="SET 'tasks' = '1';" ;;
    tasks-t1) settings="SET 'tasks' = 'per-partition'; SET 'tasks.threads' = '1';" ;;
    tasks-t2) settings="SET 'tasks' = 'per-partition'; SET 'tasks.threads' = '2';" ;;
    tasks-t4) settings="SET 'tasks' = 'per-partition'; SET 'tasks.threads' = '4';" ;;
    tasks-t2-baseline) settings="SET 'tasks' = 'per-partition'; SET 'tasks.threads' = '2';"; sluice=$BASELINE ;;
    tasks-t2-baseline2) settings="SET 'tasks' = 'per-partition'; SET 'tasks.threads' = '2';"; sluice=$BASELINE2 ;;
    group-*) procs=${case#group-}
      settings="SET 'tasks' = 'per-partition'; SET 'tasks.group' = 'true'; SET 'tasks.group.session.timeout' = '6 s';" ;;
  esac
  local format=raw
  [[ $shape == copy ]] || format=json
  cat >"$dir/q.sql" <<SQL
CREATE STREAM input ${columns}WITH (connector = 'kafka', topic = '$T-in', 'bootstrap.servers' = '$B', format = 'raw', 'max-records-per-epoch' = '100000');
CREATE STREAM other ${columns}WITH (connector = 'kafka', topic = '$T-in', 'bootstrap.servers' = '$B', format = 'raw', 'max-records-per-epoch' = '100000');
CREATE STREAM out WITH (connector = 'kafka', topic = '$name-out', 'bootstrap.servers' = '$B', format = '$format');
$settings
SET 'trigger' = '100 ms';
SET 'pipeline.name' = '$name';
SET 'checkpoint.location' = '$dir/checkpoint';
INSERT INTO out $select;
SQL
  local pids=() i
  local broker_pid broker0
  broker_pid=$(ss -ltnpH "sport = :${B##*:}" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
  broker0=$(cpu_of "$broker_pid")
  local start; start=$(date +%s.%N)
  for ((i = 0; i < procs; i++)); do
    SLUICE_LOG="sluice::progress=info,warn" NO_COLOR=1 "$sluice" run "$dir/q.sql" >/dev/null 2>"$dir/p$i.log" &
    pids+=($!)
  done
  # Done when the progress lines of all processes count every record; through
  # a repartition topic, when they count every input record and then no more
  # for 3 s (the downstream reads one row per record, or one partial row per
  # group and epoch where upstream pre-aggregates, so its count is not known).
  local want=$N last=-1 still=0 hop=0
  [[ ($shape == repartition || $shape == hop || $shape == join || $shape == q5) && $case != baseline && $case != one ]] && hop=1
  # The join reads each record twice, once per side.
  [[ $shape == join && $hop == 0 ]] && want=$((2 * N))
  local deadline=$(( $(date +%s) + 900 ))
  while :; do
    local got
    got=$(cat "$dir"/p*.log | sed -n 's/.*input_rows=\([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s+0}')
    if (( hop )); then
      if (( got >= N && got == last )); then still=$((still + 1)); else still=0; fi
      last=$got
      (( still >= 6 )) && { want=$got; break; }
    else
      (( got >= want )) && break
    fi
    if (( $(date +%s) > deadline )); then echo "timed out at $got of $want rows: $dir" >&2; break; fi
    sleep 0.5
  done
  local cpu=0 pid broker_cpu
  for pid in "${pids[@]}"; do
    cpu=$(python3 -c "print($cpu + $(cpu_of "$pid"))")
  done
  broker_cpu=$(python3 -c "print($(cpu_of "$broker_pid") - $broker0)")
  local wall; wall=$(python3 -c "import time; print(time.time() - $start)")
  for pid in "${pids[@]}"; do kill -TERM "$pid"; done
  for pid in "${pids[@]}"; do wait "$pid" || true; done
  python3 - "$dir" "$shape" "$case" "$round" "$N" "$want" "$cpu" "$start" "$broker_cpu" "$wall" <<'PY'
import datetime, glob, json, re, sys
d, shape, case, rnd, n, want, cpu, start, broker_cpu, wall = sys.argv[1:]
n, want, cpu, start = int(n), int(want), float(cpu), float(start)
broker_cpu, wall = float(broker_cpu), float(wall)
lines = []
for path in glob.glob(f"{d}/p*.log"):
    for l in open(path):
        l = re.sub(r'\x1b\[[0-9;]*m', '', l)
        m = re.search(r'input_rows=(\d+)', l)
        if m and 'epoch committed' in l:
            t = datetime.datetime.fromisoformat(l.split()[0].replace('Z', '+00:00')).timestamp()
            lines.append((t, int(m.group(1))))
lines.sort()
first = next(i for i, (_, r) in enumerate(lines) if r > 0)
t0, rows0 = lines[first]
seen, t1 = rows0, t0
for t, r in lines[first + 1:]:
    seen += r
    t1 = t
    if seen >= want:
        break
rate = (seen - rows0) / max(t1 - t0, 1e-9) * (n / want)
print(json.dumps({"shape": shape, "case": case, "round": int(rnd), "records_per_s": round(rate),
                  "cpu_s_per_m": round(cpu / (n / 1e6), 2),
                  "broker_cpu_s_per_m": round(broker_cpu / (n / 1e6), 2),
                  "cores_busy": round((cpu + broker_cpu) / max(wall, 1e-9), 2),
                  "first_commit_s": round(t0 - start, 2),
                  "epochs": len(lines)}))
PY
}

for ((r = 1; r <= ROUNDS; r++)); do
  for shape in $SHAPES; do
    for c in $CASES; do
      run "$shape" "$c" "$r"
    done
  done
done
