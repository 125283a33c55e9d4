"""Reading a config: the raw TOML tables checked key by key into the frozen objects of :mod:`pgprefetch.config.model`.

Every getter raises a one-line :class:`~pgprefetch.errors.ConfigError` naming the file, the key and what
was expected, with a "did you mean" for a misspelt key: a config is edited by hand and read by cron.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from pgprefetch.config.mix import check_fields, check_no_stray_keys, is_mixed, parse_mix
from pgprefetch.config.model import (
    CASTS,
    COMPRESSIONS,
    DTYPES,
    DUPLICATES,
    FLOAT_DTYPES,
    INTEGER_DTYPES,
    N_ROWS,
    POSTGRES_DTYPES,
    RESERVED_FIELDS,
    SPLIT_BY,
    SPLIT_NAME,
    TRUNCATES,
    WINDOW_LAYOUTS,
    BatchesConfig,
    Config,
    FieldConfig,
    SamplesConfig,
    ScanConfig,
    SourceConfig,
    SplitsConfig,
    StoreConfig,
    VocabularyFrom,
    cut_point,
)
from pgprefetch.config.packing import parse_packing
from pgprefetch.config.transforms import check_samples_fit, check_transform_fields, parse_transforms
from pgprefetch.config.values import parse_duration, parse_size, show, store_location
from pgprefetch.errors import ConfigError
from pgprefetch.sqltext import find_params, strip_statement

_TABLE_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")
_RESERVED_FOR = {
    "keys": "each batch's keys",
    "_checksums": "every chunk's checksum",
    "_longest": "each batch's longest sample",
    "_starts": "each window's first row",
}
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_config(raw: dict[str, Any], *, file: Path | None = None) -> Config:
    """Validate a config already parsed from TOML (see :func:`load_config`)."""
    p = _Parser(file)
    p.keys(
        raw,
        "",
        required=("samples", "fields", "batches", "store"),
        optional=("source", "mix", "splits", "transforms", "packing"),
    )
    source = p.section(raw, "source", required=False)
    samples = p.section(raw, "samples")
    batches = p.section(raw, "batches")
    store = p.section(raw, "store")
    fields = p.section(raw, "fields")

    p.keys(
        source,
        "source",
        optional=("dsn", "connections", "statement_timeout", "io_timeout", "memory", "scratch"),
    )
    p.keys(batches, "batches", required=("size",), optional=("seed", "drop_last"))
    p.keys(store, "store", required=("path",), optional=("compression", "windows"))

    fields_cfg = p.fields(fields)
    check_no_stray_keys(p, samples)
    mix = None
    if is_mixed(samples):
        mix = parse_mix(p, samples, p.section(raw, "mix", required=False))
        check_fields(p, fields_cfg)
        for s in mix.sources:
            p.variable_lengths(s.samples, fields_cfg)
        samples_cfg = mix.sources[0].samples
    else:
        if "mix" in raw:
            p.fail("[mix]", "mixes [samples.NAME] sources: put each source in a [samples.NAME] table")
        samples_cfg = p.samples(samples)
        p.variable_lengths(samples_cfg, fields_cfg)
    transforms = parse_transforms(p, raw["transforms"]) if "transforms" in raw else ()
    check_transform_fields(p, fields_cfg, transforms)
    for s in mix.sources if mix is not None and transforms else ():
        check_samples_fit(p, s.samples, f"samples.{s.name}")
    if transforms and mix is None:
        check_samples_fit(p, samples_cfg, "samples")
    splits = p.splits(raw["splits"]) if "splits" in raw else None
    packing = None
    if "packing" in raw:
        packing = parse_packing(p, p.section(raw, "packing"), fields_cfg, samples_cfg, mix, transforms)
    if splits is not None and splits.by == "order":
        for s in mix.sources if mix is not None else ():
            p.time_cut_fits(s.samples, f"samples.{s.name}")
        if mix is None:
            p.time_cut_fits(samples_cfg, "samples")
    windows = p.choice(store, "store", "windows", WINDOW_LAYOUTS, default="batches")
    if windows == "starts":
        p.starts_fit(samples_cfg, mix is not None, bool(transforms))
    return Config(
        source=SourceConfig(
            dsn=p.optional_str(source, "source", "dsn"),
            connections=p.positive_int(source, "source", "connections", default=8),
            statement_timeout_ms=p.duration(source, "source", "statement_timeout"),
            io_timeout_ms=_default(p.duration(source, "source", "io_timeout"), 60_000),
            memory_bytes=parse_size(source.get("memory", 512 << 20), f"{p.prefix}[source] memory"),
            scratch=p.folder(source, "source", "scratch") if "scratch" in source else None,
        ),
        samples=samples_cfg,
        fields=fields_cfg,
        batches=BatchesConfig(
            size=p.positive_int(batches, "batches", "size"),
            seed=p.integer(batches, "batches", "seed", default=0),
            drop_last=p.boolean(batches, "batches", "drop_last", default=packing is None),
        ),
        mix=mix,
        splits=splits,
        transforms=transforms,
        packing=packing,
        store=StoreConfig(
            path=p.location(store, "store", "path"),
            compression=p.choice(store, "store", "compression", COMPRESSIONS, default="none"),
            windows=windows,
        ),
        file=file,
    )


class _Parser:
    """Typed getters that raise a ConfigError naming the file and key."""

    def __init__(self, file: Path | None) -> None:
        self.file = file

    def samples(self, samples: dict[str, Any], section: str = "samples") -> SamplesConfig | ScanConfig:
        """``[samples]``: either ``keys`` + ``query`` (query mode) or ``table`` (scan mode), never both."""
        if "table" in samples and ("keys" in samples or "query" in samples):
            self.fail(f"[{section}]", 'give either "keys" and "query" (query mode) or "table" (scan mode), not both')
        return self._scan(samples, section) if "table" in samples else self._query(samples, section)

    def _query(self, samples: dict[str, Any], section: str) -> SamplesConfig:
        """Query mode's ``[samples]``: a keys query, a per-sample query, and how many rows a sample has."""
        optional = ("rows", "fraction", "duplicates", "max_rows", "truncate")
        self.keys(samples, section, required=("keys", "query"), optional=optional)
        if "max_rows" in samples and "rows" in samples:
            self.fail(f"[{section}] max_rows", "give rows (each sample has that many) or max_rows (1 to that many)")
        if "truncate" in samples and "max_rows" not in samples:
            self.fail(f"[{section}] truncate", "only max_rows has it: set max_rows too, or remove it")
        max_rows = self.positive_int(samples, section, "max_rows") if "max_rows" in samples else None
        query = SamplesConfig(
            keys=self.sql(samples, section, "keys"),
            query=self.sql(samples, section, "query"),
            rows=max_rows or self.positive_int(samples, section, "rows", default=1),
            fraction=self.fraction(samples, section, "fraction"),
            duplicates=self.choice(samples, section, "duplicates", DUPLICATES, default="error"),
            max_rows=max_rows,
            truncate=self.choice(samples, section, "truncate", TRUNCATES, default="error"),
        )
        if 0 in find_params(query.query):
            self.fail(f"[{section}] query", "parameters are numbered from $1 (the first key column); found $0")
        return query

    def _scan(self, samples: dict[str, Any], section: str) -> ScanConfig:
        """Scan mode's ``[samples]``: a table, its key columns, and for windows the order column, window, stride."""
        optional = ("order", "window", "stride", "fraction", "duplicates")
        self.keys(samples, section, required=("table", "key"), optional=optional)
        window = samples.get("window")
        if window is None:
            for key in ("order", "stride"):
                if key in samples:
                    self.fail(f"[{section}] {key}", "only windows have it: set window too, or remove it")
        elif "order" not in samples:
            self.fail(f"[{section}] order", "windows need the column that orders a series' rows")
        columns = self._key_columns(samples["key"], section)
        order = samples.get("order")
        if order is not None and (not isinstance(order, str) or not order):
            self.fail(f"[{section}] order", f"expected a column name, got {show(order)}")
        if order in columns:
            self.fail(f"[{section}] order", f'"{order}" is a key column too')
        return ScanConfig(
            table=self.table(samples, section),
            key=tuple(columns),
            order=order,
            window=None if window is None else self.positive_int(samples, section, "window"),
            stride=self.positive_int(samples, section, "stride", default=1),
            fraction=self.fraction(samples, section, "fraction"),
            duplicates=self.choice(samples, section, "duplicates", DUPLICATES, default="error"),
        )

    def _key_columns(self, named: Any, section: str) -> list[str]:
        """``[samples] key``: a column name or a non-empty list of distinct ones."""
        columns = [named] if isinstance(named, str) else named
        if not isinstance(columns, list) or not columns or not all(isinstance(k, str) and k for k in columns):
            self.fail(f"[{section}] key", f"expected a column name or a non-empty list of them, got {show(columns)}")
        if len(set(columns)) != len(columns):
            self.fail(f"[{section}] key", f"a column is listed twice in {columns}")
        return columns

    def table(self, samples: dict[str, Any], section: str = "samples") -> str:
        value = samples["table"]
        if not isinstance(value, str) or not strip_statement(value):
            self.fail(f"[{section}] table", f"expected a table or view name, or a SELECT, got {_kind(value)}")
        text = strip_statement(value)
        if not (_TABLE_NAME.fullmatch(text) or re.match(r"(?is)^\s*(select|with|values)\b", text)):
            self.fail(
                f"[{section}] table", f"expected a table or view name (schema.name), or a SELECT; got {show(text)}"
            )
        return text

    @property
    def prefix(self) -> str:
        return f"{self.file}: " if self.file else ""

    def fail(self, where: str, message: str) -> NoReturn:
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
        return value

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
        return value

    def positive_int(self, table: dict[str, Any], section: str, key: str, default: int | None = None) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(f"[{section}] {key}", f"expected a positive integer, got {show(value)}")
        return value

    def fraction(self, table: dict[str, Any], section: str, key: str) -> float:
        value = table.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self.fail(f"[{section}] {key}", f"expected a number with 0 < {key} <= 1, got {show(value)}")
        return float(value)

    def splits(self, table: Any) -> SplitsConfig:
        """``[splits]``: named shares that sum to 1 and a seed, or (``by = "order"``) a ``from`` per split."""
        if not isinstance(table, dict):
            self.fail("[splits]", f"expected a table of shares (train = 0.9), got {show(table)}")
        by = self.choice(table, "splits", "by", SPLIT_BY, default="key")
        named = {k: v for k, v in table.items() if k not in ("seed", "by")}
        for name in named:
            if not SPLIT_NAME.match(name):
                self.fail(f"[splits] {name}", "a split's name is lower-case letters, digits and _ (it names a folder)")
        if not named:
            self.fail("[splits]", "names no split: give each a share (train = 0.9, val = 0.1)")
        if by == "order":
            if "seed" in table:
                self.fail("[splits] seed", 'a time cut (by = "order") has no seed: a window\'s split is its time')
            return SplitsConfig(by="order", starts=self._cuts(named))
        shares = []
        for name, value in named.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                self.fail(f"[splits] {name}", f"expected a share with 0 < share <= 1, got {show(value)}")
            shares.append((name, float(value)))
        total = math.fsum(v for _, v in shares)
        if abs(total - 1.0) > 1e-9:
            listed = " + ".join(f"{n} {v:g}" for n, v in shares)
            self.fail("[splits]", f"the shares must sum to 1, not {total:g} ({listed})")
        return SplitsConfig(shares=tuple(shares), seed=self.integer(table, "splits", "seed", default=0))

    def time_cut_fits(self, samples: SamplesConfig | ScanConfig, section: str) -> None:
        """Refuse a time cut of samples that are not scan-mode windows: only a window's rows have times."""
        if not isinstance(samples, ScanConfig) or samples.window is None:
            self.fail(
                "[splits] by",
                f'"order" cuts windows by their rows\' times: [{section}] must be scan-mode windows (table, order, '
                'window); split other samples by key (by = "key")',
            )

    def _cuts(self, named: dict[str, Any]) -> tuple[tuple[str, str | int | None], ...]:
        """Each split's ``from`` on the order column: none for the first, rising after it (ISO dates or integers)."""
        cuts: list[tuple[str, str | int | None]] = []
        last: Any = None
        for i, (name, value) in enumerate(named.items()):
            where = f"[splits] {name}"
            if not isinstance(value, dict) or set(value) - {"from"}:
                self.fail(where, f'expected {{ from = "2024-07-01" }} (a time cut), got {show(value)}')
            start = value.get("from")
            if i == 0:
                if start is not None:
                    self.fail(where, "the first split starts at the beginning: give it {} and the next ones a from")
                cuts.append((name, None))
                continue
            point: Any = cut_point(start)
            if point is None:
                self.fail(where, f"from: expected an ISO date or time, or an integer, got {show(start)}")
            if last is not None and (type(point) is not type(last) or not _before(last, point)):
                self.fail(where, f"from {show(start)} must come after the split before it's, of the same kind")
            last = point
            cuts.append((name, start))
        if len(cuts) < 2:
            self.fail("[splits]", "a time cut needs two splits or more: the first, and one with a from")
        return tuple(cuts)

    def boolean(self, table: dict[str, Any], section: str, key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"[{section}] {key}", f"expected true or false, got {show(value)}")
        return value

    def optional_str(self, table: dict[str, Any], section: str, key: str) -> str | None:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(f"[{section}] {key}", f"expected a non-empty string, got {_kind(value)}")
        return value

    def choice(self, table: dict[str, Any], section: str, key: str, choices: tuple[str, ...], default: str) -> str:
        value = table.get(key, default)
        if value not in choices:
            self.fail(f"[{section}] {key}", f"expected one of {', '.join(choices)}; got {show(value)}")
        return str(value)  # one of choices

    def location(self, table: dict[str, Any], section: str, key: str) -> Path | str:
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(f"[{section}] {key}", f"expected a path string, got {_kind(value)}")
        prefix = f"{self.file}: " if self.file else ""
        # Relative to the config file, so cron's working directory doesn't matter.
        base = self.file.resolve().parent if self.file is not None else None
        return store_location(value, f"{prefix}[{section}] {key}", base)

    def folder(self, table: dict[str, Any], section: str, key: str) -> Path:
        """A local folder, relative to the config file's."""
        value = self.location(table, section, key)
        if not isinstance(value, Path):
            self.fail(f"[{section}] {key}", f"expected a local folder, got {show(table[key])}")
        return value

    def starts_fit(self, samples: SamplesConfig | ScanConfig, mixed: bool, transforms: bool) -> None:
        """``[store] windows = "starts"`` stores a table's rows once: scan-mode windows of one source only."""
        where = '[store] windows = "starts"'
        if mixed:
            self.fail(where, "stores one table's rows once; a mixed epoch's samples come from several sources")
        if not isinstance(samples, ScanConfig) or samples.window is None:
            self.fail(where, "stores windows as their first rows: it needs scan-mode windows ([samples] table, key, "
                             "order and window)")  # fmt: skip
        if transforms:
            self.fail(where, "gathers windows at read time; a [transforms] field is written per sample: use the "
                             "default windows = \"batches\"")  # fmt: skip

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
                what = _RESERVED_FOR[name]
                self.fail(where, f'"{name}" is reserved (the store keeps {what} under it)')
            if not _FIELD_NAME.fullmatch(name):
                self.fail(where, "a field name must be letters, digits and underscores, not starting with a digit")
            if not isinstance(spec, dict):
                self.fail(where, f"expected a table with columns and dtype, got {_kind(spec)}")
            columns = self.field_source(spec, name)
            dtype = spec["dtype"]
            if dtype not in DTYPES:
                named = POSTGRES_DTYPES.get(" ".join(str(dtype).lower().split()))
                close = [named] if named else difflib.get_close_matches(str(dtype), DTYPES, n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                self.fail(f"{where} dtype", f"expected one of {', '.join(DTYPES)}; got {show(dtype)}{hint}")
            out.append(
                FieldConfig(
                    name=name,
                    columns=tuple(columns),
                    dtype=dtype,
                    cast=self.choice(spec, f"fields.{name}", "cast", CASTS, default="safe"),
                    null=self.null_policy(spec, where, dtype),
                    categories=self.categories(spec, where, dtype),
                    **self.padding(spec, where, dtype),
                    **self.transform_output(spec, where),
                )
            )
        names = {f.name for f in out}
        for f in out:
            if f.null_mask in names:
                self.fail(f"[fields.{f.null_mask}]", f"the name is taken by the NULL mask of [fields.{f.name}]")
            if f.length_array in names:
                self.fail(f"[fields.{f.length_array}]", f"the name is taken by the lengths of [fields.{f.name}]")
        return tuple(out)

    def field_source(self, spec: dict[str, Any], name: str) -> list[str]:
        """A field's ``columns``; none for a transform's output (``transform = "NAME"``)."""
        where = f"[fields.{name}]"
        if "transform" in spec:
            outputs = ("cast", "max_length", "pad", "truncate", "shape")
            self.keys(spec, f"fields.{name}", required=("transform", "dtype"), optional=outputs)
            return []
        optional = ("cast", "null", "categories", "max_length", "pad", "truncate")
        self.keys(spec, f"fields.{name}", required=("columns", "dtype"), optional=optional)
        columns = spec["columns"]
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
            self.fail(f"{where} columns", f"expected a non-empty list of column names, got {show(columns)}")
        if len(set(columns)) != len(columns):
            self.fail(f"{where} columns", f"a column is listed twice in {columns}")
        return columns

    def transform_output(self, spec: dict[str, Any], where: str) -> dict[str, Any]:
        """A transform's output field: the transform's name, and its fixed ``shape`` (not with ``max_length``)."""
        if "transform" not in spec:
            return {}
        name = spec["transform"]
        if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):
            self.fail(f"{where} transform", f"expected a [transforms.NAME]'s name, got {show(name)}")
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
        ):
            self.fail(f"{where} shape", f"expected a list of positive integers ([3, 32, 32]), got {show(shape)}")
        if shape and "max_length" in spec:
            self.fail(f"{where} shape", "give a fixed shape or max_length (one dimension of any length), not both")
        return {"transform": name, "shape": tuple(shape)}

    def variable_lengths(self, samples: SamplesConfig | ScanConfig, fields: tuple[FieldConfig, ...]) -> None:
        """What ``max_length`` and ``max_rows`` need beyond their own sections."""
        if isinstance(samples, SamplesConfig) and samples.max_rows is not None:
            taken = next((f for f in fields if N_ROWS in (f.name, f.null_mask, f.length_array)), None)
            if taken is not None:
                self.fail(f"[fields.{taken.name}]", f'"{N_ROWS}" is reserved with max_rows (each sample\'s row count)')

    def padding(self, spec: dict[str, Any], where: str, dtype: str) -> dict[str, Any]:
        """``max_length``, ``pad`` and ``truncate`` of a field (``pad`` also pads ``[samples] max_rows``)."""
        out: dict[str, Any] = {}
        if "max_length" in spec:
            out["max_length"] = self.positive_int(spec, where.strip("[]"), "max_length")
            if spec.get("categories") is not None:
                self.fail(f"{where} max_length", "categories are scalar codes: they have no length")
            if spec.get("null", "error") != "error":
                self.fail(f"{where} max_length", "a null policy applies to scalar columns; an array or text is whole")
        elif "truncate" in spec:
            self.fail(f"{where} truncate", "only max_length has it: set max_length too, or remove it")
        if "truncate" in spec:
            out["truncate"] = self.choice(spec, where.strip("[]"), "truncate", TRUNCATES, default="error")
        if "pad" in spec:
            value = spec["pad"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not _fits(value, dtype):
                self.fail(f"{where} pad", f"expected a number that fits {dtype}, got {show(value)}")
            out["pad"] = value
        return out

    def null_policy(self, spec: dict[str, Any], where: str, dtype: str) -> str | float:
        value = spec.get("null", "error")
        if value in ("error", "nan") and not (value == "nan" and dtype not in FLOAT_DTYPES):
            return str(value)  # "error" or "nan"
        if value == "nan":
            self.fail(f"{where} null", f'"nan" needs a float dtype ({", ".join(FLOAT_DTYPES)}), not {dtype}')
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(f"{where} null", f'expected "error", "nan" or a fill value (a number), got {show(value)}')
        fits = _fits(value, dtype)
        if not fits:
            self.fail(f"{where} null", f"the fill value {show(value)} does not fit {dtype}")
        return value

    def categories(self, spec: dict[str, Any], where: str, dtype: str) -> tuple[str, ...] | str | VocabularyFrom | None:
        value = spec.get("categories")
        if value is None:
            return None
        if dtype not in INTEGER_DTYPES:
            self.fail(f"{where} categories", f"categorical codes need an integer dtype ({', '.join(INTEGER_DTYPES)})")
        if value == "auto":
            return "auto"
        if isinstance(value, dict):
            return self.vocabulary_from(value, where)
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            self.fail(
                f"{where} categories",
                f'expected "auto", a non-empty list of strings or {{ from = "STORE" }}, got {show(value)}',
            )
        if len(set(value)) != len(value):
            twice = next(c for c in value if value.count(c) > 1)
            self.fail(f"{where} categories", f"{json.dumps(twice)} is listed twice")
        if not _fits(len(value) - 1, dtype):
            self.fail(f"{where} categories", f"{len(value)} categories do not fit {dtype}")
        return tuple(value)

    def vocabulary_from(self, value: dict[str, Any], where: str) -> VocabularyFrom:
        """``{ from = "STORE" }``: another store's vocabulary, its location read as ``[store] path`` is."""
        written = value.get("from")
        if set(value) != {"from"} or not isinstance(written, str) or not written.strip():
            self.fail(
                f"{where} categories", f'expected {{ from = "STORE" }} (a store path or s3://...), got {show(value)}'
            )
        base = self.file.resolve().parent if self.file is not None else None
        store = store_location(written, f"{self.prefix}{where} categories", base)
        return VocabularyFrom(store=store, written=written)


def _before(a: Any, b: Any) -> bool:
    """Whether cut point ``a`` comes before ``b`` (False for two that do not compare: with and without an offset)."""
    try:
        return bool(a < b)
    except TypeError:
        return False


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
