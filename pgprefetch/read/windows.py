"""Windows stored as starts, read as the batches they stand for: each window a slice of the mapped rows.

A ``[store] windows = "starts"`` epoch keeps its rows once and each window as its first row (``_starts``,
:mod:`pgprefetch.write.scan.starts`). :class:`WindowRanges` has :class:`~.ranges.SampleRanges`'s interface,
so every reader above (NumPy, torch, JAX, Grain, ranks, resume) hands out the ``"batches"`` layout's bytes
without knowing which layout it reads:

- a window is ``window`` consecutive rows: in a local uncompressed store, one contiguous run of a mapped
  file, gathered for a whole range of samples by one fancy index over the runs (each an opaque item), then
  one copy into the caller's buffer; a window across two files (rare: one per file boundary) is read alone;
- in an object store, or compressed, the rows are fetched (decoded) whole on first use, in concurrent
  blocks, and held by the process while they take at most :data:`HELD_BYTES` (a starts epoch's rows are
  about the table's size, and a shuffled epoch's windows touch all of them within a few batches); larger
  rows are fetched as a batch's windows need them: the starts sorted, near ones merged (:data:`MERGE_BYTES`),
  one ranged read per run, the runs read concurrently;
- the keys, the ``_starts`` and any array that is not a window's (``n_rows``, ``source``) are read as samples.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from pgprefetch.errors import StoreError
from pgprefetch.read.ranges import MappedFile, SampleRanges
from pgprefetch.store.base import Store
from pgprefetch.store.layout import ArrayLayout

MERGE_BYTES = 256 << 10  # object stores: windows whose rows lie closer than this are fetched in one range
HELD_BYTES = 512 << 20  # object stores, compressed: rows of an epoch up to this are fetched whole and held
BLOCK_ROWS_BYTES = 8 << 20  # ... in blocks of about this many bytes, fetched concurrently
FETCHES = 8  # ranged reads in flight for one gather

T = TypeVar("T")


class WindowRanges:
    """The arrays of one published epoch of windows stored as starts, read as sample ranges.

    Args:
        backend: the store.
        epoch: the published epoch.
        names: the arrays to read, as a ``"batches"`` epoch names them.
        record: :func:`~pgprefetch.store.checks.windows_record` of its manifest.
    """

    def __init__(self, backend: Store, epoch: int, names: tuple[str, ...], record: dict[str, Any]) -> None:
        self.window = int(record["window"])
        self.n_rows = int(record["rows"])
        self.starts_name = str(record["starts"])
        self.windowed = frozenset(n for n in names if n in record["arrays"])
        self.rows = SampleRanges(backend, epoch, (*names, self.starts_name))
        self.layouts: dict[str, ArrayLayout] = self.rows.layouts
        self._check_rows(int(record["rows_per_batch"]), f"{backend.location}/epoch {epoch}")
        self._held: dict[str, np.ndarray] = {}  # object stores, compressed: rows fetched whole (see HELD_BYTES)
        self._hold_lock = threading.Lock()
        self._pid = os.getpid()
        held = sum(self.n_rows * self._row_bytes(n) for n in self.windowed)
        self.holds = (self.rows.remote or not all(self.layouts[n].raw for n in self.windowed)) and held <= HELD_BYTES

    def _check_rows(self, per_batch: int, where: str) -> None:
        """The rows arrays hold the record's rows, chunk and files alike (before any window is sized from them)."""
        for name in self.windowed:
            layout = self.layouts[name]
            if layout.batch_shape[0] != per_batch or layout.shape[0] * per_batch < self.n_rows:
                raise StoreError(
                    f"{where}/{name}: the array holds {layout.shape[0]} chunks of {layout.batch_shape[0]} rows; the "
                    f"manifest says {self.n_rows} rows, {per_batch} a chunk (a damaged store)"
                )
            self.rows.check_files(name)

    # --- SampleRanges's interface ------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        """Whether the store is an object store."""
        return self.rows.remote

    @property
    def bytes_fetched(self) -> int:
        """Object stores: bytes this process fetched."""
        return self.rows.bytes_fetched

    def sample_shape(self, name: str) -> tuple[int, ...]:
        """The shape of one sample of array ``name``: a window of rows, for the rows' arrays."""
        row = self.rows.sample_shape(name)
        return (self.window, *row) if name in self.windowed else row

    def dtype(self, name: str) -> np.dtype:
        """The dtype of array ``name``."""
        return self.rows.dtype(name)

    def mapped(self, name: str, a: int, b: int) -> tuple[MappedFile, int, int] | None:
        """Where samples ``a..b`` lie as one view of a file: never, for a window (gathered); else as stored."""
        return None if name in self.windowed else self.rows.mapped(name, a, b)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        """Samples ``a..b`` of ``name``, read-only; windows gathered into a new array."""
        if name not in self.windowed:
            return self.rows.read(name, a, b)
        starts = self.starts(a, b)  # checked before anything is allocated for them
        out = np.empty((b - a, *self.sample_shape(name)), dtype=self.dtype(name))
        self._gather(name, starts, out)
        out.flags.writeable = False
        return out

    def read_into(self, name: str, a: int, b: int, out: np.ndarray) -> None:
        """Fill ``out[: b - a]`` with samples ``a..b`` of ``name``; windows gathered from the rows."""
        if name not in self.windowed:
            self.rows.read_into(name, a, b, out)
            return
        self._gather(name, self.starts(a, b), out[: b - a])

    def _gather(self, name: str, starts: np.ndarray, target: np.ndarray) -> None:
        """The windows starting at ``starts`` into ``target``, from wherever the rows are."""
        if self.holds:
            runs = _runs(self._rows_held(name), self.window)
            target.reshape(-1).view(np.uint8).view(runs.dtype)[:] = runs[starts]
        elif self.rows.remote or not self.layouts[name].raw:
            self._gather_fetched(name, starts, target)
        else:
            self._gather_mapped(name, starts, target)

    def starts(self, a: int, b: int) -> np.ndarray:
        """Samples ``a..b``'s first rows, each checked to begin a window inside the rows."""
        starts = np.array(self.rows.read(self.starts_name, a, b))  # (a copy: checked, then used as it was checked)
        if starts.size and (int(starts.min()) < 0 or int(starts.max()) > self.n_rows - self.window):
            raise StoreError(
                f"{self.rows.backend.location}: a window of samples {a}..{b} starts outside the epoch's "
                f"{self.n_rows} rows (a damaged or altered store)"
            )
        return starts

    def forget(self) -> None:
        """Map the files afresh from the next read on (see :meth:`SampleRanges.forget`)."""
        self.rows.forget()

    # --- gathering -------------------------------------------------------------------------------------
    def _gather_mapped(self, name: str, starts: np.ndarray, out: np.ndarray) -> None:
        """Windows from the mapped files: one fancy index of runs per file, then one copy into ``out``."""
        layout = self.layouts[name]
        per_file = layout.per_file * layout.batch_shape[0]  # rows a file holds
        if self.n_rows <= per_file:  # the rows in one file, as pgprefetch writes them: the hot path
            hit = self.rows.mapped(name, 0, self.n_rows)
            samples = None if hit is None else hit[0].samples
            if hit is not None and samples is not None:
                file = hit[0]
                runs = file.views.get("runs")
                if runs is None:
                    runs = file.views["runs"] = _runs(samples, self.window)
                out.reshape(-1).view(np.uint8).view(runs.dtype)[:] = runs[starts]
                return
        files = starts // per_file
        inside = (starts + self.window - 1) // per_file == files
        for number in np.unique(files[inside]).tolist():
            at = np.flatnonzero(inside & (files == number))
            first = number * per_file
            hit = self.rows.mapped(name, first, min(first + per_file, self.n_rows))
            if hit is None or hit[0].samples is None:  # chunks out of order (not pgprefetch's writing)
                for i in at.tolist():
                    out[i] = self.rows.read(name, int(starts[i]), int(starts[i]) + self.window)
                continue
            file, lo, hi = hit
            assert file.samples is not None
            _into(out, at, _runs(file.samples[lo:hi], self.window)[starts[at] - first])
        for i in np.flatnonzero(~inside).tolist():  # across two files: one copy of its rows
            out[i] = self.rows.read(name, int(starts[i]), int(starts[i]) + self.window)

    def _gather_fetched(self, name: str, starts: np.ndarray, out: np.ndarray) -> None:
        """Windows from runs of rows fetched (or decoded) together: near windows share one ranged read."""
        if not starts.size:
            return
        gap = max(self.window, MERGE_BYTES // self._row_bytes(name))
        order = np.argsort(starts, kind="stable")
        ordered = starts[order]
        groups = np.split(np.arange(ordered.size), np.flatnonzero(np.diff(ordered) > gap) + 1)

        def fetch(group: np.ndarray) -> None:
            lo, hi = int(ordered[group[0]]), int(ordered[group[-1]]) + self.window
            _into(out, order[group], _runs(self.rows.read(name, lo, hi), self.window)[ordered[group] - lo])

        self._each(fetch, groups)  # (each group's windows are its own places of out)

    def _rows_held(self, name: str) -> np.ndarray:
        """Array ``name``'s rows, fetched (decoded) whole on first use in concurrent blocks, then held."""
        with self._hold_lock:
            if self._pid != os.getpid():  # a forked worker fetches its own
                self._held, self._pid = {}, os.getpid()
            rows = self._held.get(name)
            if rows is None:
                rows = np.empty((self.n_rows, *self.rows.sample_shape(name)), dtype=self.dtype(name))
                block = max(1, BLOCK_ROWS_BYTES // self._row_bytes(name))
                spans = [(lo, min(lo + block, self.n_rows)) for lo in range(0, self.n_rows, block)]
                self._each(lambda span: self.rows.read_into(name, span[0], span[1], rows[span[0] :]), spans)
                rows.flags.writeable = False
                self._held[name] = rows
            return rows

    def _each(self, read: Callable[[T], None], parts: Sequence[T]) -> None:
        """``read`` each of ``parts``: concurrently from an object store (ranged GETs), in turn through zarr."""
        if not self.rows.remote or len(parts) < 2:
            for part in parts:
                read(part)
            return
        with ThreadPoolExecutor(min(FETCHES, len(parts)), thread_name_prefix="pgprefetch-rows") as pool:
            list(pool.map(read, parts))

    def _row_bytes(self, name: str) -> int:
        layout = self.layouts[name]
        return max(1, layout.batch_bytes // layout.batch_shape[0])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # (the SampleRanges pickles without its mappings)
        state.update(_held={}, _hold_lock=None)  # each process fetches its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _hold_lock=threading.Lock(), _pid=os.getpid())


def _runs(rows: np.ndarray, window: int) -> np.ndarray:
    """Every ``window``-row run of ``rows`` (C-contiguous) as one opaque item: ``runs[s]`` is rows ``s..s+window``."""
    item = np.dtype((np.void, rows.strides[0] * window))
    return np.ndarray((max(0, rows.shape[0] - window + 1),), item, rows, 0, (rows.strides[0],))


def _into(out: np.ndarray, at: np.ndarray, runs: np.ndarray) -> None:
    """Put the gathered windows ``runs`` (opaque items) at places ``at`` of ``out``."""
    if at.size == out.shape[0] and np.array_equal(at, np.arange(at.size)):
        out.reshape(-1).view(np.uint8).view(runs.dtype)[:] = runs
        return
    flat = out.reshape(out.shape[0], -1).view(np.uint8).view(runs.dtype).reshape(-1)
    flat[at] = runs
