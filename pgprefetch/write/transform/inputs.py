"""What a transform is handed: its input columns, checked; the statement that sends them; every sample's key.

The statement (:func:`statement_of`, :func:`~pgprefetch.pg.statement.inputs_statement`) runs on the epoch's
snapshot, as the batches' statements do: in query mode the per-sample query LATERAL for each key, in scan mode
the table joined on its key. Its values come decoded by asyncpg, as a transform gets them (:func:`input_value`).
A sweep (``on_error = "skip"``) walks every sample key of the source, of the split being dumped
(:func:`sample_keys`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Snapshot
from pgprefetch.pg.statement import inputs_statement
from pgprefetch.sqltext import quote_ident
from pgprefetch.write.order.splits import split_keep
from pgprefetch.write.scan.shape import scan_relation


def input_value(v: Any) -> Any:
    """An input value as a transform gets it: an array (a list from the server) as a NumPy array."""
    return np.asarray(v) if isinstance(v, list) else v


async def check_inputs(cfg: Config, snap: Snapshot) -> tuple[str, ...]:
    """Every transform's inputs, each once, checked against the columns the query or table returns."""
    where = f"{cfg.file}: " if cfg.file else ""
    if cfg.mode == "query":
        returned = (await snap.describe(cfg)).returned
        what = "[samples] query"
    else:
        returned = await snap.describe_sql(
            f"SELECT * FROM {scan_relation(cfg.scan_samples)} LIMIT 0", f"{where}[samples] table"
        )
        what = "[samples] table"
    for t in cfg.transforms:
        for c in t.inputs:
            if c not in returned:
                raise ConfigError(
                    f'{where}[transforms.{t.name}] inputs: {what} returns no column "{c}" '
                    f"(it returns {', '.join(returned) or 'nothing'})"
                )
    return input_columns(cfg)


async def sample_key_columns(cfg: Config, snap: Snapshot) -> KeyColumns:
    """The key columns the epoch's plan will have: the keys query's (query mode), or the scan key's."""
    if cfg.mode == "query":
        return (await snap.describe(cfg)).keys
    return KeyColumns(cfg.scan_samples.key)


def sample_keys(cfg: Config, snap: Snapshot, keys: KeyColumns) -> AsyncIterator[np.ndarray]:
    """Every sample key of ``cfg``'s source, in chunks, on ``snap`` (its split's only: the sweep's keys)."""
    if cfg.mode == "query":
        chunks = snap.key_chunks(cfg, keys)
    else:
        relation = scan_relation(cfg.scan_samples)
        slots = keys.slot_sql([quote_ident(c) for c in keys.names])
        where = f"{cfg.file}: " if cfg.file else ""
        chunks = snap.slot_chunks(f"SELECT {', '.join(slots)} FROM {relation}", keys, f"{where}[samples] table")
    keep = split_keep(cfg, keys)
    return chunks if keep is None else _kept(chunks, keep)


async def _kept(
    chunks: AsyncIterator[np.ndarray], keep: Callable[[np.ndarray], np.ndarray]
) -> AsyncIterator[np.ndarray]:
    async for chunk in chunks:
        yield chunk[:, keep(chunk)]


def input_columns(cfg: Config) -> tuple[str, ...]:
    """Every transform's inputs, each once, in the config's order: the statement's value columns."""
    return tuple(dict.fromkeys(c for t in cfg.transforms for c in t.inputs))


def statement_of(cfg: Config, keys: KeyColumns, inputs: tuple[str, ...]) -> str:
    """The stage's statement for ``cfg``'s transforms (:func:`~pgprefetch.pg.statement.inputs_statement`)."""
    digests = [t.inputs for t in cfg.transforms]
    if cfg.mode == "query":
        return inputs_statement(keys, digests, inputs, query=cfg.query_samples.query)
    return inputs_statement(keys, digests, inputs, query=None, relation=scan_relation(cfg.scan_samples))
