#!/usr/bin/env bash
# The quarry serve benchmark: starts a server on a free loopback port in its own state
# directory ($QUARRY_BENCH_STATE, default /tmp/quarry-bench-server), without a model (cells
# need none), and runs bench/server_bench.py against it: GET latency at 50 clients (wrk) beside
# /healthz, memory with 500 idle streams, and the server's own overhead per tool step.
#
# usage: bench/server.sh [server_bench.py options: --streams 500 --cells 200 --seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-server}
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null

mkdir -p "$state"
config=$state/bench.yml
cat >"$config" <<YAML
server:
  listen: 127.0.0.1:0
model:
  api_key_env: QUARRY_BENCH_NO_MODEL   # no model: questions are refused, cells run
YAML
log=$state/server.log
# The access log of every benchmark request would cost more than the requests: warn only.
$quarry --config "$config" --state-dir "$state" --log-level warn serve >"$state/stdout" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "serving on" "$state/stdout" 2>/dev/null && break
  sleep 0.1
done
url=$(sed -n 's/^quarry is serving on //p' "$state/stdout")
[[ -n $url ]] || { cat "$log" >&2; exit 1; }
python3 bench/server_bench.py "$url" "$pid" "$@"
