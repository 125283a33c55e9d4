"""The one spill format and the one spill folder (#52): rows read back as written, files private and never linked."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgprefetch.errors import StoreError
from pgprefetch.write.spill.columns import ColumnFile
from pgprefetch.write.spill.folder import SpillFolder


def _chunk(first: int, n: int) -> dict[str, np.ndarray]:
    rows = np.arange(first, first + n)
    return {
        "k0": rows.astype(np.int64),
        "v": np.stack([rows * 0.5, rows * 2.0], axis=1).astype(np.float32),  # a row of two values
        "m": rows % 3 == 0,
    }


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.integers(0, 300), min_size=1, max_size=8), data=st.data())
def test_any_range_of_rows_reads_back_as_the_blocks_appended(
    tmp_path_factory: pytest.TempPathFactory, blocks: list[int], data: st.DataObject
) -> None:
    folder = SpillFolder(tmp_path_factory.mktemp("spill") / "s")
    file = ColumnFile(folder.create("rows"))
    at = 0
    for n in blocks:
        if data.draw(st.booleans(), label="as pieces"):
            half = n // 2
            file.append_pieces([_chunk(at, half), _chunk(at + half, n - half)])
        else:
            file.append(_chunk(at, n))
        at += n
    whole = _chunk(0, at)
    assert file.rows == at
    first = data.draw(st.integers(0, at), label="first")
    stop = data.draw(st.integers(first, at), label="stop")
    got = file.read(first, stop, ["v", "m"])
    assert np.array_equal(got["v"], whole["v"][first:stop])
    assert np.array_equal(got["m"], whole["m"][first:stop])
    out = {"k0": np.full(at + 5, -1, np.int64)}
    assert np.array_equal(file.read(first, stop, ["k0"], out)["k0"], whole["k0"][first:stop])
    assert np.array_equal(out["k0"][: stop - first], whole["k0"][first:stop])  # into the caller's buffer
    blocks_read = list(file.read_blocks())
    assert [len(b["k0"]) for b in blocks_read] == [n for n in blocks if n]
    folder.remove()


def test_a_block_written_a_column_at_a_time_reads_as_one_written_whole(tmp_path: Path) -> None:
    folder = SpillFolder(tmp_path / "s")
    schema = {f"k{j}": (np.dtype(np.int64), ()) for j in range(3)}
    lazy, whole = ColumnFile(folder.create("lazy"), schema), ColumnFile(folder.create("whole"), schema)
    keys = np.arange(30, dtype=np.int64).reshape(3, 10)
    lazy.append_lazily(10, (column for column in keys))
    whole.append({f"k{j}": keys[j] for j in range(3)})
    assert all(np.array_equal(lazy.read(2, 9)[n], whole.read(2, 9)[n]) for n in schema)
    assert (tmp_path / "s" / "lazy").read_bytes() == (tmp_path / "s" / "whole").read_bytes()


def test_the_spill_folder_is_private_made_on_first_use_and_removed_whole(tmp_path: Path) -> None:
    folder = SpillFolder(tmp_path / "epoch-00000.spill")
    assert not folder.path.exists()  # nothing spilled, nothing made
    keys = folder.sub("keys")
    ColumnFile(keys.create("runs")).append(_chunk(0, 10))
    assert stat.S_IMODE(folder.path.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder.path / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE((folder.path / "keys" / "runs").stat().st_mode) == 0o600
    folder.remove()
    assert not folder.path.exists()


def test_a_killed_dumps_leftovers_go_and_a_planted_link_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("precious")
    (tmp_path / "epoch-00000.spill").symlink_to(outside, target_is_directory=True)
    folder = SpillFolder(tmp_path / "epoch-00000.spill")
    ColumnFile(folder.create("rows")).append(_chunk(0, 10))
    assert not folder.path.is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    folder.remove()
    leftover = tmp_path / "again.spill"
    leftover.mkdir()
    (leftover / "rows").write_text("a killed dump's rows")
    again = SpillFolder(leftover)
    ColumnFile(again.create("rows")).append(_chunk(0, 3))  # made afresh: the old file is gone, not appended to
    assert again.sub("x").path.parent == leftover
    assert ColumnFile(again.create("other")).rows == 0
    assert (leftover / "rows").stat().st_size == 3 * (8 + 8 + 1)


def test_a_file_name_taken_in_the_folder_is_refused_not_written_through(tmp_path: Path) -> None:
    folder = SpillFolder(tmp_path / "s")
    ColumnFile(folder.create("rows")).append(_chunk(0, 2))
    (tmp_path / "target").write_text("x")
    (folder.path / "planted").symlink_to(tmp_path / "target")
    with pytest.raises((StoreError, FileExistsError)):
        ColumnFile(folder.create("planted")).append(_chunk(0, 2))
    assert (tmp_path / "target").read_text() == "x"


def test_a_short_write_goes_on_from_where_it_stopped_without_copying_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pwritev`` may write less than asked (2 GiB at most a call, a signal): the rest follows, byte for byte."""
    import os

    from pgprefetch.write.files import io

    real = os.pwritev

    def at_most_7(fd: int, buffers: list[memoryview], offset: int) -> int:
        return real(fd, [bytes(b"".join(bytes(b) for b in buffers[:2]))[:7]], offset)

    pieces = [np.arange(n, dtype=np.uint8).data for n in (3, 0, 10, 1, 25)]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(io.os, "pwritev", at_most_7)
        assert io.pwritev_all(fd, pieces, 4) == 39
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"\0" * 4 + b"".join(bytes(p) for p in pieces)
