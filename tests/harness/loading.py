"""The config loader's own tests: a valid config as data, changed one key at a time, written, loaded or refused.

``VALID`` is the least config that loads; ``changed`` sets (or, with ``DELETE``, removes) one key of it;
``write`` puts data (through the tiny TOML writer ``to_toml``) or text in a file; ``load`` reads it with
no environment; ``error`` is the one-line message a refused file gets (tests/test_config.py,
tests/test_config_messages.py). No database: the files lie in a test's ``tmp_path``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pgprefetch.config.load import load_config
from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError

DELETE = object()

VALID: dict[str, Any] = {
    "samples": {"keys": "SELECT id FROM items", "query": "SELECT a, b FROM rows WHERE id = $1"},
    "fields": {"x": {"columns": ["a", "b"], "dtype": "float32"}},
    "batches": {"size": 256},
    "store": {"path": "store.zarr"},
}


def to_toml(data: dict[str, Any]) -> str:
    """A tiny TOML writer for the shapes a config has: scalars, lists of strings and nested tables."""
    lines: list[str] = []

    def table(prefix: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in body.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"[{prefix}]")
        lines.extend(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in scalars.items())
        for k, v in tables.items():
            table(f"{prefix}.{json.dumps(k)}" if prefix else json.dumps(k), v)

    table("", data)
    return "\n".join(lines) + "\n"


def changed(section: str, key: str, value: Any) -> dict[str, Any]:
    """VALID with ``section.key`` (dots for nesting, e.g. ``fields.x``) set to ``value``, or removed by DELETE."""
    data = copy.deepcopy(VALID)
    table = data
    for part in section.split("."):
        table = table.setdefault(part, {})
    if value is DELETE:
        del table[key]
    else:
        table[key] = value
    return data


def write(path: Path, content: dict[str, Any] | str) -> Path:
    """``content`` (data, or TOML text as it is) written to ``path``, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else to_toml(content), encoding="utf-8")
    return path


def load(path: Path, content: dict[str, Any] | str = VALID, **kwargs: Any) -> Config:
    """``content`` written to ``path`` and loaded, with no environment unless ``environ`` is given."""
    kwargs.setdefault("environ", {})
    return load_config(write(path, content), **kwargs)


def error(path: Path, content: dict[str, Any] | str) -> str:
    """The message of the ConfigError that loading ``content`` raises, checked to be a one-line usage error."""
    with pytest.raises(ConfigError) as excinfo:
        load(path, content)
    assert excinfo.value.exit_code == 2
    message = str(excinfo.value)
    assert "\n" not in message
    return message
