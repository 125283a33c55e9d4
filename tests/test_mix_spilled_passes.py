"""A mixed scan source's passes on disk walk its keys exactly as the passes in memory do (#52).

:class:`~pgprefetch.write.mix.spilled.SpilledPasses` finds a run of a pass order by counting hashes in
ranges and sorting only the ranges the run touches; :class:`~pgprefetch.write.mix.passes.Passes` sorts the
whole pass. Both must give the same keys, in the same order, from any position, across pass boundaries,
and agree on the positions and records that carry a source from one epoch to the next.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgprefetch.write.mix import spilled
from pgprefetch.write.mix.passes import Passes, Position, choose
from pgprefetch.write.mix.spilled import SpilledIndex, SpilledPasses
from pgprefetch.write.spill.folder import SpillFolder

SEED, NAME = 7, "events"


def _both(tmp_path: Path, keys: np.ndarray, buckets: int) -> tuple[Passes, SpilledPasses]:
    """The same chosen keys as passes in memory and on disk (appended bucket by bucket, in several blocks)."""
    chosen = choose(keys, seed=SEED, name=NAME, fraction=1.0, drop=False, where="[samples.events]")
    index = SpilledIndex(SpillFolder(tmp_path / "spill"), keys.shape[0])
    bucket = np.arange(keys.shape[1]) % buckets
    for b in range(buckets):
        mine = np.flatnonzero(bucket == b)
        index.append(keys[:, mine], b, mine)
    return Passes(chosen, seed=SEED, name=NAME), SpilledPasses(index, seed=SEED, name=NAME)


def _taken_keys(memory: Passes, disk: SpilledPasses, at: Position, n: int) -> tuple[np.ndarray, np.ndarray]:
    columns, end = memory.take(at, n)
    rows, end_on_disk = disk.take(at, n)
    assert end == end_on_disk
    return memory.chosen.keys[:, columns], disk.index.pick(rows)[0]


@pytest.mark.parametrize("width", [1, 2])
def test_a_run_taken_on_disk_is_the_run_taken_in_memory_from_any_position(
    tmp_path: Path, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spilled, "BLOCK_ROWS", 1000)  # several blocks a bucket
    rng = np.random.default_rng(width)
    m = 30_000
    keys = rng.choice(1 << 40, size=(width, m), replace=False).astype(np.int64)
    memory, disk = _both(tmp_path, keys, buckets=7)
    assert disk.m == memory.m == m
    for at, n in [
        (Position(0, 0), 1),
        (Position(0, 0), m),  # one whole pass
        (Position(3, 12_345), 5_000),  # inside a pass
        (Position(1, m - 10), 25),  # across a pass boundary
        (Position(2, 17), 2 * m + 5),  # over two passes and more
        (Position(4, m), 3),  # at a pass's end: the next one begins
    ]:
        in_memory, on_disk = _taken_keys(memory, disk, at, n)
        assert on_disk.shape == (width, n)
        np.testing.assert_array_equal(on_disk, in_memory)


def test_positions_and_records_agree_with_the_passes_in_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 40, size=(1, 5_000), replace=False).astype(np.int64)
    memory, disk = _both(tmp_path, keys, buckets=3)
    for at in [Position(0, 0), Position(0, 1), Position(2, 2_500), Position(5, 4_999)]:
        assert disk.after(at) == memory.after(at)  # what a record says of a position
        record = memory.after(at)
        assert disk.locate(at.pass_, record) == memory.locate(at.pass_, record) == at
    memory.take(Position(1, 100), 400)
    disk.take(Position(1, 100), 400)
    assert disk.after(Position(1, 500)) == memory.after(Position(1, 500))  # the last key taken, remembered
    # a key recorded that is no longer there (deleted since): both continue after where it would be
    gone = memory.after(Position(1, 2_000))
    assert gone is not None
    shifted = (gone[0], [gone[1][0] + 1])
    assert disk.locate(1, shifted) == memory.locate(1, shifted)


def test_an_index_picks_keys_and_their_places_by_row_in_any_order(tmp_path: Path) -> None:
    index = SpilledIndex(SpillFolder(tmp_path / "spill"), 2)
    keys = np.arange(20, dtype=np.int64).reshape(2, 10)
    index.append(keys[:, :6], 4, np.arange(100, 106))
    index.append(keys[:, 6:], 9, np.arange(200, 204))
    picked, buckets, starts = index.pick(np.array([7, 0, 7, 5], dtype=np.int64))
    np.testing.assert_array_equal(picked, keys[:, [7, 0, 7, 5]])
    np.testing.assert_array_equal(buckets, [9, 4, 9, 4])
    np.testing.assert_array_equal(starts, [201, 100, 201, 105])
