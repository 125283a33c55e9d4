"""The TOML config, validated once at the edge into frozen dataclasses.

Nothing past :func:`load_config` sees a raw dict: the pipeline, the store and the CLI take these objects.
Every error is one line naming the file, the key and what was expected (with a "did you mean" for typos),
because a config is edited by hand and read by cron.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from .errors import ConfigError
from .sqltext import find_params, strip_statement

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_DTYPES = ("float16", "float32", "float64")
COMPRESSIONS = ("none", "zstd", "lz4")
CASTS = ("safe", "unsafe")
DUPLICATES = ("error", "drop")
NULL_SUFFIX = "_null"  # a field with a NULL policy gets a boolean array "<field>_null" beside it
RESERVED_FIELDS = ("keys",)  # the store keeps each batch's keys in an array of that name

_TABLE_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|min|h|d)?\s*$")
_DURATION_MS = {"ms": 1, "s": 1_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """Where the data lives and how hard to read it."""

    dsn: str | None = None
    """libpq-style URI; None lets asyncpg use the PG* environment variables."""
    connections: int = 8
    """Pool size, which is also the number of batches in flight."""
    statement_timeout_ms: int | None = None
    """Applied to every statement of every connection; None leaves the server's setting."""
    io_timeout_ms: int = 60_000
    """How long one round trip may go unanswered before its connection counts as lost (0: forever).

    A peer that stops answering without closing (a dropped route, a frozen proxy) is otherwise noticed only
    by TCP keepalives, after hours. It must exceed the slowest batch statement."""
    memory_bytes: int = 512 << 20
    """Scan mode: the table data held at once; a larger table is read in several range passes."""


@dataclass(frozen=True, kw_only=True)
class SamplesConfig:
    """Which samples exist (``keys``) and how to read one of them (``query``)."""

    keys: str
    query: str
    rows: int = 1
    fraction: float = 1.0
    duplicates: str = "error"
    """What a key returned twice by the keys query means: an error, or ("drop") one sample all the same."""

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
class FieldConfig:
    """One tensor of the batch, built from one or more result columns."""

    name: str
    columns: tuple[str, ...]
    dtype: str
    cast: str = "safe"
    """``safe``: a value the dtype cannot hold (overflow, NaN into an integer) stops the dump; ``unsafe``: casts."""
    null: str | float = "error"
    """``error``, ``nan`` (float fields) or a fill value; other than ``error``, a mask array records the NULLs."""
    categories: tuple[str, ...] | str | None = None
    """Text labels stored as integer codes: the list (code = position), ``auto`` (sorted distinct values), or None."""

    @property
    def null_mask(self) -> str | None:
        """The name of the boolean array recording this field's NULLs, or None when NULLs are errors."""
        return f"{self.name}{NULL_SUFFIX}" if self.null != "error" else None


@dataclass(frozen=True, kw_only=True)
class BatchesConfig:
    """How samples are grouped: size, shuffle seed and what to do with a short last batch."""

    size: int
    seed: int = 0
    drop_last: bool = True


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Where epochs are written, and how."""

    path: Path
    compression: str = "none"


@dataclass(frozen=True, kw_only=True)
class Config:
    """A whole, validated config."""

    source: SourceConfig
    samples: SamplesConfig | ScanConfig
    fields: tuple[FieldConfig, ...]
    batches: BatchesConfig
    store: StoreConfig
    file: Path | None = None
    """The file it came from, for messages; None when built in code."""

    @property
    def mode(self) -> str:
        """``query`` (a statement per batch) or ``scan`` (one read of a table per epoch)."""
        return "scan" if isinstance(self.samples, ScanConfig) else "query"

    def field(self, name: str) -> FieldConfig:
        """Return the field called ``name``."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def content(self) -> dict[str, Any]:
        """The settings that decide an epoch's bytes, as plain JSON data.

        Connection settings and the store path are left out: they change where and how fast, not what.
        """
        return {
            "samples": _without_defaults(self.samples, ("duplicates",) if self.mode == "query" else ()),
            "fields": [
                _without_defaults(f, ("cast", "null", "categories")) | {"columns": list(f.columns)} for f in self.fields
            ],
            "batches": dataclasses.asdict(self.batches),
            "compression": self.store.compression,
        }

    def sha256(self) -> str:
        """Hash of :meth:`content`, recorded in every epoch to tell which config wrote it."""
        text = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


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


def load_config(
    path: str | os.PathLike[str],
    *,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Read, validate and freeze a config file, then apply command-line overrides.

    Args:
        path: the TOML file.
        dsn: ``--dsn``; wins over ``PGPREFETCH_DSN``, which wins over ``[source] dsn``.
        connections: ``--connections``, overriding ``[source] connections``.
        store: ``--store``, overriding ``[store] path`` (relative to the working directory, as typed).
        memory: ``--memory``, overriding ``[source] memory`` (scan mode).
        environ: the environment to read ``PGPREFETCH_DSN`` from (``os.environ`` by default).

    Returns:
        The frozen config.

    Raises:
        ConfigError: the file is missing, not TOML, or breaks the contract; the message names the key.
    """
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: cannot read config file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: invalid TOML: {e}") from None
    cfg = parse_config(raw, file=file)
    return with_overrides(cfg, dsn=dsn, connections=connections, store=store, memory=memory, environ=environ)


def with_overrides(
    cfg: Config,
    *,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """``cfg`` with the command-line (or API) overrides applied; see :func:`load_config`."""
    env = os.environ if environ is None else environ
    source = cfg.source
    chosen_dsn = dsn or env.get("PGPREFETCH_DSN") or source.dsn
    if not chosen_dsn and env.get("PGSERVICE"):  # libpq's service name; asyncpg reads it only from a DSN
        chosen_dsn = f"postgresql://?service={quote(env['PGSERVICE'])}"
    if connections is not None:
        if isinstance(connections, bool) or connections <= 0:
            raise ConfigError(f"--connections: expected a positive integer, got {connections!r}")
        source = dataclasses.replace(source, connections=connections)
    if memory is not None:
        source = dataclasses.replace(source, memory_bytes=parse_size(memory, "--memory"))
    source = dataclasses.replace(source, dsn=chosen_dsn)
    store_cfg = cfg.store if store is None else dataclasses.replace(cfg.store, path=Path(store))
    return dataclasses.replace(cfg, source=source, store=store_cfg)


def parse_config(raw: dict[str, Any], *, file: Path | None = None) -> Config:
    """Validate a config already parsed from TOML (see :func:`load_config`)."""
    p = _Parser(file)
    p.keys(raw, "", required=("samples", "fields", "batches", "store"), optional=("source",))
    source = p.section(raw, "source", required=False)
    samples = p.section(raw, "samples")
    batches = p.section(raw, "batches")
    store = p.section(raw, "store")
    fields = p.section(raw, "fields")

    p.keys(source, "source", optional=("dsn", "connections", "statement_timeout", "io_timeout", "memory"))
    p.keys(batches, "batches", required=("size",), optional=("seed", "drop_last"))
    p.keys(store, "store", required=("path",), optional=("compression",))

    samples_cfg = p.samples(samples)
    return Config(
        source=SourceConfig(
            dsn=p.optional_str(source, "source", "dsn"),
            connections=p.positive_int(source, "source", "connections", default=8),
            statement_timeout_ms=p.duration(source, "source", "statement_timeout"),
            io_timeout_ms=_default(p.duration(source, "source", "io_timeout"), 60_000),
            memory_bytes=parse_size(source.get("memory", 512 << 20), f"{p.prefix}[source] memory"),
        ),
        samples=samples_cfg,
        fields=p.fields(fields),
        batches=BatchesConfig(
            size=p.positive_int(batches, "batches", "size"),
            seed=p.integer(batches, "batches", "seed", default=0),
            drop_last=p.boolean(batches, "batches", "drop_last", default=True),
        ),
        store=StoreConfig(
            path=p.path(store, "store", "path"),
            compression=p.choice(store, "store", "compression", COMPRESSIONS, default="none"),
        ),
        file=file,
    )


class _Parser:
    """Typed getters that raise a ConfigError naming the file and key."""

    def __init__(self, file: Path | None) -> None:
        self.file = file

    def samples(self, samples: dict[str, Any]) -> SamplesConfig | ScanConfig:
        """``[samples]``: either ``keys`` + ``query`` (query mode) or ``table`` (scan mode), never both."""
        if "table" in samples and ("keys" in samples or "query" in samples):
            self.fail("[samples]", 'give either "keys" and "query" (query mode) or "table" (scan mode), not both')
        if "table" not in samples:
            self.keys(samples, "samples", required=("keys", "query"), optional=("rows", "fraction", "duplicates"))
            query = SamplesConfig(
                keys=self.sql(samples, "samples", "keys"),
                query=self.sql(samples, "samples", "query"),
                rows=self.positive_int(samples, "samples", "rows", default=1),
                fraction=self.fraction(samples, "samples", "fraction"),
                duplicates=self.choice(samples, "samples", "duplicates", DUPLICATES, default="error"),
            )
            if 0 in find_params(query.query):
                self.fail("[samples] query", "parameters are numbered from $1 (the first key column); found $0")
            return query
        optional = ("order", "window", "stride", "fraction", "duplicates")
        self.keys(samples, "samples", required=("table", "key"), optional=optional)
        window = samples.get("window")
        if window is None:
            for key in ("order", "stride"):
                if key in samples:
                    self.fail(f"[samples] {key}", "only windows have it: set window too, or remove it")
        elif "order" not in samples:
            self.fail("[samples] order", "windows need the column that orders a series' rows")
        key = samples["key"]
        key = [key] if isinstance(key, str) else key
        if not isinstance(key, list) or not key or not all(isinstance(k, str) and k for k in key):
            self.fail("[samples] key", f"expected a column name or a non-empty list of them, got {_show(key)}")
        if len(set(key)) != len(key):
            self.fail("[samples] key", f"a column is listed twice in {key}")
        order = samples.get("order")
        if order is not None and (not isinstance(order, str) or not order):
            self.fail("[samples] order", f"expected a column name, got {_show(order)}")
        if order in key:
            self.fail("[samples] order", f'"{order}" is a key column too')
        return ScanConfig(
            table=self.table(samples),
            key=tuple(key),
            order=order,
            window=None if window is None else self.positive_int(samples, "samples", "window"),
            stride=self.positive_int(samples, "samples", "stride", default=1),
            fraction=self.fraction(samples, "samples", "fraction"),
            duplicates=self.choice(samples, "samples", "duplicates", DUPLICATES, default="error"),
        )

    def table(self, samples: dict[str, Any]) -> str:
        value = samples["table"]
        if not isinstance(value, str) or not strip_statement(value):
            self.fail("[samples] table", f"expected a table or view name, or a SELECT, got {_kind(value)}")
        text = strip_statement(value)
        if not (_TABLE_NAME.fullmatch(text) or re.match(r"(?is)^\s*(select|with|values)\b", text)):
            self.fail("[samples] table", f"expected a table or view name (schema.name), or a SELECT; got {_show(text)}")
        return text

    @property
    def prefix(self) -> str:
        return f"{self.file}: " if self.file else ""

    def fail(self, where: str, message: str) -> None:
        raise ConfigError(f"{self.prefix}{where}: {message}")

    def keys(
        self, table: dict[str, Any], section: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> None:
        known = required + optional
        where = f"[{section}]" if section else "top level"
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else f" (expected one of: {', '.join(known)})"
                self.fail(where, f'unknown key "{key}"{hint}')
        for key in required:
            if key not in table:
                self.fail(where, f'missing required {"section" if not section else "key"} "{key}"')

    def section(self, raw: dict[str, Any], name: str, required: bool = True) -> dict[str, Any]:
        value = raw.get(name, {} if not required else None)
        if not isinstance(value, dict):
            self.fail(f"[{name}]", f"expected a table, got {_kind(value)}")
        return value  # type: ignore[return-value]

    def sql(self, table: dict[str, Any], section: str, key: str) -> str:
        value = table[key]
        if not isinstance(value, str):
            self.fail(f"[{section}] {key}", f"expected a SQL string, got {_kind(value)}")
        if not strip_statement(value):
            self.fail(f"[{section}] {key}", "expected a SQL query, got an empty string")
        return strip_statement(value)

    def integer(self, table: dict[str, Any], section: str, key: str, default: int) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"[{section}] {key}", f"expected an integer, got {_kind(value)}")
        return value  # type: ignore[no-any-return]

    def positive_int(self, table: dict[str, Any], section: str, key: str, default: int | None = None) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(f"[{section}] {key}", f"expected a positive integer, got {_show(value)}")
        return value  # type: ignore[no-any-return]

    def fraction(self, table: dict[str, Any], section: str, key: str) -> float:
        value = table.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self.fail(f"[{section}] {key}", f"expected a number with 0 < {key} <= 1, got {_show(value)}")
        return float(value)

    def boolean(self, table: dict[str, Any], section: str, key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"[{section}] {key}", f"expected true or false, got {_show(value)}")
        return value  # type: ignore[no-any-return]

    def optional_str(self, table: dict[str, Any], section: str, key: str) -> str | None:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(f"[{section}] {key}", f"expected a non-empty string, got {_kind(value)}")
        return value

    def choice(self, table: dict[str, Any], section: str, key: str, choices: tuple[str, ...], default: str) -> str:
        value = table.get(key, default)
        if value not in choices:
            self.fail(f"[{section}] {key}", f"expected one of {', '.join(choices)}; got {_show(value)}")
        return value  # type: ignore[no-any-return]

    def path(self, table: dict[str, Any], section: str, key: str) -> Path:
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(f"[{section}] {key}", f"expected a path string, got {_kind(value)}")
        path = Path(value).expanduser()
        # Relative to the config file, so cron's working directory doesn't matter.
        if not path.is_absolute() and self.file is not None:
            path = self.file.resolve().parent / path
        return Path(os.path.normpath(path))

    def duration(self, table: dict[str, Any], section: str, key: str) -> int | None:
        value = table.get(key)
        if value is None:
            return None
        prefix = f"{self.file}: " if self.file else ""
        return parse_duration(value, f"{prefix}[{section}] {key}")

    def fields(self, table: dict[str, Any]) -> tuple[FieldConfig, ...]:
        if not table:
            self.fail("[fields]", "expected at least one field, e.g. [fields.x] with columns and dtype")
        out = []
        for name, spec in table.items():
            where = f"[fields.{name}]"
            if name in RESERVED_FIELDS:
                self.fail(where, f'"{name}" is reserved (the store keeps each batch\'s keys under it)')
            if not _FIELD_NAME.fullmatch(name):
                self.fail(where, "a field name must be letters, digits and underscores, not starting with a digit")
            if not isinstance(spec, dict):
                self.fail(where, f"expected a table with columns and dtype, got {_kind(spec)}")
            self.keys(spec, f"fields.{name}", required=("columns", "dtype"), optional=("cast", "null", "categories"))
            columns = spec["columns"]
            if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
                self.fail(f"{where} columns", f"expected a non-empty list of column names, got {_show(columns)}")
            if len(set(columns)) != len(columns):
                self.fail(f"{where} columns", f"a column is listed twice in {columns}")
            dtype = spec["dtype"]
            if dtype not in DTYPES:
                close = difflib.get_close_matches(str(dtype), DTYPES, n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                self.fail(f"{where} dtype", f"expected one of {', '.join(DTYPES)}; got {_show(dtype)}{hint}")
            out.append(
                FieldConfig(
                    name=name,
                    columns=tuple(columns),
                    dtype=dtype,
                    cast=self.choice(spec, f"fields.{name}", "cast", CASTS, default="safe"),
                    null=self.null_policy(spec, where, dtype),
                    categories=self.categories(spec, where, dtype),
                )
            )
        names = {f.name for f in out}
        for f in out:
            if f.null_mask in names:
                self.fail(f"[fields.{f.null_mask}]", f"the name is taken by the NULL mask of [fields.{f.name}]")
        return tuple(out)

    def null_policy(self, spec: dict[str, Any], where: str, dtype: str) -> str | float:
        value = spec.get("null", "error")
        if value in ("error", "nan") and not (value == "nan" and dtype not in FLOAT_DTYPES):
            return value  # type: ignore[no-any-return]
        if value == "nan":
            self.fail(f"{where} null", f'"nan" needs a float dtype ({", ".join(FLOAT_DTYPES)}), not {dtype}')
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(f"{where} null", f'expected "error", "nan" or a fill value (a number), got {_show(value)}')
        fits = _fits(value, dtype)
        if not fits:
            self.fail(f"{where} null", f"the fill value {_show(value)} does not fit {dtype}")
        return value  # type: ignore[no-any-return]

    def categories(self, spec: dict[str, Any], where: str, dtype: str) -> tuple[str, ...] | str | None:
        value = spec.get("categories")
        if value is None:
            return None
        if dtype not in INTEGER_DTYPES:
            self.fail(f"{where} categories", f"categorical codes need an integer dtype ({', '.join(INTEGER_DTYPES)})")
        if value == "auto":
            return "auto"
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            self.fail(f"{where} categories", f'expected "auto" or a non-empty list of strings, got {_show(value)}')
        if len(set(value)) != len(value):
            twice = next(c for c in value if value.count(c) > 1)
            self.fail(f"{where} categories", f"{json.dumps(twice)} is listed twice")
        if not _fits(len(value) - 1, dtype):
            self.fail(f"{where} categories", f"{len(value)} categories do not fit {dtype}")
        return tuple(value)


def parse_duration(value: Any, where: str) -> int:
    """Milliseconds from ``"500ms"``, ``"30s"``, ``"5min"``, ``"1h"``, ``"7d"`` or a bare number of ms.

    Raises:
        ConfigError: naming ``where`` (the key or the option) and what was expected.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value  # a bare number is milliseconds, as in postgresql.conf
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m:
        raise ConfigError(f'{where}: expected a duration such as "500ms", "30s", "5min" or "1h", got {_show(value)}')
    return math.ceil(float(m[1]) * _DURATION_MS[m[2] or "ms"])  # rounded up: 0 would mean no timeout at all


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$")
_SIZE_BYTES = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 1 << 10, "M": 1 << 20,
               "G": 1 << 30, "T": 1 << 40, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}  # fmt: skip
_MIN_MEMORY = 1 << 20


def parse_size(value: Any, where: str) -> int:
    """Bytes from ``"512MiB"``, ``"2GB"``, ``"1G"`` (binary) or a bare number of bytes; at least 1 MiB.

    Raises:
        ConfigError: naming ``where`` and what was expected.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = _SIZE.match(value) if isinstance(value, str) else None
        if not m:
            raise ConfigError(f'{where}: expected a size such as "512MiB" or "2GiB", got {_show(value)}')
        size = int(float(m[1]) * _SIZE_BYTES[m[2] or "B"])
    if size < _MIN_MEMORY:
        raise ConfigError(f"{where}: at least 1MiB, got {size} bytes")
    return size


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def _fits(value: float, dtype: str) -> bool:
    """Whether ``value`` is exactly representable in ``dtype`` (a finite float may round in a float dtype)."""
    if dtype == "bool":
        return value in (0, 1)
    if dtype in FLOAT_DTYPES:
        return math.isnan(value) or abs(value) <= float(np.finfo(dtype).max)
    info = np.iinfo(dtype)
    return float(value).is_integer() and info.min <= value <= info.max


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return "nothing" if value is None else names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, float) else json.dumps(value, default=str)
