"""Values typed by hand in a config or on the command line: sizes, durations, store locations.

Each parser names where the value came from (the key or the option) in its one-line error, and shows the
bad value as the config file spells it.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from pgprefetch.errors import ConfigError

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


def show_size(nbytes: float) -> str:
    """A byte count as every command prints it: decimal units, three significant digits (``48.2 kB``).

    One way for all of them, so the same epoch reads alike in ``dump``, ``ls`` and ``check``.
    """
    if nbytes < 1000:
        return f"{int(nbytes)} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        value = float(f"{nbytes / scale:.3g}")  # rounded first: 999,999 B is 1.00 MB, not 1,000 kB
        if value < 1000 or unit == "TB":
            return f"{value:,.{max(0, 2 - len(str(int(value))) + 1)}f} {unit}"
    raise AssertionError("unreachable")


def show(value: Any) -> str:
    """A value as config messages show it: JSON, with floats as Python writes them."""
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, float) else json.dumps(value, default=str)
