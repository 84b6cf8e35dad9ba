#!/usr/bin/env bash
# Snapshots (issue 15), whole commands as a user runs them, with hyperfine (no shell in between),
# printed side by side from one run:
#
# 1. start: `quarry sandbox run -- true` (create, run, destroy) from the bare image and from a
#    snapshot whose layer holds an installed package set (PACKAGE and what it needs), and the
#    freeze itself (`quarry snapshot create` of that sandbox);
# 2. the first step of a conversation that needs an extra package: a sandbox created with
#    `--package PACKAGE`, `python -c 'import PACKAGE'` in it, and its removal (one bash script,
#    three quarry commands), with the package's snapshot cached; without it (installed from
#    the cached lock and wheels, then frozen again); and cold (resolved by the host's pip too).
#
# pip reads the wheels quarry's image builds left in <cache>/wheels (PIP_NO_INDEX,
# PIP_FIND_LINKS), so nothing is downloaded: PACKAGE and its dependencies must be there (jedi and
# parso are, after bench/kernel.sh). State and a cache of the bench's own (the images and wheels
# linked from the real cache) in $QUARRY_BENCH_STATE, default /tmp/quarry-bench-snapshot.
#
# usage: bench/snapshot.sh [--runs 30] [--package-runs 10] [--package jedi]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

runs=30
package_runs=10
package=jedi
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --package-runs) package_runs=$2; shift 2 ;;
    --package) package=$2; shift 2 ;;
    *) echo "usage: bench/snapshot.sh [--runs N] [--package-runs N] [--package NAME]" >&2; exit 2 ;;
  esac
done

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-snapshot}
real_cache=$(cache_dir)
cache=$state/cache
quarry="$PWD/build/src/quarry"

scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null
mkdir -p "$cache"
ln -sfn "$real_cache/images" "$cache/images"
ln -sfn "$real_cache/wheels" "$cache/wheels"
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS=$real_cache/wheels
q="$quarry --state-dir $state --cache-dir $cache"

# What an earlier run left.
$q sandbox rm --all >/dev/null 2>&1 || true
for name in $($q snapshot ls --json | python3 -c 'import json, sys
for s in reversed(json.load(sys.stdin)): print(s["name"])'); do
  $q snapshot rm "$name" >/dev/null
done
rm -rf "$cache/package-locks"

# A sandbox with the package installed (this also makes its package snapshot), frozen by name.
source_id=$($q sandbox create --package "$package" 2>/dev/null)
$q snapshot create "$source_id" bench-prepared >/dev/null 2>&1
package_snapshot=$($q snapshot ls --json | python3 -c 'import json, sys
print(next(s["name"] for s in json.load(sys.stdin) if s["kind"] == "packages"))')
layer_size=$($q snapshot ls --json | python3 -c 'import json, sys
print(next(s["size_bytes"] for s in json.load(sys.stdin) if s["name"] == "bench-prepared"))')
trap '$q sandbox rm --all >/dev/null 2>&1 || true' EXIT

first_step=$state/first-step.sh
cat >"$first_step" <<EOF
#!/usr/bin/env bash
set -e
id=\$($q sandbox create --package $package 2>/dev/null)
$q sandbox exec "\$id" -- python -c 'import $package'
$q sandbox rm "\$id" >/dev/null
EOF

bench() {
  local json=$1
  shift
  # Its advice to rerun on a quiet machine comes with every run here; the p90s show the noise.
  hyperfine -N --style none "$@" --export-json "$json" >/dev/null \
    2> >(grep -v -e "Statistical outliers" -e "^ *$" >&2)
}
bench "$state/start.json" --warmup 5 --runs "$runs" \
  -n "from the image: sandbox run -- true" "$q sandbox run -- true" \
  -n "from the snapshot: sandbox run --snapshot -- true" \
  "$q sandbox run --snapshot bench-prepared -- true"
bench "$state/freeze.json" --warmup 2 --runs "$runs" \
  --prepare "bash -c '$q snapshot rm bench-freeze >/dev/null 2>&1 || true'" \
  -n "snapshot create (the same sandbox)" "$q snapshot create $source_id bench-freeze"
$q snapshot rm bench-freeze >/dev/null
bench "$state/cached.json" --warmup 1 --runs "$package_runs" \
  -n "first step, the package's snapshot cached" "bash $first_step"
bench "$state/installed.json" --runs "$package_runs" \
  --prepare "bash -c '$q snapshot rm $package_snapshot >/dev/null 2>&1 || true'" \
  -n "first step, no snapshot: install, freeze" "bash $first_step"
bench "$state/cold.json" --runs "$package_runs" \
  --prepare "bash -c '$q snapshot rm $package_snapshot >/dev/null 2>&1; rm -rf $cache/package-locks'" \
  -n "first step, cold: resolve, install, freeze" "bash $first_step"

python3 - "$state" "$(nproc)" "$package" "$layer_size" <<'PY'
import json, sys

state, cores, package, layer_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def quantile(times, q):
    times = sorted(times)
    return times[int(q * (len(times) - 1))] * 1000

rows = []
for name in ["start", "freeze", "cached", "installed", "cold"]:
    rows += json.load(open(f"{state}/{name}.json"))["results"]
p50 = {}
print(f"snapshots, whole commands one after another ({cores} cores); milliseconds; the snapshot's "
      f"layer holds {package} installed ({layer_size / 2**20:.1f} MiB)")
print(f"{'':52} {'runs':>5} {'p50':>9} {'p90':>9}")
for row in rows:
    p50[row["command"]] = quantile(row["times"], 0.5)
    print(f"{row['command']:52} {len(row['times']):5} {p50[row['command']]:9.2f} "
          f"{quantile(row['times'], 0.9):9.2f}")
start = p50["from the snapshot: sandbox run --snapshot -- true"]
base = p50["from the image: sandbox run -- true"]
print(f"\nstart from the snapshot / from the image (p50): {start / base:.2f}x")
cached = p50["first step, the package's snapshot cached"]
for name in ["first step, no snapshot: install, freeze", "first step, cold: resolve, install, freeze"]:
    print(f"{name} / cached (p50): {p50[name] / cached:.1f}x")
PY
