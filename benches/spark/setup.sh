#!/usr/bin/env bash
# Idempotent setup of the Spark side of the side-by-side benchmarks.
#
# Creates a Python venv at ${SLUICE_CACHE:-$HOME/.cache/sluice}/spark-venv and
# installs PySpark 4.0.x into it (pinned; override with PYSPARK_VERSION), and
# matplotlib for the charts.
# PySpark bundles its own Spark jars, so only a JDK 17+ is needed on the host.
#
# The last line of stdout is the absolute path of the venv's python.
set -euo pipefail

PYSPARK_VERSION="${PYSPARK_VERSION:-4.0.5}"   # newest 4.0.x on PyPI when written
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
VENV="$CACHE/spark-venv"
PY="$VENV/bin/python"

log() { echo "[spark-setup] $*" >&2; }

if ! command -v java >/dev/null 2>&1; then
  log "java not found on PATH; Spark 4.0 needs a JDK 17 or 21"
  exit 1
fi

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
  log "creating venv at $VENV"
  python3 -m venv "$VENV"
fi

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("pyspark"))' 2>/dev/null || true)"
if [ "$installed" != "$PYSPARK_VERSION" ]; then
  log "installing pyspark==$PYSPARK_VERSION (found: ${installed:-none})"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "pyspark==$PYSPARK_VERSION" >&2
else
  log "pyspark $installed already installed"
fi

# matplotlib draws the Nexmark charts (benches/nexmark/charts.py).
MATPLOTLIB_VERSION="${MATPLOTLIB_VERSION:-3.9.2}"
if ! "$PY" -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$MATPLOTLIB_VERSION')" 2>/dev/null; then
  log "installing matplotlib==$MATPLOTLIB_VERSION"
  "$PY" -m pip install --quiet --disable-pip-version-check "matplotlib==$MATPLOTLIB_VERSION" >&2
fi

"$PY" -c 'import pyspark, sys; sys.stderr.write("[spark-setup] pyspark %s ok\n" % pyspark.__version__)'
echo "$PY"
