"""The epoch the hostile-store tests copy and tamper with: ``r(id, v, score)``, dumped once a module.

The ``hostile_db`` fixture (module-scoped, tests/conftest.py) holds ``R_TABLE``: ``N`` rows, ``score`` NULL
on every fifth; the ``hostile_store`` fixture dumps epoch 0 of it with ``r_config`` (batches of ``SIZE``) into a
store the tests copy before they tamper (tests/test_security_store.py, tests/test_security_store_links.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .configs import write_config
from .dumps import dump

N, SIZE = 96, 16
R_TABLE = (
    "CREATE TABLE r (id int PRIMARY KEY, v bigint NOT NULL, score real)",
    f"INSERT INTO r SELECT i, i, CASE WHEN i % 5 = 0 THEN NULL ELSE i END FROM generate_series(1, {N}) i",
)


def r_config(folder: Path) -> Path:
    """``v`` (int64) and ``score`` (float32, NULL as NaN) of ``r``, a sample an ``id``: ``test.toml`` in ``folder``."""
    fields = {"v": (["v"], "int64"), "score": (["score"], "float32", {"null": "nan"})}
    return write_config(
        folder, keys="SELECT id FROM r", query="SELECT v, score FROM r WHERE id = $1", fields=fields, size=SIZE
    )


def pristine_store(database: str, folder: Path) -> Path:
    """Epoch 0 of ``r`` dumped into ``folder``; the store's path."""
    dump(r_config(folder), database, epoch=0)
    return folder / "store.zarr"


# --- tampering, as someone who can write the store would ------------------------------------------------
def epoch(store: Path) -> Path:
    return store / "epoch-00000"


def edit_manifest(store: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    path = epoch(store) / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc["attributes"]["pgprefetch"])
    path.write_text(json.dumps(doc))


def edit_array(store: Path, name: str, edit: Callable[[dict[str, Any]], object]) -> None:
    path = epoch(store) / name / "zarr.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def without_hashes(store: Path) -> None:
    """As an older pgprefetch published it: no SHA-256 of the arrays' zarr.json in the manifest."""
    edit_manifest(store, lambda m: m.pop("metadata_sha256"))


def rehash(store: Path) -> None:
    """Record every array's zarr.json as it is now: a forger who can write the manifest does."""
    digests = {name: hashlib.sha256((p / "zarr.json").read_bytes()).hexdigest() for name, p in _arrays(store)}
    edit_manifest(store, lambda m: m["metadata_sha256"].update(digests))


def _arrays(store: Path) -> list[tuple[str, Path]]:
    return [(p.name, p) for p in sorted(epoch(store).iterdir()) if p.is_dir()]
