#!/usr/bin/env bash
# The Python kernel benchmark: a step `df.shape` after `import polars` and a read of a Parquet
# file (1,000,000 rows), in quarry's kernel, in a fresh process per step, and in a Jupyter
# kernel (ipykernel + jupyter_client, the E2B approach) in the same sandbox, side by side from
# one run (build/bench/kernel_bench). The image is the default one plus ipykernel and
# jupyter_client, built once and cached by its definition like any other; its lock is made by
# the first build, beside the configuration ($state/bench.lock), and kept.
#
# usage: bench/kernel.sh [STEPS]    (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."

steps=${1:-50}
state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench-kernel}
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
mkdir -p "$state"
config=$state/bench.yml
cat >"$config" <<YAML
sandbox:
  packages: [polars==1.35.2, duckdb==1.4.5, pyarrow==22.0.0, pandas==2.3.3, numpy==2.3.5,
             matplotlib==3.10.9, plotly==6.5.2, ipykernel, jupyter_client]
YAML
"$quarry" --config "$config" --log-level warn image build >/dev/null
build/bench/kernel_bench "$config" "$steps"
