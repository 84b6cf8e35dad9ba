#!/usr/bin/env bash
# The export benchmark: ROWS rows of the demo events table exported, in one run, by
#   1. quarry db export       (binary COPY -> Arrow -> Parquet, zstd)
#   2. psycopg 3 + pyarrow    (bench/export_psycopg.py: server-side cursor -> Parquet, zstd)
#   3. psql \copy ... CSV     (COPY ... TO STDOUT as CSV into a file: the floor)
# and quarry once more on a tenth of the rows, to show that its memory does not grow with
# them. Prints wall time, rows per second and peak RSS (/usr/bin/time) side by side. All three
# read over the same unix socket from quarry's private PostgreSQL in $QUARRY_BENCH_STATE
# (default /tmp/quarry-bench), seeded with ROWS events on first use.
#
# usage: bench/export.sh [ROWS]    (default 10000000)
set -euo pipefail
cd "$(dirname "$0")/.."

rows=${1:-10000000}
state=${QUARRY_BENCH_STATE:-/tmp/quarry-bench}
port=55433
quarry=build/src/quarry

scripts/setup
scripts/build >/dev/null
source scripts/lib.sh
python=$(venv_path bench-venv bench/requirements.txt)/bin/python

mkdir -p "$state"
config=$state/bench.yml
cat >"$config" <<YAML
sandbox:
  export_max_rows: 10000000000
database:
  port: $port
  statement_timeout: 1h
YAML
q=("$quarry" --config "$config" --state-dir "$state")

url=$("${q[@]}" db up)
# The same unix socket for every client: postgresql://user:password@/analytics?host=...
socket_url="${url/@127.0.0.1:$port\//@/}?host=$state/postgres/run&port=$port"
count=$("${q[@]}" db query --json "SELECT count(*) FROM events" 2>/dev/null |
  "$python" -c 'import json,sys; print(json.load(sys.stdin)["rows"][0][0])' 2>/dev/null || echo 0)
if [[ $count != "$rows" ]]; then
  "${q[@]}" --log-level info db seed-demo --events "$rows"
fi
sql="SELECT * FROM events"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Warm the page cache so no method pays for the first read from disk.
"${q[@]}" db query "SELECT count(*), sum(length(device)) FROM events" >/dev/null

# measure NAME COMMAND...: wall seconds and peak RSS (KiB) of COMMAND into $out/NAME.time.
measure() {
  local name=$1
  shift
  /usr/bin/time -f '%e %M' -o "$out/$name.time" "$@" >"$out/$name.log" 2>&1 ||
    { echo "$name failed:"; cat "$out/$name.log"; exit 1; }
}

echo "export of $rows rows: $sql ($(nproc) cores)"
measure quarry "${q[@]}" db export "$sql" "$out/quarry.parquet"
measure psycopg "$python" bench/export_psycopg.py "$socket_url" "$sql" "$out/psycopg.parquet"
measure csv psql -X -q "$socket_url" -c "\\copy ($sql) TO '$out/events.csv' WITH (FORMAT csv)"
small=$((rows / 10))
measure quarry_small "${q[@]}" db export "$sql LIMIT $small" "$out/quarry_small.parquet"

report() {
  local name=$1 label=$2 count=$3 file=$4
  read -r seconds kib <"$out/$name.time"
  awk -v label="$label" -v rows="$count" -v s="$seconds" -v kib="$kib" \
    -v bytes="$(stat -c %s "$file")" \
    'BEGIN { printf "%-30s %12d %9.2f %12.0f %10.1f %10.1f\n", label, rows, s, rows / s,
             kib / 1024, bytes / 1048576 }'
}
printf "%-30s %12s %9s %12s %10s %10s\n" method rows seconds rows/s "peak MiB" "file MiB"
report quarry "quarry db export (Parquet)" "$rows" "$out/quarry.parquet"
report psycopg "psycopg 3 + pyarrow (Parquet)" "$rows" "$out/psycopg.parquet"
report csv "psql \\copy (CSV)" "$rows" "$out/events.csv"
report quarry_small "quarry db export, rows/10" "$small" "$out/quarry_small.parquet"
read -r quarry_seconds _ <"$out/quarry.time"
read -r psycopg_seconds _ <"$out/psycopg.time"
awk -v q="$quarry_seconds" -v p="$psycopg_seconds" \
  'BEGIN { printf "quarry throughput: %.1fx psycopg 3 + pyarrow\n", p / q }'
