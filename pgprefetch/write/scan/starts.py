"""Windows stored as starts: an epoch's rows once, and each window as the row it starts at.

In the ``"batches"`` layout every window's rows are written out: 64-row windows at stride 1 write the table
64 times, and the dump's time is the disk's. With ``[store] windows = "starts"`` the epoch holds

- ``_starts`` (int64, one per sample, in the epoch's order, batch chunks like every sample array): where
  each window begins among the stored rows;
- each array of the batch layout (fields, NULL masks, lengths) as *rows*, under its own name: the table's
  rows in (key, order) order, only those some window of this epoch covers (a split's or a ``fraction``'s
  epoch keeps its own), cast exactly as the batches' would be. So window ``i`` is ``rows[s : s + window]``
  for ``s = _starts[i]``, byte for byte the sample the ``"batches"`` layout stores;
- the keys, as every epoch.

The rows are spread evenly over the epoch's batches, ``per_batch`` a chunk (the last chunk's tail zeros): every
array keeps a chunk per batch, so the writer journals, checksums, resumes and uploads them as it does samples,
and a kill -9 resumes both. The readers gather a window as one contiguous slice of the mapped rows
(:mod:`pgprefetch.read.windows`).

The statistics are the windows' own, from the rows each counted for the windows it is in; each batch's longest
sample (padded fields) is the longest row of its windows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.store.base import STARTS_ARRAY
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, RowArrays, local_unit_batches
from pgprefetch.write.files.stats import EpochStats
from pgprefetch.write.memory.policy import STARTS_ROW_BYTES
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.table import Table, gather


@dataclass(frozen=True, eq=False)
class Placed:
    """Where an epoch's windows lie among the rows it stores."""

    rows: np.ndarray  # the table's rows stored, ascending
    starts: np.ndarray  # each sample's first row among them, in the epoch's order (int32 below 2**31 rows)
    weights: np.ndarray  # how many of the epoch's windows each stored row is in (int32)

    @property
    def digest(self) -> str:
        """A SHA-256 of the rows' count and the starts: a partial epoch resumes only under the same ones."""
        h = hashlib.sha256(np.int64(self.rows.size).tobytes())
        h.update(np.ascontiguousarray(self.starts, dtype="<i8").data)  # (int32 or int64 alike)
        return h.hexdigest()


def place(table_starts: np.ndarray, window: int, n_table_rows: int) -> Placed:
    """The rows that the windows starting at ``table_starts`` (table rows, epoch order) cover, and their starts there.

    A window's rows are consecutive table rows, all covered, so they stay consecutive among the rows kept.
    In int32 below 2**31 rows, one buffer reused: each array of a table's length costs its page faults, which
    this machine's kernel takes at about 0.5 GB/s.
    """
    kind = np.dtype(np.int32 if n_table_rows < 2**31 - 1 else np.int64)
    counts: np.ndarray = np.cumsum(np.bincount(table_starts, minlength=n_table_rows), dtype=kind)  # starts at <= i
    counts[window:] -= counts[:-window].copy() if window < n_table_rows else 0  # ... past i - window: holding i
    covered = counts > 0
    weights = counts[covered]
    np.cumsum(covered, dtype=kind, out=counts)  # (reused: each kept row's place among them, plus one)
    starts = counts[table_starts]
    starts -= 1
    return Placed(np.flatnonzero(covered), starts, weights)


def window_max(values: np.ndarray, window: int) -> np.ndarray:
    """The largest of each ``window`` consecutive ``values``: ``len(values) - window + 1`` of them.

    Doubling spans (the max of two halves), then two overlapping spans: ``log2(window)`` passes, no window's
    values ever gathered.
    """
    m, span = values, 1
    while span * 2 <= window:
        m = np.maximum(m[:-span], m[span:])
        span *= 2
    n = values.size - window + 1
    out: np.ndarray = np.maximum(m[:n], m[window - span : window - span + n])
    return out


def starts_source(
    cfg: Config,
    plan: EpochPlan,
    layout: BatchLayout,
    row_layout: BatchLayout,
    table: Table,
    table_starts: np.ndarray,
    snapshot: str,
    server_version: str,
    rows_read: int | None,
) -> BatchSource:
    """The epoch of windows starting at table rows ``table_starts`` (epoch order), stored as starts.

    ``row_layout``: ``layout`` for one row (what each window is ``window`` of).
    """
    size, window = cfg.batches.size, layout.rows
    n = int(table.keys.shape[1])
    with memory.current().reserve("window places", STARTS_ROW_BYTES * (n + 1)):  # its peak, measured: 21 B a row
        placed = place(table_starts, window, n)
    per_batch = max(1, -(-placed.rows.size // plan.n_batches))
    memory.current().reserve("window starts", placed.rows.nbytes + placed.starts.nbytes + placed.weights.nbytes)
    rows = RowArrays(tuple(row_layout.arrays()), per_batch, int(placed.rows.size), window)
    stats = EpochStats.of_rows(row_layout, plan.n_batches, per_batch, placed.weights)
    padded = sum(1 for f in row_layout.fields if f.config.max_length is not None)
    with memory.current().reserve("longest windows", 16 * padded * placed.rows.size):  # lengths, their maxima
        stats.set_longest(_longest(table, row_layout, placed, window, size, plan.n_batches))

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        starts = placed.starts[batch * size : (batch + count) * size]
        buffers[STARTS_ARRAY][: starts.size] = starts
        lo = min(batch * per_batch, placed.rows.size)
        hi = min((batch + count) * per_batch, placed.rows.size)
        kept = placed.rows[lo:hi]  # cast and checked as a window's rows are (an error names the row's key)
        gather(table, row_layout, kept, table.keys[:, kept], buffers)
        for name, _, _ in rows.arrays:  # past the last row: zeros
            buffers[name][hi - lo : count * per_batch] = 0

    unit_bytes = size * 8 + per_batch * rows.row_bytes  # a batch's starts and rows
    threads = 2 if cfg.store.compression == "none" else 1
    unit = min(local_unit_batches(1, unit_bytes, cfg.source.memory_bytes), plan.n_batches)
    return BatchSource(
        plan, layout, snapshot, server_version, rows_read, fetch, produce, threads, threads, unit,
        rows=rows, records={"windows": _record(rows)}, stats=stats, identity={"rows_sha256": placed.digest},
    )  # fmt: skip


def _longest(
    table: Table, row_layout: BatchLayout, placed: Placed, window: int, size: int, n_batches: int
) -> dict[str, np.ndarray]:
    """Each batch's longest window per lengths array: the longest kept row of its windows (0: padding samples)."""
    out: dict[str, np.ndarray] = {}
    for f in row_layout.fields:
        if f.config.length_array is None or f.config.max_length is None:
            continue
        kept = np.minimum(table.lengths[f.columns[0]][placed.rows], f.config.max_length)  # (longer ones fail)
        per_sample = np.zeros(n_batches * size, dtype=np.int64)
        used = placed.starts[: n_batches * size]
        per_sample[: used.size] = window_max(kept, window)[used] if kept.size >= window else 0
        out[f.config.length_array] = per_sample.reshape(n_batches, size).max(axis=1)
    return out


def starts_bytes(plan: EpochPlan, layout: BatchLayout, size: int, kept_rows: int) -> int:
    """The bytes of a starts epoch whose windows (``layout``) cover ``kept_rows`` rows: what the dump writes."""
    per_batch = max(1, -(-kept_rows // plan.n_batches))
    row_bytes = layout.sample_bytes // layout.rows
    return plan.n_batches * (size * 8 * (1 + plan.key_columns.width) + per_batch * row_bytes)


def _record(rows: RowArrays) -> dict[str, object]:
    """The manifest's record of the layout: what a reader needs to gather a window from the rows."""
    return {
        "layout": "starts",
        "window": rows.window,
        "starts": STARTS_ARRAY,
        "rows": rows.n_rows,
        "rows_per_batch": rows.per_batch,
        "arrays": [name for name, _, _ in rows.arrays],
    }
