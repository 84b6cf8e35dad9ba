#!/usr/bin/env bash
# Runs every fuzzer (fuzz/) for longer than scripts/test does: SECONDS each (default 300),
# after its seeds, with new inputs kept in build-fuzz/corpus/NAME (outside the repository) for
# the next run. Inputs that crash are saved as build-fuzz/artifacts/NAME-crash-...; the full
# output is in build-fuzz/fuzz.log. Only some fuzzers: bench/fuzz.sh 60 sse url
#
# A crash found becomes a regression test: fix the code, add a unit test that reproduces the
# input (tests/unit), and copy the input into fuzz/corpus/NAME/regression-<what>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-300}
shift || true
scripts/build --fuzz
exec fuzz/run.py --seconds "$seconds" --corpus build-fuzz/corpus "$@"
