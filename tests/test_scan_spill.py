"""Scan mode's keys beyond ``[source] memory``: the keys pass ordered on disk, the same order, the same bytes.

A table larger than the budget is read in passes; when its key and order columns outgrow the budget too,
the keys pass orders them on disk (:mod:`pgprefetch.write.scan.keyspill`). Each test dumps under a small
``--memory`` and compares, byte for byte, with the in-memory dump of the same table (which reads it once).
``test_two_million_rows_...`` is the scale test (marked ``scale``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from pgprefetch import dump_epochs, load_config
from pgprefetch.config.model import Config
from pgprefetch.errors import SampleError
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.check import check_config
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.shuffle import order_part
from pgprefetch.write.scan.partition import EpochRanges, Partition
from pgprefetch.write.scan.strategy import Estimate, ScanJob
from pgprefetch.write.scan.strategy.keysonly import KeysOnly
from pgprefetch.write.scan.whole import Coding
from pgprefetch.write.spill.folder import SpillFolder

from .harness.configs import scan_config
from .harness.db import execute
from .harness.dumps import RESUME_HINT, chunk_bytes, dump, dump_argv, dump_on_a_full_disk, kill_9_mid_dump
from .harness.spill import TINY_SOURCE as TINY
from .harness.spill import WINDOWS, load_tables

WINDOWS_LINE = re.compile(
    r"epoch \d+: ([\d,]+) rows outgrew \[source\] memory: ([\d,]+) windows cut from (\d+) data passes"
)
STRETCH_LINE = re.compile(
    r"epoch \d+: ([\d,]+) rows outgrew \[source\] memory: read once, in (\d+) stretches of the epoch's order"
)
ROWS = {"table": "flat", "key": "id", "fields": {"v": (["v"], "float32"), "w": (["w"], "int64")}}


@pytest.fixture
def tables(db: str) -> str:
    load_tables(db)
    return db


def logged(caplog: pytest.LogCaptureFixture, pattern: re.Pattern[str]) -> tuple[int, ...]:
    found = [m for m in map(pattern.search, caplog.messages) if m]
    assert found, f"no such line: {caplog.messages}"
    return tuple(int(g.replace(",", "")) for g in found[-1].groups())


def manifest(path: Path) -> dict[str, object]:
    return json.loads((path / "zarr.json").read_text())["attributes"]["pgprefetch"]  # type: ignore[no-any-return]


# ---- the pieces ------------------------------------------------------------------------------------------------


def test_the_partition_puts_every_series_whole_in_the_pass_its_key_names_even_after_a_split(tmp_path: Path) -> None:
    """Rows routed by series hash: each pass holds whole series, every row once; a bucket too large is split."""
    rng = np.random.default_rng(2)
    series = np.repeat(np.arange(5000), rng.integers(1, 60, size=5000))  # series of 1-59 rows
    arrived = rng.permutation(series.size)
    partition = Partition(SpillFolder(tmp_path / "rows"), buckets=3, n_key=1, room=100_000)  # 3.2 MB of rows: too few
    for lo in range(0, arrived.size, 7000):
        rows = arrived[lo : lo + 7000]
        partition.add({"k0": series[rows].astype(np.int32), "k1": rows.astype(np.int64), "c0": rows * 0.5})
    partition.settle()
    assert partition.passes > 3  # the buckets outgrew the room: split again
    seen = []
    for p in range(partition.passes):
        blocks = partition.load(p)  # the blocks held rows were written in
        chunk = {name: np.concatenate([b[name] for b in blocks]) for name in ("k0", "k1", "c0")}
        assert chunk["c0"].tolist() == (chunk["k1"] * 0.5).tolist()  # the columns of a row stay together
        assert (partition.pass_of(chunk["k0"][None, :].astype(np.int64)) == p).all()
        seen.append(chunk["k1"])
        assert chunk["k0"].nbytes + chunk["k1"].nbytes + chunk["c0"].nbytes <= 2 * 100_000
    got = np.concatenate(seen)
    assert np.array_equal(np.sort(got), np.arange(series.size))  # every row once
    assert not any((tmp_path / "rows").iterdir())  # each pass's files removed as it was loaded


def test_epoch_ranges_make_each_pass_a_stretch_of_the_epochs_order_even_after_a_split(tmp_path: Path) -> None:
    """Rows routed by their order hash: the passes one after another are the epoch's order, every row once."""
    rng = np.random.default_rng(3)
    keys = rng.permutation(60_000).astype(np.int64) * 7  # with a repeated key: equal keys go to one pass
    keys[:50] = keys[50]
    ranges = EpochRanges(SpillFolder(tmp_path / "rows"), buckets=3, n_key=1, room=80_000, seed=5, epoch=2)
    for lo in range(0, keys.size, 7000):
        part = keys[lo : lo + 7000]
        ranges.add({"k0": part, "c0": part * 0.5})
    ranges.settle()
    assert ranges.passes > 3  # the ranges outgrew the room: split again, each into sub-ranges
    in_order = []
    for p in range(ranges.passes):
        blocks = ranges.load(p)
        chunk = {name: np.concatenate([b[name] for b in blocks]) for name in ("k0", "c0")}
        assert chunk["c0"].tolist() == (chunk["k0"] * 0.5).tolist()
        order, _ = order_part(chunk["k0"][None, :], seed=5, epoch=2)
        in_order.append(chunk["k0"][order])
        assert chunk["k0"].nbytes + chunk["c0"].nbytes <= 2 * 80_000
    whole, repeats = order_part(keys[None, :], seed=5, epoch=2)
    assert repeats.count == 50
    assert np.array_equal(np.concatenate(in_order), keys[whole])  # the stretches, in turn, are the epoch


# ---- dumps through PostgreSQL -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [1.0, 0.7])
def test_windows_keys_beyond_memory_give_the_bytes_of_the_in_memory_dump(
    tables: str, tmp_path: Path, fraction: float, caplog: pytest.LogCaptureFixture
) -> None:
    windows = {**WINDOWS, "fraction": fraction}
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        spilled = dump(scan_config(tmp_path / "s", **windows, extra=TINY), tables)
    rows, samples, passes = logged(caplog, WINDOWS_LINE)  # cut from the passes: the rows' keys never sorted whole
    assert rows > 120_000
    assert passes >= 8
    whole = dump(scan_config(tmp_path / "w", **windows), tables)
    assert spilled.n_samples == whole.n_samples
    assert samples == whole.n_samples if fraction == 1.0 else samples > whole.n_samples
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
    assert manifest(spilled.path)["keys_sha256"] == manifest(whole.path)["keys_sha256"]
    meta = tmp_path / "s" / "store.zarr" / ".pgprefetch"
    assert not list((meta / "partial").iterdir())  # the keys' files are gone
    assert not (meta / "partial" / "epoch-00000.spill").exists()


@pytest.mark.parametrize("fraction", [1.0, 0.7])
def test_windows_of_a_table_beyond_memory_whose_keys_fit_give_the_bytes_of_the_in_memory_dump(
    db: str, tmp_path: Path, fraction: float, caplog: pytest.LogCaptureFixture
) -> None:
    """A wide table read in passes, its windows' keys and start rows ordered in memory (not on disk)."""
    execute(
        db,
        "CREATE TABLE wide_ticks (series_id int NOT NULL, t int NOT NULL, emb real[] NOT NULL, label int NOT NULL)",
        "INSERT INTO wide_ticks SELECT s, t, array_fill((s * 1000 + t)::real, ARRAY[64]), (s + t) % 5"
        " FROM generate_series(1, 60) s, generate_series(1, 200) t ORDER BY random()",
    )
    windows = {"table": "wide_ticks", "key": ["series_id"], "order": "t", "window": 8, "stride": 2}
    windows |= {"fraction": fraction, "fields": {"x": (["emb"], "float32"), "y": (["label"], "int64")}}
    with caplog.at_level(logging.INFO, logger="pgprefetch"):  # 3.4 MB decoded; 5,820 windows' keys: 0.8 MB
        spilled = dump(scan_config(tmp_path / "s", **windows, extra='memory = "8MiB"'), db)
    rows, samples, passes = logged(caplog, WINDOWS_LINE)
    assert (rows, samples) == (12_000, 5_820)
    assert passes >= 4
    assert not [m for m in caplog.messages if "ordered on disk" in m]  # the windows' keys fit: held
    whole = dump(scan_config(tmp_path / "w", **windows), db)
    assert spilled.n_samples == whole.n_samples
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
    assert manifest(spilled.path)["keys_sha256"] == manifest(whole.path)["keys_sha256"]


def test_windows_beyond_memory_ordered_by_a_timestamp_keep_its_type_in_the_manifest(db: str, tmp_path: Path) -> None:
    """The manifest's key types are the in-memory dump's: a timestamp order column is read back as one."""
    execute(
        db,
        "CREATE TABLE stamped (series_id int NOT NULL, ts timestamptz NOT NULL, f0 real NOT NULL, f1 real NOT NULL,"
        " label int NOT NULL)",
        "INSERT INTO stamped SELECT s, timestamptz '2024-01-01 00:00+00' + t * interval '1 minute', t, s, t % 5"
        " FROM generate_series(1, 300) s, generate_series(1, 200) t ORDER BY random()",
    )
    windows = {"table": "stamped", "key": ["series_id"], "order": "ts", "window": 16, "stride": 5}
    spilled = dump(scan_config(tmp_path / "s", **windows, extra=TINY), db)
    whole = dump(scan_config(tmp_path / "w", **windows), db)
    assert manifest(whole.path)["key_types"] == ["int", "timestamptz"]
    assert manifest(spilled.path)["key_types"] == manifest(whole.path)["key_types"]
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)


def test_rows_keys_beyond_memory_give_the_bytes_of_the_in_memory_dump(
    tables: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows beyond memory are split by ranges of the epoch's order and written a stretch at a time."""
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        spilled = dump(scan_config(tmp_path / "s", **ROWS, fraction=0.7, size=999, extra=TINY), tables)
    rows, stretches = logged(caplog, STRETCH_LINE)
    assert rows == 200_000
    assert stretches >= 8
    assert not [m for m in caplog.messages if "ordered on disk" in m]  # no key is sorted on disk: none needs to be
    whole = dump(scan_config(tmp_path / "w", **ROWS, fraction=0.7, size=999), tables)
    assert spilled.n_samples == whole.n_samples
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
    assert manifest(spilled.path)["keys_sha256"] == manifest(whole.path)["keys_sha256"]


def test_repeated_rows_beyond_memory_are_refused_or_dropped_as_in_memory(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE twice (id bigint NOT NULL, v real NOT NULL)",
        "INSERT INTO twice SELECT i % 29000, (i % 29000) * 0.5 FROM generate_series(1, 30000) i ORDER BY random()",
    )
    rows = {"table": "twice", "key": "id", "fields": {"v": (["v"], "float32")}}
    messages = []
    for extra in (TINY, ""):
        with pytest.raises(SampleError) as e:
            dump(scan_config(tmp_path / f"e{len(extra)}", **rows, extra=extra), db)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("[samples] table returned 1000 repeated key(s), e.g. (id=1); (id=2);")
    spilled = dump(scan_config(tmp_path / "d", **rows, duplicates="drop", extra=TINY), db)
    whole = dump(scan_config(tmp_path / "w", **rows, duplicates="drop"), db)
    assert spilled.duplicates_dropped == whole.duplicates_dropped == 1000
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)


@pytest.mark.parametrize("settings", [WINDOWS, ROWS], ids=["windows", "rows"])
def test_check_and_several_epochs_from_keys_beyond_memory(tables: str, tmp_path: Path, settings: dict) -> None:
    """Each epoch of ``--epochs`` beyond memory is read and ordered for itself (rows: split by its own order)."""
    cfg = scan_config(tmp_path / "s", **settings, extra=TINY)
    report = asyncio.run(check_config(load_config(cfg, dsn=tables)))
    assert report.errors == []
    spilled = asyncio.run(dump_epochs(load_config(cfg, dsn=tables), [0, 1]))
    whole = asyncio.run(dump_epochs(load_config(scan_config(tmp_path / "w", **settings), dsn=tables), [0, 1]))
    assert report.n_samples == whole[0].n_samples
    for a, b in zip(spilled, whole, strict=True):
        assert chunk_bytes(a.path) == chunk_bytes(b.path)
    assert chunk_bytes(spilled[0].path) != chunk_bytes(spilled[1].path)


def test_the_keys_pass_is_held_within_memory_and_in_memory_when_the_keys_fit(db: str, tmp_path: Path) -> None:
    """The keys pass's peak (traced) is flat in the rows under a budget; a table whose keys fit keeps them."""
    peaks = {}
    for rows in (100_000, 400_000):
        execute(db, "DROP TABLE IF EXISTS big", "DROP TABLE IF EXISTS flat")
        load_tables(db, series=1, rows=rows)
        cfg = load_config(scan_config(tmp_path / f"c{rows}", **ROWS, extra='memory = "2MiB"'), dsn=db)
        on_disk, peaks[rows] = asyncio.run(_traced_plan(cfg, tmp_path / f"keys-{rows}"))
        assert on_disk
    assert peaks[400_000] - peaks[100_000] < 2e6, peaks  # measured 0.3 MB; in memory: 24 MB and up
    execute(
        db,
        "CREATE TABLE wide (id bigint NOT NULL, emb real[] NOT NULL)",  # 136 bytes a row: the keys fit, the data not
        "INSERT INTO wide SELECT i, array_fill(i::real, ARRAY[32]) FROM generate_series(1, 20000) i ORDER BY random()",
    )
    wide = {"table": "wide", "key": "id", "fields": {"emb": (["emb"], "float32")}}
    # 8 MiB: the process's budget, of which the writer and the heap take about half (pgprefetch.write.memory.policy)
    fits = load_config(scan_config(tmp_path / "fits", **wide, extra='memory = "8MiB"'), dsn=db)
    on_disk, _ = asyncio.run(_traced_plan(fits, tmp_path / "keys-fits"))
    assert not on_disk  # its keys held: nothing went to disk
    assert not (tmp_path / "keys-fits").exists()


async def _traced_plan(cfg: Config, folder: Path) -> tuple[bool, int]:
    """A check's keys pass of ``cfg``'s table (the keys-only strategy): whether its keys went to disk, its peak."""
    async with Snapshot.open(cfg.source) as snap:
        tracemalloc.start()
        try:
            coding = Coding(cfg, snap, None)
            job = ScanJob(cfg, snap, 0, await coding.shape(), coding, Estimate(), SpillFolder(folder))
            async with KeysOnly().open(job) as plan:
                return isinstance(plan.keys, OrderedKeys), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def test_kill_9_while_keys_are_on_disk_then_rerun_gives_the_clean_bytes(tables: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path / "a", **WINDOWS, extra=TINY)
    store = tmp_path / "a" / "store.zarr"
    keys = store / ".pgprefetch" / "partial" / "epoch-00000.spill"
    kill_9_mid_dump(cfg, tables, lambda: (keys / "samples" / "ordered").exists())
    assert not (store / "epoch-00000").exists()
    rerun = dump(cfg, tables)
    clean = dump(scan_config(tmp_path / "b", **WINDOWS), tables)
    assert chunk_bytes(rerun.path) == chunk_bytes(clean.path)
    assert not keys.exists()


def test_scratch_takes_the_keys_and_a_full_one_is_one_line_with_nothing_published(tables: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path / "a", **WINDOWS, extra=TINY)
    store = tmp_path / "a" / "store.zarr"
    scratch = tmp_path / "scratch"
    argv = [*dump_argv(cfg, tables), "--scratch", str(scratch)]
    proc = dump_on_a_full_disk(argv, 256 << 10, timeout=120)  # writes past 256 KiB fail; the keys take ~2 MB
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    # The first file past the cap, in the scratch: the passes' files, their sorted rows, or the keys' sort.
    spill = rf"{re.escape(str(scratch))}/pgprefetch-[0-9a-f]{{12}}-epoch-00000\.spill/(partition|sorted|samples)"
    assert re.fullmatch(rf"Error: cannot write {spill}: File too large; {RESUME_HINT}", proc.stderr.splitlines()[-1]), (
        proc.stderr
    )
    assert not (store / "epoch-00000").exists()
    assert not list(scratch.iterdir())
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not list(scratch.iterdir())  # removed after the epoch
    assert not list((store / ".pgprefetch" / "partial").iterdir())  # and never beside the store
    clean = dump(scan_config(tmp_path / "b", **WINDOWS), tables)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


def test_scratch_in_the_config_is_a_local_folder_relative_to_it(tmp_path: Path) -> None:
    cfg = load_config(scan_config(tmp_path, **ROWS, extra='scratch = "tmp/keys"'))
    assert cfg.source.scratch == tmp_path / "tmp" / "keys"
    assert load_config(scan_config(tmp_path, **ROWS), scratch="/var/x").source.scratch == Path("/var/x")
    with pytest.raises(Exception, match=r"\[source\] scratch: expected a local folder"):
        load_config(scan_config(tmp_path, **ROWS, extra='scratch = "s3://bucket/keys"'))


@pytest.mark.scale
def test_two_million_rows_in_eight_or_more_buckets_give_the_in_memory_bytes(
    db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The scale test: 2,000,000 rows (and windows over 2,000,000 rows) under 8 MiB against the dump in memory."""
    load_tables(db, series=6500, rows=2_000_000)
    for name, settings in (("rows", ROWS), ("windows", {**WINDOWS, "stride": 8})):
        with caplog.at_level(logging.INFO, logger="pgprefetch"):
            spilled = dump(scan_config(tmp_path / f"s-{name}", **settings, size=4096, extra='memory = "8MiB"'), db)
        if name == "rows":
            rows, stretches = logged(caplog, STRETCH_LINE)
            assert stretches >= 8
        else:
            rows, _, passes = logged(caplog, WINDOWS_LINE)
            assert passes >= 8
        assert rows >= 2_000_000
        whole = dump(scan_config(tmp_path / f"w-{name}", **settings, size=4096, extra='memory = "1GiB"'), db)
        assert spilled.n_samples == whole.n_samples
        assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
        caplog.clear()


def test_a_link_planted_for_the_spill_folder_is_replaced_not_followed(tables: str, tmp_path: Path) -> None:
    """The passes write into the epoch's spill folder beside its partial epoch: a link planted there leads nowhere."""
    outside = tmp_path / "outside"
    outside.mkdir()
    meta = tmp_path / "s" / "store.zarr" / ".pgprefetch"
    (meta / "partial").mkdir(parents=True)
    (meta / "partial" / "epoch-00000.spill").symlink_to(outside, target_is_directory=True)
    spilled = dump(scan_config(tmp_path / "s", **WINDOWS, extra=TINY), tables)
    assert not list(outside.iterdir())  # nothing of the passes' rows, windows or starts written through it
    assert not (meta / "partial" / "epoch-00000.spill").exists()
    whole = dump(scan_config(tmp_path / "w", **WINDOWS), tables)
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)


# ---- rows beyond memory, in stretches: faults ------------------------------------------------------------------

SLOW_FLAT = "SELECT id, v, w, CASE WHEN id % 7000 = 0 THEN pg_sleep(0.005) END AS pause FROM flat"  # one COPY, ~1 s


def test_a_connection_terminated_while_rows_are_split_into_stretches_is_retried(tables: str, tmp_path: Path) -> None:
    """The connections killed while the rows stream into the stretches' files: retried, the same bytes."""
    import threading

    from pgprefetch import dump_epoch
    from pgprefetch.pg.retry import RetryPolicy

    from .harness.faults import kill_every_connection

    rows = {**ROWS, "table": SLOW_FLAT}
    cfg = scan_config(tmp_path / "s", **rows, extra=TINY)
    ranges = tmp_path / "s" / "store.zarr" / ".pgprefetch" / "partial" / "epoch-00000.spill" / "ranges"

    def kill_once_split() -> None:
        deadline = time.monotonic() + 60
        while not ranges.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # rows are streaming into the ranges' files
        kill_every_connection(tables)

    killer = threading.Thread(target=kill_once_split)
    killer.start()
    result = asyncio.run(dump_epoch(load_config(cfg, dsn=tables), 0, retries=RetryPolicy(first_wait=0.1)))
    killer.join()
    assert result.retry_causes.get("terminated", 0) >= 1, result.retry_causes
    whole = dump(scan_config(tmp_path / "w", **ROWS), tables)
    assert chunk_bytes(result.path) == chunk_bytes(whole.path)


def test_kill_9_while_stretches_are_written_then_rerun_gives_the_clean_bytes(tables: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path / "a", **ROWS, extra=TINY)
    spool = tmp_path / "a" / "store.zarr" / ".pgprefetch" / "partial" / "epoch-00000.spill"
    kill_9_mid_dump(cfg, tables, lambda: (spool / "stretches" / "samples").exists())
    assert not (tmp_path / "a" / "store.zarr" / "epoch-00000").exists()
    rerun = dump(cfg, tables)
    clean = dump(scan_config(tmp_path / "b", **ROWS), tables)
    assert chunk_bytes(rerun.path) == chunk_bytes(clean.path)
    assert not spool.exists()
