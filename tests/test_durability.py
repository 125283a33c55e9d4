"""An epoch is on disk before it is published: its own files synced, as each is finished and at publication.

The dump syncs the files it wrote (``fdatasync`` per file, ``fsync`` per folder) instead of the whole
filesystem, so a publication does not wait for other processes' dirty pages. What these tests pin down is
the contract that replaces ``syncfs``: every file and folder of the epoch is synced *before* the rename
that publishes it, and a write-back that fails stops the publication.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pgprefetch.errors import StoreError
from pgprefetch.store import durable, local

from .harness.configs import s_config
from .harness.dumps import chunk_bytes, dump


def _path_of(fd: int) -> Path:
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    """Every sync the dump makes, in order: ("data", file) or ("dir", folder); the real syncs still run."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name a descriptor's file")
    calls: list[tuple[str, Path]] = []
    real_data, real_dir = durable.sync_data, durable.sync_dir

    def sync_data(fd: int) -> None:
        calls.append(("data", _path_of(fd)))
        real_data(fd)

    def sync_dir(fd: int) -> None:
        calls.append(("dir", _path_of(fd)))
        real_dir(fd)

    monkeypatch.setattr(durable, "sync_data", sync_data)
    for module in (durable, local):
        monkeypatch.setattr(module, "sync_dir", sync_dir)
    return calls


def test_every_file_and_folder_of_an_epoch_is_synced_before_it_is_published(
    s_table: str, tmp_path: Path, synced: list[tuple[str, Path]]
) -> None:
    result = dump(s_config(tmp_path), s_table)
    final = Path(result.path)
    partial = tmp_path / "store.zarr" / ".pgprefetch" / "partial" / final.name
    # What was synced under the partial folder: before the rename that published it.
    before = {(kind, path.relative_to(partial)) for kind, path in synced if path.is_relative_to(partial)}
    files = {("data", p.relative_to(final)) for p in final.rglob("*") if p.is_file()}
    folders = {("dir", p.relative_to(final)) for p in [final, *final.rglob("*")] if p.is_dir()}
    assert files
    assert files <= before, sorted(files - before)
    assert folders <= before, sorted(folders - before)
    assert ("dir", final.parent) in synced  # the rename itself, after
    # The shard files went to disk as they were finished (the local store's write-back), then the sweep.
    shards = {p for _, p in files if p.parts[0] in ("v", "keys") and p.parts[1] == "c"}
    flushed = [path.relative_to(partial) for kind, path in synced if kind == "data" and path.is_relative_to(partial)]
    assert shards
    assert all(flushed.count(p) == 2 for p in shards), flushed


def test_a_write_back_that_fails_stops_the_publication_and_the_next_dump_resumes(
    s_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = s_config(tmp_path)

    def failing(self: durable.WriteBack, path: Path) -> None:  # what a disk says when it cannot write back
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(durable.WriteBack, "_write_back", failing)
    with pytest.raises(StoreError, match=r"^cannot write \S+/\.pgprefetch/partial/epoch-00000: Input/output error$"):
        dump(cfg, s_table)
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()
    monkeypatch.undo()
    again = dump(cfg, s_table)
    assert again.status == "written"
    assert again.resumed > 0
    (tmp_path / "clean").mkdir()
    assert chunk_bytes(Path(again.path)) == chunk_bytes(Path(dump(s_config(tmp_path / "clean"), s_table).path))
