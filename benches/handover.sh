#!/usr/bin/env bash
# benches/handover.sh kill|term — the hand-over time of a task group.
#
# Two `sluice run` processes share a 6-partition pass-through
# ('tasks' = 'per-partition', 'tasks.group' = 'true', session timeout 6 s,
# 100 ms trigger) while Kafka's ProducerPerformance writes 2,000 records/s.
# After 25 s one is killed with SIGKILL (`kill`) or stopped with SIGTERM
# (`term`); the report is when the survivor was given the stopped one's
# tasks and when it committed its first epoch of each, in seconds after
# the stop.
#
# Needs the broker on $SLUICE_KAFKA_BOOTSTRAP (default 127.0.0.1:19092,
# scripts/kafka start with SLUICE_KAFKA_PORT=19092), python3, and a sluice
# binary ($SLUICE, default target/release/sluice, else target/debug/sluice).
set -euo pipefail
MODE="${1:-kill}"   # kill | term
B="${SLUICE_KAFKA_BOOTSTRAP:-127.0.0.1:19092}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SLUICE="${SLUICE:-$ROOT/target/release/sluice}"
[[ -x "$SLUICE" ]] || SLUICE="$ROOT/target/debug/sluice"
LIBS="${SLUICE_CACHE:-$HOME/.cache/sluice}/kafka-4.4.0/libs/*"
T=ho-$(date +%s%N)
WORK="$(mktemp -d)"
cd "$WORK"
java -cp "$LIBS" org.apache.kafka.tools.TopicCommand --bootstrap-server $B --create --topic $T-in --partitions 6 --replication-factor 1 >/dev/null 2>&1 || true
java -cp "$LIBS" org.apache.kafka.tools.TopicCommand --bootstrap-server $B --create --topic $T-out --partitions 6 --replication-factor 1 >/dev/null 2>&1 || true
cat > q.sql <<SQL
CREATE STREAM input WITH (connector = 'kafka', topic = '$T-in', 'bootstrap.servers' = '$B', format = 'raw');
CREATE STREAM out WITH (connector = 'kafka', topic = '$T-out', 'bootstrap.servers' = '$B', format = 'raw');
SET 'tasks' = 'per-partition';
SET 'tasks.group' = 'true';
SET 'tasks.group.session.timeout' = '6 s';
SET 'trigger' = '100 ms';
SET 'pipeline.name' = '$T';
SET 'checkpoint.location' = '$WORK/checkpoint';
INSERT INTO out SELECT value FROM input;
SQL
java -cp "$LIBS" org.apache.kafka.tools.ProducerPerformance --topic $T-in --num-records 120000 --record-size 100 --throughput 2000 --producer-props bootstrap.servers=$B >producer.log 2>&1 &
PRODUCER=$!
export SLUICE_LOG="sluice_kafka::group=info,sluice::progress=info,warn"
export NO_COLOR=1
$SLUICE run q.sql >/dev/null 2>a.log & A=$!
$SLUICE run q.sql >/dev/null 2>b.log & Bp=$!
sleep 25
T0=$(date +%s.%N)
if [[ $MODE == kill ]]; then kill -9 $A; else kill -TERM $A; fi
sleep 20
kill -TERM $Bp; wait $Bp || true; wait $A 2>/dev/null || true
kill $PRODUCER 2>/dev/null || true
echo "stopped A at $T0 ($MODE)"
python3 - "$T0" <<'PY'
import re, sys, datetime
t0 = float(sys.argv[1])
def ts(line):
    m = re.match(r'(\S+Z)', line.strip().replace('\x1b[2m','').replace('\x1b[0m',''))
    s = re.sub(r'\x1b\[[0-9;]*m', '', line).split()[0]
    return datetime.datetime.fromisoformat(s.replace('Z','+00:00')).timestamp()
clean = lambda l: re.sub(r'\x1b\[[0-9;]*m', '', l)
a = [clean(l) for l in open('a.log')]
b = [clean(l) for l in open('b.log')]
# A's tasks at the moment it stopped: the last assignment minus revokes.
owned = set()
for l in a:
    m = re.search(r'tasks=\{([0-9, ]*)\}', l)
    if not m: continue
    ts_ = ts(l)
    if ts_ > t0: break
    s = {int(x) for x in m.group(1).split(',') if x.strip()}
    if 'tasks come' in l: owned |= s
    if 'tasks leave' in l: owned -= s
print('A owned', sorted(owned))
come = None
for l in b:
    if 'tasks come' in l and ts(l) > t0:
        come = ts(l); print('B given', l.split('tasks=')[1].strip(), f'after {come - t0:.2f} s'); break
first = {}
for l in b:
    m = re.search(r'task=Some\((\d+)\)', l)
    if m and 'epoch committed' in l and ts(l) > t0:
        t = int(m.group(1))
        if t in owned and t not in first: first[t] = ts(l) - t0
print('first commit of each of A\'s tasks on B, s after the stop:', {k: round(v,2) for k,v in sorted(first.items())})
if first: print(f'hand-over (last of them): {max(first.values()):.2f} s')
PY
