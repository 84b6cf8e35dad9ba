#!/usr/bin/env bash
# What a command costs through the Daytona-compatible API (issue 13), measured with Daytona's
# official Python SDK against a `quarry serve` on loopback: create, `process.exec("true")` and
# delete, one sandbox per run, and `exec("true")` again and again in one sandbox; beside the same
# through quarry's own command line (`quarry sandbox run -- true`: create, run, destroy; and
# `quarry sandbox exec ID -- true`), the same commands with quarry as the Daytona client
# (sandbox.provider: daytona, this server as the engine), and the seed's figure for Daytona
# itself. Medians and p90s; then what each provider adds around a command by quarry's metering.
#
# usage: bench/daytona.sh [--runs 100]
set -euo pipefail
cd "$(dirname "$0")/.."

runs=100
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: bench/daytona.sh [--runs N]" >&2; exit 2 ;;
  esac
done

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-daytona}
quarry=build/src/quarry
scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null
source scripts/lib.sh
python=$(venv_path daytona-venv tests/api/daytona-requirements.txt)/bin/python

mkdir -p "$state"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$quarry --log-level warn --state-dir "$state" serve --listen "127.0.0.1:$port" >"$state/serve.log" 2>&1 &
server=$!
sandbox=""
cleanup() {
  [[ -n $sandbox ]] && $quarry --state-dir "$state" sandbox rm "$sandbox" >/dev/null
  kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done

echo "Daytona's SDK ($($python -c 'from importlib.metadata import version; print(version("daytona"))')) against quarry serve, $runs runs each ($(nproc) cores); milliseconds"
DAYTONA_API_URL="http://127.0.0.1:$port/daytona/api" DAYTONA_API_KEY=local \
  "$python" bench/daytona_bench.py "$runs"

# quarry as a Daytona client: the same commands with sandbox.provider: daytona and this server
# as the engine (a server without tokens takes any key), so each goes through the DaytonaProvider
# (quarry-data, the HTTP calls, the probe around the command in the sandbox).
config=$state/daytona.yml
printf 'sandbox:\n  provider: daytona\n  daytona:\n    api_url: "http://127.0.0.1:%s/daytona/api"\n    image: quarry\n' \
  "$port" >"$config"
export DAYTONA_API_KEY=local
sandbox=$($quarry --state-dir "$state" sandbox create)
remote=$($quarry --config "$config" --state-dir "$state" sandbox create)
json=$state/cli.json
hyperfine -N --style none --warmup 5 --runs "$runs" --export-json "$json" \
  -n "quarry sandbox run -- true" "$quarry --state-dir $state sandbox run -- true" \
  -n "quarry sandbox exec ID -- true" "$quarry --state-dir $state sandbox exec $sandbox -- true" \
  -n "provider daytona: sandbox run -- true" \
  "$quarry --config $config --state-dir $state sandbox run -- true" \
  -n "provider daytona: sandbox exec ID -- true" \
  "$quarry --config $config --state-dir $state sandbox exec $remote -- true" \
  -n "quarry --version (start and exit)" "$quarry --version" \
  -n "quarry-data --version (start and exit)" "build/src/quarry-data --version" \
  >/dev/null 2> >(grep -v -e "Statistical outliers" -e "^ *$" >&2)
python3 - "$json" <<'PY'
import json, sys

for result in json.load(open(sys.argv[1]))["results"]:
    times = sorted(t * 1000 for t in result["times"])
    p50, p90 = times[int(0.5 * (len(times) - 1))], times[int(0.9 * (len(times) - 1))]
    print(f"{result['command'] + ' (whole process)':52} {p50:9.2f} {p90:9.2f}")
PY
printf '%-52s %9s %9s\n' "Daytona, per command (the seed's figure, seed 002)" "~1500" "-"

# What each provider adds around a command, by quarry's own metering (--json): the run time of
# `true` and the overhead around it (Daytona: the HTTP call, the toolbox's shell, the probe's
# python3 start; local: init's fork, joining the exec's cgroups, the reap).
echo
echo "quarry's metering of sandbox exec ID --json -- true, $runs runs each; milliseconds (p50)"
for provider in local daytona; do
  if [[ $provider == local ]]; then
    args=(--state-dir "$state" sandbox exec "$sandbox")
  else
    args=(--config "$config" --state-dir "$state" sandbox exec "$remote")
  fi
  for _ in $(seq "$runs"); do $quarry "${args[@]}" --json -- true | tr -d '\n'; echo; done \
    >"$state/$provider.jsonl"
  python3 - "$provider" "$state/$provider.jsonl" <<'PY'
import json, statistics, sys

results = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
run = statistics.median(r["run_ms"] for r in results)
overhead = statistics.median(r["overhead_ms"] for r in results)
print(f"{sys.argv[1] + ' provider':18} run {run:8.2f}   overhead {overhead:8.2f}")
PY
done
$quarry --config "$config" --state-dir "$state" sandbox rm "$remote" >/dev/null
