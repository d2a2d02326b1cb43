#!/usr/bin/env bash
# Two builds of Sluice side by side, alternating in one run: the stateless
# pipeline (rate -> filter -> projection), a GROUP BY over 100 000 keys
# (checkpointed every epoch) and the Kafka -> Kafka pass-through, each
# round running build A's bench and then build B's, so that the machine's
# drift reaches both alike. For a change that should not move the figures
# (a refactoring), this says whether it did.
#
#   benches/compare-builds.sh [A_REV] [B_REV]     (default: HEAD~1 HEAD)
#
# Each revision is checked out in a worktree under $OUT and its bench
# binaries built there (release; one target directory for both, so the
# second build compiles only what differs). Results: $OUT/compare.md, with
# every bench's JSON line under $OUT/runs/. Run again with the same OUT, it
# reuses the binaries built there and only measures.
#
# Env: ROUNDS (default 3), R (rows/s offered, default 4 000 000), N (measured
# epochs, default 10), K (GROUP BY keys, default 100 000), RECORDS (the
# pass-through's records, default 2 000 000), OUT, BENCH_TARGET (the shared
# target directory, default ~/.cache/sluice/bench-target).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
A_REV="${1:-HEAD~1}"
B_REV="${2:-HEAD}"
ROUNDS="${ROUNDS:-3}"
R="${R:-4000000}"
N="${N:-10}"
K="${K:-100000}"
RECORDS="${RECORDS:-2000000}"
OUT="${OUT:-$ROOT/target/bench-results/compare-$(date +%Y%m%d-%H%M%S)}"
export CARGO_TARGET_DIR="${BENCH_TARGET:-$HOME/.cache/sluice/bench-target}"
mkdir -p "$OUT/runs"
log() { echo "[compare] $(date +%H:%M:%S) $*" >&2; }

BENCHES=(stateless aggregate kafka_copy)

# Builds revision $2's benches in a worktree and copies them to $OUT/bin/$1.
build() {
  local side="$1" rev="$2" tree="$OUT/wt-$1"
  git worktree add -f --detach "$tree" "$rev" >&2
  log "building $side = $(git -C "$tree" rev-parse --short HEAD) (release)"
  mkdir -p "$OUT/bin/$side"
  (cd "$tree" && cargo bench --no-run --message-format=json \
      $(printf -- '--bench %s ' "${BENCHES[@]}") 2>"$OUT/build-$side.err") |
    python3 -c '
import json, shutil, sys
dest, names = sys.argv[1], set(sys.argv[2:])
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    name = m.get("target", {}).get("name")
    if m.get("reason") == "compiler-artifact" and m.get("executable") and name in names:
        shutil.copy(m["executable"], dest + "/" + name)
' "$OUT/bin/$side" "${BENCHES[@]}"
  for b in "${BENCHES[@]}"; do
    [ -x "$OUT/bin/$side/$b" ] || { tail -n 30 "$OUT/build-$side.err" >&2; exit 1; }
  done
  git -C "$tree" rev-parse --short HEAD >"$OUT/bin/$side/rev"
  git worktree remove --force "$tree"
}

# Binaries already built under $OUT (a rerun with the same OUT) are reused.
for side in a b; do
  rev="$A_REV"; [ "$side" = b ] && rev="$B_REV"
  [ -f "$OUT/bin/$side/rev" ] || build "$side" "$rev"
done

run() {
  local side="$1" bench="$2" round="$3" f="$OUT/runs/$2-$1-$3"
  shift 3
  log "round $round: $bench, build $side"
  "$OUT/bin/$side/$bench" --bench "$@" >"$f.out" 2>"$f.err" \
    || { tail -n 30 "$f.err" >&2; log "$bench ($side) failed"; exit 1; }
  grep '^{' "$f.out" | tail -n 1 >"$f.json"
}

for i in $(seq 1 "$ROUNDS"); do
  for side in a b; do
    run "$side" stateless "$i" --rows-per-second "$R" --epochs "$N"
    run "$side" aggregate "$i" --rows-per-second "$R" --epochs "$N" --keys "$K"
    run "$side" kafka_copy "$i" --records "$RECORDS" --rounds 1
  done
done

python3 - "$OUT" "$ROUNDS" >"$OUT/compare.md" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rev = {s: open(f"{out}/bin/{s}/rev").read().strip() for s in "ab"}
def load(bench, side, i):
    return json.load(open(f"{out}/runs/{bench}-{side}-{i}.json"))
def copy_ratio(d, which):
    # The pass-through's rate as a fraction of the raw librdkafka copy's in
    # the same round, epochs capped at 100 ms or 1 s of the copy's records.
    return d.get(f"ratio_{which}_median")
figures = [
    ("stateless rows/s", "stateless", lambda d: d["median_rows_per_s"]),
    ("GROUP BY rows/s", "aggregate", lambda d: d["median_rows_per_s"]),
    ("pass-through 100 ms, of the raw copy", "kafka_copy", lambda d: copy_ratio(d, "100ms")),
    ("pass-through 1 s, of the raw copy", "kafka_copy", lambda d: copy_ratio(d, "1s")),
]
print(f"### Build A ({rev['a']}) and build B ({rev['b']}), alternating, {rounds} rounds\n")
print("| figure | A per round | B per round | A median | B median | B / A |")
print("|---|---|---|---:|---:|---:|")
for name, bench, get in figures:
    a = [get(load(bench, "a", i)) for i in range(1, rounds + 1)]
    b = [get(load(bench, "b", i)) for i in range(1, rounds + 1)]
    if None in a or None in b:
        print(f"| {name} | {a} | {b} | | | |")
        continue
    f = (lambda x: f"{x / 1e6:.2f} M") if a[0] > 10 else (lambda x: f"{x:.2f}")
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {name} | {', '.join(map(f, a))} | {', '.join(map(f, b))} | {f(ma)} | {f(mb)} | {mb / ma:.2f} |")
PY
cat "$OUT/compare.md"
