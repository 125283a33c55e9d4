"""Small batches travel in units: fewer statements and writes, the same bytes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from pgprefetch import load_config
from pgprefetch.write.batches import local_unit_batches, unit_batches
from pgprefetch.write.pipeline import dump_epoch
from pgprefetch.write.schedule import UNIT_SECONDS, Units

from .harness.configs import s_config
from .harness.db import S_ROWS, fetch
from .harness.dumps import StopAfter, chunk_bytes, dump, read_arrays


def drain(units: Units, seconds: float) -> list[tuple[int, int]]:
    out = []
    while unit := units.next():
        out.append(unit)
        units.took(unit[1], seconds)
    return out


def test_units_double_while_fetches_are_fast_up_to_the_most_and_skip_written_batches() -> None:
    pending = [*range(0, 5), *range(7, 40)]  # batches 5 and 6 were kept from an interrupted dump
    got = drain(Units(pending, most=8), seconds=0.0)
    assert got == [(0, 1), (1, 2), (3, 2), (7, 4), (11, 8), (19, 8), (27, 8), (35, 5)]  # a gap cuts (3, 4) short
    assert [b for first, count in got for b in range(first, first + count)] == pending  # each once, in order


def test_units_stay_one_batch_when_a_fetch_is_slow_and_halve_when_one_turns_slow() -> None:
    assert drain(Units(list(range(5)), most=64), seconds=3 * UNIT_SECONDS) == [(b, 1) for b in range(5)]
    units = Units(list(range(100)), most=64)
    in_flight = [units.next() for _ in range(4)]  # four workers took a unit each, of one batch
    for unit in in_flight:
        units.took(unit[1], 0.0)  # type: ignore[index]
    assert units.count == 2  # one doubling: the other three were units of the old size
    for _ in range(3):
        unit = units.next()
        units.took(unit[1], 0.0)  # type: ignore[index]
    assert units.count == 16
    units.took(16, 3 * UNIT_SECONDS)
    assert units.count == 8


def test_unit_size_aims_at_about_a_thousand_samples_and_at_most_4_mib() -> None:
    assert unit_batches(10) == unit_batches(10, 400) == 102
    assert unit_batches(1024) == unit_batches(5000) == 1
    assert unit_batches(10, 16384) == 25  # 1,000 samples of 16 KiB would be 16 MiB of buffers
    assert unit_batches(10, 1 << 30) == 1


def test_units_with_nothing_to_fetch_hold_about_4_mib_of_samples() -> None:
    # Scan mode hands a unit from the event loop to a writer thread and back: few hand-offs, bounded buffers.
    assert local_unit_batches(1024, 92) == 44
    assert local_unit_batches(10, 8) == 52428
    assert local_unit_batches(256, 1 << 20) == 1  # a 256 MiB batch is a unit of its own


def _open_files() -> set[str]:
    folder = Path("/proc/self/fd")
    return {str(p.readlink()) for p in folder.iterdir() if p.is_symlink()} if folder.is_dir() else set()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_dump_leaves_no_file_open_whether_it_finishes_or_fails(s_table: str, tmp_path: Path) -> None:
    # Shard files stay open while their batches are written (one open per file, not per pwrite).
    cfg = load_config(s_config(tmp_path, size=5, connections=1), dsn=s_table)
    with pytest.raises(RuntimeError, match="interrupted"):
        asyncio.run(dump_epoch(cfg, 0, progress=StopAfter(3)))  # type: ignore[arg-type]
    assert not {f for f in _open_files() if "store.zarr" in f}
    asyncio.run(dump_epoch(cfg, 0))
    assert not {f for f in _open_files() if "store.zarr" in f}


def test_small_batches_share_statements_and_each_sample_equals_the_database(s_table: str, tmp_path: Path) -> None:
    # statement_timestamp() is the same for every sample of one statement: distinct values count statements.
    query = "SELECT v, extract(epoch FROM statement_timestamp())::float8 AS t FROM s WHERE id = $1"
    cfg = s_config(
        tmp_path, size=7, drop_last=False, query=query, fields={"v": (["v"], "float32"), "t": (["t"], "float64")}
    )
    result = dump(cfg, s_table)
    assert result.n_batches == -(-S_ROWS // 7)
    arrays = read_arrays(result)
    keys = arrays["keys"].reshape(-1)[:S_ROWS]
    v = arrays["v"].reshape(-1)
    truth = {r["id"]: r["v"] for r in fetch(s_table, "SELECT id, v FROM s")}
    assert sorted(keys.tolist()) == sorted(truth)  # a permutation of the table
    np.testing.assert_array_equal(v[:S_ROWS], [truth[k] for k in keys.tolist()])
    assert not v[S_ROWS:].any()  # the padded last batch
    statements = np.unique(arrays["t"].reshape(-1)[:S_ROWS]).size
    assert statements <= result.n_batches // 4, f"{statements} statements for {result.n_batches} batches"


def test_a_resumed_epoch_of_small_batches_with_gaps_is_byte_identical(s_table: str, tmp_path: Path) -> None:
    cfg = load_config(s_config(tmp_path, size=5, connections=1), dsn=s_table)
    with pytest.raises(RuntimeError, match="interrupted"):
        asyncio.run(dump_epoch(cfg, 0, progress=StopAfter(5)))  # type: ignore[arg-type]
    journal = tmp_path / "store.zarr" / ".pgprefetch" / "partial" / "epoch-00000.journal"
    header, *lines = journal.read_text().splitlines()
    written = [line for line in lines if not line.startswith("#")]
    assert len(written) > 5  # units of several batches
    kept = [line for i, line in enumerate(written) if i % 3]  # every third batch forgotten: gaps
    journal.write_text("\n".join([header, *kept]) + "\n")
    result = asyncio.run(dump_epoch(cfg, 0))
    assert result.resumed == len(kept)
    clean = dump(s_config(tmp_path, size=5, name="clean.toml", store="clean.zarr"), s_table)
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)
