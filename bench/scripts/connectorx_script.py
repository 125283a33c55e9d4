"""A user's script: ConnectorX reads the table over 8 partitions, numpy shuffles and writes (``by_hand``).

``python connectorx_script.py DSN JOB OUT BATCH SEED``: ``read_sql(..., partition_on=<key>,
partition_num=8, return_type="arrow")``: eight connections, each reading a range of the key (no shared
snapshot). Prints a JSON line: samples, the read's seconds, the whole run's seconds.
"""

import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import connectorx as cx
from by_hand import cut_and_write

QUERY = {
    "rows": "SELECT id, " + ", ".join(f"r{i}" for i in range(16)) + ", label FROM wide",
    "windows": "SELECT series_id, t, f0, f1, label FROM series",
}
PARTITION_ON = {"rows": "id", "windows": "series_id"}


def main() -> None:
    dsn, job, out, batch, seed = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    parts = urlsplit(dsn)
    if parts.hostname is None:  # a unix socket (?host=/dir): ConnectorX wants a host name in the URL as well
        dsn = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[0] + "@localhost"))
    started = time.perf_counter()
    table = cx.read_sql(dsn, QUERY[job], partition_on=PARTITION_ON[job], partition_num=8, return_type="arrow")
    read_s = time.perf_counter() - started
    n = cut_and_write(table, job, out, batch, seed)
    print(json.dumps({"samples": n, "read_s": read_s, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
