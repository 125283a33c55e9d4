"""What an epoch will hold, decided on its snapshot before anything is written.

:func:`plan_epoch` does the database-side thinking that the dump (:mod:`pgprefetch.pipeline`) and
``pgprefetch check`` share: check the queries against the config, read and shuffle the keys (refusing
or dropping repeated keys), fix the category lists, and build the batch statement. The field shapes are
fixed later, by the first batch (:func:`layout_from`), because a per-sample query's array lengths are
only known once it has run.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .blobs import Fetched, array_lengths
from .collate import BatchLayout
from .columns import Column, plan_columns
from .config import Config
from .errors import SampleError, SourceError
from .keys import KeyColumns
from .scan import ScanShape
from .shuffle import DuplicateKeysError, epoch_indices, n_batches
from .source import Snapshot
from .statement import batch_statement, row_wise
from .store import Store

log = logging.getLogger("pgprefetch")


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's samples in order, and how to fetch and decode them."""

    epoch: int
    keys: np.ndarray  # (n_slots, n) int64, in the epoch's order: a slot per integer key column, two per uuid
    key_columns: KeyColumns
    n_keys: int  # what the keys query returned, repeated keys included
    duplicates_dropped: int
    used: int  # samples written: all of them, or those of the full batches (drop_last)
    n_batches: int
    keys_sha256: str  # the used keys' hash: a partial epoch resumes only under the same keys
    columns: tuple[Column, ...]
    by_field: dict[str, tuple[Column, ...]]
    categories: dict[str, list[str]]  # field -> the category list its codes index
    sql: str  # the batch statement (query mode; "" in scan mode)
    params: tuple[list[str], ...]  # bind parameters after the key arrays: the category lists
    samples: np.ndarray | None = None  # scan mode: each sample of the epoch, as its index among the cut samples
    row_wise: bool = False  # the batch statement returns a row per sample (statement.row_wise)

    def batch_keys(self, batch: int, size: int, count: int = 1) -> np.ndarray:
        """The keys of ``count`` batches from ``batch`` on, ``(n_slots, <= count * size)``."""
        return self.keys[:, batch * size : (batch + count) * size]


async def plan_epoch(cfg: Config, snap: Snapshot, epoch: int, vocabulary: Vocabulary | None = None) -> EpochPlan:
    """Describe the queries, read and order the keys, fix the categories and the statement.

    ``vocabulary``: the store whose category vocabularies ``"auto"`` fields extend (none: a fresh store).

    Raises:
        ConfigError: the queries do not fit the config.
        SourceError: the database failed, the keys cannot make an epoch (none, repeated, no full batch), or
            a field's categories do not fit its dtype.
    """
    shape = await snap.describe(cfg)
    keys = await snap.read_keys(cfg, shape.keys)
    order = order_keys(cfg, keys, shape.keys, epoch, in_place=True)
    where = f"{cfg.file}: " if cfg.file else ""
    columns, by_field = plan_columns(cfg.fields, shape.returned, shape.keys.width, where)
    categories = await resolve_categories(cfg, lambda column: snap.distinct_text(cfg, column), vocabulary)
    variable = cfg.samples.max_rows is not None
    sql = batch_statement(cfg.samples.query, shape.keys, columns, cfg.samples.rows, variable_rows=variable)
    rows_each = row_wise(columns, cfg.samples.rows, variable)
    order.pop("index")
    return EpochPlan(
        epoch=epoch,
        key_columns=shape.keys,
        **order,
        columns=columns,
        by_field=by_field,
        categories=categories,
        sql=sql,
        params=tuple(categories[f.name] for f in cfg.fields if f.categories is not None),
        row_wise=rows_each,
    )


@dataclass(frozen=True)
class Vocabulary:
    """The store an epoch's ``categories = "auto"`` codes are kept stable in, and whether to record new values.

    The dump records them (``record``); ``pgprefetch check`` reads the store's vocabulary and writes nothing.
    Without a store the epoch is coded as a fresh store's first epoch: the sorted distinct values.
    """

    store: Store | None = None
    record: bool = False


async def resolve_categories(
    cfg: Config, distinct: Callable[[str], Awaitable[Iterable[str]]], vocabulary: Vocabulary | None = None
) -> dict[str, list[str]]:
    """The category list each categorical field's codes index (code = position), the same in both modes.

    An explicit list in the config is the codes. For ``"auto"`` the codes must keep their meaning in every
    epoch of a store, or a model trained across epochs learns noise, so the list is the store's vocabulary
    of the field (:meth:`~pgprefetch.store.Store.vocabulary`) followed by the values ``distinct(column)``
    finds in this snapshot that it lacks, sorted by code point: a fresh store's first epoch is coded by
    the sorted values, a value first seen later gets the next code, and a value no longer in the data
    keeps its code. The extended vocabulary is recorded before any batch is written (the dump's
    ``vocabulary.record``), so a resumed or ``--force`` dump of the epoch, and any later epoch, finds it.

    Every list must fit the field's dtype whatever ``cast`` says: a code is an index, and a wrapped one
    points at another category.

    Raises:
        SourceError: a field's list has more values than its dtype has codes (nothing is recorded then).
    """
    found: dict[str, set[str]] = {}
    for f in cfg.fields:
        if f.categories == "auto":
            found[f.name] = set()
            for column in f.columns:
                found[f.name].update(await distinct(column))
    added: dict[str, tuple[int, list[str]]] = {}  # field -> (codes before, values appended), from the last grow

    def grow(recorded: dict[str, list[str]]) -> dict[str, list[str]]:
        out = {}
        for f in cfg.fields:
            if f.name in found:
                known = recorded.get(f.name, [])
                new = sorted(found[f.name].difference(known))
                _check_fits(f.name, f.dtype, len(known), len(new))
                out[f.name] = known + new
                added[f.name] = (len(known), new)
        return out

    store, record = (vocabulary.store, vocabulary.record) if vocabulary is not None else (None, False)
    if not found:
        auto: dict[str, list[str]] = {}
    elif store is None:
        auto = grow({})
    elif record:
        auto = store.grow_vocabulary(grow)
        for name, (known, new) in added.items():
            if known:  # a field's first vocabulary is all new values: only those appended to one are news
                for code, value in enumerate(new, known):
                    log.info("[fields.%s] categories: new value %r gets code %d", name, value, code)
    else:
        auto = grow(store.vocabulary())
    categories = {}
    for f in cfg.fields:
        if f.name in auto:
            categories[f.name] = auto[f.name]
        elif f.categories is not None:
            _check_fits(f.name, f.dtype, 0, len(f.categories))
            categories[f.name] = list(f.categories)
    return categories


def _check_fits(name: str, dtype: str, recorded: int, new: int) -> None:
    """Refuse a category list of ``recorded + new`` values that the codes of ``dtype`` cannot all index."""
    codes = int(np.iinfo(dtype).max) + 1
    total = recorded + new
    if total <= codes:
        return
    counted = f"{total} distinct values"
    if recorded:
        counted = f"{total} values ({recorded} in the store's vocabulary, {new} new)"
    raise SourceError(
        f"[fields.{name}] categories: {counted} do not fit {dtype} (at most {codes} codes); use a wider integer dtype"
    )


def order_keys(
    cfg: Config, keys: np.ndarray, key_columns: KeyColumns, epoch: int, *, in_place: bool = False
) -> dict[str, Any]:
    """The epoch's order of ``keys`` (repeats refused or dropped, ``fraction`` applied) and its counts.

    ``in_place`` reorders ``keys`` itself when nothing is dropped (a key list read for this epoch alone:
    no second copy of the keys); scan mode keeps its samples' keys for the next epoch.

    Returns the :class:`EpochPlan` fields both modes share: ``keys`` in order, ``index`` (the order as
    indices into the given keys), ``n_keys``, ``duplicates_dropped``, ``used``, ``n_batches``, ``keys_sha256``.
    """
    size = cfg.batches.size
    n_keys = keys.shape[1]
    if n_keys == 0:
        raise SourceError("the keys query returned no rows: there is nothing to dump")
    samples = cfg.samples
    try:
        index, dropped = epoch_indices(
            keys, seed=cfg.batches.seed, epoch=epoch, fraction=samples.fraction, duplicates=samples.duplicates
        )
    except DuplicateKeysError as e:
        shown = "; ".join(f"({key_columns.show(k)})" for k in e.examples.T)
        more = f" and {e.count - e.examples.shape[1]} more" if e.count > e.examples.shape[1] else ""
        what = "the keys query" if cfg.mode == "query" else "[samples] table"
        raise SampleError(
            f"{what} returned {e.count} repeated key(s), e.g. {shown}{more}: each sample must come once "
            'per epoch; fix the keys query, or set [samples] duplicates = "drop" to keep one of each'
        ) from None
    n = index.size
    nb = n_batches(n, size, cfg.batches.drop_last)
    if nb == 0:
        hint = "lower [batches] size or set drop_last = false" if n else "raise [samples] fraction"
        raise SourceError(f"{n} samples make no full batch of {size}: {hint}")
    used = nb * size if cfg.batches.drop_last else n
    if in_place and n == n_keys:
        for column in keys:  # one key column at a time
            column[:] = column[index]
        ordered = keys
    else:
        ordered = np.ascontiguousarray(keys[:, index])
    digest = hashlib.sha256()
    for column in ordered:  # rows of a C-ordered array: hashed in place
        digest.update(np.ascontiguousarray(column[:used]))
    return {
        "keys": ordered,
        "index": index,
        "n_keys": n_keys,
        "duplicates_dropped": dropped,
        "used": used,
        "n_batches": nb,
        "keys_sha256": digest.hexdigest(),
    }


def plan_scan(cfg: Config, shape: ScanShape, sample_keys: np.ndarray, epoch: int) -> EpochPlan:
    """The epoch of a scanned table: its samples (cut by :func:`pgprefetch.scan.cut`) in the epoch's order."""
    key_columns = KeyColumns(shape.key_names)
    order = order_keys(cfg, sample_keys, key_columns, epoch)
    index = order.pop("index")
    return EpochPlan(
        epoch=epoch,
        key_columns=key_columns,
        **order,
        columns=shape.columns,
        by_field=shape.by_field,
        categories=shape.categories,
        sql="",
        params=(),
        samples=index,
    )


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


async def name_unknown_category(cfg: Config, snap: Snapshot, e: SampleError) -> SampleError:
    """The error for a value outside a field's category list, naming the value (looked up in the snapshot)."""
    key, field, column = e.key, e.field, e.column  # type: ignore[attr-defined]
    try:
        values = await snap.sample_text(cfg, key, column)
    except Exception:  # the message without the value is still right
        return e
    categories = next(f.categories for f in cfg.fields if f.name == field)
    known = set(categories) if isinstance(categories, tuple) else set()
    unknown = [v for v in values if v not in known]
    prefix = str(e).split(":", 1)[0]
    if unknown and unknown[0] is None:
        return SampleError(f"{prefix}: field {field}, column {column} is NULL (a category needs a value)")
    if unknown:
        return SampleError(
            f"{prefix}: field {field}, column {column} value {unknown[0]!r} is not in [fields.{field}] categories"
        )
    return e
