"""The epoch the hostile-store tests copy and tamper with: ``r(id, v, score)``, dumped once a module.

The ``hostile_db`` fixture (module-scoped, tests/conftest.py) holds ``R_TABLE``: ``N`` rows, ``score`` NULL
on every fifth; the ``hostile_store`` fixture dumps epoch 0 of it with ``r_config`` (batches of ``SIZE``) into a
store the tests copy before they tamper (tests/test_security_store.py, tests/test_security_store_links.py).
"""

from __future__ import annotations

from pathlib import Path

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
