#!/usr/bin/env bash
# The several-servers benchmark, on quarry's private PostgreSQL in its own state directory
# ($QUARRY_BENCH_STATE, default /tmp/quarry-bench-multi):
#   1. the history store's write rate, SQLite beside PostgreSQL (build/bench/history_bench);
#   2. turns per second and p50 / p99 turn latency of the same work (CELLS python cells from
#      CONVERSATIONS clients) through one quarry serve, then through two sharing the history
#      (bench/multiserver_bench.py), side by side.
# Servers run without a model (cells need none) and with the local sandbox provider; both
# servers share the state directory, as servers on one machine do. Nothing is asserted.
#
# usage: bench/multiserver.sh [--conversations 8] [--cells 400] [--steps 2000]
set -euo pipefail
cd "$(dirname "$0")/.."

conversations=8 cells=400 steps=2000
while [[ $# -gt 0 ]]; do
  case $1 in
    --conversations) conversations=$2 ;;
    --cells) cells=$2 ;;
    --steps) steps=$2 ;;
    *) echo "usage: bench/multiserver.sh [--conversations N] [--cells N] [--steps N]" >&2; exit 2 ;;
  esac
  shift 2
done

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-multi}
port=55434
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null

mkdir -p "$state"
# The configuration of the server of instance $1 (each server has an instance id of its own).
write_config() {
  cat >"$state/$1.yml" <<YAML
server:
  listen: 127.0.0.1:0
database:
  port: $port
conversations:
  instance_id: $1
  store: postgres                      # quarry's private PostgreSQL: database quarry_history
model:
  api_key_env: QUARRY_BENCH_NO_MODEL   # no model: questions are refused, cells run
capacity:
  # Every client is the one local user: a sandbox for each of its conversations, or turns
  # measure evictions and cold starts (per-user limit 4) instead of turns.
  max_per_user: $conversations
YAML
}
write_config bench-1
write_config bench-2
$quarry --config "$state/bench-1.yml" --state-dir "$state" db up >/dev/null

echo "== history store"
build/bench/history_bench "$state" "$port" --steps "$steps" --writers 4

pids=()
stop_servers() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_servers EXIT

# Starts a server of instance $1; its URL in $started_url (not in a subshell: its pid is kept).
start_server() {
  local out=$state/$1.stdout
  # The access log of every request would cost more than the requests: warn only.
  $quarry --config "$state/$1.yml" --state-dir "$state" --log-level warn serve \
    >"$out" 2>"$state/$1.log" &
  pids+=($!)
  for _ in $(seq 200); do
    grep -q "serving on" "$out" 2>/dev/null && break
    sleep 0.1
  done
  started_url=$(sed -n 's/^quarry is serving on //p' "$out")
}

echo "== turns: $cells python cells from $conversations clients"
printf '%-10s %12s %10s %10s %8s\n' servers turns/s p50_ms p99_ms failed
for servers in 1 2; do
  urls=()
  for n in $(seq "$servers"); do
    start_server "bench-$n"
    [[ -n $started_url ]] || { cat "$state/bench-$n.log" >&2; exit 1; }
    urls+=("$started_url")
  done
  python3 bench/multiserver_bench.py "${urls[@]}" --conversations "$conversations" \
    --cells "$cells"
  stop_servers
done
