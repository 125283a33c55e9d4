"""A mixed epoch's budget is shared by what each source needs, and a scan source beyond its share spills (#52).

The new user's case, scaled down: a large scan source beside two small query sources. Dividing the budget
equally among three sources refused the scan source a share that its table fits once the query sources'
keys (a few KB) are counted for what they are; a table past what is left is read once into buckets on disk
(:mod:`pgprefetch.write.mix.spilled`) and gives the bytes the epoch in memory gives.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, dump_argv
from .harness.mixing import CODE, MIX_TABLES, WEB, mix_config

ROWS = 250_000  # about 9 MB decoded, 22 MB while read and cut (twice the table and its plan)
BIG = {"table": "events", "key": "id"}


@pytest.fixture
def big_mix_db(db: str) -> str:
    execute(
        db,
        *MIX_TABLES,
        "CREATE TABLE events (id bigint PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        f"INSERT INTO events SELECT i, 3000000 + i, i * 0.125, i % 3 FROM generate_series(1, {ROWS}) i",
        "ANALYZE events",
    )
    return db


def _config(tmp_path: Path, memory: str, store: str) -> Path:
    """The mix under ``[source] memory = memory``, into its own store."""
    sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}, "events": {"weight": 2, **BIG}}
    config = mix_config(tmp_path, sources, size=100, samples=2000, store=store, name=f"{store}.toml")
    config.write_text(config.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1))
    return config


def test_a_scan_source_takes_what_the_query_sources_leave_not_a_third(big_mix_db: str, tmp_path: Path) -> None:
    """Under 48 MiB a third (16 MiB, 10 for data) does not hold the table (17 MiB as read); what is left does."""
    shared = dump(_config(tmp_path, "48MiB", "shared.zarr"), big_mix_db)
    whole = dump(_config(tmp_path, "4GiB", "whole.zarr"), big_mix_db)
    assert shared.sources == whole.sources
    assert chunk_bytes(shared.path) == chunk_bytes(whole.path)


def test_a_scan_source_beyond_its_share_is_read_once_to_disk_and_dumps_the_same_bytes(
    big_mix_db: str, tmp_path: Path
) -> None:
    """Under 24 MiB the table (22 MB as read and cut) is past its share: it spills, started as users start a dump."""
    config = _config(tmp_path, "24MiB", "small.zarr")
    proc = subprocess.run([*dump_argv(config, big_mix_db), "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\[samples\.events\] table: 250,000 rows beyond its share .* \d+ buckets on disk", proc.stderr)
    assert json.loads(proc.stdout.splitlines()[-1])["rows_read"] == ROWS  # the table read once
    whole = dump(_config(tmp_path, "4GiB", "whole.zarr"), big_mix_db)
    small = tmp_path / "small.zarr" / "epoch-00000"
    assert chunk_bytes(small) == chunk_bytes(whole.path)
    assert not list((tmp_path / "small.zarr").rglob("*.spill"))  # its spill folder went with the dump


def test_a_spilled_scan_source_continues_from_epoch_to_epoch_as_in_memory(big_mix_db: str, tmp_path: Path) -> None:
    """Epochs 1 and 2 continue each source from the record of the epoch before: found on disk, as in memory.

    With ``fraction`` and repeated keys dropped, which the index applies bucket by bucket.
    """
    repeated = "INSERT INTO events SELECT * FROM events WHERE id % 997 = 0"  # the same rows twice: either kept
    execute(big_mix_db, "ALTER TABLE events DROP CONSTRAINT events_pkey", repeated)
    sources = {
        "web": {"weight": 1, **WEB},
        "events": {"weight": 3, **BIG, "fraction": 0.5, "duplicates": "drop"},
    }
    results = {}
    for memory in ("24MiB", "4GiB"):
        config = mix_config(tmp_path, sources, size=100, samples=3000, store=f"{memory}.zarr", name=f"{memory}.toml")
        config.write_text(config.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1))
        results[memory] = [dump(config, big_mix_db, epoch) for epoch in range(3)]
    for small, whole in zip(results["24MiB"], results["4GiB"], strict=True):
        assert small.sources == whole.sources
        assert chunk_bytes(small.path) == chunk_bytes(whole.path)


def test_a_spilled_windows_source_keeps_each_series_whole_and_dumps_the_same_bytes(db: str, tmp_path: Path) -> None:
    """Windows beyond the share: a bucket holds whole series, so each window is cut from all of its rows."""
    execute(
        db,
        "CREATE TABLE ticks (sid int NOT NULL, t int NOT NULL, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        "INSERT INTO ticks SELECT i / 500, i % 500, 1000000 + i, i * 0.5, i % 7 FROM generate_series(0, 249999) i "
        "ORDER BY random()",
        "CREATE TABLE short_ticks (sid int NOT NULL, t int NOT NULL, a float8 NOT NULL, b real NOT NULL, "
        "tag int NOT NULL)",
        "INSERT INTO short_ticks SELECT i / 50, i % 50, 2000000 + i, i * 0.25, i % 5 FROM generate_series(0, 999) i",
        "ANALYZE ticks",
    )
    windows = {"key": "sid", "order": "t", "window": 8, "stride": 4}
    sources = {
        "ticks": {"weight": 3, "table": "ticks", **windows},
        "short": {"weight": 1, "table": "short_ticks", **windows},
    }
    stores = {}
    for memory in ("24MiB", "4GiB"):
        config = mix_config(tmp_path, sources, size=64, samples=4096, store=f"{memory}.zarr", name=f"{memory}.toml")
        config.write_text(config.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1))
        proc = subprocess.run([*dump_argv(config, db), "--json"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert ("[samples.ticks] table: 250,000 rows beyond its share" in proc.stderr) == (memory == "24MiB")
        stores[memory] = tmp_path / f"{memory}.zarr" / "epoch-00000"
    assert chunk_bytes(stores["24MiB"]) == chunk_bytes(stores["4GiB"])


def test_a_series_no_bucket_of_its_share_holds_is_refused_naming_the_least_memory_of_the_whole_mix(
    db: str, tmp_path: Path
) -> None:
    """The one refusal left: a series cannot be split from its windows. The --memory it names reads it (whole).

    The smaller source, read first, takes what it holds: the larger has the rest of the budget, not half.
    """
    execute(
        db,
        "CREATE TABLE ticks (sid int NOT NULL, t int NOT NULL, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        "INSERT INTO ticks SELECT i / 1000000, i % 1000000, 1000000 + i, i * 0.5, i % 7 "
        "FROM generate_series(0, 1049999) i",
        "CREATE TABLE short_ticks (sid int NOT NULL, t int NOT NULL, a float8 NOT NULL, b real NOT NULL, "
        "tag int NOT NULL)",
        "INSERT INTO short_ticks SELECT i / 50, i % 50, 2000000 + i, i * 0.25, i % 5 FROM generate_series(0, 999) i",
        "ANALYZE ticks",
        "ANALYZE short_ticks",  # the smaller table is read first, and leaves the larger the rest
    )
    windows = {"key": "sid", "order": "t", "window": 8, "stride": 4}
    sources = {
        "ticks": {"weight": 3, "table": "ticks", **windows},
        "short": {"weight": 1, "table": "short_ticks", **windows},
    }

    def run(memory: str) -> subprocess.CompletedProcess[str]:
        config = mix_config(tmp_path, sources, size=64, samples=4096, store=f"{memory}.zarr", name=f"{memory}.toml")
        config.write_text(config.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1))
        return subprocess.run([*dump_argv(config, db), "--json"], capture_output=True, text=True, check=False)

    proc = run("24MiB")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    error = json.loads(proc.stdout)["error"]
    m = re.fullmatch(
        r"\[samples\.ticks\] table: series \(sid=0\) has 1,000,000 rows \([\d.]+ MiB decoded\), more than "
        r"a data pass holds under \[source\] memory 24 MiB; the least budget that reads it is --memory (\d+)MiB",
        error,
    )
    assert m is not None, error
    least = int(m.group(1))
    assert not (tmp_path / "24MiB.zarr" / "epoch-00000").exists()  # nothing published
    assert run(f"{least}MiB").returncode == 0, "the budget it names reads it"
    assert run(f"{least - 16}MiB").returncode != 0, "and a budget well under it does not"


def test_a_connection_terminated_while_a_scan_source_streams_into_buckets_is_retried_to_the_same_bytes(
    big_mix_db: str, tmp_path: Path
) -> None:
    """Killed once its read was handed over to the buckets (their files seen in the scratch): one retry, same bytes.

    The source is a SELECT (no estimate), so its read starts in memory and outgrows the share midway; a pause
    every 1,000 rows keeps its COPY going for about 1.5 s.
    """
    import asyncio
    import threading
    import time

    from pgprefetch import dump_epoch, load_config
    from pgprefetch.pg.retry import RetryPolicy

    from .harness.faults import kill_every_connection

    slow = "SELECT id, a, b, tag, CASE WHEN id % 1000 = 0 THEN pg_sleep(0.006) END AS pause FROM events"
    sources = {"web": {"weight": 1, **WEB}, "events": {"weight": 2, "table": slow, "key": "id"}}
    config = mix_config(tmp_path, sources, size=100, samples=2000, store="killed.zarr", name="killed.toml")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cfg = load_config(config, dsn=big_mix_db, memory="24MiB", scratch=scratch)
    done = threading.Event()

    def kill_once_the_buckets_fill() -> None:
        while not done.is_set():
            if any(p.parent.name == "partition" for p in scratch.rglob("*") if p.is_file()):
                kill_every_connection(big_mix_db)
                return
            time.sleep(0.002)

    killer = threading.Thread(target=kill_once_the_buckets_fill)
    killer.start()
    try:
        result = asyncio.run(dump_epoch(cfg, 0, retries=RetryPolicy(first_wait=0.1)))
    finally:
        done.set()
        killer.join()
    assert result.retries == 1
    assert set(result.retry_causes) <= {"terminated", "connection lost"}  # as the backend's end reached the COPY
    whole = dump(config, big_mix_db, memory="4GiB", store=str(tmp_path / "whole.zarr"))
    assert chunk_bytes(result.path) == chunk_bytes(whole.path)
    assert list(scratch.iterdir()) == []


def test_a_mixed_epoch_spread_over_ray_is_the_single_process_bytes(
    ray_cluster: object, db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two query sources fetched by the parts, a scan source in buckets on the driver's disk decoded by the driver.

    (A scan source held in memory on Ray: tests/test_transforms.py's mixed epoch on Ray.)
    """
    from .harness.raycluster import manifest, on_ray

    execute(
        db,
        *MIX_TABLES,
        "CREATE TABLE events (id bigint PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        "INSERT INTO events SELECT i, 3000000 + i, i * 0.125, i % 3 FROM generate_series(1, 40000) i",
        "ANALYZE events",
    )

    def config(store: str) -> Path:
        sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}, "events": {"weight": 2, **BIG}}
        path = mix_config(tmp_path, sources, size=100, samples=2000, store=store, name=f"{store}.toml")
        path.write_text(path.read_text().replace("[source]\n", '[source]\nmemory = "1MiB"\n', 1))
        return path

    with caplog.at_level("INFO", logger="pgprefetch"):
        single = dump(config("single.zarr"), db, 1)
    assert "[samples.events] table: 40,000 rows beyond its share" in caplog.text  # the buckets, not memory
    spread = on_ray(config("ray.zarr"), db, epoch=1, parts=3)
    assert (spread.executor, spread.parts, spread.sources) == ("ray", 3, single.sources)
    assert chunk_bytes(spread.path) == chunk_bytes(single.path)
    assert manifest(spread.path)["mix"] == manifest(single.path)["mix"]
