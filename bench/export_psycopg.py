"""The Python baseline of bench/export.sh: a query exported to Parquet the way a Python backend
usually does it, with psycopg 3 and pyarrow.

A server-side (named) cursor streams the rows in batches, each batch becomes a pyarrow table
(one array per column, types inferred from the Python values) and a row group of a
ParquetWriter with zstd, so memory stays at about one batch, like quarry's export.

usage: export_psycopg.py CONNINFO SQL FILE [BATCH_ROWS]
prints: one JSON line {"rows": N, "seconds": S}
"""

import json
import sys
import time

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq


def main():
    conninfo, sql, path = sys.argv[1:4]
    batch_rows = int(sys.argv[4]) if len(sys.argv) > 4 else 131072
    start = time.monotonic()
    rows = 0
    writer = None
    with psycopg.connect(conninfo) as connection:
        connection.read_only = True
        with connection.cursor(name="export") as cursor:
            cursor.itersize = batch_rows
            cursor.execute(sql)
            names = None
            while True:
                batch = cursor.fetchmany(batch_rows)
                if not batch:
                    break
                if names is None:
                    names = [column.name for column in cursor.description]
                columns = list(zip(*batch))
                table = pa.table({name: pa.array(values) for name, values in zip(names, columns)})
                if writer is None:
                    writer = pq.ParquetWriter(path, table.schema, compression="zstd")
                writer.write_table(table, row_group_size=batch_rows)
                rows += len(batch)
    if writer is not None:
        writer.close()
    print(json.dumps({"rows": rows, "seconds": time.monotonic() - start}))


if __name__ == "__main__":
    main()
