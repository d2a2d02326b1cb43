#!/usr/bin/env bash
# Fetches Spark's Kafka connector (spark-sql-kafka-0-10 and the jars it needs
# beyond PySpark's own) from Maven Central with mvn, once, into
# ${SLUICE_CACHE:-$HOME/.cache/sluice}/spark-kafka-jars.
#
# The last line of stdout is the comma-separated jar list for spark.jars.
set -euo pipefail

SPARK_KAFKA_VERSION="${SPARK_KAFKA_VERSION:-4.0.0}"  # the 4.0.x Maven Central serves
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
DIR="$CACHE/spark-kafka-jars"
# spark-sql-kafka-0-10 4.0.0's own dependencies, beyond what PySpark bundles.
ARTIFACTS=(
  "org.apache.spark:spark-sql-kafka-0-10_2.13:$SPARK_KAFKA_VERSION"
  "org.apache.spark:spark-token-provider-kafka-0-10_2.13:$SPARK_KAFKA_VERSION"
  "org.apache.kafka:kafka-clients:3.9.0"
  "org.apache.commons:commons-pool2:2.12.0"
)

log() { echo "[spark-kafka-jars] $*" >&2; }

mkdir -p "$DIR"
for a in "${ARTIFACTS[@]}"; do
  IFS=: read -r group artifact version <<<"$a"
  jar="$DIR/$artifact-$version.jar"
  if [ ! -s "$jar" ]; then
    log "fetching $a from Maven Central"
    mvn -q dependency:copy -Dartifact="$a" -DoutputDirectory="$DIR" >&2
  fi
  [ -s "$jar" ] || { log "missing $jar after mvn"; exit 1; }
done
ls "$DIR"/*.jar | paste -sd, -
