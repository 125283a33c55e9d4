"""Small epochs for the readers' tests: ``s(id, v = id)``, so that a batch's values are its sample keys.

The readers' tests (NumPy, torch, JAX, Grain, the reader contracts) check which samples each step sees;
with ``v`` the key itself, what a reader returns says where it came from. ``shard_batches`` makes shard
files that small, so that reads cross them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import pgprefetch.write.files.shardfiles

from .configs import SEQUENCES, write_config
from .db import own_database
from .dumps import dump


def counting_table(n: int) -> tuple[str, str]:
    """``s(id, v = id)`` of ``n`` rows."""
    return (
        "CREATE TABLE s (id int PRIMARY KEY, v bigint NOT NULL)",
        f"INSERT INTO s SELECT i, i FROM generate_series(1, {n}) i",
    )


def counting_config(folder: Path, *, size: int, drop_last: bool = True) -> Path:
    """One sample a row of ``s``, the field ``v`` (the key)."""
    return write_config(
        folder,
        keys="SELECT id FROM s",
        query="SELECT v FROM s WHERE id = $1",
        fields={"v": (["v"], "int64")},
        size=size,
        drop_last=drop_last,
    )


def dump_with_shards(config: Path, dsn: str, epochs: tuple[int, ...], shard_bytes: int | None = None) -> None:
    """Dump ``epochs`` of ``config``; ``shard_bytes`` makes shard files that small, so that reads cross them."""
    with pytest.MonkeyPatch.context() as mp:
        if shard_bytes is not None:
            mp.setattr(pgprefetch.write.files.shardfiles, "SHARD_BYTES", shard_bytes)
        for epoch in epochs:
            dump(config, dsn, epoch=epoch)


def dump_counting(
    dsn: str,
    folder: Path,
    *,
    size: int,
    drop_last: bool = True,
    epochs: tuple[int, ...] = (0,),
    shard_batches: int | None = None,
) -> Path:
    """Dump ``epochs`` of ``s`` (see :func:`counting_table`) into ``folder``'s store; return the store."""
    config = counting_config(folder, size=size, drop_last=drop_last)
    dump_with_shards(config, dsn, epochs, None if shard_batches is None else shard_batches * size * 8)
    return folder / "store.zarr"


def sequences_store(demo_db: str, folder: Path, *, size: int, shard_batches: int) -> Path:
    """Epochs 0 and 1 of the demo's sequences (``SEQUENCES``) in batches of ``size``, a short last one kept."""
    config = write_config(folder, **{**SEQUENCES, "size": size, "drop_last": False})  # type: ignore[arg-type]
    dump_with_shards(config, demo_db, (0, 1), shard_batches * size * 64 * 2 * 4)  # x: 64 rows of 2 float32
    return folder / "store.zarr"


def swap_shard_chunks(store: Path, copy: Path, chunk: int) -> list[int]:
    """``store`` copied to ``copy``, the two chunks of epoch 2's first ``v`` shard swapped and its index to match.

    zarr itself may write a shard's chunks in any order; its index says where each one is, and the readers
    must follow it. Returns the chunks' offsets as they were (pgprefetch writes them back to back).
    """
    import shutil

    import google_crc32c
    import numpy as np

    shutil.copytree(store, copy)
    shard = copy / "epoch-00002" / "v" / "c" / "0" / "0"
    data = shard.read_bytes()
    index_bytes = 2 * 16 + 4
    index = np.frombuffer(data[-index_bytes:-4], dtype="<u8").reshape(2, 2).copy()
    before = index[:, 0].tolist()
    index[:, 0] = [chunk, 0]  # the same chunks, swapped
    raw = index.tobytes()
    shard.write_bytes(data[chunk : 2 * chunk] + data[:chunk] + raw + google_crc32c.value(raw).to_bytes(4, "little"))
    return before


@contextmanager
def counting_store(pg_dsn: str, folder: Path, *, n: int, **settings: Any) -> Iterator[Path]:
    """A store of ``s(id, v = id)``, ``n`` rows, from a database of its own; ``settings`` as :func:`dump_counting`'s.

    The database is dropped afterwards; the store stays in ``folder``.
    """
    with own_database(pg_dsn, *counting_table(n)) as dsn:
        yield dump_counting(dsn, folder, **settings)


def counting_store_fixture(name: str, **settings: Any) -> Callable[..., Iterator[Path]]:
    """A module's ``store`` fixture: :func:`counting_store` with ``settings``, in a temp folder named ``name``."""

    @pytest.fixture(scope="module")
    def store(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        with counting_store(pg_dsn, tmp_path_factory.mktemp(name), **settings) as path:
            yield path

    return store


def assert_a_partial_epoch_is_not_read(reader: Callable[..., object], store: Path, copy: Path, timeout: float) -> None:
    """``reader`` (EpochArrays, EpochDataset) refuses epoch 4 of ``copy``, a copy of ``store`` where it is partial.

    At once without ``wait``; after ``timeout`` seconds with it, saying it gave up.
    """
    import shutil

    from pgprefetch.errors import EpochNotReadyError

    shutil.copytree(store, copy)
    (copy / ".pgprefetch" / "partial" / "epoch-00004").mkdir(parents=True)
    with pytest.raises(EpochNotReadyError) as partial:
        reader(copy, epoch=4)
    assert str(partial.value) == f"epoch 4 in {copy} is still being written (or its dump died)"
    with pytest.raises(EpochNotReadyError, match=rf"gave up waiting after {timeout} s$"):
        reader(copy, epoch=4, wait=True, timeout=timeout)


def claim_format_version(epoch: Path, version: int) -> None:
    """Rewrite ``epoch``'s manifest to claim format ``version``, as a newer pgprefetch would have written it."""
    import json

    meta = epoch / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["pgprefetch"]["format_version"] = version
    meta.write_text(json.dumps(doc))
