#!/usr/bin/env bash
# quarry's command line as whole commands (issue 14): `quarry sandbox run -- true` and `quarry
# sandbox exec ID -- true` (in a sandbox created once before) against bubblewrap running true
# over the same image (the invocation of sandbox_bench) and a host fork/exec of true, side by
# side from one hyperfine run (no shell between it and the command): medians, p90s, and the
# ratio of run to bwrap (target: 1.5x).
#
# With --before REV, the quarry of that commit (built from `git archive REV` into
# build-bench/REV/) is measured in the same run, for a before/after.
#
# usage: bench/cli_start.sh [--runs 200] [--before REV]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

runs=200
before=
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    *) echo "usage: bench/cli_start.sh [--runs N] [--before REV]" >&2; exit 2 ;;
  esac
done

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-cli}
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
hash=$($quarry --log-level warn image build)
rootfs=$(cache_dir)/images/$hash/rootfs

old=
if [[ -n $before ]]; then
  rev=$(git rev-parse --short "$before")
  dir=build-bench/$rev
  if [[ ! -x $dir/build/src/quarry ]]; then
    rm -rf "$dir" && mkdir -p "$dir"
    git archive "$rev" | tar -x -C "$dir"
    use_ccache "$PWD/$dir"
    cmake -S "$dir" -B "$dir/build" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DQUARRY_BUILD_BENCH=OFF >/dev/null
    cmake --build "$dir/build" --target quarry quarry-init >/dev/null
  fi
  old=$dir/build/src/quarry
fi

id=$($quarry --state-dir "$state" sandbox create)
trap '$quarry --state-dir "$state" sandbox rm "$id" >/dev/null' EXIT

json=$state/cli_start.json
commands=(
  -n "quarry sandbox run -- true" "$quarry --state-dir $state sandbox run -- true"
  -n "quarry sandbox exec ID -- true" "$quarry --state-dir $state sandbox exec $id -- true"
  -n "quarry --version (start and exit)" "$quarry --version"
)
if [[ -n $old ]]; then
  commands+=(
    -n "before ($rev): sandbox run -- true" "$old --state-dir $state sandbox run -- true"
    -n "before ($rev): sandbox exec ID -- true" "$old --state-dir $state sandbox exec $id -- true"
    -n "before ($rev): --version" "$old --version"
  )
fi
bwrap="/usr/bin/bwrap --ro-bind $rootfs / --proc /proc --dev /dev --tmpfs /tmp --unshare-all"
bwrap+=" --die-with-parent --clearenv --setenv PATH /opt/quarry/venv/bin:/usr/bin:/bin true"
commands+=(-n "bwrap ... true" "$bwrap" -n "host fork/exec true" "/bin/true")
# Its advice to rerun on a quiet machine comes with every run here; the p90s show the noise.
hyperfine -N --style none --warmup 10 --runs "$runs" --export-json "$json" "${commands[@]}" \
  >/dev/null 2> >(grep -v -e "Statistical outliers" -e "^ *$" >&2)

python3 - "$json" "$(nproc)" <<'PY'
import json, sys

results = json.load(open(sys.argv[1]))["results"]
def quantile(times, q):
    times = sorted(times)
    return times[int(q * (len(times) - 1))] * 1000

print(f"whole commands, {len(results[0]['times'])} runs each, one command after another "
      f"({sys.argv[2]} cores); milliseconds")
print(f"{'':42} {'p50':>8} {'p90':>8}")
p50 = {}
for result in results:
    p50[result["command"]] = quantile(result["times"], 0.5)
    print(f"{result['command']:42} {p50[result['command']]:8.2f} "
          f"{quantile(result['times'], 0.9):8.2f}")
bwrap = p50["bwrap ... true"]
print(f"\nquarry sandbox run / bwrap (p50): {p50['quarry sandbox run -- true'] / bwrap:.2f}x "
      "(target: 1.5x)")
# A command in a sandbox that is already there, which is what an agent's step is: a fork in
# its init, where bwrap makes a whole sandbox for each command.
print(f"quarry sandbox exec / bwrap (p50): {p50['quarry sandbox exec ID -- true'] / bwrap:.2f}x")
for name in p50:
    if name.startswith("before") and name.endswith("run -- true"):
        print(f"{name} / bwrap (p50): {p50[name] / bwrap:.2f}x")
    if name.startswith("before"):
        now = "quarry " + name.split(": ", 1)[1]
        now = next(key for key in p50 if key.startswith(now))
        print(f"  {now}: {p50[name] / p50[now]:.2f}x faster than before")
PY
