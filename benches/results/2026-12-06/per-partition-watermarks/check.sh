#!/usr/bin/env bash
# usage: run.sh PARTITIONS E
set -euo pipefail
P=$1; E=$2
S=${S:-~/.cache/sluice/bench-target/release/sluice}; Q=${Q:-q4}
F=/work/main/benches/nexmark/flink
BOOT=127.0.0.1:9092
T=${Q}chk-$P-$E-$(date +%s)
W=/tmp/wmchk/$T; mkdir -p $W
python3 - <<PY
from subprocess import run
PY
/work/main/scripts/kafka start >/dev/null
# topic with P partitions
$S --help >/dev/null
cat > $W/mk.sql <<SQL
SQL
{
  echo "SET 'checkpoint.location' = '$W/load';"
  sed -e "s/{topic}/$T/g; s/{bootstrap}/$BOOT/g; s/{events}/1000000/g; s/{rate}/10000/g" $F/load.sql
} > $W/load.sql
~/.cache/sluice/confluent-client-2.16.1-grpcio-tools-1.85.1/bin/python -c "from confluent_kafka.admin import AdminClient, NewTopic; a=AdminClient({'bootstrap.servers':'$BOOT'}); [f.result() for f in a.create_topics([NewTopic('$T', $P, 1)]).values()]"
$S run $W/load.sql > $W/load.log 2>&1
OUT=$T-out
{
  echo "SET 'checkpoint.location' = '$W/cp';"
  echo "SET 'trigger' = 'available-now';"
  sed -e "s/{topic}/$T/; s/{bootstrap}/$BOOT/" -e "s/'format' = 'json'/'format' = 'json', 'max-records-per-epoch' = '$E'/" $F/ddl_kafka.sql
  cat $F/ddl_views.sql
  sed -e "s|WITH ('connector' = 'blackhole');|WITH ('connector' = 'kafka', 'topic' = '$OUT', 'properties.bootstrap.servers' = '$BOOT', 'format' = 'json', 'key.fields' = 'id');|" $F/$Q.sql
} > $W/$Q.sql
$S run $W/$Q.sql --progress-log $W/$Q.jsonl > $W/$Q.log 2>&1
$S verify $W/$Q.sql > $W/verify.txt 2>&1 || true
python3 -c "
import json
ls=[json.loads(l) for l in open('$W/$Q.jsonl')]
print('epochs',len(ls),'late',sum(l['late_rows'] for l in ls))"
grep -E "^OK|^DIFFERENT|differences" $W/verify.txt | head -3
