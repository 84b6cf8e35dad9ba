#!/usr/bin/env bash
# What network mode allowlist costs (issue 15): a whole `quarry sandbox run -- true` (create,
# run, destroy) with network none beside the same with an allowlist (quarry-proxy started with
# the sandbox and killed with it), and `quarry sandbox exec ID -- true` in a sandbox of each (the
# allowlist one asks its proxy for its counts before and after the command), side by side from
# one hyperfine run: medians, p90s and the differences.
#
# usage: bench/network.sh [--runs 100]
set -euo pipefail
cd "$(dirname "$0")/.."

runs=100
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: bench/network.sh [--runs N]" >&2; exit 2 ;;
  esac
done

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-network}
quarry=build/src/quarry
scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null

mkdir -p "$state"
none=$state/none.yml
allow=$state/allowlist.yml
printf 'sandbox:\n  network: {mode: none}\n' >"$none"
printf 'sandbox:\n  network: {mode: allowlist, allow: [pypi.org, "*.pythonhosted.org"]}\n' >"$allow"
plain=$($quarry --config "$none" --state-dir "$state" sandbox create)
proxied=$($quarry --config "$allow" --state-dir "$state" sandbox create)
trap '$quarry --state-dir "$state" sandbox rm "$plain" "$proxied" >/dev/null' EXIT

json=$state/network.json
hyperfine -N --style none --warmup 5 --runs "$runs" --export-json "$json" \
  -n "sandbox run -- true, network none" "$quarry --config $none --state-dir $state sandbox run -- true" \
  -n "sandbox run -- true, allowlist" "$quarry --config $allow --state-dir $state sandbox run -- true" \
  -n "sandbox exec ID -- true, network none" "$quarry --state-dir $state sandbox exec $plain -- true" \
  -n "sandbox exec ID -- true, allowlist" "$quarry --state-dir $state sandbox exec $proxied -- true" \
  >/dev/null 2> >(grep -v -e "Statistical outliers" -e "^ *$" >&2)

python3 - "$json" "$(nproc)" <<'PY'
import json, sys

results = json.load(open(sys.argv[1]))["results"]
def quantile(times, q):
    times = sorted(times)
    return times[int(q * (len(times) - 1))] * 1000

print(f"whole commands, {len(results[0]['times'])} runs each ({sys.argv[2]} cores); milliseconds")
print(f"{'':40} {'p50':>8} {'p90':>8}")
p50 = {}
for result in results:
    p50[result["command"]] = quantile(result["times"], 0.5)
    print(f"{result['command']:40} {p50[result['command']]:8.2f} "
          f"{quantile(result['times'], 0.9):8.2f}")
for what in ("sandbox run -- true", "sandbox exec ID -- true"):
    extra = p50[f"{what}, allowlist"] - p50[f"{what}, network none"]
    print(f"allowlist costs {what}: {extra:+.2f} ms (p50)")
PY
