"""pgprefetch: pre-generate shuffled, snapshot-consistent training epochs from PostgreSQL into Zarr.

The dump side (config, pipeline, store) never imports torch, so cron start-up stays fast; the reader,
:class:`EpochDataset` and :class:`EpochStream`, is imported lazily on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .api import build_config, dump, ls, prune, verify
from .config import Config, load_config
from .errors import (
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
from .keys import KeyColumns, uuid_bytes, uuid_slots
from .pipeline import DumpResult, dump_epoch, dump_epochs
from .store import Store

if TYPE_CHECKING:
    from .padding import lengths_to_mask
    from .reader import EpochDataset
    from .stream import EpochStream

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
    "prune",
    "uuid_bytes",
    "uuid_slots",
    "verify",
]


_READER = {"EpochDataset": "reader", "EpochStream": "stream", "lengths_to_mask": "padding"}  # need torch


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
