"""The benchmark datasets: their pgprefetch configs, batch statements and blog-post queries.

*windows* and *rows* are the demo data's; *mixed* (bench/mixed.py) brings its own load.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np

from pgprefetch.demo.data import load_rows, load_sequences, row_count, sequence_counts
from pgprefetch.sqltext import replace_params
from pgprefetch.write.order.shuffle import n_batches, order_part

CONNECTIONS = 8
SEED = 0
EPOCH = 0

WINDOWS_FIELDS = """
[fields.x]
columns = ["f0", "f1"]
dtype = "float32"

[fields.y]
columns = ["label"]
dtype = "int64"
"""

ROWS_FIELDS = """
[fields.emb]
columns = ["emb"]
dtype = "float32"

[fields.features]
columns = ["price", "qty"]
dtype = "float32"

[fields.day]
columns = ["day"]
dtype = "int32"

[fields.label]
columns = ["label"]
dtype = "int64"
"""


def _window(record: asyncpg.Record) -> str:
    # The post pastes the values into the text with an f-string, so every query text is new.
    a, b = record
    return f"SELECT f0, f1, label FROM ticks WHERE series_id = {a} AND t >= {b} ORDER BY t LIMIT 64"


def _window_array(rows: list[asyncpg.Record]) -> np.ndarray:
    return np.array([tuple(r) for r in rows], dtype=np.float32)  # (64, 3)


def _row(record: asyncpg.Record) -> str:
    (i,) = record
    return f"SELECT emb, price, qty, day, label FROM items WHERE id = {i}"


_EPOCH_DAY = np.datetime64("1970-01-01", "D")


def _row_array(rows: list[asyncpg.Record]) -> np.ndarray:
    (r,) = rows
    day = (np.datetime64(r["day"], "D") - _EPOCH_DAY).astype(np.float32)
    return np.concatenate([np.asarray(r["emb"], dtype=np.float32), [float(r["price"]), r["qty"], day, r["label"]]])


@dataclass(frozen=True)
class Dataset:
    """One dataset as every contender reads it."""

    name: str
    keys: str  # pgprefetch's keys query
    query: str  # pgprefetch's per-sample query, $1..$k = key columns
    rows: int
    batch_size: int
    drop_last: bool
    fields: str  # the [fields.*] TOML
    blog_keys: str  # the blog post's start-point query
    blog_query: Callable[[asyncpg.Record], str]
    blog_array: Callable[[list[asyncpg.Record]], np.ndarray]
    # A dataset other than the demo's two brings its own load (returns the train samples) and count.
    loader: Callable[[asyncpg.Connection, float], Awaitable[int]] | None = None
    counter: Callable[[float], int] | None = None

    def config(self, store: Path | str, fraction: float = 1.0) -> str:
        """A pgprefetch config for this dataset, modelled on configs/demo*.toml (``store``: a folder or URL)."""
        return (
            f'[source]\nconnections = {CONNECTIONS}\nstatement_timeout = "5min"\n\n'
            f"[samples]\nkeys = {_toml_str(self.keys)}\nquery = {_toml_str(self.query)}\n"
            f"rows = {self.rows}\nfraction = {fraction!r}\n"
            f"{self.fields}\n"
            f"[batches]\nsize = {self.batch_size}\nseed = {SEED}\ndrop_last = {str(self.drop_last).lower()}\n\n"
            f'[store]\npath = {_toml_str(str(store))}\ncompression = "none"\n'
        )

    async def load(self, conn: asyncpg.Connection, scale: float) -> int:
        """(Re)create the dataset's tables at ``scale``; return the number of train samples."""
        if self.loader is not None:
            return await self.loader(conn, scale)
        return await (load_sequences(conn, scale) if self.name == "windows" else load_rows(conn, scale))

    def expected(self, scale: float) -> int:
        """Train samples at ``scale`` (before loading)."""
        if self.counter is not None:
            return self.counter(scale)
        return sequence_counts(scale)[1] if self.name == "windows" else round(row_count(scale) * 0.9)

    async def epoch_keys(self, conn: asyncpg.Connection) -> np.ndarray:
        """The dump's epoch-0 keys in its order, shape ``(n_key_columns, n)``: only the samples it writes."""
        records = await conn.fetch(self.keys)
        keys = np.ascontiguousarray(np.array(records, dtype=np.int64).reshape(len(records), -1).T)
        keys = keys[:, order_part(keys, seed=SEED, epoch=EPOCH)[0]]
        n = keys.shape[1]
        if self.drop_last:
            n = n_batches(n, self.batch_size, True) * self.batch_size
        return keys[:, :n]

    def copy_statement(self, keys: np.ndarray) -> str:
        """One batch as a COPY-able query: the keys pasted in as array literals (COPY takes no parameters)."""
        arrays = ", ".join("'{" + ",".join(map(str, column.tolist())) + "}'::int8[]" for column in keys)
        names = ", ".join(f"k{i}" for i in range(1, keys.shape[0] + 1))
        inner = replace_params(self.query, lambda n: f"k.k{n}")
        return (
            f"SELECT k.ord, q.* FROM unnest({arrays}) WITH ORDINALITY AS k({names}, ord) "
            f"CROSS JOIN LATERAL ({inner}) AS q"
        )


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


WINDOWS = Dataset(
    name="windows",
    keys="SELECT series_id, start_t FROM train_samples",
    query="SELECT f0, f1, label FROM ticks WHERE series_id = $1 AND t >= $2 ORDER BY t LIMIT 64",
    rows=64,
    batch_size=256,
    drop_last=True,
    fields=WINDOWS_FIELDS,
    blog_keys="SELECT series_id, start_t FROM train_samples TABLESAMPLE SYSTEM (100)",
    blog_query=_window,
    blog_array=_window_array,
)

ROWS = Dataset(
    name="rows",
    keys="SELECT id FROM train_items",
    query="SELECT emb, price, qty, day, label FROM items WHERE id = $1",
    rows=1,
    batch_size=1024,
    drop_last=False,
    fields=ROWS_FIELDS,
    blog_keys="SELECT id FROM train_items TABLESAMPLE SYSTEM (100)",
    blog_query=_row,
    blog_array=_row_array,
)
