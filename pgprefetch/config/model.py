"""The TOML config, validated once at the edge into frozen dataclasses.

Nothing past :func:`load_config` sees a raw dict: the pipeline, the store and the CLI take these objects.
Every error is one line naming the file, the key and what was expected (with a "did you mean" for typos),
because a config is edited by hand and read by cron.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgprefetch.sqltext import find_params

if TYPE_CHECKING:
    import numpy as np  # (annotations only: loading a config needs no numpy, nor does `pgprefetch --help`)

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "float16", "float32", "float64")

# PostgreSQL's own names of a column type, as a user copying them from \d would type them: the dtype that
# holds the type exactly. Closeness of spelling would suggest "int8" for "int" and "float64" for "float4".
POSTGRES_DTYPES = {
    "smallint": "int16",
    "int2": "int16",
    "int": "int32",
    "integer": "int32",
    "int4": "int32",
    "bigint": "int64",
    "real": "float32",
    "float4": "float32",
    "float": "float64",
    "double": "float64",
    "double precision": "float64",
    "float8": "float64",
    "boolean": "bool",
}
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
FLOAT_DTYPES = ("float16", "float32", "float64")
COMPRESSIONS = ("none", "zstd", "lz4")
CASTS = ("safe", "unsafe")
DUPLICATES = ("error", "drop")
NULL_SUFFIX = "_null"  # a field with a NULL policy gets a boolean array "<field>_null" beside it
LENGTH_SUFFIX = "_length"  # a field with max_length gets an int32 array "<field>_length" of real lengths
N_ROWS = "n_rows"  # with [samples] max_rows, an int32 array of each sample's real row count
TRUNCATES = ("error", "right", "left")
# Arrays of every epoch: each batch's keys, every chunk's CRC32C, each batch's longest sample (padded fields)
RESERVED_FIELDS = ("keys", "_checksums", "_longest", "_starts")
SOURCE_ARRAY = "source"  # a mixed epoch's int8 array: each sample's source, as its code (position in [samples])
MIX_VERSION = 1  # the plan of mixed epochs (pass orders, apportionment): a change of it is a new version


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """Where the data lives and how hard to read it."""

    dsn: str | None = dataclasses.field(default=None, repr=False)
    """libpq-style URI; None lets asyncpg use the PG* environment variables.

    Left out of ``repr()``: a Config is printed in notebooks, log lines and tracebacks, and the DSN may hold
    the password (#36.14). Read ``source.dsn`` where it is needed."""
    connections: int = 8
    """Pool size, which is also the number of batches in flight."""
    statement_timeout_ms: int | None = None
    """Applied to every statement of every connection; None leaves the server's setting."""
    io_timeout_ms: int = 60_000
    """How long one round trip may go unanswered before its connection counts as lost (0: forever).

    A peer that stops answering without closing (a dropped route, a frozen proxy) is otherwise noticed only
    by TCP keepalives, after hours. It must exceed the slowest batch statement."""
    memory_bytes: int = 512 << 20
    """What a dump holds at once. Query mode: the keys and the shuffle's temporaries; more keys are ordered on
    disk (:mod:`pgprefetch.write.order.spill`). Scan mode: the table data; a larger table is read in range passes."""
    scratch: Path | None = None
    """The local folder every file a dump writes beyond ``memory`` goes in (``dump --scratch``: keys, a scan's
    rows); None: beside the store's partial epoch. Removed when the epoch is published or the dump fails."""


@dataclass(frozen=True, kw_only=True)
class SamplesConfig:
    """Which samples exist (``keys``) and how to read one of them (``query``)."""

    keys: str
    query: str
    rows: int = 1
    """Rows per sample; with ``max_rows``, the most rows a sample may have (it is padded to them)."""
    fraction: float = 1.0
    duplicates: str = "error"
    """What a key returned twice by the keys query means: an error, or ("drop") one sample all the same."""
    max_rows: int | None = None
    """Samples of 1..max_rows rows, padded to ``max_rows`` (``rows`` is then ``max_rows``); None: exactly ``rows``."""
    truncate: str = "error"
    """With ``max_rows``: more rows are an error, or the first (``right``) or last (``left``) ``max_rows`` are kept."""

    @property
    def max_param(self) -> int:
        """The highest ``$n`` the query uses; it must not exceed the number of key columns."""
        return max(find_params(self.query), default=0)


@dataclass(frozen=True, kw_only=True)
class ScanConfig:
    """Scan mode: samples cut from one read of ``table`` per epoch (rows, or windows over series)."""

    table: str
    """A table or view name, or a SELECT returning the key, order and field columns."""
    key: tuple[str, ...]
    """Integer columns: a sample's key (rows), or a series' key (windows)."""
    order: str | None = None
    """Windows only: the integer, timestamp or date column ordering a series' rows."""
    window: int | None = None
    """Windows only: rows per sample."""
    stride: int = 1
    """Windows only: rows from one window start to the next, counted from a series' first row."""
    fraction: float = 1.0
    duplicates: str = "error"

    @property
    def rows(self) -> int:
        """Rows per sample: the window, or 1."""
        return self.window or 1


@dataclass(frozen=True, kw_only=True)
class MixSource:
    """One source of a mixed epoch (``[samples.NAME]``): its own samples, and its weight over the epochs."""

    name: str
    samples: SamplesConfig | ScanConfig
    weights: tuple[tuple[int, int | float], ...] = ((0, 1),)
    """``(from epoch, weight)``, ascending, the first from epoch 0: a plain ``weight = 3`` is ``((0, 3),)``."""

    def weight(self, epoch: int) -> int | float:
        """The weight in force at ``epoch``: that of the last step of the schedule at or before it."""
        return next(w for start, w in reversed(self.weights) if start <= epoch)


@dataclass(frozen=True, kw_only=True)
class MixConfig:
    """Several sources in one epoch, in proportion to their weights (:mod:`pgprefetch.write.mix`)."""

    sources: tuple[MixSource, ...]
    samples: int | None = None
    """Samples per epoch in all; None: the epoch in which the source with the fewest samples per unit of
    weight takes one pass (whole batches)."""

    def source(self, name: str) -> MixSource:
        """The source called ``name``."""
        return next(s for s in self.sources if s.name == name)


@dataclass(frozen=True, kw_only=True)
class VocabularyFrom:
    """``categories = { from = "../train.zarr" }``: the codes are another store's vocabulary of this field.

    ``"auto"`` codes are per store: a validation store dumped from other rows numbers its labels by the
    values it happens to see, so one label can get two codes. A store that borrows the vocabulary of the
    store its model is trained on codes every value as that store does; a value it lacks is an error, as
    for a list in the config.
    """

    store: Path | str
    """The other store: a folder (relative to the config file's folder, as ``[store] path``) or ``s3://``."""
    written: str
    """The location as the config writes it: what the config's identity hashes (see :meth:`Config.content`)."""


@dataclass(frozen=True, kw_only=True)
class FieldConfig:
    """One tensor of the batch, built from one or more result columns."""

    name: str
    columns: tuple[str, ...]
    dtype: str
    cast: str = "safe"
    """``safe``: a value the dtype cannot hold (overflow, NaN into an integer) stops the dump; ``unsafe``: casts."""
    null: str | float = "error"
    """``error``, ``nan`` (float fields) or a fill value; other than ``error``, a mask array records the NULLs."""
    categories: tuple[str, ...] | str | VocabularyFrom | None = None
    """Text labels stored as integer codes: the list (code = position), ``auto`` (sorted distinct values, fixed
    by the store's first epoch), another store's vocabulary (:class:`VocabularyFrom`), or None."""
    max_length: int | None = None
    """Arrays of any length (and text or bytea, as bytes) padded to this many elements; None: fixed length."""
    pad: int | float = 0
    """The value of the padding (``max_length``, ``max_rows``)."""
    truncate: str = "error"
    """A longer array is an error naming the sample, or keeps its first (``right``) or last (``left``) elements."""
    transform: str | None = None
    """The ``[transforms.NAME]`` whose output of this field's name it stores (``columns`` is then empty)."""
    shape: tuple[int, ...] = ()
    """A transform's output of a fixed shape per sample (``()``: a scalar); ``max_length`` for any length."""

    @property
    def null_mask(self) -> str | None:
        """The name of the boolean array recording this field's NULLs, or None when NULLs are errors."""
        return f"{self.name}{NULL_SUFFIX}" if self.null != "error" else None

    @property
    def length_array(self) -> str | None:
        """The name of the int32 array of each sample's real length, or None for fixed-length fields."""
        return f"{self.name}{LENGTH_SUFFIX}" if self.max_length is not None else None


PACKING_METHODS = ("best-fit", "concat")
PACKING_GROUP = 65_536  # documents per best-fit group: under 0.01% padding on lognormal lengths (docs/packing.md)


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """``[packing]``: documents packed into sequences of ``length`` tokens (:mod:`pgprefetch.write.pack`).

    The epoch holds one sample per sequence: ``tokens``, ``segment_ids``, ``position_ids``, ``segment_keys``
    and ``segment_offsets``; ``[batches] size`` counts sequences.
    """

    field: str
    """The field whose values are each document's tokens (an integer dtype with ``max_length``)."""
    length: int
    """Tokens per sequence."""
    method: str = "best-fit"
    """``best-fit``: whole documents, best-fit decreasing within groups; ``concat``: the stream cut anywhere."""
    eos: int | None = None
    """A token appended after each document (part of its last piece); None: none."""
    pad: int = 0
    """The token of the padding after a sequence's last piece."""
    group: int = PACKING_GROUP
    """``best-fit``: documents per group packed together (consecutive in the epoch's shuffled order)."""


@dataclass(frozen=True, kw_only=True)
class TransformConfig:
    """``[transforms.NAME]``: Python run on each sample's inputs before the write (:mod:`pgprefetch.write.transform`).

    Its outputs are the fields that name it (``transform = "NAME"``). Everything here but ``workers`` decides
    the epoch's bytes; ``workers`` only how fast (a random transform draws from the sample's key, not from
    the worker that ran it).
    """

    name: str
    function: str | Callable[..., Any]
    """``module:callable`` (the config file's folder on the import path), or a function object (the Python API)."""
    inputs: tuple[str, ...]
    """Columns of the query (or the scan table) handed to it, by name; no field need store them."""
    random: bool = False
    """An augmentation: drawn anew each epoch from ``ctx.rng(i)``, never cached."""
    workers: int | None = None
    """Processes that run it (0: the dump's own process); None: one per core."""
    version: str = ""
    """Part of the cache key beside the function's source: bump it for what the source does not show."""
    setup: str | Callable[..., Any] | None = None
    """Run once per worker with ``options``; its return value is ``ctx.state``."""
    options: tuple[tuple[str, Any], ...] = ()
    """``[transforms.NAME.options]``: handed to ``setup`` and kept at ``ctx.options``."""
    folder: Path | None = None
    """The config file's folder: on the import path of ``function`` and ``setup``; None when built in code."""
    on_error: str = "error"
    """``error``: a sample it fails on stops the dump; ``skip``: such samples are left out of every epoch."""

    @property
    def option_values(self) -> dict[str, Any]:
        """``options`` as a dict, an option named ``path`` made absolute (relative to the config's folder)."""
        values = dict(self.options)
        path = values.get("path")
        if isinstance(path, str) and self.folder is not None and not Path(path).is_absolute():
            values["path"] = str(self.folder / path)
        return values

    def content(self) -> dict[str, Any]:
        """What the config's identity records of it: what it is, not which version of its code.

        The code and ``version`` key the cache instead: an edited function or a bumped ``version``
        recomputes its outputs in the same store, as a changed row does, rather than making the store
        refuse the config as another's.
        """
        out: dict[str, Any] = {"function": callable_name(self.function), "inputs": list(self.inputs)}
        out |= {"random": True} if self.random else {}
        out |= {"on_error": self.on_error} if self.on_error != "error" else {}
        out |= {"setup": callable_name(self.setup)} if self.setup is not None else {}
        out |= {"options": dict(self.options)} if self.options else {}  # as written: a path relative
        return out


def callable_name(function: str | Callable[..., Any] | None) -> str:
    """``module:callable`` as the config writes it, or a function object's own ``module:qualname``."""
    if function is None or isinstance(function, str):
        return function or ""
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', repr(function))}"


@dataclass(frozen=True, kw_only=True)
class BatchesConfig:
    """How samples are grouped: size, shuffle seed and what to do with a short last batch."""

    size: int
    seed: int = 0
    drop_last: bool = True


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Where epochs are written, and how."""

    path: Path | str  # a local folder, or an object store URL (``s3://bucket/prefix``; see store_location)
    compression: str = "none"
    windows: str = "batches"
    """Scan-mode windows: ``"batches"`` stores every window's rows; ``"starts"`` the rows once and each window's
    first row (:mod:`pgprefetch.write.scan.starts`), gathered at read time (:mod:`pgprefetch.read.windows`)."""


WINDOW_LAYOUTS = ("batches", "starts")


TRAIN = "train"  # the split that is shuffled anew every epoch; every other split is an evaluation split
SPLIT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")  # a split's name is a folder's name in the store: no path


SPLIT_BY = ("key", "order")


def cut_point(value: object) -> int | dt.date | dt.datetime | None:
    """A time cut's ``from`` as a comparable value: an integer, or an ISO date or date-time (None: neither)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    try:
        return dt.date.fromisoformat(value) if len(value) == 10 else dt.datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class SplitsConfig:
    """``[splits]``: which split each sample is in, a pure function of the sample, never of the other samples.

    ``by = "key"`` (the default): shares, cut points on a 53-bit hash of the key (of a window's series' key)
    and ``seed``, in the config's order: a row added later lands in one split for good, no key ever moves.
    ``by = "order"``: a time cut (scan-mode windows): each split from its ``from`` value of the order column on
    (the first from the beginning), in the config's order; a window across a cut is in no split.
    """

    shares: tuple[tuple[str, float], ...] = ()  # by key: (name, share), the shares summing to 1
    seed: int = 0
    by: str = "key"
    starts: tuple[tuple[str, str | int | None], ...] = ()  # by order: (name, from), None for the first

    @property
    def names(self) -> tuple[str, ...]:
        """The splits, in the config's order."""
        return tuple(name for name, _ in (self.shares if self.by == "key" else self.starts))

    @staticmethod
    def evaluation(name: str) -> bool:
        """Whether split ``name`` is an evaluation split: written once, in a fixed order, every sample kept."""
        return name != TRAIN

    def content(self) -> dict[str, Any]:
        """The rule as a config's identity and the store's record hold it."""
        if self.by == "key":
            return {"shares": [list(s) for s in self.shares], "seed": self.seed}
        return {"by": "order", "starts": [list(s) for s in self.starts]}


@dataclass(frozen=True, kw_only=True)
class Config:
    """A whole, validated config."""

    source: SourceConfig
    samples: SamplesConfig | ScanConfig
    """The one source's samples; of a mixed config, its first source's (each source's: :meth:`for_source`)."""
    fields: tuple[FieldConfig, ...]
    batches: BatchesConfig
    store: StoreConfig
    file: Path | None = None
    """The file it came from, for messages; None when built in code."""
    mix: MixConfig | None = None
    """Several sources mixed into each epoch (``[samples.NAME]`` tables); None: the one ``[samples]``."""
    splits: SplitsConfig | None = None
    """``[splits]``: train, validation and test by a hash of each key; None: one set of samples."""
    split: str | None = None
    """The split this dump or check is of (``--split``); None where the config has no splits."""
    transforms: tuple[TransformConfig, ...] = ()
    """``[transforms.NAME]``: Python run on input columns before the write; their outputs are fields."""
    packing: PackingConfig | None = None
    """``[packing]``: documents packed into fixed-length token sequences; None: a sample per key."""
    left_out: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    """The sample keys (``(n_slots, n)`` int64, sorted) an epoch leaves out: those an ``on_error = "skip"``
    transform failed on, found before the epoch is planned. Set by the dump for one epoch; never in a file."""
    left_out_by_source: tuple[tuple[str, np.ndarray], ...] = dataclasses.field(default=(), compare=False, repr=False)
    """A mixed epoch's ``left_out``, per source (each source's keys are its own)."""

    @property
    def column_fields(self) -> tuple[FieldConfig, ...]:
        """The fields read from result columns (not a transform's outputs)."""
        return tuple(f for f in self.fields if f.transform is None)

    def transform(self, name: str) -> TransformConfig:
        """The transform called ``name``."""
        return next(t for t in self.transforms if t.name == name)

    @property
    def evaluation(self) -> bool:
        """Whether this is an evaluation split's dump: one fixed epoch, every sample (:class:`SplitsConfig`)."""
        return self.split is not None and SplitsConfig.evaluation(self.split)

    def for_source(self, name: str) -> Config:
        """The single-source config of a mixed config's source ``name``: its samples, the shared rest.

        Each source is read, ordered and decoded by the machinery of its own mode with this config.
        """
        assert self.mix is not None
        left_out = dict(self.left_out_by_source).get(name)
        return dataclasses.replace(
            self, samples=self.mix.source(name).samples, mix=None, left_out=left_out, left_out_by_source=()
        )

    @property
    def mode(self) -> str:
        """``query`` (a statement per batch) or ``scan`` (one read of a table per epoch)."""
        return "scan" if isinstance(self.samples, ScanConfig) else "query"

    @property
    def query_samples(self) -> SamplesConfig:
        """``samples`` of a query-mode config, for the code that runs only in that mode."""
        if not isinstance(self.samples, SamplesConfig):
            raise TypeError("a scan-mode config has no per-sample query")
        return self.samples

    @property
    def scan_samples(self) -> ScanConfig:
        """``samples`` of a scan-mode config, for the code that runs only in that mode."""
        if not isinstance(self.samples, ScanConfig):
            raise TypeError("a query-mode config has no table to scan")
        return self.samples

    def field(self, name: str) -> FieldConfig:
        """Return the field called ``name``."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def content(self) -> dict[str, Any]:
        """The settings that decide an epoch's bytes, as plain JSON data.

        Connection settings and the store path are left out: they change where and how fast, not what.
        A mixed config's weights and ``[mix] samples`` are left out too: they may be edited between epochs,
        and each epoch records the weights it used and where it left each source (:mod:`pgprefetch.write.mix`).
        """
        if self.mix is not None:
            return {
                "mix": {
                    "version": MIX_VERSION,
                    "sources": [
                        {"name": s.name, "mode": "query" if isinstance(s.samples, SamplesConfig) else "scan"}
                        | _without_defaults(s.samples, _OPTIONAL if isinstance(s.samples, SamplesConfig) else ())
                        for s in self.mix.sources
                    ],
                },
                **self._shared_content(),
            }
        return {
            "samples": _without_defaults(self.samples, _OPTIONAL if self.mode == "query" else ()),
            **self._shared_content(),
        }

    def _shared_content(self) -> dict[str, Any]:
        splits = {"splits": self.splits.content()} if self.splits is not None else {}
        transforms = {"transforms": {t.name: t.content() for t in self.transforms}} if self.transforms else {}
        packing = {"packing": dataclasses.asdict(self.packing)} if self.packing is not None else {}
        return (
            splits
            | transforms
            | packing
            | {
                "fields": [
                    _without_defaults(
                        f, ("cast", "null", "categories", "max_length", "pad", "truncate", "transform", "shape")
                    )
                    | {"columns": list(f.columns)}
                    | ({"shape": list(f.shape)} if f.shape else {})
                    | _borrowed(f)
                    for f in self.fields
                ],
                "batches": dataclasses.asdict(self.batches),
                "compression": self.store.compression,
            }
            | ({"windows": self.store.windows} if self.store.windows != "batches" else {})  # (hashed once set)
        )

    def sha256(self) -> str:
        """Hash of :meth:`content`, recorded in every epoch to tell which config wrote it."""
        text = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _borrowed(f: FieldConfig) -> dict[str, Any]:
    """A borrowed vocabulary as the config writes it: moving the folders of both stores keeps the identity."""
    return {"categories": {"from": f.categories.written}} if isinstance(f.categories, VocabularyFrom) else {}


_OPTIONAL = ("duplicates", "max_rows", "truncate")  # query mode's [samples] settings added after its format


def _without_defaults(obj: Any, optional: tuple[str, ...]) -> dict[str, Any]:
    """``asdict(obj)`` less the ``optional`` settings left at their defaults.

    Settings added after a store format was fixed are hashed only when set, so a config that does not use
    them keeps the hash its stores were written under.
    """
    out = dataclasses.asdict(obj)
    defaults = {f.name: f.default for f in dataclasses.fields(obj)}
    for name in optional:
        if out[name] == defaults[name]:
            del out[name]
    return out


_SHOWN_VALUE = 40  # a differing value longer than this (a query) is named, not printed
_SHOWN_KEYS = 6  # differing keys named in one line; the rest are counted


def config_change(stored: Any, stored_sha256: Any, cfg: Config) -> str:
    """How ``cfg`` differs from the config an epoch was written with, by the keys a user edits.

    ``stored`` is that epoch's recorded :meth:`Config.content` (its manifest's ``config_content``), read
    from a store and so not trusted to be well formed. Two hashes tell a user only that something changed;
    the dotted keys (``batches.size``, ``fields.x.dtype``) say what, so that an edit is told from a wrong
    ``[store] path``. An epoch written before the content was recorded has only its hash to compare.
    """
    hashes = f"config sha256 {str(stored_sha256)[:12]}, this config: {cfg.sha256()[:12]}"
    theirs = _flat(stored) if isinstance(stored, dict) else None
    if theirs is None:
        return f"{hashes}; that epoch records only the hash of its config, so which keys differ is not known"
    here = _flat(cfg.content())
    assert here is not None  # a Config's own content is well formed
    changed = _differences(*theirs, *here)
    if not changed:
        return hashes
    more = f" and {len(changed) - _SHOWN_KEYS} more" if len(changed) > _SHOWN_KEYS else ""
    return "differs in " + ", ".join(changed[:_SHOWN_KEYS]) + more


def _differences(theirs: dict[str, Any], their_order: list[str], here: dict[str, Any], order: list[str]) -> list[str]:
    """Each differing key with both values (where short), this config's order first.

    A field or mixed source that one side lacks is one entry (``fields.y (only in this config)``), not
    one per setting of it; the fields' order (the arrays' and parameters' order) is one of its own.
    """
    owners_there, owners_here = {_owner(k) for k in theirs}, {_owner(k) for k in here}
    out: list[str] = []
    for key in [*here, *(k for k in theirs if k not in here)]:
        owner = _owner(key)
        if owner is not None and (owner not in owners_there or owner not in owners_here):
            entry = f"{owner} (only {'in this config' if owner in owners_here else 'there'})"
        elif theirs.get(key, _UNSET) != here.get(key, _UNSET):
            shown = [_show_value(v) for v in (theirs.get(key, _UNSET), here.get(key, _UNSET))]
            entry = key if None in shown else f"{key} ({shown[0]} there, {shown[1]} in this config)"
        else:
            continue
        if entry not in out:
            out.append(entry)
    if set(their_order) == set(order) and their_order != order:
        out.append(f"the order of the fields ({', '.join(their_order)} there)")
    return out


_UNSET = object()  # a key one side does not record: a setting left at its default


def _owner(key: str) -> str | None:
    """The field or mixed source a dotted key belongs to (``fields.x`` of ``fields.x.dtype``), if any."""
    parts = key.split(".")
    return ".".join(parts[:2]) if len(parts) == 3 and parts[0] in ("fields", "samples") else None


def _show_value(value: Any) -> str | None:
    """A value as the config writes it, ``not set`` for none; None when it is too long to show in a line."""
    if value is _UNSET:
        return "not set"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _SHOWN_VALUE else None


def _flat(content: dict[str, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """:meth:`Config.content` as the TOML file's dotted keys (``fields.x.dtype``), and the fields' names in order.

    None when ``content`` is not shaped like one (a damaged or foreign record).
    """
    out: dict[str, Any] = {}
    order: list[str] = []
    try:
        for key, value in content.items():
            if key == "samples":
                out |= {f"samples.{k}": v for k, v in value.items()}
            elif key == "mix":
                out["mix.version"] = value["version"]  # how pgprefetch plans mixed epochs
                for s in value["sources"]:
                    out |= {f"samples.{s['name']}.{k}": v for k, v in s.items() if k not in ("name", "mode")}
            elif key == "fields":
                for f in value:
                    out |= {f"fields.{f['name']}.{k}": v for k, v in f.items() if k != "name"}
                    order.append(str(f["name"]))
            elif key == "compression":
                out["store.compression"] = value
            elif isinstance(value, dict):
                out |= {f"{key}.{k}": v for k, v in value.items()}
            else:
                out[key] = value
    except (AttributeError, KeyError, TypeError):
        return None
    if not all(_NAME.fullmatch(part) for key in [*out, *order] for part in key.split(".")):
        return None  # a name no config can have (a newline would split the refusal's one line)
    return out, order


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
