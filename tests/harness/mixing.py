"""The mixing tests' tables and configs: two sources of different sizes and key types, one field set.

``web(id int, a, b, tag)`` holds 300 rows, ``code_docs(id bigint, a, b, tag)`` 90, ``uuids(u uuid, a, b,
tag)`` 40. Each row's ``a`` is its source's number times 1,000,000 plus its id, so a sample read back names
its source and key without the keys array: ``a // 1e6`` and ``a % 1e6``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .configs import toml_value

MIX_TABLES = (
    "CREATE TABLE web (id int PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
    "INSERT INTO web SELECT i, 1000000 + i, i * 0.5, i % 7 FROM generate_series(1, 300) i",
    "CREATE TABLE code_docs (id bigint PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
    "INSERT INTO code_docs SELECT i, 2000000 + i, i * 0.25, i % 5 FROM generate_series(1, 90) i",
)

WEB = {"keys": "SELECT id FROM web", "query": "SELECT a, b, tag FROM web WHERE id = $1"}
CODE = {"keys": "SELECT id FROM code_docs", "query": "SELECT a, b, tag FROM code_docs WHERE id = $1"}
CODE_SCAN = {"table": "code_docs", "key": "id"}
FIELDS = {"x": (["a", "b"], "float64"), "tag": (["tag"], "int32")}


def mix_config(
    folder: Path,
    sources: dict[str, dict[str, Any]],
    *,
    size: int = 10,
    samples: int | None = None,
    seed: int = 0,
    fields: dict[str, tuple[list[str], str]] | None = None,
    name: str = "mix.toml",
    store: str = "store.zarr",
    extra: str = "",
) -> Path:
    """A mixed config: ``sources`` maps a name to its ``[samples.NAME]`` keys (``weight`` among them)."""
    lines = ["[source]", "connections = 2"]
    for source, table in sources.items():
        lines.append(f"[samples.{source}]")
        for key, value in table.items():
            if isinstance(value, dict):
                value = "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
                lines.append(f"{key} = {value}")
            else:
                lines.append(f"{key} = {toml_value(value)}")
    if samples is not None:
        lines += ["[mix]", f"samples = {samples}"]
    for field, (columns, dtype) in (fields or FIELDS).items():
        lines += [f"[fields.{field}]", f"columns = {toml_value(columns)}", f"dtype = {toml_value(dtype)}"]
    lines += ["[batches]", f"size = {size}", f"seed = {seed}", "[store]", f"path = {toml_value(store)}", extra]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path
