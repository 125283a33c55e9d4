"""A user's script: ADBC's PostgreSQL driver reads the table, numpy shuffles and writes (``by_hand``).

``python adbc_script.py DSN JOB OUT BATCH SEED``: one connection, ``cursor.fetch_arrow_table()`` (binary
COPY decoded into Arrow in C++). Prints a JSON line: samples, the read's seconds, the whole run's seconds.
"""

import json
import sys
import time
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
from by_hand import cut_and_write

QUERY = {
    "rows": "SELECT id, " + ", ".join(f"r{i}" for i in range(16)) + ", label FROM wide",
    "windows": "SELECT series_id, t, f0, f1, label FROM series",
}


def main() -> None:
    dsn, job, out, batch, seed = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    started = time.perf_counter()
    with adbc.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(QUERY[job])
        table = cur.fetch_arrow_table()
    read_s = time.perf_counter() - started
    n = cut_and_write(table, job, out, batch, seed)
    print(json.dumps({"samples": n, "read_s": read_s, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
