"""The variable-length data of the ragged tests: the ``seqs`` and ``events`` tables, a config over them, and
each stored sample by its key beside what the database holds.

``seqs_table`` makes them in a test's fresh database (the ``seqs`` fixture): ``seqs`` holds int[] tokens of
0..40 elements (some empty), text titles in several scripts and bytea blobs; ``events`` gives user ``u``
1 + (u % 12) rows, for samples of 1..max_rows rows (tests/test_ragged.py, test_ragged_scan.py,
test_ragged_stats.py).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from .configs import write_config
from .db import execute, fetch

N = 300
TEXTS = [
    "",
    "a",
    "plain ascii text",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🎉🎊🎈 party",
    "Привет мир",
    "مرحبا بالعالم",
]


def seqs_table(db: str) -> str:
    """``seqs``: int[] tokens of 0..40 elements (some empty), text titles in several scripts, bytea blobs."""
    rng = random.Random(7)
    rows = []
    for i in range(1, N + 1):
        n = rng.choice([0, 1, 5, 16, 17, 40, rng.randrange(41)])
        tokens = [rng.randrange(-1000, 1000) for _ in range(n)]
        title = rng.choice(TEXTS) * rng.randrange(1, 3)
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
        rows.append(f"({i}, ARRAY{tokens}::int[], {_literal(title)}, '\\x{blob.hex()}'::bytea)")
    execute(
        db,
        "CREATE TABLE seqs (id int PRIMARY KEY, tokens int[] NOT NULL, title text NOT NULL, blob bytea NOT NULL)",
        f"INSERT INTO seqs VALUES {', '.join(rows)}",
        "CREATE TABLE events (uid int, t int, v real NOT NULL, PRIMARY KEY (uid, t))",
        # user u has 1 + (u % 12) events: 1 to 12 of them
        "INSERT INTO events SELECT u, t, u * 100 + t FROM generate_series(1, 120) u, generate_series(1, 1 + u % 12) t",
    )
    return db


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def seqs_config(folder: Path, fields: dict[str, tuple[Any, ...]], **kwargs: Any) -> Path:
    """A query-mode config over ``seqs`` (a sample an ``id``, batches of 32, the padded last one kept)."""
    query = "SELECT * FROM seqs WHERE id = $1"
    kwargs = {"drop_last": False, **kwargs}
    return write_config(folder, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, **kwargs)


def by_key(arrays: dict[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    """Each stored sample's arrays by its key (the last batch's padding samples left out)."""
    keys = arrays["keys"].reshape(-1, arrays["keys"].shape[-1])[:, 0]
    out = {}
    for i, k in enumerate(keys.tolist()):
        if k:
            out[k] = {name: a.reshape(-1, *a.shape[2:])[i] for name, a in arrays.items() if name != "keys"}
    return out


def database(dsn: str, sql: str) -> dict[int, Any]:
    """What the database holds: ``sql``'s first column mapped to its second."""
    return {r[0]: r[1] for r in fetch(dsn, sql)}
