"""Query mode's batch source: the user's per-sample query, one statement per batch, on one snapshot.

:func:`plan_epoch` does the database-side thinking: check the queries against the config, read and
shuffle the keys (refusing or dropping repeated keys; in memory while they fit ``[source] memory``, on
disk beyond it, :mod:`pgprefetch.write.order.spill`), fix the category lists, and build the batch statement.
The field shapes are fixed later, by the first batch (:func:`layout_from`), because a per-sample query's
array lengths are only known once it has run. :func:`query_source` then serves the epoch: ``fetch`` runs
the batch statement on one of the worker connections (one round trip per unit), ``produce`` decodes its
binary arrays into the batch buffers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode import collate
from pgprefetch.decode.blobs import array_lengths
from pgprefetch.decode.layout import BatchLayout, UnknownCategoryError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import plan_columns
from pgprefetch.pg.session import BatchReader, Shape, Snapshot
from pgprefetch.pg.statement import (
    Fetched,
    batch_statement,
    distinct_values_statement,
    query_column,
    row_wise,
    samples_rows,
)
from pgprefetch.write.batches import BatchSource, unit_batches
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.spill import KeyRuns, collect_keys
from pgprefetch.write.plan import (
    MAX_CATEGORY_BYTES,
    EpochPlan,
    Vocabulary,
    name_unknown_category,
    order_keys,
    order_spilled,
    resolve_categories,
)
from pgprefetch.write.spill.folder import SpillFolder


@asynccontextmanager
async def query_source(
    cfg: Config, snap: Snapshot, epoch: int, vocabulary: Vocabulary | None = None, spill: SpillFolder | None = None
) -> AsyncIterator[BatchSource]:
    """The query mode: a prepared statement per batch on ``connections`` workers importing ``snap``.

    ``vocabulary``: the store the ``"auto"`` categories extend (:func:`pgprefetch.write.plan.resolve_categories`).
    ``spill``: the dump's folder for keys beyond ``[source] memory`` (a temporary one of its own if None,
    removed when the source closes).
    """
    size = cfg.batches.size
    own = SpillFolder.temporary(cfg.source.scratch) if spill is None else None
    plan = None
    try:
        plan = await plan_epoch(cfg, snap, epoch, vocabulary, _keys_folder(spill, own))
        async with BatchReader.open(cfg.source, snap.id, plan.sql, plan.params, row_wise=plan.row_wise) as reader:
            # Batch 0's array lengths fix the field shapes. It is fetched again when it is written, so that every
            # unit's fetch time is a real one (the writer sizes units by it): one batch's cost, once an epoch.
            layout = layout_from(cfg, plan, await reader.fetch(0, plan.batch_keys(0, size)))
            unit = min(unit_batches(size, layout.sample_bytes), plan.n_batches)
            first = plan.batch_keys(0, size, unit)  # the keys of a unit, as the dump binds them
            advice = await snap.index_advice(plan.sql, (*(column.tolist() for column in first), *plan.params))
            try:
                yield served(plan, layout, reader, snap.id, snap.server_version, size, tuple(a.line() for a in advice))
            except UnknownCategoryError as e:
                raise await name_unknown_category(cfg, snap, e) from None
    finally:
        if plan is not None and isinstance(plan.keys, OrderedKeys):
            plan.keys.close()
        if own is not None:
            own.remove()


def served(
    plan: EpochPlan,
    layout: BatchLayout,
    reader: BatchReader,
    snapshot: str,
    server_version: str,
    size: int,
    warnings: tuple[str, ...] = (),
) -> BatchSource:
    """The batches of ``plan`` fetched by ``reader``'s workers and decoded by ``layout``.

    Also how a part of an epoch spread over a cluster serves its batches (:mod:`pgprefetch.write.ray`),
    with the plan and layout its driver made.
    """

    async def fetch(batch: int, count: int) -> object:
        return await reader.fetch(batch, plan.batch_keys(batch, size, count), count)

    def produce(batch: int, count: int, blobs: object, buffers: dict[str, np.ndarray]) -> None:
        # blobs: what fetch above returned (BatchSource hands it over untyped)
        collate.decode(layout, cast("Fetched", blobs), plan.batch_keys(batch, size, count), buffers)

    unit = min(unit_batches(size, layout.sample_bytes), plan.n_batches)
    return BatchSource(
        plan, layout, snapshot, server_version, None, fetch, produce, reader.size, unit=unit, warnings=warnings
    )


async def plan_epoch(
    cfg: Config, snap: Snapshot, epoch: int, vocabulary: Vocabulary | None = None, scratch: SpillFolder | None = None
) -> EpochPlan:
    """Describe the queries, read and order the keys, fix the categories and the statement.

    ``vocabulary``: the store whose category vocabularies ``"auto"`` fields extend (none: a fresh store).
    ``scratch``: where keys beyond ``[source] memory`` are ordered on disk (:mod:`pgprefetch.write.order.spill`);
    None keeps them in memory whatever their size. The caller removes it.

    Raises:
        ConfigError: the queries do not fit the config.
        SourceError: the database failed, the keys cannot make an epoch (none, repeated, no full batch), or
            a field's categories do not fit its dtype.
        StoreError: the keys' scratch folder cannot be written (a full disk).
    """
    shape = await snap.describe(cfg)
    order = await _read_and_order(cfg, snap, shape.keys, epoch, scratch)
    try:
        statement = await query_statement(cfg, snap, shape, vocabulary)
    except BaseException:
        if isinstance(order["keys"], OrderedKeys):
            order["keys"].close()
        raise
    order.pop("index", None)
    return EpochPlan(epoch=epoch, key_columns=shape.keys, **order, **statement)


async def query_statement(
    cfg: Config,
    snap: Snapshot,
    shape: Shape,
    vocabulary: Vocabulary | None,
    categories: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The batch statement of a described query-mode config, with its columns and category lists.

    Returns the :class:`EpochPlan` fields ``columns``, ``by_field``, ``categories``, ``sql``, ``params`` and
    ``row_wise``. ``categories``: the lists to bind (a mixed epoch's, over all its sources); None resolves
    them for this config (:func:`~pgprefetch.write.plan.resolve_categories`).
    """
    where = f"{cfg.file}: " if cfg.file else ""
    columns, by_field = plan_columns(cfg.fields, shape.returned, shape.keys.width, where)
    if categories is None:
        categories = await resolve_categories(cfg, lambda columns: _distinct(cfg, snap, columns), vocabulary)
    samples = cfg.query_samples
    variable = samples.max_rows is not None
    sql = batch_statement(
        samples.query, shape.keys, columns, samples.rows, variable_rows=variable, row_truncate=samples.truncate
    )
    return {
        "columns": columns,
        "by_field": by_field,
        "categories": categories,
        "sql": sql,
        "params": tuple(categories[f.name] for f in cfg.fields if f.categories is not None),
        "row_wise": row_wise(columns, samples.rows, variable),
    }


async def _read_and_order(
    cfg: Config, snap: Snapshot, key_columns: KeyColumns, epoch: int, scratch: SpillFolder | None
) -> dict[str, Any]:
    """The keys read and put in the epoch's order: in memory while they fit the budget, else on disk."""
    if scratch is None:
        keys: np.ndarray | KeyRuns = await snap.read_keys(cfg, key_columns)
    else:
        seed, budget = cfg.batches.seed, Policy.for_scan(cfg.source.memory_bytes).keys_bytes(beside_rows=False)
        async with aclosing(snap.key_chunks(cfg, key_columns)) as chunks:
            keys = await collect_keys(chunks, key_columns.width, budget, scratch, seed=seed, epoch=epoch)
    if isinstance(keys, KeyRuns):
        try:
            return order_spilled(cfg, keys, key_columns, epoch)
        finally:
            keys.close()
    return order_keys(cfg, keys, key_columns, epoch, in_place=True)


def layout_from(cfg: Config, plan: EpochPlan, first: Fetched) -> BatchLayout:
    """The decoding plan, with the field shapes fixed by the first batch's array lengths."""
    lengths = array_lengths(plan.columns, first, plan.row_wise)
    s = cfg.samples
    variable = getattr(s, "max_rows", None) is not None  # query mode's [samples] max_rows
    return BatchLayout.build(
        cfg.fields,
        plan.columns,
        plan.by_field,
        lengths,
        s.rows,
        plan.key_columns,
        variable_rows=variable,
        row_truncate=getattr(s, "truncate", "error"),
        row_wise=plan.row_wise,
    )


async def _distinct(cfg: Config, snap: Snapshot, columns: list[str]) -> dict[str, set[str]]:
    """The distinct values of the ``"auto"`` columns over every sample (not the epoch's ``fraction``): one statement.

    The keys query and the per-sample query for every key, run once for all the columns, not once a column.
    """
    samples = cfg.query_samples
    source = samples_rows(samples.keys, samples.query, samples.max_param)
    sql = distinct_values_statement(source, [query_column(c) for c in columns], MAX_CATEGORY_BYTES + 1)
    where = f"{cfg.file}: " if cfg.file else ""
    values, _ = await snap.distinct_values(sql, f"{where}categories of column(s) {', '.join(columns)}")
    return {c: values.get(i, set()) for i, c in enumerate(columns)}


def _keys_folder(spill: SpillFolder | None, own: SpillFolder | None) -> SpillFolder:
    """The keys' folder in the dump's spill folder, or in the source's own."""
    folder = spill if spill is not None else own
    assert folder is not None, "a spill folder of the dump's or of the source's own"
    return folder.sub("keys")
