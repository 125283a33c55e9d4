"""What a scan survives: a connection killed mid-COPY, ``kill -9`` while reading or writing, a table larger
than ``[source] memory`` (read in passes); each ends with the bytes of a clean dump.

Over the ``ticks`` fixture's tables (tests/harness/db.py), or tables of the test's own.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .harness.configs import scan_config
from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, read_arrays

SLOW = "SELECT series_id, t, f0, f1, label, pg_sleep(0.0005) AS pause FROM ticks"  # a COPY of about 1.2 s


def test_a_connection_terminated_mid_scan_is_retried(ticks: str, tmp_path: Path) -> None:
    import asyncio
    import threading

    from pgprefetch import dump_epoch, load_config
    from pgprefetch.pg.retry import RetryPolicy

    from .harness.faults import kill_every_connection

    cfg = scan_config(tmp_path / "a", table=SLOW, key=["series_id"], order="t", window=8)
    killer = threading.Timer(0.6, kill_every_connection, args=(ticks,))
    killer.start()
    result = asyncio.run(dump_epoch(load_config(cfg, dsn=ticks), 0, retries=RetryPolicy(first_wait=0.1)))
    killer.join()
    assert result.retries == 1  # the kill met the dump while it read
    assert result.retry_causes == {"terminated": 1}
    clean = dump(scan_config(tmp_path / "b", table="ticks", key=["series_id"], order="t", window=8), ticks)
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)


@pytest.mark.parametrize("moment", ["reading", "writing"])
def test_kill_9_mid_scan_then_rerun_gives_the_clean_bytes(ticks: str, tmp_path: Path, moment: str) -> None:
    import time

    from .harness.dumps import dump_argv, journal_lines, wait_for

    table = SLOW if moment == "reading" else "ticks"
    # Writing: batches of two samples, compressed: milliseconds each through zarr, so the dump is still
    # writing when it is killed (uncompressed, units of up to 512 such batches would write it all at once).
    settings = {"key": ["series_id"], "order": "t", "window": 2, "size": 1 if moment == "reading" else 2}
    if moment == "writing":  # a third of the windows: about 400 batches, still writing when killed at 20
        settings["stride"] = 3
    settings["compression"] = "none" if moment == "reading" else "zstd"
    cfg = scan_config(tmp_path / "a", table=table, **settings)
    store = tmp_path / "a" / "store.zarr"
    proc = subprocess.Popen(dump_argv(cfg, ticks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if moment == "reading":
        time.sleep(1.5)  # started, connected, in the middle of the COPY
    else:
        wait_for(lambda: journal_lines(store) >= 20)
    proc.kill()
    proc.communicate()
    assert not (store / "epoch-00000").exists()
    rerun = subprocess.run([*dump_argv(cfg, ticks), "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert (summary.get("resumed_batches", 0) > 0) == (moment == "writing")
    clean = dump(scan_config(tmp_path / "b", table="ticks", **settings), ticks)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_table_larger_than_memory_is_read_in_passes_and_gives_the_same_bytes(
    db: str, tmp_path: Path, compression: str
) -> None:
    execute(
        db,
        "CREATE TABLE big (series_id int, t int, f0 real NOT NULL, f1 float8 NOT NULL, label int NOT NULL)",
        """INSERT INTO big SELECT s, t, s + t * 0.5, s * 1000 + t / 3.0, (s * 7 + t) % 5
           FROM generate_series(1, 200) s, generate_series(1, 300 + s % 17) t ORDER BY random()""",
        "CREATE INDEX ON big (series_id, t)",
    )  # about 63,000 rows: 3.3 MB as COPY sends them
    windows = {"table": "big", "key": ["series_id"], "order": "t", "window": 16, "stride": 3, "fraction": 0.8}
    whole = dump(scan_config(tmp_path / "whole", **windows), db)
    small = scan_config(tmp_path / "small", **windows, extra='memory = "1MiB"', compression=compression)
    passes = dump(small, db)
    assert passes.rows_read is not None
    # One read of every column (the keys pass, which splits the rows into the passes' files), after the first
    # read that outgrew memory (a table ANALYZE has not counted yet) was given up part way.
    assert whole.rows_read <= passes.rows_read < 2 * whole.rows_read
    assert not (tmp_path / "small" / "store.zarr" / ".pgprefetch" / "partial" / "epoch-00000.spill").exists()
    got = read_arrays(passes)
    for name, array in read_arrays(whole).items():
        np.testing.assert_array_equal(got[name], array)


def test_a_table_analyze_counted_past_memory_goes_straight_to_the_passes(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE wide (id int8 PRIMARY KEY, a real NOT NULL, b real NOT NULL, label int NOT NULL)",
        "INSERT INTO wide SELECT i, i * 0.5, i % 13, i % 7 FROM generate_series(1, 200000) i ORDER BY random()",
        "ANALYZE wide",
    )  # 200,000 rows of 20 decoded bytes: 4 MB against 1 MiB of memory
    rows = {"table": "wide", "key": ["id"], "fields": {"x": (["a", "b"], "float32"), "y": (["label"], "int64")}}
    whole = dump(scan_config(tmp_path / "whole", **rows), db)
    passes = dump(scan_config(tmp_path / "small", **rows, extra='memory = "1MiB"'), db)
    # The table read once: no first read given up when it outgrew memory, and the data passes read local disk.
    assert passes.rows_read == whole.rows_read == 200_000
    got = read_arrays(passes)
    for name, array in read_arrays(whole).items():
        np.testing.assert_array_equal(got[name], array)
