"""pgprefetch: pre-generate shuffled, snapshot-consistent training epochs from PostgreSQL into Zarr.

The dump side (``config``, ``pg``, ``decode``, ``store``, ``write``) never imports torch, JAX or Grain, so
cron start-up stays fast; and the library's names are imported on first use too, so ``import pgprefetch``
alone (``pgprefetch --version``, ``--help``) does not load zarr, numpy or asyncpg. The readers are imported
lazily on first use as well: the NumPy core (``read``: :class:`EpochArrays`, :class:`ArrayStream`, no
framework needed) and the torch layer (``torch``: :class:`EpochDataset`, :class:`EpochStream`,
:func:`lengths_to_mask`); ``pgprefetch.jax`` and ``pgprefetch.grain`` are imported by name. README.md's
code map says what each subpackage holds and which may import which.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pgprefetch._version import __version__
from pgprefetch.errors import (
    ConfigError,
    EpochNotFoundError,
    EpochNotReadyError,
    FormatVersionError,
    PgprefetchError,
    SampleError,
    SourceError,
    StoreError,
    StoreNotFoundError,
)

if TYPE_CHECKING:
    from pgprefetch.api import build_config, dump, forget, ls, prune, verify
    from pgprefetch.config import Config, load_config
    from pgprefetch.keys import KeyColumns, uuid_bytes, uuid_slots
    from pgprefetch.read.epoch import EpochArrays
    from pgprefetch.read.stream import ArrayStream
    from pgprefetch.store import Store, open_store
    from pgprefetch.torch.dataset import EpochDataset
    from pgprefetch.torch.padding import lengths_to_mask
    from pgprefetch.torch.stream import EpochStream
    from pgprefetch.write import DumpResult, dump_epoch, dump_epochs

__all__ = [
    "ArrayStream",
    "Config",
    "ConfigError",
    "DumpResult",
    "EpochArrays",
    "EpochDataset",
    "EpochNotFoundError",
    "EpochNotReadyError",
    "EpochStream",
    "FormatVersionError",
    "KeyColumns",
    "PgprefetchError",
    "SampleError",
    "SourceError",
    "Store",
    "StoreError",
    "StoreNotFoundError",
    "__version__",
    "build_config",
    "dump",
    "dump_epoch",
    "dump_epochs",
    "forget",
    "lengths_to_mask",
    "load_config",
    "ls",
    "open_store",
    "prune",
    "uuid_bytes",
    "uuid_slots",
    "verify",
]


# Imported on first use, so that `import pgprefetch` (and `pgprefetch --version`) does not load zarr,
# numpy and asyncpg: the library's names, the NumPy readers, the torch layer.
_LIBRARY = {
    **dict.fromkeys(("build_config", "dump", "forget", "ls", "prune", "verify"), "api"),
    **dict.fromkeys(("Config", "load_config"), "config"),
    **dict.fromkeys(("KeyColumns", "uuid_bytes", "uuid_slots"), "keys"),
    **dict.fromkeys(("Store", "open_store"), "store"),
    **dict.fromkeys(("DumpResult", "dump_epoch", "dump_epochs"), "write"),
}
_READERS = {"EpochArrays": "read.epoch", "ArrayStream": "read.stream"}  # NumPy: no framework needed
_TORCH = {"EpochDataset": "torch.dataset", "EpochStream": "torch.stream", "lengths_to_mask": "torch.padding"}


def __getattr__(name: str) -> Any:
    if name in _LIBRARY:
        value = getattr(importlib.import_module(f".{_LIBRARY[name]}", __name__), name)
        globals()[name] = value  # found here from now on, without this function
        return value
    if name in _READERS:
        return getattr(importlib.import_module(f".{_READERS[name]}", __name__), name)
    if name in _TORCH:
        try:
            module = importlib.import_module(f".{_TORCH[name]}", __name__)
        except ImportError as e:
            if e.name != "torch":
                raise
            raise ImportError(f"pgprefetch.{name} needs torch: pip install 'pgprefetch[torch]'", name="torch") from None
        return getattr(module, name)
    raise AttributeError(f"module 'pgprefetch' has no attribute {name!r}")
