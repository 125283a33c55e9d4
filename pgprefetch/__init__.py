"""pgprefetch: pre-generate shuffled, snapshot-consistent training epochs from PostgreSQL into Zarr.

The dump side (``config``, ``pg``, ``decode``, ``store``, ``write``) never imports torch, so cron start-up
stays fast; the reader (``read``: :class:`EpochDataset`, :class:`EpochStream`) is imported lazily on first
use. README.md's code map says what each subpackage holds and which may import which.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pgprefetch._version import __version__
from pgprefetch.api import build_config, dump, ls, prune, verify
from pgprefetch.config import Config, load_config
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
from pgprefetch.keys import KeyColumns, uuid_bytes, uuid_slots
from pgprefetch.store import Store, open_store
from pgprefetch.write import DumpResult, dump_epoch, dump_epochs

if TYPE_CHECKING:
    from pgprefetch.read.dataset import EpochDataset
    from pgprefetch.read.padding import lengths_to_mask
    from pgprefetch.read.stream import EpochStream

__all__ = [
    "Config",
    "ConfigError",
    "DumpResult",
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
    "lengths_to_mask",
    "load_config",
    "ls",
    "open_store",
    "prune",
    "uuid_bytes",
    "uuid_slots",
    "verify",
]


_READER = {"EpochDataset": "read.dataset", "EpochStream": "read.stream", "lengths_to_mask": "read.padding"}  # torch


def __getattr__(name: str) -> Any:
    if name in _READER:
        try:
            module = importlib.import_module(f".{_READER[name]}", __name__)
        except ImportError as e:
            if e.name != "torch":
                raise
            raise ImportError(f"pgprefetch.{name} needs torch: pip install 'pgprefetch[torch]'", name="torch") from None
        return getattr(module, name)
    raise AttributeError(f"module 'pgprefetch' has no attribute {name!r}")
