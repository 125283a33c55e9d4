"""A training script as a user writes it against pgprefetch's public API; tests/test_typing.py type-checks it.

Never run (it would need a server and a store): mypy --strict must pass it, and each ``assert_type`` pins
what the API gives, so an annotation that went vague (``Any``) or wrong fails the check, not a user.
"""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import jax
import numpy as np
import torch

import pgprefetch
import pgprefetch.grain
import pgprefetch.jax
from pgprefetch import (
    ArrayStream,
    Config,
    ConfigError,
    DumpResult,
    EpochArrays,
    EpochDataset,
    EpochNotFoundError,
    EpochNotReadyError,
    EpochStream,
    PgprefetchError,
    SourceError,
    StoreError,
)


def dump_side(store: Path) -> None:
    cfg = pgprefetch.build_config(
        {
            "source": {"connections": 2},
            "samples": {"keys": "SELECT id FROM s", "query": "SELECT v FROM s WHERE id = $1"},
            "fields": {"v": {"columns": ["v"], "dtype": "float32"}},
            "batches": {"size": 16},
            "store": {"path": str(store)},
        },
        dsn="postgresql://localhost/train",
        connections=4,
    )
    assert_type(cfg, Config)
    assert_type(cfg.mode, str)
    try:
        results = pgprefetch.dump(cfg, epochs=range(3), force=False, retries=2)
    except SourceError as e:
        assert_type(e.transient, bool)
        raise
    except ConfigError as e:
        assert_type(e.exit_code, int)
        raise
    assert_type(results, list[DumpResult])
    for result in results:
        assert_type(result.n_samples, int)
        assert_type(result.path, Path | str)
    for info in pgprefetch.ls(store):
        assert_type(info.epoch, int)
    assert_type(pgprefetch.verify(store, 0), list[str])
    assert_type(pgprefetch.prune(store, keep=1, dry_run=True).epochs, list[int])
    assert_type(pgprefetch.load_config("configs/demo.toml", dsn="postgresql://localhost/train"), Config)


def torch_side(store: Path) -> float:
    total = 0.0
    try:
        ds = EpochDataset(store, epoch=0, fields=["v"], batch_size=32, wait=True, timeout=60.0)
    except EpochNotFoundError:
        return total
    except (EpochNotReadyError, StoreError) as e:
        raise SystemExit(str(e)) from e
    assert_type(len(ds), int)
    for i in range(len(ds)):
        batch = ds[i]
        assert_type(batch, dict[str, torch.Tensor])
        total += float(batch["v"].sum())
    assert_type(EpochDataset.from_config("configs/demo.toml", epoch=1, trim=True), EpochDataset)
    mask = pgprefetch.lengths_to_mask(torch.tensor([1, 2, 3]))
    assert_type(mask, torch.Tensor)
    stream = EpochStream(store, start_epoch=0, epochs=2, batch_size=32)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    for tensors in loader:
        total += float(tensors["v"].mean())
    state = stream.state_dict()
    stream.load_state_dict(state)
    return total


def numpy_jax_grain_side(store: Path) -> int:
    arrays = EpochArrays(store, 0, rank=jax.process_index(), world_size=jax.process_count())
    first = arrays[0]
    assert_type(first, dict[str, np.ndarray])
    assert_type(arrays.batch_keys(0), np.ndarray)
    seen = 0
    for batch in ArrayStream(store, 0, 1, batch_size=64):
        assert_type(batch, dict[str, np.ndarray])
        seen += batch["v"].shape[0]
    for on_device in pgprefetch.jax.device_batches(ArrayStream(store, epochs=1), prefetch=2, pad_last=True):
        assert_type(on_device, dict[str, jax.Array])
    source = pgprefetch.grain.EpochSource(store, 0, fields=["v"], keys=True)
    assert_type(len(source), int)
    assert_type(source[0], dict[str, np.ndarray])
    return seen


def main() -> None:
    store = Path("prefetch/demo.zarr")
    try:
        dump_side(store)
        print(torch_side(store), numpy_jax_grain_side(store))
    except PgprefetchError as e:
        raise SystemExit(f"pgprefetch: {e}") from None


if __name__ == "__main__":
    main()
