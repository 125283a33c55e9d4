"""``[packing]``, checked at the edge against the field it packs and the samples it reads.

A packed config's samples are documents and its one field their tokens; the epoch's samples are sequences
(:mod:`pgprefetch.write.pack`). So the field must hold integers of any length (``max_length``: the longest
document it takes, under the field's ``truncate``), ``eos`` and ``pad`` must fit its dtype, and nothing else
may be a field: a sequence has no single row for another column to come from. A transform's output packs
when it is deterministic (a tokenizer): the epoch is planned from its lengths, computed once and cached. What
is not built yet (a packed mix of a transform's output) is refused here in one line rather than half-served.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

from pgprefetch.config.model import (
    INTEGER_DTYPES,
    PACKING_GROUP,
    PACKING_METHODS,
    FieldConfig,
    MixConfig,
    PackingConfig,
    SamplesConfig,
    ScanConfig,
    TransformConfig,
)
from pgprefetch.config.values import show

MAX_LENGTH = 1 << 20  # tokens per sequence: beyond any context length trained on today
_RANGES = {  # what each integer dtype holds (config imports no numpy at run time)
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint8": (0, (1 << 8) - 1),
    "uint16": (0, (1 << 16) - 1),
    "uint32": (0, (1 << 32) - 1),
}


class _Parser(Protocol):
    """The getters of :mod:`pgprefetch.config.parse` ``[packing]`` is checked with."""

    def fail(self, where: str, message: str) -> NoReturn: ...

    def keys(
        self, table: dict[str, Any], section: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> None: ...

    def positive_int(self, table: dict[str, Any], section: str, key: str, default: int | None = None) -> int: ...

    def integer(self, table: dict[str, Any], section: str, key: str, default: int) -> int: ...

    def choice(self, table: dict[str, Any], section: str, key: str, choices: tuple[str, ...], default: str) -> str: ...


def parse_packing(
    p: _Parser,
    table: dict[str, Any],
    fields: tuple[FieldConfig, ...],
    samples: SamplesConfig | ScanConfig,
    mix: MixConfig | None,
    transforms: tuple[TransformConfig, ...] = (),
) -> PackingConfig:
    """``[packing]`` as a :class:`PackingConfig`, or one line saying what does not fit."""
    p.keys(table, "packing", required=("field", "length"), optional=("method", "eos", "pad", "group"))
    name = table["field"]
    by_name = {f.name: f for f in fields}
    if not isinstance(name, str) or name not in by_name:
        p.fail("[packing] field", f"expected the name of a [fields.NAME], got {show(name)}")
    field = by_name[name]
    _check_field(p, field, fields, transforms)
    length = p.positive_int(table, "packing", "length")
    if length > MAX_LENGTH:
        p.fail("[packing] length", f"expected at most {MAX_LENGTH:,} tokens a sequence, got {length:,}")
    lo, hi = _RANGES[field.dtype]
    eos = table.get("eos")
    if eos is not None:
        eos = p.integer(table, "packing", "eos", 0)
        if not lo <= eos <= hi:
            p.fail("[packing] eos", f"{eos} does not fit [fields.{name}] dtype {field.dtype} ({lo}..{hi})")
    pad = p.integer(table, "packing", "pad", 0)
    if not lo <= pad <= hi:
        p.fail("[packing] pad", f"{pad} does not fit [fields.{name}] dtype {field.dtype} ({lo}..{hi})")
    method = p.choice(table, "packing", "method", PACKING_METHODS, "best-fit")
    group = p.positive_int(table, "packing", "group", PACKING_GROUP)
    _check_samples(p, samples, mix)
    if mix is not None and field.transform is not None:
        p.fail(
            "[packing]", "a packed mix of a transform's output is not built yet: store the tokens, or pack one source"
        )
    return PackingConfig(field=name, length=length, method=method, eos=eos, pad=pad, group=group)


def _check_field(
    p: _Parser, field: FieldConfig, fields: tuple[FieldConfig, ...], transforms: tuple[TransformConfig, ...]
) -> None:
    where = f"[packing] field = {show(field.name)}"
    if field.dtype not in INTEGER_DTYPES:
        p.fail(where, f"token ids need an integer dtype, got {field.dtype}")
    if field.max_length is None:
        p.fail(where, f"documents have any length: give [fields.{field.name}] a max_length (the longest it takes)")
    random = [t.name for t in transforms if t.name == field.transform and t.random]
    if random:
        p.fail(where, f"[transforms.{random[0]}] is random: an epoch is packed from its tokens' lengths, known "
               "before it is written; pack a deterministic transform's output (it is cached)")  # fmt: skip
    if field.transform is None and len(field.columns) != 1:
        p.fail(where, f"expected one column of tokens, got {len(field.columns)}")
    others = [f.name for f in fields if f.name != field.name]
    if others:
        p.fail(
            "[packing]",
            f"a packed epoch holds token sequences only: remove [fields.{others[0]}] (a sequence has no one row)",
        )


def _check_samples(p: _Parser, samples: SamplesConfig | ScanConfig, mix: MixConfig | None) -> None:
    for each in [s.samples for s in mix.sources] if mix is not None else [samples]:
        _check_one(p, each)


def _check_one(p: _Parser, samples: SamplesConfig | ScanConfig) -> None:
    if isinstance(samples, ScanConfig):
        if samples.window is not None or samples.order is not None:
            p.fail("[packing]", "a document is one row: remove [samples] window / order (windows are not documents)")
        return
    if samples.rows != 1 or samples.max_rows is not None:
        p.fail("[packing]", "a document is one row: remove [samples] rows / max_rows")


__all__ = ["MAX_LENGTH", "parse_packing"]
