"""Whether values fit a field's dtype: the checks behind ``[fields.X] cast = "safe"``.

numpy's casts wrap integers around (339 into int8 is 83), turn NaN into an arbitrary integer and overflow
floats to infinity, all with at most a warning. A training set must not change silently on the way, so
every cast the dump makes is judged: before it, where the cast itself would destroy the evidence
(integers, floats into integers), and after it for float narrowing, where infinity in the result next to
a finite source value is the evidence. Each check is vectorised and skipped when the source type's range
fits the target's; most fields cost one ``min``/``max`` pass or nothing.

The error names the dtype that would hold the value (:func:`holding_dtype`), not ``cast = "unsafe"``: for
an integer field that would wrap the value around or make a number up, never what the user wants.
"""

from __future__ import annotations

import math

import numpy as np

_ADVISED_INTEGERS = ("int8", "int16", "int32", "int64")
_ADVISED_FLOATS = ("float32", "float64")


def misfit_before(v: np.ndarray, dtype: np.dtype) -> tuple[int, str] | None:
    """The first value of ``v`` that ``dtype`` cannot hold, judged before the cast (which would wrap it)."""
    src = v.dtype
    if src.kind == "b" or (dtype.kind == "f" and src.kind == "f"):
        return None  # bool fits every dtype; float narrowing is judged after the cast (see below)
    if dtype.kind == "b":
        bad = (v != 0) & (v != 1)
        return (int(np.flatnonzero(bad)[0]), " (only 0 and 1 fit bool)") if bad.any() else None
    if dtype.kind == "f":
        return _integers_into_float(v, dtype)
    if src.kind in "iu":
        return _integers_into_integers(v, dtype)
    return _floats_into_integers(v, dtype)


def _integers_into_float(v: np.ndarray, dtype: np.dtype) -> tuple[int, str] | None:
    """Integers into floats: only float16's range (65504) can be exceeded."""
    limit = float(np.finfo(dtype).max)
    if v.dtype.itemsize <= 2 or v.size == 0 or (v.min() >= -limit and v.max() <= limit):
        return None
    return int(np.flatnonzero(np.abs(v.astype(np.float64)) > limit)[0]), ""


def _integers_into_integers(v: np.ndarray, dtype: np.dtype) -> tuple[int, str] | None:
    """Integers into a narrower integer type: its range (a wider source type than needs checking is not scanned)."""
    info, s = np.iinfo(dtype), np.iinfo(v.dtype)
    if (s.min >= info.min and s.max <= info.max) or v.size == 0 or (v.min() >= info.min and v.max() <= info.max):
        return None
    return int(np.flatnonzero((v < info.min) | (v > info.max))[0]), f" (range {info.min}..{info.max})"


def _floats_into_integers(v: np.ndarray, dtype: np.dtype) -> tuple[int, str] | None:
    """Floats into integers: finite, whole and in range (``info.max + 1`` is a power of two, exact as a float)."""
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        ok = (v >= info.min) & (v < float(info.max) + 1) & (np.trunc(v) == v)
    if ok.all():
        return None
    index = int(np.flatnonzero(~ok)[0])
    value = float(v.reshape(-1)[index])
    why = " (not a whole number)" if np.isfinite(value) and info.min <= value <= info.max else ""
    return index, why or f" (range {info.min}..{info.max})"


def misfit_after(v: np.ndarray, out: np.ndarray, dtype: np.dtype) -> tuple[int, str] | None:
    """The first finite float that became infinite when cast to a narrower float ``dtype``."""
    if not (v.dtype.kind == "f" and dtype.kind == "f" and v.dtype.itemsize > dtype.itemsize):
        return None
    if not np.isinf(out).any():
        return None
    bad = np.isinf(out).reshape(v.shape) & np.isfinite(v)
    return (int(np.flatnonzero(bad)[0]), f" (largest {float(np.finfo(dtype).max):g})") if bad.any() else None


def holding_dtype(value: int | float, dtype: np.dtype) -> str:
    """The smallest dtype that holds ``value``, which a field of ``dtype`` cannot: what the error advises.

    For an integer or bool field, a whole number gets the smallest signed integer dtype holding it exactly;
    a fraction, NaN or an infinity (or a whole number beyond int64) gets a float. For a float field, the
    smallest float wider than it whose range holds the value. Floats are judged by their range, as the safe
    cast judges them, and float16 is never advised: one value fitting it says little about the others.
    """
    if dtype.kind != "f" and (isinstance(value, int) or (math.isfinite(value) and value == math.floor(value))):
        whole = int(value)
        for name in _ADVISED_INTEGERS:
            info = np.iinfo(name)
            if info.min <= whole <= info.max:
                return name
    for name in _ADVISED_FLOATS:
        if not math.isfinite(value) or abs(value) <= float(np.finfo(name).max):
            return name
    return _ADVISED_FLOATS[-1]
