"""Windows beyond ``[source] memory`` are gathered a group of batches at a time (``pgprefetch.write.scan.sweep``).

The writer's threads take their units in any order they start them: a thread may ask for a later group
while another still takes batches from the group held, or asks for an earlier one. Whatever the order and
the threads, every batch is the batch the table held in memory gives (the dump tests compare whole epochs;
here the units are taken out of order, by more threads than a dump runs, to reach the group's hand-overs).
"""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pgprefetch import load_config
from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.sources import ReadCache, open_source
from pgprefetch.write.spill.folder import SpillFolder

from .harness.configs import scan_config
from .harness.spill import TINY_SOURCE, WINDOWS, load_tables

Units = list[tuple[int, int]]


def _units(n_batches: int, rng: random.Random) -> Units:
    """Every batch once, in units of 1-3 batches."""
    units, b = [], 0
    while b < n_batches:
        count = min(rng.randint(1, 3), n_batches - b)
        units.append((b, count))
        b += count
    return units


def _take(source: BatchSource, units: Units, size: int, threads: int) -> dict[int, dict[str, np.ndarray]]:
    """Each unit produced on ``threads`` threads at once, its arrays copied out as they come."""

    def one(unit: tuple[int, int]) -> tuple[int, dict[str, np.ndarray]]:
        first, count = unit
        buffers = source.allocate(count * size, count)
        source.produce(first, count, None, buffers)
        return first, buffers

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(pool.map(one, units))


async def _produced(cfg: Config, spill: Path, rounds: list[Units], threads: int) -> list[dict]:
    async with (
        Snapshot.open(cfg.source) as snap,
        open_source(cfg, 0, snap, ReadCache(), spill=SpillFolder(spill)) as source,
    ):
        assert isinstance(source, BatchSource)
        size = cfg.batches.size
        return [await asyncio.to_thread(_take, source, units, size, threads) for units in rounds]


def test_windows_beyond_memory_give_every_batch_in_whatever_order_and_threads_take_them(
    db: str, tmp_path: Path
) -> None:
    load_tables(db, series=120)
    spilled = load_config(scan_config(tmp_path / "s", **WINDOWS, extra=TINY_SOURCE), dsn=db)
    whole = load_config(scan_config(tmp_path / "w", **WINDOWS), dsn=db)
    rng = random.Random(3)
    units = _units(_n_batches(whole), rng)
    rounds = [rng.sample(units, len(units)) for _ in range(3)]  # the same units, each round in another order
    got = asyncio.run(_produced(spilled, tmp_path / "spool", rounds, threads=4))
    expected = asyncio.run(_produced(whole, tmp_path / "unused", [units], threads=1))[0]
    for taken in got:
        assert taken.keys() == expected.keys()
        for first, arrays in expected.items():
            for name, array in arrays.items():
                assert np.array_equal(taken[first][name], array), (first, name)


def _n_batches(cfg: Config) -> int:
    async def count() -> int:
        spill = SpillFolder.temporary()
        async with Snapshot.open(cfg.source) as snap, open_source(cfg, 0, snap, ReadCache(), spill=spill) as source:
            assert isinstance(source, BatchSource)
            return source.plan.n_batches

    return asyncio.run(count())
