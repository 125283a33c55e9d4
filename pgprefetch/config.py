"""The TOML config, validated once at the edge into frozen dataclasses.

Nothing past :func:`load_config` sees a raw dict: the pipeline, the store and the CLI take these objects.
Every error is one line naming the file, the key and what was expected (with a "did you mean" for typos),
because a config is edited by hand and read by cron.
"""

from __future__ import annotations

import dataclasses
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

from .errors import ConfigError
from .sqltext import find_params

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_DTYPES = ("float16", "float32", "float64")
COMPRESSIONS = ("none", "zstd", "lz4")
CASTS = ("safe", "unsafe")
DUPLICATES = ("error", "drop")
NULL_SUFFIX = "_null"  # a field with a NULL policy gets a boolean array "<field>_null" beside it
LENGTH_SUFFIX = "_length"  # a field with max_length gets an int32 array "<field>_length" of real lengths
N_ROWS = "n_rows"  # with [samples] max_rows, an int32 array of each sample's real row count
TRUNCATES = ("error", "right", "left")
# Arrays of every epoch: each batch's keys, every chunk's CRC32C, each batch's longest sample (padded fields)
RESERVED_FIELDS = ("keys", "_checksums", "_longest")


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
    max_length: int | None = None
    """Arrays of any length (and text or bytea, as bytes) padded to this many elements; None: fixed length."""
    pad: int | float = 0
    """The value of the padding (``max_length``, ``max_rows``)."""
    truncate: str = "error"
    """A longer array is an error naming the sample, or keeps its first (``right``) or last (``left``) elements."""

    @property
    def null_mask(self) -> str | None:
        """The name of the boolean array recording this field's NULLs, or None when NULLs are errors."""
        return f"{self.name}{NULL_SUFFIX}" if self.null != "error" else None

    @property
    def length_array(self) -> str | None:
        """The name of the int32 array of each sample's real length, or None for fixed-length fields."""
        return f"{self.name}{LENGTH_SUFFIX}" if self.max_length is not None else None


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
            "samples": _without_defaults(
                self.samples, ("duplicates", "max_rows", "truncate") if self.mode == "query" else ()
            ),
            "fields": [
                _without_defaults(f, ("cast", "null", "categories", "max_length", "pad", "truncate"))
                | {"columns": list(f.columns)}
                for f in self.fields
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


_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def store_location(value: str | os.PathLike[str], where: str, base: Path | None = None) -> Path | str:
    """A store location: ``s3://bucket/prefix`` as a normalised string, or a local folder as a Path.

    Any other URL scheme is an error: ``Path("gs://b/x")`` would silently be a local folder named ``gs:``.
    A relative folder is taken relative to ``base`` (the config file's folder) when given.
    """
    text = os.fspath(value)
    url = _URL.match(text) if isinstance(text, str) else None
    if url is None:
        path = Path(text).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return Path(os.path.normpath(path))
    scheme, rest = url[1].lower(), url[2]
    if scheme != "s3":
        raise ConfigError(f"{where}: unsupported store URL {scheme}://...: use a local folder or s3://bucket/prefix")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ConfigError(f"{where}: {text!r} does not name a valid S3 bucket (s3://bucket/prefix)")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"{where}: {text!r}: '.' and '..' are not allowed in an S3 prefix")
    return "s3://" + "/".join([bucket, *parts])


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
    store_cfg = cfg.store if store is None else dataclasses.replace(cfg.store, path=store_location(store, "--store"))
    return dataclasses.replace(cfg, source=source, store=store_cfg)


def parse_config(raw: dict[str, Any], *, file: Path | None = None) -> Config:
    """Validate a config already parsed from TOML (see :func:`load_config`)."""
    from .configparse import parse_config as parse  # the parser needs this module's classes: imported late

    return parse(raw, file=file)


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|min|h|d)?\s*$")
_DURATION_MS = {"ms": 1, "s": 1_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(value: Any, where: str) -> int:
    """Milliseconds from ``"500ms"``, ``"30s"``, ``"5min"``, ``"1h"``, ``"7d"`` or a bare number of ms.

    Raises:
        ConfigError: naming ``where`` (the key or the option) and what was expected.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value  # a bare number is milliseconds, as in postgresql.conf
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m:
        raise ConfigError(f'{where}: expected a duration such as "500ms", "30s", "5min" or "1h", got {show(value)}')
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
            raise ConfigError(f'{where}: expected a size such as "512MiB" or "2GiB", got {show(value)}')
        size = int(float(m[1]) * _SIZE_BYTES[m[2] or "B"])
    if size < _MIN_MEMORY:
        raise ConfigError(f"{where}: at least 1MiB, got {size} bytes")
    return size


def show(value: Any) -> str:
    """A value as config messages show it: JSON, with floats as Python writes them."""
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, float) else json.dumps(value, default=str)
