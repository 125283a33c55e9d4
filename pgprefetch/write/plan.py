"""What an epoch will hold, decided on its snapshot before anything is written: the same for both modes.

:func:`order_keys` puts the keys in the epoch's order (refusing or dropping repeated keys, taking the
fraction, cutting to full batches) and hashes them, :func:`order_spilled` the same for keys that outgrew
``[source] memory`` (query mode: ordered on disk, the same order and hash); :func:`resolve_categories`
fixes each categorical field's list, stable across the epochs of a store. Each mode plans with these: the
query mode in :func:`pgprefetch.write.query.plan_epoch`, the scan mode in
:func:`pgprefetch.write.scan.whole.plan_scan`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, FieldConfig, VocabularyFrom
from pgprefetch.decode.layout import UnknownCategoryError, null_hint
from pgprefetch.errors import ConfigError, SampleError, SourceError, StoreError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.base import Store
from pgprefetch.store.open import open_store
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.shuffle import Repeats, n_batches, order_part
from pgprefetch.write.order.spill import KeyRuns
from pgprefetch.write.order.splits import split_keep

log = logging.getLogger("pgprefetch")


@dataclass(frozen=True)
class KeyWindow:
    """A run of an epoch's ordered keys, indexed as the whole epoch's: what one part of a spread epoch gets.

    Each part of an epoch spread over a cluster (:mod:`pgprefetch.write.ray`) is sent only the keys of its
    own batches, so the driver never holds all the keys at once when they were ordered on disk.
    """

    keys: np.ndarray  # (n_slots, m): the keys of the epoch's samples first ... first + m - 1
    first: int

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_slots, first + m)``: as far as the epoch's key array reaches here."""
        return self.keys.shape[0], self.first + self.keys.shape[1]

    def columns(self, start: int, stop: int) -> np.ndarray:
        """The keys of samples ``start ... stop - 1`` (within the window)."""
        assert start >= self.first, "a part reads only its own keys"
        return self.keys[:, start - self.first : stop - self.first]


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's samples in order, and how to fetch and decode them."""

    epoch: int
    # (n_slots, n) int64 in the epoch's order, a slot per integer key column, two per uuid; or, for keys beyond
    # [source] memory, the same on disk
    keys: np.ndarray | OrderedKeys | KeyWindow  # a KeyWindow: a spread epoch's part
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
    last_dropped: int = 0  # samples of the short last batch left out (drop_last): others each epoch

    def batch_keys(self, batch: int, size: int, count: int = 1) -> np.ndarray:
        """The keys of ``count`` batches from ``batch`` on, ``(n_slots, <= count * size)``."""
        if isinstance(self.keys, OrderedKeys | KeyWindow):
            return self.keys.columns(batch * size, (batch + count) * size)
        return self.keys[:, batch * size : (batch + count) * size]


@dataclass(frozen=True)
class Vocabulary:
    """The store an epoch's ``categories = "auto"`` codes are kept stable in, and whether to record new values.

    The dump records them (``record``); ``pgprefetch check`` reads the store's vocabulary and writes nothing.
    Without a store the epoch is coded as a fresh store's first epoch: the sorted distinct values.
    """

    store: Store | None = None
    record: bool = False


MAX_CATEGORY_BYTES = 1024  # a category value's UTF-8 bytes: every reader and `ls` parses the vocabulary
MAX_CATEGORIES = 65_536  # values in one field's list (uint16's codes), whatever wider dtype it has

# The distinct values of each of the given columns (the ``categories = "auto"`` ones), found in one read.
Distinct = Callable[[list[str]], Awaitable[dict[str, set[str]]]]


def auto_columns(cfg: Config) -> list[str]:
    """The columns of the ``categories = "auto"`` fields, each once, in field order."""
    return list(dict.fromkeys(c for f in cfg.fields if f.categories == "auto" for c in f.columns))


async def resolve_categories(
    cfg: Config, distinct: Distinct | None, vocabulary: Vocabulary | None = None
) -> dict[str, list[str]]:
    """The category list each categorical field's codes index (code = position), the same in both modes.

    An explicit list in the config is the codes. For ``"auto"`` the codes must keep their meaning in every
    epoch of a store, or a model trained across epochs learns noise, so the list is the store's vocabulary
    of the field (:meth:`~pgprefetch.store.base.Store.vocabulary`) followed by the values ``distinct``
    finds in this snapshot (for all the auto columns at once: one read) that it lacks, sorted by code point:
    a fresh store's first epoch is coded by the sorted values, a value first seen later gets the next code,
    and a value no longer in the data keeps its code. The extended vocabulary is recorded before any batch
    is written (the dump's ``vocabulary.record``), so a resumed or ``--force`` dump of the epoch, and any
    later epoch, finds it. ``distinct`` None: no new values (a scan that found every value in the store's
    vocabulary, :func:`pgprefetch.write.scan.whole.read_whole`).

    Every list must fit the field's dtype whatever ``cast`` says: a code is an index, and a wrapped one
    points at another category. A value is at most :data:`MAX_CATEGORY_BYTES` and a list at most
    :data:`MAX_CATEGORIES` long: the vocabulary is parsed by every reader and every ``ls``.

    Raises:
        SourceError: a field's list has more values than its dtype has codes, or more than the limit, or a
            value is too long (nothing is recorded then).
    """
    columns = auto_columns(cfg)
    by_column = await distinct(columns) if columns and distinct is not None else {}
    found: dict[str, set[str]] = {
        f.name: set().union(*(by_column.get(c, set()) for c in f.columns)) for f in cfg.fields if f.categories == "auto"
    }
    added: dict[str, tuple[int, list[str]]] = {}  # field -> (codes before, values appended), from the last grow

    def grow(recorded: dict[str, list[str]]) -> dict[str, list[str]]:
        out = {}
        for f in cfg.fields:
            if f.name in found:
                known = recorded.get(f.name, [])
                new = sorted(found[f.name].difference(known))
                for value in new:
                    _check_length(f.name, value, "the data")
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
            elif new and store.parent is None:  # this store's codes were fixed just now: they are its alone
                log.info("%s", per_store_notice(name, store.location, len(new)))  # (a split's are all splits')
    else:
        auto = grow(store.vocabulary())
    categories = {}
    for f in cfg.fields:
        if f.name in auto:
            categories[f.name] = auto[f.name]
        elif isinstance(f.categories, VocabularyFrom):
            categories[f.name] = borrowed_vocabulary(cfg, f, f.categories)
        elif f.categories is not None:
            for value in f.categories:
                _check_length(f.name, value, "the config")
            _check_fits(f.name, f.dtype, 0, len(f.categories))
            categories[f.name] = list(f.categories)
    return categories


def per_store_notice(field: str, location: str, count: int, *, planned: bool = False) -> str:
    """The line said when a store's ``"auto"`` codes are first fixed (by a dump; ``planned``: by ``check``).

    Each store numbers the values its own first epoch finds, so a validation store dumped from other rows
    may give a label another code than the training store does, and nothing else would say so.
    """
    coded = "will code" if planned else "codes"
    return (
        f"[fields.{field}] categories: codes are per store: {location} {coded} the {count} value(s) found in "
        f"sorted order; a store dumped from other rows (a validation split) codes its own: give its field "
        f"categories = {{ from = {json.dumps(str(location))} }} to share these codes"
    )


def borrowed_vocabulary(cfg: Config, f: FieldConfig, source: VocabularyFrom) -> list[str]:
    """The vocabulary of field ``f`` that another store recorded (``categories = { from = STORE }``).

    It is read, never written, at each epoch's plan: the other store's codes only grow, so an epoch
    planned later may have more of them, each meaning what it meant before. A value of the data that
    the list lacks stops the epoch as for a list in the config.

    Raises:
        ConfigError: ``STORE`` is this config's own store, holds no pgprefetch store, or has no vocabulary
            of the field (it is not ``"auto"`` there).
    """
    where = f"[fields.{f.name}] categories = {{ from = {json.dumps(source.written)} }}"
    own, theirs = cfg.store.path, source.store
    if own.resolve() == theirs.resolve() if isinstance(own, Path) and isinstance(theirs, Path) else own == theirs:
        raise ConfigError(f'{where}: that is this config\'s own store; give the store to share codes with, or "auto"')
    other = open_store(source.store)
    if not other.exists():
        raise ConfigError(
            f"{where}: no pgprefetch store at {other.location}: dump that store first, or fix the path "
            "(relative to the config file's folder)"
        )
    recorded = other.vocabulary()
    values = recorded.get(f.name)
    if not values:
        has = f"it has those of {', '.join(sorted(recorded))}" if recorded else "it has none"
        raise ConfigError(
            f'{where}: {other.location} has no vocabulary of field {f.name} ({has}; a field has one where it is "auto")'
        )
    _check_fits(f.name, f.dtype, 0, len(values))
    return values


def known_vocabulary(cfg: Config, vocabulary: Vocabulary | None) -> dict[str, list[str]] | None:
    """The store's vocabulary of every ``"auto"`` field, when the store has one for each (else None).

    A scan codes its values against it while it reads (:func:`pgprefetch.write.scan.whole.read_whole`): if
    the data holds no other value, the epoch's lists are known without a read of their own.
    """
    store = vocabulary.store if vocabulary is not None else None
    names = [f.name for f in cfg.fields if f.categories == "auto"]
    if store is None or not names:
        return None
    recorded = store.vocabulary()
    return recorded if all(recorded.get(n) for n in names) else None


def _check_length(name: str, value: str, source: str) -> None:
    """Refuse a category value longer than :data:`MAX_CATEGORY_BYTES` (UTF-8), naming the field and the limit."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_CATEGORY_BYTES:
        shown = value[:40] + "..."
        raise SourceError(
            f"[fields.{name}] categories: a value of {source} is longer than {MAX_CATEGORY_BYTES} bytes "
            f"({shown!r}); categories are labels: use a uint8 field with max_length for long text"
        )


def _check_fits(name: str, dtype: str, recorded: int, new: int) -> None:
    """Refuse a category list of ``recorded + new`` values that the codes of ``dtype`` cannot all index."""
    codes = int(np.iinfo(dtype).max) + 1
    total = recorded + new
    if total <= min(codes, MAX_CATEGORIES):
        return
    counted = f"{total} distinct values"
    if recorded:
        counted = f"{total} values ({recorded} in the store's vocabulary, {new} new)"
    if total > MAX_CATEGORIES and codes >= MAX_CATEGORIES:
        raise SourceError(
            f"[fields.{name}] categories: {counted} are more than the limit of {MAX_CATEGORIES:,} values; "
            "a column of that many values is an id, not a label: use it as a number"
        )
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
    indices into the given keys), ``n_keys``, ``duplicates_dropped``, ``used``, ``n_batches``, ``last_dropped``,
    ``keys_sha256``.
    """
    n_keys = keys.shape[1]
    if n_keys == 0:
        raise SourceError("the keys query returned no rows: there is nothing to dump")
    samples = cfg.samples
    keep = split_keep(cfg, key_columns)
    index, repeats = order_part(keys, seed=cfg.batches.seed, epoch=epoch, fraction=samples.fraction, keep=keep)
    n = index.size
    counts = _counts(cfg, key_columns, n_keys, n, repeats)
    if in_place and n == n_keys:
        for column in keys:  # one key column at a time
            column[:] = column[index]
        ordered = keys
    else:
        ordered = np.ascontiguousarray(keys[:, index])
    digest = hashlib.sha256()
    for column in ordered:  # rows of a C-ordered array: hashed in place
        digest.update(np.ascontiguousarray(column[: counts["used"]]).data)
    return {"keys": ordered, "index": index, **counts, "keys_sha256": digest.hexdigest()}


def order_spilled(cfg: Config, runs: KeyRuns, key_columns: KeyColumns, epoch: int) -> dict[str, Any]:
    """:func:`order_keys` for keys that outgrew ``[source] memory``: the same order, into an ordered key file.

    Returns the same fields but ``index``; ``keys`` is the :class:`~pgprefetch.write.order.keyfile.OrderedKeys`
    (the caller closes it and removes its folder).
    """
    drop_last = cfg.batches.drop_last
    quantum = cfg.batches.size if drop_last else 1
    ordered, repeats, buckets = runs.order(
        fraction=cfg.samples.fraction, quantum=quantum, keep=split_keep(cfg, key_columns)
    )
    fields = ordered_fields(cfg, key_columns, runs.n, ordered, repeats)
    log.info(
        "epoch %d: %s keys outgrew [source] memory (%s): ordered on disk in %d runs and %d buckets, %.1f s",
        epoch, f"{runs.n:,}", _size(cfg.source.memory_bytes), len(runs.runs), buckets,
        time.monotonic() - runs.started,
    )  # fmt: skip
    return fields


def ordered_fields(
    cfg: Config, key_columns: KeyColumns, n_keys: int, ordered: OrderedKeys, repeats: Repeats
) -> dict[str, Any]:
    """:func:`order_keys`'s fields but ``index`` for an epoch's order written to ``ordered`` (closed on an error).

    ``n_keys``: the keys before repeats and ``fraction`` were taken out; ``repeats``: those found.
    """
    try:
        counts = _counts(cfg, key_columns, n_keys, ordered.n, repeats)
        digest = ordered.finish(counts["used"])
    except BaseException:
        ordered.close()
        raise
    return {"keys": ordered, **counts, "keys_sha256": digest}


def _counts(cfg: Config, key_columns: KeyColumns, n_keys: int, n: int, repeats: Repeats) -> dict[str, int]:
    """The epoch's counts from ``n`` samples kept of ``n_keys``; refuses repeats unless dropped, and no batch.

    Raises:
        SampleError: repeated keys, with ``duplicates = "error"``.
        SourceError: the samples make no batch.
    """
    size = cfg.batches.size
    if repeats.count and cfg.samples.duplicates != "drop":
        shown = "; ".join(f"({key_columns.show(k)})" for k in repeats.examples.T)
        more = (
            f" and {repeats.count - repeats.examples.shape[1]} more"
            if repeats.count > repeats.examples.shape[1]
            else ""
        )
        what = "the keys query" if cfg.mode == "query" else "[samples] table"
        raise SampleError(
            f"{what} returned {repeats.count} repeated key(s), e.g. {shown}{more}: each sample must come once "
            'per epoch; fix the keys query, or set [samples] duplicates = "drop" to keep one of each'
        ) from None
    nb = n_batches(n, size, cfg.batches.drop_last)
    if nb == 0:
        hint = "lower [batches] size or set drop_last = false" if n else "raise [samples] fraction"
        if not n and cfg.split is not None and n_keys:
            hint = f"[splits] {cfg.split} holds none of the {n_keys:,} keys: check its share"
        raise SourceError(f"{n} samples make no full batch of {size}: {hint}")
    used = nb * size if cfg.batches.drop_last else n
    return {
        "n_keys": n_keys,
        "duplicates_dropped": repeats.count,
        "used": used,
        "n_batches": nb,
        "last_dropped": n - used,
    }


def _size(nbytes: int) -> str:
    """A byte count as the config writes it: ``64MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes} bytes"


SampleText = Callable[[Sequence[object], str], Awaitable[list[str | None]]]
"""A sample's values of one column as text, looked up on the epoch's snapshot: ``(key values, column)``."""

SHOWN_CHARS = 80  # of a value, the most an error line shows


async def name_unknown_category(
    cfg: Config, snap: Snapshot, e: UnknownCategoryError, lookup: SampleText | None = None
) -> SampleError:
    """The error for a value outside a field's category list, naming the value (looked up in the snapshot).

    ``lookup`` finds the sample's values: query mode's per-sample query by default; scan mode's COPY codes a
    value outside the list as -1 on the server, so it reads the sample's rows again
    (:func:`pgprefetch.write.scan.shape.sample_text`).
    """
    key, field, column = e.key, e.field, e.column
    try:
        values = await (lookup(key, column) if lookup is not None else snap.sample_text(cfg, key, column))
    except Exception:  # the message without the value is still right
        return e
    f = next(f for f in cfg.fields if f.name == field)
    known = set(f.categories) if isinstance(f.categories, tuple) else set()
    borrowed = ""
    if isinstance(f.categories, VocabularyFrom):  # the other store's list, as planned (it only grows)
        other = open_store(f.categories.store)
        try:
            known, borrowed = set(other.vocabulary().get(field, [])), f" (the vocabulary of {other.location})"
        except StoreError:  # gone or damaged since the plan read it: the message without the value is still right
            return e
    unknown = [v for v in values if v not in known]
    if not unknown:
        return e
    if unknown[0] is None:
        return SampleError(f"{e.sample}: field {field}, column {column} is NULL{null_hint(f)}")
    return SampleError(
        f"{e.sample}: field {field}, column {column} value {shown_value(unknown[0])} is not in "
        f"[fields.{field}] categories{borrowed}"
    )


def shown_value(value: str) -> str:
    """A value as an error line shows it: escaped (``repr``: one line, whatever it holds), cut past a length."""
    return repr(value) if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]!r}..."
