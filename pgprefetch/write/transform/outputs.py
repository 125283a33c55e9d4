"""A transform's return value checked against the fields it fills, and packed: one flat array per field.

What a function returns is Python (lists of ints, arrays, bytes); what the store holds is one dtype and one
shape per field. Every output is judged here, in whichever process ran the function, with the casts a
column gets (:mod:`pgprefetch.decode.casts`: a value the dtype cannot hold is an error under ``cast =
"safe"``), before anything reaches a batch: a missing output, a value count other than the samples', a wrong
shape, a length beyond ``max_length`` under ``truncate = "error"``. The error is one line naming the
transform, the field, the sample's key, what was expected and what came.

:class:`Packed` is every sample's values of one field back to back, in the field's dtype, with each
sample's length: variable-length fields and fixed shapes alike, so the cache stores and the batch takes
one form.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import FieldConfig
from pgprefetch.decode.casts import holding_dtype, misfit_after, misfit_before
from pgprefetch.errors import TransformError


@dataclass(frozen=True)
class Packed:
    """One field's values for ``len(lengths)`` samples: ``values`` back to back, sample ``i`` ``lengths[i]`` long."""

    values: np.ndarray
    lengths: np.ndarray  # int64

    @property
    def starts(self) -> np.ndarray:
        """Where each sample's values begin in ``values``."""
        return np.concatenate(([0], np.cumsum(self.lengths)[:-1])) if self.lengths.size else self.lengths

    def take(self, order: np.ndarray) -> Packed:
        """The samples at positions ``order``, in that order."""
        starts, lengths = self.starts[order], self.lengths[order]
        index = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(lengths.sum())
        return Packed(self.values[index.astype(np.int64)], lengths)

    @staticmethod
    def join(parts: Sequence[Packed]) -> Packed:
        """The samples of ``parts``, one after the other."""
        return Packed(np.concatenate([p.values for p in parts]), np.concatenate([p.lengths for p in parts]))


Naming = Callable[[int], str]
"""Sample ``i`` of a call's key as an error names it: ``id=4``."""


def _bad(named: Naming, i: int, message: str) -> TransformError:
    """The error for sample ``i``'s output, naming its key."""
    return TransformError(f"sample ({named(i)}): {message}", sample=named(i))


def pack_outputs(
    transform: str, fields: Sequence[FieldConfig], result: Any, n: int, named: Naming
) -> dict[str, Packed]:
    """Check ``result`` (what the function returned for ``n`` samples) and pack each field's output."""
    where = f"transform {transform}"
    if not isinstance(result, dict):
        raise TransformError(f"{where} returned {type(result).__name__}; expected a dict of outputs, one per field")
    out = {}
    for f in fields:
        if f.name not in result:
            got = ", ".join(map(str, result)) or "none"
            raise TransformError(f"{where} returned no output {f.name!r} for [fields.{f.name}] (its outputs: {got})")
        values = result[f.name]
        if not hasattr(values, "__len__") or len(values) != n:
            count = str(len(values)) if hasattr(values, "__len__") else type(values).__name__
            raise TransformError(f"{where}, field {f.name}: {count} values for {n} samples; expected one per sample")
        out[f.name] = _pack(where, f, values, n, named)
    return out


def _pack(where: str, f: FieldConfig, values: Any, n: int, named: Naming) -> Packed:
    flat = _lists_of_numbers(f, values)
    if flat is not None:  # what a tokenizer returns: one list of ints a sample, taken in one pass
        lengths = np.fromiter(map(len, values), np.int64, n)
        arrays = np.split(flat, np.cumsum(lengths)[:-1]) if n else []
    else:
        arrays = [_as_array(where, f, v, i, named) for i, v in enumerate(values)]
        lengths = np.fromiter((a.size for a in arrays), np.int64, n)
    if f.max_length is not None:
        over = np.flatnonzero(lengths > f.max_length)
        if over.size and f.truncate == "error":
            i = int(over[0])
            raise _bad(
                named,
                i,
                f"{where}, field {f.name}: {lengths[i]} values, more than max_length {f.max_length}; "
                f'[fields.{f.name}] truncate = "right" or "left" keeps that many',
            )
        if over.size:
            cut = slice(None, f.max_length) if f.truncate == "right" else slice(-f.max_length, None)
            arrays = [a[cut] if a.size > f.max_length else a for a in arrays]
            lengths = np.minimum(lengths, f.max_length)
    if len({a.dtype.kind for a in arrays}) > 1:  # ints beside floats: each cast alone, not promoted together
        cast = [_cast(where, f, a, lengths[i : i + 1], _only(named, i)) for i, a in enumerate(arrays)]
        return Packed(np.concatenate(cast), lengths)
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return Packed(_cast(where, f, flat, lengths, named), lengths)


def _only(named: Naming, i: int) -> Naming:
    """How sample ``i`` of the run is named, for a cast of its values alone."""
    return lambda _: named(i)


def _lists_of_numbers(f: FieldConfig, values: Any) -> np.ndarray | None:
    """Every sample's values back to back, where each is a list of plain numbers (else None: judged one by one)."""
    if f.max_length is None or not all(type(v) is list for v in values):
        return None
    flat = np.asarray(list(itertools.chain.from_iterable(values)))
    if flat.ndim != 1 or flat.dtype.kind not in "biuf":
        return None
    # floats among the values of an integer field: judged sample by sample (one sample's ints are not promoted to
    # floats, and rounded, because another sample returned a float)
    return None if flat.dtype.kind == "f" and np.dtype(f.dtype).kind != "f" else flat


def _as_array(where: str, f: FieldConfig, value: Any, i: int, named: Naming) -> np.ndarray:
    """One sample's output as a flat array, its shape checked (text and bytes as their UTF-8 bytes)."""
    if value is None:
        raise _bad(named, i, f"{where}, field {f.name}: returned None; expected a value")
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        a = np.frombuffer(bytes(value), np.uint8)
    else:
        try:
            a = np.asarray(value)
        except (ValueError, TypeError) as e:  # ragged nested lists
            raise _bad(named, i, f"{where}, field {f.name}: not an array ({e})") from None
    if a.dtype.kind not in "biuf":
        raise _bad(named, i, f"{where}, field {f.name}: values of type {a.dtype}; expected numbers")
    expected = (None,) if f.max_length is not None else f.shape
    if len(a.shape) != len(expected) or any(e is not None and e != s for e, s in zip(expected, a.shape, strict=True)):
        shown = "[any length]" if f.max_length is not None else list(f.shape)
        raise _bad(named, i, f"{where}, field {f.name}: shape {list(a.shape)}; expected {shown}")
    return a.reshape(-1)


def _cast(where: str, f: FieldConfig, flat: np.ndarray, lengths: np.ndarray, named: Naming) -> np.ndarray:
    """``flat`` in the field's dtype, every value judged as a column's would be under ``cast = "safe"``."""
    dtype = np.dtype(f.dtype)
    bad = misfit_before(flat, dtype) if f.cast == "safe" and flat.size else None
    with np.errstate(over="ignore", invalid="ignore"):
        out = flat.astype(dtype)
    if bad is None and f.cast == "safe" and flat.size:
        bad = misfit_after(flat, out, dtype)
    if bad is not None:
        index, why = bad
        sample = int(np.searchsorted(np.cumsum(lengths), index, side="right"))
        value = flat[index].item()
        raise _bad(
            named,
            sample,
            f"{where}, field {f.name}: value {value} does not fit {dtype.name}{why}; "
            f'set [fields.{f.name}] dtype = "{holding_dtype(value, dtype)}" to hold it',
        )
    return out


def fill_field(f: FieldConfig, packed: Packed, field_out: np.ndarray, length_out: np.ndarray | None) -> None:
    """Put ``packed`` into a batch's buffer of ``f`` (and its lengths), padded with ``pad`` where nothing is."""
    n = packed.lengths.size
    width = math.prod(field_out.shape[1:])
    target = field_out[:n].reshape(n, width)
    if f.max_length is None:  # a fixed shape: every sample has `width` values
        target[:] = packed.values.reshape(n, width)
        return
    target[:] = f.pad
    rows = np.repeat(np.arange(n), packed.lengths)
    columns = np.arange(packed.values.size) - np.repeat(packed.starts, packed.lengths)
    target[rows, columns] = packed.values
    if length_out is not None:
        length_out[:n] = packed.lengths
