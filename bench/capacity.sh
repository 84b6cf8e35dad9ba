#!/usr/bin/env bash
# The capacity benchmark: 200 conversations of 20 users share 8 sandboxes through the real API
# (quarry serve in its own state directory, $QUARRY_BENCH_STATE, default
# /tmp/quarry-bench-capacity), once without a warm pool and once with one, printed side by
# side: turns completed and lost, queue waits, first-step latency cold and warm, warm acquire,
# memory per idle sandbox, and what is left after the server stopped.
#
# usage: bench/capacity.sh [capacity_bench.py options: --conversations 200 --users 20 --steps 3
#                          --sandboxes 8 --warm 2]
set -euo pipefail
cd "$(dirname "$0")/.."

state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-capacity}
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
$quarry --log-level warn image build >/dev/null
mkdir -p "$state"
python3 bench/capacity_bench.py "$quarry" "$state" "$@"
