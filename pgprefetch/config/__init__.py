"""The configuration: frozen dataclasses built once at the edge, from a TOML file or in code.

``model`` holds the objects, ``values`` the parsers of hand-typed values, ``parse`` checks the raw tables
key by key, and ``load`` reads a file and applies the command line's overrides. Everything past
:func:`load_config` sees only these frozen objects. ``load`` (and ``parse``, which loads numpy) is imported on
first use: the command line's start-up needs ``values`` only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pgprefetch.config.model import (
    BatchesConfig,
    Config,
    FieldConfig,
    SamplesConfig,
    ScanConfig,
    SourceConfig,
    StoreConfig,
)
from pgprefetch.config.values import parse_duration, parse_size, store_location

if TYPE_CHECKING:
    from pgprefetch.config.load import load_config, parse_config, with_overrides

__all__ = [
    "BatchesConfig",
    "Config",
    "FieldConfig",
    "SamplesConfig",
    "ScanConfig",
    "SourceConfig",
    "StoreConfig",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_size",
    "store_location",
    "with_overrides",
]


def __getattr__(name: str) -> Any:
    if name in ("load_config", "parse_config", "with_overrides"):
        return getattr(importlib.import_module(".load", __name__), name)
    raise AttributeError(f"module 'pgprefetch.config' has no attribute {name!r}")
