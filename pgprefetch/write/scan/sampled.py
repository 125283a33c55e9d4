"""Scan mode for ``pgprefetch check``: the epoch planned from a keys pass, then only the checked batches' rows read.

A dump reads the whole table; a check of a few batches need not. The keys pass (the key and order
columns only, as a dump of a table larger than ``[source] memory`` does) gives the epoch's samples and
order exactly as the dump's read would (the same cut, the same shuffle); then one COPY reads the series
the checked batches' samples come from (``WHERE (key) IN (VALUES ...)``, the keys as numbers: integers
pgprefetch read, never text), and those batches are gathered from it with the dump's code
(:func:`~pgprefetch.write.scan.mode.cut_source`). What the check reads is the keys of every row and the
data of the checked batches' series, plus, for ``categories = "auto"``, the one read of the values.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import numpy as np

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.errors import SourceError
from pgprefetch.pg.session import Snapshot
from pgprefetch.sqltext import quote_ident
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.plan import Vocabulary, resolve_categories
from pgprefetch.write.scan.mode import cut_source, plan_scan, scan_layout
from pgprefetch.write.scan.passes import keys_only
from pgprefetch.write.scan.shape import ScanShape, describe_scan, distinct_values
from pgprefetch.write.scan.table import array_lengths, cut, read_table


async def sampled_source(
    cfg: Config,
    snap: Snapshot,
    epoch: int,
    vocabulary: Vocabulary | None,
    choose: Callable[[int], list[int]],
) -> tuple[BatchSource, list[int]]:
    """The epoch's source for the batches ``choose(n_batches)`` only, and those batches.

    Any other batch is not to be produced. The source's ``rows_read`` counts every row the server read
    for it (the keys pass, the values of ``"auto"`` fields, the checked series).

    Raises:
        TableTooLarge: the keys alone outgrow ``[source] memory``: they are held here, so the caller checks
            the epoch from keys ordered on disk instead.
    """
    assert isinstance(cfg.samples, ScanConfig)
    shape = await describe_scan(cfg, snap)
    counted = [0]

    async def distinct(columns: list[str]) -> dict[str, set[str]]:
        values, rows = await distinct_values(cfg, snap, shape, columns)
        counted[0] += rows
        return values

    shape = dataclasses.replace(shape, categories=await resolve_categories(cfg, distinct, vocabulary))
    keys = await read_table(cfg, snap, keys_only(shape))  # TableTooLarge: keys beyond memory (the caller's)
    sample_keys, _ = await asyncio.to_thread(cut, keys, shape, cfg.samples)
    plan = plan_scan(cfg, shape, sample_keys, epoch)
    chosen = choose(plan.n_batches)
    size = cfg.batches.size
    positions = np.concatenate([np.arange(b * size, min((b + 1) * size, plan.used)) for b in chosen])
    wanted = np.asarray(plan.keys)[:, positions]  # (key columns [+ order], m): the checked samples' keys
    table = await read_table(cfg, snap, shape, [series_in(shape, wanted[: shape.n_key])], budget=0)
    rows_read = keys.rows_read + counted[0] + table.rows_read
    got_keys, got_starts = await asyncio.to_thread(cut, table, shape, cfg.samples)
    start_of = {tuple(k): int(s) for k, s in zip(got_keys.T.tolist(), got_starts.tolist(), strict=True)}
    starts = np.zeros(plan.used, dtype=np.int64)
    for position, key in zip(positions.tolist(), wanted.T.tolist(), strict=True):
        if tuple(key) not in start_of:
            raise SourceError("the checked samples' rows are not those the keys pass cut (the table changed?)")
        starts[position] = start_of[tuple(key)]
    layout = scan_layout(cfg, shape, array_lengths(table), plan)
    source = cut_source(cfg, plan, layout, table, starts, snap.id, snap.server_version, rows_read)
    return source, chosen


def series_in(shape: ScanShape, series: np.ndarray) -> str:
    """``WHERE (k1, k2) IN (VALUES (1, 2), ...)``: the rows of the given series (key columns, one per row).

    The keys are integers read from the table (int64 as Python ints): numbers in SQL text, never text.
    A list of ``VALUES`` is a hashed semi-join for the planner, however many keys it holds.
    """
    unique = np.unique(series, axis=1) if series.size else series
    cols = ", ".join(quote_ident(k) for k in shape.key_names[: shape.n_key])
    rows = ", ".join("(" + ", ".join(str(int(v)) for v in column) + ")" for column in unique.T.tolist())
    return f" WHERE ({cols}) IN (VALUES {rows})"
