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
    lines += ["[batches]", f"size = {size}", f"seed = {seed}", extra, "[store]", f"path = {toml_value(store)}"]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def by_source(arrays: dict[str, Any]) -> tuple[Any, Any]:
    """Each sample's source number (1 web, 2 code_docs) and id, read from its ``a`` column (``x[..., 0]``)."""
    a = arrays["x"][..., 0].astype("int64")
    return a // 1_000_000, a % 1_000_000


def source_runs(arrays_by_epoch: list[dict[str, Any]], code: int) -> list[list[int]]:
    """Source ``code``'s keys batch by batch over the epochs in order: the order its passes took them in.

    Within a batch the samples are shuffled, so a batch's keys are sorted: the tests judge passes at batch
    boundaries, where the order taken and the order stored agree.
    """
    runs = []
    for arrays in arrays_by_epoch:
        for b in range(arrays["source"].shape[0]):
            mine = arrays["source"][b] == code
            runs.append(sorted(arrays["keys"][b, mine, 0].tolist()))
    return runs


def assert_passes(runs: list[list[int]], keys: set[int]) -> int:
    """After every batch, no key of ``keys`` was taken twice more than another: each pass before the next.

    Returns the passes completed.
    """
    counts = dict.fromkeys(keys, 0)
    for i, run in enumerate(runs):
        for k in run:
            counts[k] += 1
        spread = max(counts.values()) - min(counts.values())
        assert spread <= 1, f"after batch {i}: a key taken {max(counts.values())} times, another {min(counts.values())}"
    return min(counts.values())
