"""Packed epochs for the tests: a table of documents (token arrays of many lengths), configs, reading back.

:func:`read_back` rebuilds each document from an epoch alone: its pieces found by ``segment_keys`` and
``segment_offsets``, their tokens by ``segment_ids``, checked against ``position_ids`` on the way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch import EpochArrays

from .db import fetch

N_DOCS = 300
LENGTH = 64  # tokens a sequence in the tests' configs


def docs_table(n: int = N_DOCS) -> tuple[str, ...]:
    """``docs``: ``n`` documents of 0 .. 150 tokens (past two sequences of 64), ids 0 .. 50,000 (uint16)."""
    return (
        "CREATE TABLE docs (id bigint PRIMARY KEY, tokens int[] NOT NULL)",
        f"""INSERT INTO docs SELECT i, ARRAY(
               SELECT ((i * 7919 + j * 104729) % 50000)::int FROM generate_series(1, (i * 37) % 151) j)
           FROM generate_series(1, {n}) i""",
    )


DOCS = docs_table()
# a second source for a packed mix: 120 documents of 1 .. 200 tokens, ids 50,000 .. 59,999
CODE_DOCS = (
    "CREATE TABLE code_docs (id bigint PRIMARY KEY, tokens int[] NOT NULL)",
    """INSERT INTO code_docs SELECT i, ARRAY(
           SELECT (50000 + (i * 31 + j * 17) % 10000)::int FROM generate_series(1, 1 + (i * 53) % 200) j)
       FROM generate_series(1, 120) i""",
)
# the same documents as bytea: each token two bytes, little-endian (an empty document: no bytes)
BYTEA_TWIN = """CREATE TABLE docs_b AS SELECT id, coalesce((
    SELECT decode(string_agg(lpad(to_hex(((t & 255) << 8) | (t >> 8)), 4, '0'), '' ORDER BY o), 'hex')
    FROM unnest(tokens) WITH ORDINALITY AS u(t, o)), '\\x'::bytea) AS tokens FROM docs"""


def packed_config(
    folder: Path,
    *,
    method: str = "best-fit",
    eos: int | None = None,
    length: int = LENGTH,
    size: int = 4,
    store: str = "store.zarr",
    name: str = "packed.toml",
    extra: str = "",
    scan: bool = False,
) -> Path:
    """A packed config over the ``docs`` table (``scan``: the table as a scan's, its documents looked up by key)."""
    eos_line = f"eos = {eos}\n" if eos is not None else ""
    samples = (
        '[samples]\ntable = "docs"\nkey = ["id"]\n'
        if scan
        else '[samples]\nkeys = "SELECT id FROM docs"\nquery = "SELECT tokens FROM docs WHERE id = $1"\n'
    )
    path = folder / name
    path.write_text(
        f"[source]\nconnections = 2\n{samples}"
        '[fields.tokens]\ncolumns = ["tokens"]\ndtype = "uint16"\nmax_length = 1000\n'
        f'[packing]\nfield = "tokens"\nlength = {length}\nmethod = "{method}"\n{eos_line}pad = 0\n'
        f'[batches]\nsize = {size}\n{extra}[store]\npath = "{store}"\n'
    )
    return path


def documents(dsn: str, table: str = "docs") -> dict[int, list[int]]:
    """Every document's tokens, as the database has them."""
    return {int(r["id"]): list(r["tokens"]) for r in fetch(dsn, f"SELECT id, tokens FROM {table}")}


def mixed_config(folder: Path, web: int, code: int, *, method: str = "best-fit", name: str = "mix.toml",
                 store: str = "mix.zarr", extra: str = "") -> Path:  # fmt: skip
    """A packed mix: ``docs`` (query mode) and ``code_docs`` (a scan table) by weight, ``eos`` 7."""
    path = folder / name
    path.write_text(
        "[source]\nconnections = 2\n"
        f'[samples.web]\nweight = {web}\nkeys = "SELECT id FROM docs"\n'
        'query = "SELECT tokens FROM docs WHERE id = $1"\n'
        f'[samples.code]\nweight = {code}\ntable = "code_docs"\nkey = ["id"]\n{extra}'
        '[fields.tokens]\ncolumns = ["tokens"]\ndtype = "uint16"\nmax_length = 1000\n'
        f'[packing]\nfield = "tokens"\nlength = {LENGTH}\nmethod = "{method}"\neos = 7\n'
        f'[batches]\nsize = 4\n[store]\npath = "{store}"\n'
    )
    return path


def read_back(path: Path | str, eos: int | None) -> dict[int, list[int]]:
    """Each document's tokens rebuilt from the epoch's sequences; every consistency rule checked on the way."""
    store, epoch = Path(path).parent, int(Path(path).name.rsplit("-", 1)[1])
    arrays = EpochArrays(store, epoch)
    pieces: dict[int, list[tuple[int, list[int]]]] = {}
    for b in range(len(arrays)):
        batch = arrays[b]
        for s in range(batch["tokens"].shape[0]):
            _sequence(batch, s, pieces)
    out = {}
    for key, found in pieces.items():
        found.sort()
        tokens: list[int] = []
        for offset, piece in found:
            assert offset == len(tokens), (key, offset, len(tokens))  # pieces in order, no gap, no overlap
            tokens += piece
        out[key] = tokens
    return out


def _sequence(batch: dict[str, Any], s: int, pieces: dict[int, list[tuple[int, list[int]]]]) -> None:
    segments, positions, tokens = batch["segment_ids"][s], batch["position_ids"][s], batch["tokens"][s]
    keys, offsets = batch["segment_keys"][s], batch["segment_offsets"][s]
    real = int((segments > 0).sum())
    assert (segments[real:] == 0).all()  # padding at the end only
    n = int(segments.max(initial=0))
    assert (np.diff(segments[:real]) >= 0).all()
    assert (np.diff(segments[:real]) <= 1).all()
    assert n == int((offsets >= 0).sum())
    assert (offsets[n:] == -1).all()
    assert (keys[n:] == -1).all()
    for i in range(1, n + 1):
        at = np.flatnonzero(segments == i)
        assert at.size > 0  # no empty segment
        assert (positions[at] == offsets[i - 1] + np.arange(at.size)).all()
        pieces.setdefault(int(keys[i - 1, 0]), []).append((int(offsets[i - 1]), tokens[at].tolist()))
