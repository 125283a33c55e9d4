"""``[samples.NAME]`` tables and ``[mix]``: a config whose epochs mix several sources, checked at the edge.

A mixed config's ``[samples]`` holds one sub-table per source, each a query-mode or scan-mode source as a
lone ``[samples]`` would be, plus its ``weight``: a number, or a schedule ``{ 0 = 3, 10 = 1 }`` (from
epoch 0 weight 3, from epoch 10 weight 1). ``[mix] samples`` fixes the epoch's length.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn, Protocol

from pgprefetch.config.model import SOURCE_ARRAY, FieldConfig, MixConfig, MixSource, SamplesConfig, ScanConfig
from pgprefetch.config.values import show


class _Parser(Protocol):
    """The getters of :mod:`pgprefetch.config.parse` that a source's table is checked with."""

    def fail(self, where: str, message: str) -> NoReturn: ...

    def keys(
        self, table: dict[str, Any], section: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> None: ...

    def samples(self, samples: dict[str, Any], section: str = "samples") -> SamplesConfig | ScanConfig: ...

    def positive_int(self, table: dict[str, Any], section: str, key: str, default: int | None = None) -> int: ...


_SOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SOURCES = 127  # each sample's source is an int8 code
_OWN_KEYS = ("weight",)  # what a source table has beyond a lone [samples]'s keys
_QUERY_KEYS = ("keys", "query", "rows", "fraction", "duplicates", "max_rows", "truncate")
_SCAN_KEYS = ("table", "key", "order", "window", "stride", "fraction", "duplicates")


def is_mixed(samples: dict[str, Any]) -> bool:
    """Whether ``[samples]`` is a table of sources (every value a table) rather than one source."""
    return bool(samples) and all(isinstance(v, dict) for v in samples.values())


def check_no_stray_keys(p: _Parser, samples: dict[str, Any]) -> None:
    """Refuse a setting written beside ``[samples.NAME]`` sources, naming it: it belongs in each source.

    ``fraction = 0.5`` above the first ``[samples.NAME]`` table lands in ``[samples]`` itself, which then
    is neither one source nor a table of sources; the error must name that key, not ``[mix]`` or a source.
    """
    sources = [k for k, v in samples.items() if isinstance(v, dict)]
    stray = [k for k, v in samples.items() if not isinstance(v, dict)]
    if not sources or not stray:
        return
    key = stray[0]
    if key in (*_QUERY_KEYS, *_SCAN_KEYS, *_OWN_KEYS):
        named = ", ".join(f"[samples.{n}]" for n in sources[:3]) + (", ..." if len(sources) > 3 else "")
        advice = f"it is a source's setting: put it under each [samples.NAME] that needs it ({named})"
    elif key == "samples":
        advice = "a mixed epoch's length is [mix] samples"
    else:
        advice = "a [samples] with [samples.NAME] sources holds only those tables"
    p.fail(f"[samples] {key}", f"a key beside [samples.NAME] sources: {advice}")


def parse_mix(p: _Parser, samples: dict[str, Any], mix: dict[str, Any]) -> MixConfig:
    """The sources of ``[samples.NAME]`` tables with their weights, and ``[mix]``'s options."""
    p.keys(mix, "mix", optional=("samples",))
    if len(samples) > MAX_SOURCES:
        p.fail("[samples]", f"{len(samples)} sources are more than {MAX_SOURCES} (a sample's source is an int8 code)")
    sources = []
    for name, table in samples.items():
        section = f"samples.{name}"
        if not _SOURCE_NAME.fullmatch(name):
            p.fail(f"[{section}]", "a source name must be letters, digits and underscores, not starting with a digit")
        if "dsn" in table:
            p.fail(f"[{section}] dsn", "every source is read from [source] dsn, on the epoch's one snapshot")
        mode = _SCAN_KEYS if "table" in table else _QUERY_KEYS
        p.keys(table, section, optional=(*mode, *_OWN_KEYS))  # a misspelt weight is "did you mean weight"
        own = {k: table[k] for k in _OWN_KEYS if k in table}
        rest = {k: v for k, v in table.items() if k not in _OWN_KEYS}
        sources.append(MixSource(name=name, samples=p.samples(rest, section), weights=_weights(p, own, section)))
    _check_some_weight(p, sources)
    total = p.positive_int(mix, "mix", "samples") if "samples" in mix else None
    return MixConfig(sources=tuple(sources), samples=total)


def _weights(p: _Parser, table: dict[str, Any], section: str) -> tuple[tuple[int, int | float], ...]:
    """``weight``: a number >= 0 (default 1), or a schedule ``{ epoch = weight }`` starting at epoch 0."""
    value = table.get("weight", 1)
    if not isinstance(value, dict):
        return ((0, _weight(p, value, f"[{section}] weight")),)
    steps: list[tuple[int, int | float]] = []
    for start, weight in value.items():
        if not re.fullmatch(r"0|[1-9][0-9]{0,8}", start):
            p.fail(f"[{section}] weight", f"a schedule's keys are epochs (0, 1, ...), got {show(start)}")
        steps.append((int(start), _weight(p, weight, f"[{section}] weight.{start}")))
    steps.sort()
    if not steps or steps[0][0] != 0:
        p.fail(f"[{section}] weight", "a schedule starts at epoch 0, e.g. weight = { 0 = 3, 10 = 1 }")
    return tuple(steps)


def _weight(p: _Parser, value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
        p.fail(where, f"expected a number >= 0 (or a schedule {{ epoch = weight }}), got {show(value)}")
    return value


def _check_some_weight(p: _Parser, sources: list[MixSource]) -> None:
    """Refuse a schedule under which, from some epoch on, every source weighs 0: such an epoch has no source."""
    for start in sorted({e for s in sources for e, _ in s.weights}):
        if not any(s.weight(start) > 0 for s in sources):
            when = "" if start == 0 else f" from epoch {start}"
            p.fail("[samples]", f"every source's weight is 0{when}: give one a positive weight")


def check_fields(p: _Parser, fields: tuple[FieldConfig, ...]) -> None:
    """A mixed epoch's ``source`` array takes its name: no field, mask or lengths array may have it."""
    for f in fields:
        if SOURCE_ARRAY in (f.name, f.null_mask, f.length_array):
            p.fail(f"[fields.{f.name}]", f'"{SOURCE_ARRAY}" is reserved in a mixed epoch (each sample\'s source)')
