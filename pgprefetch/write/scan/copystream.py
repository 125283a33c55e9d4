"""Binary ``COPY ... TO STDOUT (FORMAT binary)`` streams viewed as numpy records, a chunk at a time.

The stream is an 11-byte signature, flags and a header extension, then per row an int16 field count and,
per field, an int32 byte length (-1: NULL) and the value's bytes, big-endian; then an int16 -1. Scan mode
sends every value fixed-width and NOT NULL (NULLs as a placeholder plus a boolean mask), so every row has
the byte length of the first one, and a run of whole rows is one big-endian structured array: decoding is
a ``frombuffer`` and a check of the length words, with no Python object per row. A row that breaks the
layout (a NULL key, an array of another length) is named, column and all.

A run of scalar columns of one wire type (16 ``real`` columns of a feature vector) lies at a fixed stride in
every row: it is byte-swapped in one pass into a row-major block, whose columns the table keeps as views,
so a batch's gather reads one cache line per row for the whole run instead of one per column. The length
words are checked the same way, a strided view per run compared in the stream's byte order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pgprefetch.decode.layout import empty_for_null
from pgprefetch.errors import SampleError, SourceError
from pgprefetch.write.memory.policy import DRAIN_BYTES  # a range's stream decoded this often, not at its end

if TYPE_CHECKING:
    from pgprefetch.write.scan.shape import ScanShape

_HEADER = b"PGCOPY\n\xff\r\n\x00"
_HEADER_BYTES = 19  # signature, flags, header extension length

# A chunk of rows, column by column: "k0".. keys and order, "c0".. values, "m0".. masks; "b3": columns c3..c(3+w-1)
# (a run of one scalar wire type) as one row-major (n, w) block, in place of their "c" entries.
Columns = dict[str, np.ndarray]


def _structure(row: np.dtype) -> tuple[tuple[str, ...], Any]:
    """A row record's field names and fields: set, since the record is a structured dtype (``_row_dtype``)."""
    assert row.names is not None
    assert row.fields is not None
    return row.names, row.fields


@dataclass(frozen=True)
class _Strided:
    """``count`` values of one dtype at ``offset``, ``offset + step``, ... in every row of the record."""

    offset: int
    count: int
    step: int
    dtype: np.dtype

    def view(self, rows: np.ndarray) -> np.ndarray:
        """These values of every row of ``rows`` (a record array), as an ``(n, count)`` view: nothing copied."""
        return np.ndarray((rows.size, self.count), self.dtype, rows, self.offset, (rows.dtype.itemsize, self.step))


def _runs(fields: list[tuple[int, object]]) -> list[list[int]]:
    """Indices of ``fields`` (offset, kind) grouped into runs of one kind at one stride, in order."""
    runs: list[list[int]] = []
    for i, (offset, kind) in enumerate(fields):
        run = runs[-1] if runs else None
        if run is not None and fields[run[0]][1] == kind:
            step = offset - fields[run[-1]][0]
            if len(run) == 1 or step == fields[run[1]][0] - fields[run[0]][0]:
                run.append(i)
                continue
        runs.append([i])
    return runs


class CopyDecoder:
    """Turns one range's COPY stream into column arrays, a chunk of rows at a time (fixed-size rows)."""

    def __init__(
        self,
        shape: ScanShape,
        on_rows: Callable[[int], None] | None = None,
        drain_bytes: int | None = None,
        route: Callable[[Columns], None] | None = None,
        keep: tuple[str, ...] | None = None,
    ) -> None:
        self.shape = shape
        self.route = route  # each decoded chunk handed on whole (to the passes' files, :mod:`.partition`)
        self.keep = keep  # with ``route``: the columns kept in ``parts`` (the keys pass's ``k0``...)
        self.drain_bytes = drain_bytes  # None: DRAIN_BYTES; the keys pass drains sooner, within its budget
        self.on_rows = on_rows
        self.chunks: list[bytes] = []  # the stream's bytes not decoded yet, as they came
        self.pending_bytes = 0
        self.lock = threading.Lock()  # drains run on a thread; a budget check may drain from the loop
        self.started = False
        self.parts: list[Columns] = []  # the decoded rows' columns, a chunk at a time
        self.rows = 0
        self.decoded_bytes = 0
        self.row: np.dtype | None = None
        self._blocks: list[tuple[int, _Strided]] = []  # (first column, its run) of runs of 2+ scalar columns
        self._words: list[tuple[_Strided, int]] = []  # the field count and length words, runs and expected values

    def feed(self, data: bytes) -> bool:
        """Take the next chunk of the stream; True when enough has gathered to :meth:`drain` it.

        The chunk is only kept: it runs on the event loop, which must get back to the other COPYs. (Appending
        to one buffer here was half of the loop's time in the read.) :meth:`drain` joins them, on a thread.
        """
        self.chunks.append(data)
        self.pending_bytes += len(data)
        return self.pending_bytes >= (DRAIN_BYTES if self.drain_bytes is None else self.drain_bytes)

    def finish(self) -> list[Columns]:
        """The stream has ended: decode the rest, check the trailer, return the rows' columns, by chunk.

        The chunks are not joined here: the table joins each column's chunks, contiguous, into its own.
        """
        self.drain(final=True)
        return self.parts

    def drain(self, final: bool = False) -> None:
        """Decode the whole rows received so far (``final``: the stream is complete, trailer included)."""
        with self.lock:
            buf = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            self._keep(self._decode(buf, final))

    def _keep(self, rest: bytes) -> None:
        """What :meth:`drain` could not decode yet: the start of the next row."""
        self.chunks = [rest] if rest else []
        self.pending_bytes = len(rest)

    def _decode(self, buf: bytes, final: bool) -> bytes:
        """Decode the whole rows at the start of ``buf``; return the bytes after them."""
        start = 0
        if not self.started:
            if len(buf) < _HEADER_BYTES:
                return buf
            if bytes(buf[:11]) != _HEADER:
                raise SourceError("the server's COPY stream does not start with the binary COPY signature")
            start = _HEADER_BYTES + int.from_bytes(buf[15:19], "big")
            self.started = True
        if self.row is None:
            if len(buf) - start < 2 or buf[start : start + 2] == b"\xff\xff":  # no row yet, or none at all
                return buf[start:]
            self.row = self._row_dtype(bytes(buf[start:]))
            self._plan_runs(self.row)
        size = self.row.itemsize
        body = len(buf) - start
        if final:
            if body < 2 or buf[len(buf) - 2 :] != b"\xff\xff":
                raise SourceError("the server's COPY stream ended without its trailer")
            body -= 2
            if body % size:  # the rows before the irregular one are checked first, to name the right column
                whole = body // size
                self._check(np.frombuffer(bytes(buf[start : start + whole * size]), dtype=self.row))
                raise self._irregular(self._culprit(bytes(buf[start + whole * size :])))
        n = body // size
        if n:
            rows = np.frombuffer(buf, dtype=self.row, count=n, offset=start)  # a view: compacted, then let go
            self._check(rows)
            columns = self._columns(rows)
            if self.route is not None:
                self.route(columns)
                columns = {name: columns[name] for name in self.keep or ()}
            if columns:
                self.parts.append(columns)
                self.decoded_bytes += sum(v.nbytes for v in columns.values())
            del columns
            self.rows += n
            if self.on_rows:
                self.on_rows(n)
            del rows
        return buf[start + n * size :]

    def overflow_into(self, route: Callable[[Columns], None]) -> None:
        """Hand every chunk decoded so far to ``route``, and each chunk decoded from now on (none kept)."""
        with self.lock:
            for part in self.parts:
                route(part)
            self.parts, self.decoded_bytes = [], 0
            self.route, self.keep = route, ()

    @property
    def held_bytes(self) -> int:
        """Memory this stream holds: its decoded rows, and the bytes not decoded yet."""
        return self.decoded_bytes + self.pending_bytes

    def _columns(self, rows: np.ndarray) -> Columns:
        """Each value column of ``rows`` (``k0``, ``c0``, ``m0``, ...) on its own: contiguous, native byte order.

        The length words and array headers stay behind (about half the bytes), and each column's chunks
        are contiguous, so joining them into the table's columns is a plain copy.
        """
        assert self.row is not None
        out: Columns = {}
        in_blocks: set[str] = set()
        for j, run in self._blocks:
            out[f"b{j}"] = run.view(rows).astype(run.dtype.newbyteorder("="))  # one pass: swapped, row-major
            in_blocks.update(f"c{i}" for i in range(j, j + run.count))
        for name in _structure(self.row)[0][2::2]:
            if name in in_blocks:
                continue
            source = rows[name]
            values = source["e"]["v"] if source.dtype.names else source  # an array column: its elements
            out[name] = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
        return out

    def _row_dtype(self, data: bytes) -> np.dtype:
        """The record of one row, with each array column's length taken from the first row."""
        fields: list[tuple[Any, ...]] = [("n", ">i2")]
        pos = 2
        wires = [*self.shape.key_wire, *([self.shape.order_wire] if self.shape.order_wire is not None else [])]
        for i, w in enumerate(wires):
            fields += [(f"l{i}", ">i4"), (f"k{i}", w)]
            pos += 4 + w.itemsize
        for j, c in enumerate(self.shape.columns):
            if c.is_array:
                size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
                if size < 20:
                    raise SampleError(f"column {c.name} is NULL or empty in the table's first row")
                length = int.from_bytes(data[pos + 16 : pos + 20], "big")
                element = np.dtype([("len", ">i4"), ("v", c.wire)])
                fields += [(f"l_c{j}", ">i4"), (f"c{j}", [("head", ">i4", (5,)), ("e", element, (length,))])]
                pos += 4 + size
                if c.padded is not None:  # its length before the cut
                    fields += [(f"l_n{j}", ">i4"), (f"n{j}", ">i4")]
                    pos += 8
            elif c.padded is not None:  # text or bytea, cut and padded to c.padded bytes, then its length
                fields += [(f"l_c{j}", ">i4"), (f"c{j}", "u1", (c.padded,)), (f"l_n{j}", ">i4"), (f"n{j}", ">i4")]
                pos += 4 + c.padded + 8
            else:
                fields += [(f"l_c{j}", ">i4"), (f"c{j}", c.wire)]
                pos += 4 + c.wire.itemsize
            if c.nullable:
                fields += [(f"l_m{j}", ">i4"), (f"m{j}", "?")]
                pos += 5
        return np.dtype(fields)

    def _plan_runs(self, row: np.dtype) -> None:
        """The runs of scalar columns to decode as blocks, and the runs of words :meth:`_check` compares."""
        names, described = _structure(row)
        scalars = [(j, described[n]) for j, n in enumerate(names) if n[0] == "c" and described[n][0].shape == ()]
        columns = [(int(names[j][1:]), f[1], f[0]) for j, f in scalars if f[0].names is None]
        for run in _runs([(off, dt) for _, off, dt in columns]):
            j, offset, dtype = columns[run[0]]
            if len(run) > 1 and all(columns[i][0] == j + k for k, i in enumerate(run)):  # c{j}, c{j+1}, ... in order
                step = columns[run[1]][1] - offset
                self._blocks.append((j, _Strided(offset, len(run), step, dtype)))
        # Each word as the stream holds it (big-endian), read as a native integer: compared with no byte swap.
        words: list[tuple[int, np.dtype, int]] = [(0, np.dtype(">i2"), (len(names) - 1) // 2)]
        for length, value in zip(names[1::2], names[2::2], strict=True):
            words.append((described[length][1], np.dtype(">i4"), described[value][0].itemsize))
        native = [(off, dt.newbyteorder("="), int(np.array(v, dt).view(dt.newbyteorder("=")))) for off, dt, v in words]
        for run in _runs([(off, (dt, value)) for off, dt, value in native]):
            (offset, dtype, expected), count = native[run[0]], len(run)
            step = native[run[1]][0] - offset if count > 1 else row.itemsize
            self._words.append((_Strided(offset, count, step, dtype), expected))

    def _check(self, rows: np.ndarray) -> None:
        """Every row has every field, each with the byte length of the first row's (names: n, l0, k0, ...).

        The fast path compares each run of words as a strided view; only a stream that breaks the layout
        is searched, field by field, for the first row that does.
        """
        assert self.row is not None
        if not rows.size or not any(np.any(run.view(rows) != expected) for run, expected in self._words):
            return
        names, described = _structure(self.row)
        bad: np.ndarray = rows["n"] != (len(names) - 1) // 2
        for length, value in zip(names[1::2], names[2::2], strict=True):
            bad |= rows[length] != described[value][0].itemsize
        if bad.any():
            raise self._irregular(self._culprit(rows[int(np.flatnonzero(bad)[0]) :].tobytes()))

    def _culprit(self, data: bytes) -> str | None:
        """The field (``k0``, ``c1``, ...) where the row at the start of ``data`` leaves the fixed layout."""
        assert self.row is not None
        (names, described), pos = _structure(self.row), 2
        for value in names[2::2]:
            size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
            if size != described[value][0].itemsize:
                return value
            pos += 4 + size
        return None

    def _irregular(self, field: str | None = None) -> SampleError:
        """The error for a row that breaks the fixed layout, naming the column where it breaks.

        Field values are sent NOT NULL (placeholder and mask), so what can break it is a NULL key or order
        value, a NULL text or bytea, or an array column whose value is NULL, holds a NULL or has another
        length than the first row's. (After that row the stream is misaligned, so only the first such row is named.)
        """
        keys = self.shape.key_names
        if field is not None and field[0] == "k":
            return SampleError(f'[samples] table: a row has a NULL in column "{keys[int(field[1:])]}"')
        arrays = [c.name for c in self.shape.columns if c.is_array]
        if field is not None and field[0] in "cm":
            column = self.shape.columns[int(field[1:])]
            if column.is_bytes:  # sent as exactly `padded` bytes: only a NULL breaks the layout
                return SampleError(
                    f'[samples] table: a row has a NULL in column "{column.name}"; {empty_for_null(column)}'
                )
            if column.padded is not None:  # cut and padded to max_length by the COPY: a NULL breaks it
                return SampleError(
                    f'[samples] table: a row\'s array in column "{column.name}" is NULL or holds a NULL element; '
                    f"a NULL array: {empty_for_null(column)}"
                )
            arrays = [column.name]
        return SampleError(
            f"[samples] table: a row's {' or '.join(arrays) or 'value'} is a NULL array, holds a NULL or has another "
            "length than the first row's (scan mode needs every row's arrays to have one length)"
        )
