"""Per-field statistics of an epoch, computed while it is written: count, mean, std, min and max.

Users normalise features with these, and today they pay a second pass over the data for them. The writer
sees every batch it writes, so it computes them on the way: per column of each integer and float field,
over the real values only (padding and NULLs left out), in float64.

Each batch gets its own ``(count, mean, M2, min, max)`` per column, computed with numpy reductions over
the batch alone, and the batches are merged in batch order when the epoch is published (Chan et al.'s
pairwise update). So the result does not depend on which thread wrote which batch when, and a resumed
dump, which recomputes the kept batches from their bytes on disk, publishes the same figures.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import N_ROWS
from pgprefetch.decode.layout import BatchLayout


@dataclass(frozen=True)
class FieldStats:
    """Where one field's values are in its batch array, and what marks padding and NULLs."""

    name: str
    columns: tuple[str, ...]
    rows: int
    length: int  # elements per row of a column: the array length, max_length, or 1
    null_mask: str | None
    length_array: str | None
    n_rows: str | None  # the n_rows array, with max_rows


class EpochStats:
    """Collects each batch's statistics (from any thread, in any order) and merges them in batch order."""

    def __init__(
        self,
        fields: tuple[FieldStats, ...],
        n_batches: int,
        batch_size: int,
        n_samples: int,
        lengths: tuple[str, ...] = (),
        weights: np.ndarray | None = None,
    ) -> None:
        self.fields = fields
        self.size, self.n_samples = batch_size, n_samples
        self.weights = weights  # rows (windows stored as starts): the samples each item counts for
        width = sum(len(f.columns) for f in self.fields)
        self._batches = np.full((n_batches, width, 5), np.nan)  # count, mean, M2, min, max
        self._longest = {name: np.zeros(n_batches, dtype=np.int64) for name in lengths}  # each batch's
        self._lock = threading.Lock()

    @classmethod
    def of(cls, layout: BatchLayout, n_batches: int, batch_size: int, n_samples: int) -> EpochStats:
        """The statistics of a dump's integer and float fields (not category codes, not bytes)."""
        fields = tuple(
            FieldStats(
                f.name,
                f.column_names,
                layout.rows,
                f.array_length,
                f.config.null_mask,
                f.config.length_array,
                N_ROWS if layout.variable_rows else None,
            )
            for f in layout.fields
            if f.dtype.kind in "iuf"
            and f.config.categories is None
            and not any(c.is_bytes for c in f.columns)
            and f.column_names  # (a packed epoch's arrays are no column's: ids and positions, not measurements)
        )
        lengths = tuple(f.config.length_array for f in layout.fields if f.config.length_array)
        return cls(fields, n_batches, batch_size, n_samples, (*lengths, *([N_ROWS] if layout.variable_rows else [])))

    @classmethod
    def of_rows(cls, layout: BatchLayout, n_batches: int, per_batch: int, weights: np.ndarray) -> EpochStats:
        """The statistics of windows stored as starts, from their rows: the figures the windows would give.

        ``layout`` is of one row, ``per_batch`` rows a chunk, each row counted for the ``weights`` windows it is in.

        Each batch's longest sample is the source's to :meth:`put` (a window's rows lie in other chunks).
        """
        stats = cls.of(layout, n_batches, per_batch, int(weights.size))
        stats.weights = weights
        return stats

    def add(self, first: int, count: int, arrays: dict[str, np.ndarray]) -> None:
        """The statistics of batches ``first..first+count-1``: ``count * batch_size`` samples of ``arrays``."""
        if self.weights is None:
            for name, longest in self._longest.items():  # the last batch's padding samples have length 0
                longest[first : first + count] = arrays[name][: count * self.size].reshape(count, -1).max(axis=1)
        if not self.fields:
            return
        out = np.empty((count, self._batches.shape[1], 5))
        col = 0
        samples = first * self.size + np.arange(count * self.size).reshape(count, self.size)
        real = samples < self.n_samples  # the last batch's padding samples
        for f in self.fields:
            shape = (count, self.size, f.rows, len(f.columns), f.length)
            values = arrays[f.name][: count * self.size].reshape(shape)
            # What is real, as a mask that broadcasts to `shape`; None when every value is.
            valid = None if real.all() else np.broadcast_to(real[:, :, None, None, None], shape)
            if f.n_rows is not None:
                n_rows = arrays[f.n_rows][: count * self.size].reshape(count, self.size)
                valid = _and(valid, (np.arange(f.rows, dtype=n_rows.dtype) < n_rows[:, :, None])[:, :, :, None, None])
            if f.length_array is not None:
                lengths = arrays[f.length_array][: count * self.size].reshape(count, self.size, f.rows)
                # (in the lengths' dtype: comparing int64 with int32 took twice as long)
                valid = _and(valid, (np.arange(f.length, dtype=lengths.dtype) < lengths[..., None])[:, :, :, None, :])
            if f.null_mask is not None:
                valid = _and(valid, ~arrays[f.null_mask][: count * self.size].reshape(shape))
            if self.weights is not None:  # rows, each counted for the windows it is in
                weights = self._weights(first, count).reshape(count, self.size, 1, 1)
                for j in range(len(f.columns)):
                    mask = None if valid is None else np.broadcast_to(valid, shape)[:, :, :, j, :]
                    out[:, col] = _per_batch_weighted(values[:, :, :, j, :], mask, weights)
                    col += 1
                continue
            if valid is None:  # every value is real: all the field's columns of all the batches at once
                out[:, col : col + len(f.columns)] = _per_batch_columns(np.moveaxis(values, 3, 1))
                col += len(f.columns)
                continue
            for j in range(len(f.columns)):
                mask = None if valid is None else np.broadcast_to(valid, shape)[:, :, :, j, :]
                out[:, col] = _per_batch(values[:, :, :, j, :], mask)
                col += 1
        with self._lock:
            self._batches[first : first + count] = out

    def _weights(self, first: int, count: int) -> np.ndarray:
        """The weights of rows ``first * size ..`` for ``count`` chunks: zero past the last row."""
        assert self.weights is not None
        out = np.zeros(count * self.size, dtype=np.float64)
        part = self.weights[first * self.size : (first + count) * self.size]
        out[: part.size] = part
        return out

    def taken(self, batches: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The figures of ``batches`` (indices), for another process's :meth:`put` (a part of a spread dump)."""
        return self._batches[batches].copy(), {name: longest[batches].copy() for name, longest in self._longest.items()}

    def put(self, batches: np.ndarray, figures: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
        """Take the figures of ``batches`` that another process computed (:meth:`taken`)."""
        rows, longest = figures
        with self._lock:
            self._batches[batches] = rows
            for name, values in longest.items():
                self._longest[name][batches] = values

    def set_longest(self, longest: dict[str, np.ndarray]) -> None:
        """Each batch's longest sample per lengths array, known before the batches (windows stored as starts)."""
        for name, values in longest.items():
            self._longest[name][:] = values

    def longest(self) -> dict[str, list[int]]:
        """Each batch's longest sample per lengths array (``<field>_length``, and ``n_rows``: its most rows).

        Published with the epoch (``_longest``), so that batches can be bucketed or sized by length
        without reading them.
        """
        return {name: longest.tolist() for name, longest in self._longest.items()}

    def result(self) -> dict[str, dict[str, dict[str, float | int | None]]]:
        """``{field: {column: {count, mean, std, min, max}}}`` over the epoch.

        None where nothing was counted, or where a value is not finite (an infinity in the data).
        """
        out: dict[str, dict[str, dict[str, float | int | None]]] = {}
        merged = _merge(self._batches).tolist()
        col = 0
        for f in self.fields:
            out[f.name] = {}
            for name in f.columns:
                n, mean, m2, lo, hi = merged[col]
                col += 1
                some = n > 0
                out[f.name][name] = {
                    "count": int(n),
                    "mean": _finite(mean) if some else None,
                    "std": _finite(math.sqrt(m2 / n)) if some and m2 == m2 else None,
                    "min": _number(lo) if some else None,
                    "max": _number(hi) if some else None,
                }
        return out


def _and(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    return b if a is None else a & b


def _per_batch(values: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """``(count, mean, M2, min, max)`` of each batch (axis 0) over its valid values (all when None).

    One batch at a time, whatever the unit it was written in: a batch's figures depend on its bytes only.
    """
    out = np.empty((values.shape[0], 5))
    for b in range(values.shape[0]):
        real = values[b].reshape(-1) if valid is None else values[b][valid[b]]
        if not real.size:
            out[b] = (0.0, 0.0, 0.0, np.inf, -np.inf)
            continue
        x = real.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # an infinity makes the figures NaN, said as None
            mean = x.sum() / x.size
            x -= mean
            np.square(x, out=x)
            out[b] = (x.size, mean, x.sum(), real.min(), real.max())  # min and max in the field's own dtype
    return out


def _per_batch_weighted(values: np.ndarray, valid: np.ndarray | None, weights: np.ndarray) -> np.ndarray:
    """:func:`_per_batch` with each value counted ``weights`` times (``(count, items, 1, 1)``, 0: not counted).

    Vectorised over the batches, in float64: min and max of the values counted at least once. In blocks of
    batches of about :data:`BLOCK_BYTES` of float64 each, as :func:`_per_batch_columns` works.
    """
    per = max(1, int(np.prod(values.shape[1:], dtype=np.int64)))
    block = max(1, BLOCK_BYTES // (8 * per))
    parts = [
        _weighted_block(values[b : b + block], None if valid is None else valid[b : b + block], weights[b : b + block])
        for b in range(0, values.shape[0], block)
    ]
    return np.concatenate(parts) if parts else np.empty((0, 5))


def _weighted_block(values: np.ndarray, valid: np.ndarray | None, weights: np.ndarray) -> np.ndarray:
    """:func:`_per_batch_weighted` of a block of batches."""
    count = values.shape[0]
    w = np.broadcast_to(weights, values.shape).reshape(count, -1)
    if valid is not None:
        w = np.where(valid.reshape(count, -1), w, 0.0)
    counted = w > 0
    x = np.where(counted, values.reshape(count, -1), 0).astype(np.float64)  # (a NULL's fill is never summed)
    out = np.empty((count, 5))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        n = w.sum(axis=1)
        mean = np.where(n > 0, (w * x).sum(axis=1) / np.maximum(n, 1), 0.0)
        d = x - mean[:, None]
        out[:, 0], out[:, 1], out[:, 2] = n, mean, (w * d * d).sum(axis=1)
        out[:, 3] = np.where(counted, x, np.inf).min(axis=1, initial=np.inf)
        out[:, 4] = np.where(counted, x, -np.inf).max(axis=1, initial=-np.inf)
    return out


BLOCK_BYTES = 1 << 19  # float64 bytes that :func:`_per_batch_columns` works on at a time: within a core's L2


def _per_batch_columns(values: np.ndarray) -> np.ndarray:
    """:func:`_per_batch` of all columns at once, every value real: ``(count, columns, ...)`` to ``(..., 5)``.

    The same figures, bit for bit: each (batch, column) is summed as one contiguous float64 row, which
    numpy reduces with the same pairwise summation as the 1-D sum of that row alone. Without a Python
    call per batch and column (2,000 batches of 17 columns made the statistics the largest part of a scan
    dump's CPU time), in blocks of batches small enough to stay in cache between the passes.
    """
    count, width = values.shape[:2]
    n = int(np.prod(values.shape[2:], dtype=np.int64))
    out = np.empty((count, width, 5))
    if not n:
        out[:] = (0.0, 0.0, 0.0, np.inf, -np.inf)
        return out
    block = max(1, BLOCK_BYTES // (width * n * 8))
    for b in range(0, count, block):
        part = values[b : b + block]
        x = part.astype(np.float64, order="C").reshape(part.shape[0], width, n)  # one contiguous row per column
        o = out[b : b + block]
        o[..., 0] = n
        # The min and max of the float64 copy: converting is monotonic, so they are the field's own min and
        # max converted, which is what _per_batch stores.
        o[..., 3] = x.min(axis=-1)
        o[..., 4] = x.max(axis=-1)
        with np.errstate(invalid="ignore", over="ignore"):
            mean = x.sum(axis=-1) / n
            x -= mean[..., None]
            np.square(x, out=x)
            o[..., 1] = mean
            o[..., 2] = x.sum(axis=-1)
    return out


def _merge(batches: np.ndarray) -> np.ndarray:
    """Merge per-batch ``(count, mean, M2, min, max)`` rows, ``(n_batches, width, 5)`` -> ``(width, 5)``.

    Pairwise (Chan et al.), neighbours first, vectorised over the columns: the same order every time.
    Batches never computed (NaN) count as empty.
    """
    b = np.where(np.isnan(batches[..., :1]), _EMPTY, batches)
    while b.shape[0] > 1:
        if b.shape[0] % 2:
            b = np.concatenate([b, np.broadcast_to(_EMPTY, (1, *b.shape[1:]))])
        a, c = b[0::2], b[1::2]
        n = a[..., 0] + c[..., 0]
        safe = np.maximum(n, 1)
        delta = c[..., 1] - a[..., 1]
        mean = a[..., 1] + delta * c[..., 0] / safe
        m2 = a[..., 2] + c[..., 2] + delta * delta * a[..., 0] * c[..., 0] / safe
        b = np.stack([n, mean, m2, np.minimum(a[..., 3], c[..., 3]), np.maximum(a[..., 4], c[..., 4])], axis=-1)
    return b[0] if b.shape[0] else np.broadcast_to(_EMPTY, batches.shape[1:])


_EMPTY = np.array([0.0, 0.0, 0.0, np.inf, -np.inf])


def _number(x: float) -> float | int | None:
    if not math.isfinite(x):
        return None  # the manifest is JSON: no NaN or infinity in it
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
