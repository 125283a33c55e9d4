"""A packed epoch whose documents outgrow ``--memory``: their lengths, the packing and its pieces on disk.

Held in memory, a packed epoch costs a few hundred bytes a document (its key, its lengths, the packer's
lists). Beyond its share of the budget (the share the epoch's keys have: the documents are the plan's keys)
the same epoch is built in three passes, a window of documents at a time, each window reserved:

1. **Count**: the documents' keys, read in the epoch's order (from memory, or from the ordered key file when
   they outgrew the budget too), are counted by the server a window at a time (:mod:`.lengths`) and
   appended with their lengths to a column file (:mod:`pgprefetch.write.spill.columns`).
2. **Pack**: that file is read back a window at a time and packed as the whole epoch is. ``best-fit`` packs
   within groups of consecutive documents, so a window of whole groups packs as it does among all the
   epoch's; its remainders' sequences are numbered after the windows before it, and its full pieces after
   every remainder's sequence (:func:`~.packer.remainders`, :func:`~.packer.full_pieces`). ``concat`` cuts
   the stream from where the window before it ended (:func:`~.packer.concat_pieces`). Each piece is appended
   to a pieces file with what placing it needs: its offset and size, its document's key and lengths.
3. **Shuffle**: the sequences are shuffled by the hash of their numbers, as in memory.

What stays in memory is a few bytes a *sequence*: where its pieces begin in the file, its tokens, and the
shuffle (a sequence holds ``length`` tokens, so these are a small fraction of the tokens' bytes). A unit
reads its sequences' pieces with one ``pread`` a column a sequence (:meth:`SpilledPieces.unit`): the bytes
are those of the epoch held in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.keys import KeyColumns
from pgprefetch.write import memory
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.order.shuffle import key_hash
from pgprefetch.write.order.spill import KEYS_RESERVATION
from pgprefetch.write.pack.documents import Documents
from pgprefetch.write.pack.packer import PACK_BYTES, PACK_STREAM, Packing, concat_pieces, full_pieces, remainders
from pgprefetch.write.pack.pieces import Identity, Summary
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.spill.columns import ColumnFile
from pgprefetch.write.spill.folder import SpillFolder

# What counting a window holds a document: its key slots and lengths, the server's answer (Python ints).
COUNT_BYTES = 160
# What the epoch holds a sequence: where its pieces begin, its pieces and tokens, its number, the shuffle's sort.
SEQUENCE_BYTES = 64
LEAST_WINDOW = 1024  # documents counted, or cut under concat, at once however small the share

# count(keys, first): the kept token counts of the documents ``keys`` (from document ``first`` on), and where
# their kept tokens begin; Counting opens one (its connections) for as long as the documents are counted.
Count = Callable[[np.ndarray, int], Awaitable[tuple[np.ndarray, np.ndarray]]]
Counting = Callable[[], AbstractAsyncContextManager[Count]]


def documents_share(cfg: Config) -> int:
    """The bytes a packed epoch's documents may hold in memory: the data's share, less the epoch's keys held.

    The documents' plan is a query-mode epoch's: its keys, in memory while they fit, take the data's share
    first (:meth:`~pgprefetch.write.memory.policy.Policy.keys_bytes`); the documents have what they leave.
    """
    pool = memory.current()
    keys = sum(size for name, size in pool.holders() if name == KEYS_RESERVATION)
    return max(0, Policy.for_scan(cfg.source.memory_bytes).keys_bytes(beside_rows=False) - keys)


@dataclass(frozen=True)
class _Files:
    """The pieces files and the schema of a row: a piece, with its document's key and lengths."""

    rest: ColumnFile  # the remainders' sequences' pieces (every piece under concat), in packing order
    full: ColumnFile  # best-fit's full pieces, a sequence each, in document order
    width: int
    left: bool  # ``truncate = "left"``: each document's kept tokens begin past ``skip``

    def rows(self, p: Packing, window: dict[str, np.ndarray], doc: np.ndarray) -> dict[str, np.ndarray]:
        """A row for each of ``p``'s pieces (``doc``: their documents, by place in ``window``)."""
        out = {"offset": p.offset, "size": p.size, "length": window["length"][doc]}
        if self.left:
            out["skip"] = window["skip"][doc]
        return out | {f"k{i}": window[f"k{i}"][doc] for i in range(self.width)}


@dataclass
class SpilledPieces:
    """A packed epoch's pieces in the spill folder; in memory, a few numbers a sequence (see the module)."""

    key_columns: KeyColumns
    length: int
    files: _Files
    starts: np.ndarray  # (remainder sequences + 1,) int64: sequence i's pieces are rows starts[i] ... of rest
    per_sequence: np.ndarray  # (sequences,) int64: each one's pieces, in packing order
    tokens: np.ndarray  # (sequences,) int64: each one's tokens, in packing order
    numbers: np.ndarray  # (sequences,) int64: the shuffled order, each sequence's number in the packing
    documents: int
    empty_documents: int
    documents_cut: int

    @property
    def n_sequences(self) -> int:
        """The sequences: the epoch's samples."""
        return int(self.numbers.size)

    @property
    def max_segments(self) -> int:
        """The most pieces a sequence holds, at least 1."""
        return max(1, int(self.per_sequence.max(initial=0)))

    def unit(self, first: int, last: int) -> tuple[Packing, Documents]:
        """Sequences ``first ... last - 1`` of the epoch: their pieces read back, a document row each."""
        numbers = self.numbers[first:last]
        n_rest = self.starts.size - 1
        chunks: list[dict[str, np.ndarray]] = []
        for s in numbers.tolist():
            if s < n_rest:
                chunks.append(self.files.rest.read(int(self.starts[s]), int(self.starts[s + 1])))
            else:
                chunks.append(self.files.full.read(s - n_rest, s - n_rest + 1))
        counts = self.per_sequence[numbers]
        starts = np.zeros(numbers.size + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        empty = {name: np.empty((0, *shape), dtype) for name, (dtype, shape) in self.files.rest.schema.items()}
        columns = {name: np.concatenate([empty[name], *(c[name] for c in chunks)]) for name in empty}
        n = int(starts[-1])
        packed = Packing(self.length, starts, np.arange(n, dtype=np.int64), columns["offset"], columns["size"])
        keys = np.vstack([columns[f"k{i}"] for i in range(self.files.width)]) if n else np.empty((self.files.width, 0))
        skip = columns["skip"] if self.files.left else None
        return packed, Documents(self.key_columns, keys.astype(np.int64), columns["length"], skip=skip)

    def summary(self, used: int) -> Summary:
        """The figures over the first ``used`` sequences."""
        written = self.numbers[:used]
        return Summary(
            documents=self.documents,
            empty_documents=self.empty_documents,
            sequences=self.n_sequences,
            tokens=int(self.tokens[written].sum()),
            pieces=int(self.per_sequence[written].sum()),
            documents_cut=self.documents_cut,
            max_segments=self.max_segments,
        )


@contextlib.asynccontextmanager
async def spilled_pieces(
    cfg: Config, plan: EpochPlan, counting: Counting, folder: SpillFolder, identity: Identity, *, left: bool
) -> AsyncIterator[SpilledPieces]:
    """The documents of ``plan`` (one a batch) counted, packed and shuffled, on disk in ``folder``.

    ``counting()``: opens what counts them (:data:`Counting`); ``identity`` is given every window's lengths;
    ``left``: ``truncate = "left"``.
    """
    packing = cfg.packing
    assert packing is not None
    width = plan.key_columns.width
    schema = {f"k{i}": (np.dtype(np.int64), ()) for i in range(width)}
    documents = ColumnFile(folder.create("documents"), schema | _lengths_schema())
    rest = ColumnFile(folder.create("pieces"), _pieces_schema(width, left))
    files = _Files(rest, ColumnFile(folder.create("full pieces"), rest.schema), width, left)
    try:
        async with counting() as count:
            empty, total = await _count(cfg, plan, count, documents, identity)
        if packing.method == "concat":
            built = await asyncio.to_thread(_pack_concat, cfg, documents, files, total)
        else:
            built = await asyncio.to_thread(_pack_best_fit, cfg, documents, files)
        documents.remove()
        with memory.current().reserve("the shuffle of the sequences", built.n_sequences * 24):
            numbers = await asyncio.to_thread(_shuffle, built.n_sequences, cfg.batches.seed, plan.epoch)
        held = memory.current().reserve("the sequences", built.n_sequences * SEQUENCE_BYTES)
        with held:
            yield SpilledPieces(
                plan.key_columns, packing.length, files, built.starts, built.per_sequence, built.tokens,
                numbers.astype(np.int64), plan.used, empty, built.documents_cut,
            )  # fmt: skip
    finally:
        for file in (documents, files.rest, files.full):
            file.close()


def _shuffle(n: int, seed: int, epoch: int) -> np.ndarray:
    """The sequences' order, as :meth:`~.packer.Packing.shuffled` draws it: by the hash of their numbers."""
    return np.argsort(key_hash(np.arange(n, dtype=np.int64)[None], seed=seed, epoch=epoch, stream=PACK_STREAM))


def _lengths_schema() -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    return {"length": (np.dtype(np.int64), ()), "skip": (np.dtype(np.int64), ())}


def _pieces_schema(width: int, left: bool) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    names = ["offset", "size", "length", *(["skip"] if left else []), *(f"k{i}" for i in range(width))]
    return {name: (np.dtype(np.int64), ()) for name in names}


async def _count(
    cfg: Config, plan: EpochPlan, count: Count, documents: ColumnFile, identity: Identity
) -> tuple[int, int]:
    """Pass 1: every document's lengths, a window at a time, appended to ``documents``.

    Returns the documents with no token and no eos, and the tokens of all (their eos counted).
    """
    assert cfg.packing is not None
    width, eos = plan.key_columns.width, cfg.packing.eos is not None
    window = max(LEAST_WINDOW, documents_share(cfg) // COUNT_BYTES)  # (statements of CHUNK documents each)
    empty, total = 0, 0
    for first in range(0, plan.used, window):
        n = min(window, plan.used - first)
        with memory.current().reserve("counting documents", n * COUNT_BYTES):
            keys = np.ascontiguousarray(plan.batch_keys(first, 1, n))
            kept, skip = await count(keys, first)
            identity.update(kept, skip if cfg.field(cfg.packing.field).truncate == "left" else None)
            empty += int((kept + eos == 0).sum())
            total += int(kept.sum()) + eos * n
            documents.append({f"k{i}": keys[i] for i in range(width)} | {"length": kept, "skip": skip})
    return empty, total


@dataclass
class _Built:
    """What packing the windows leaves in memory: a few numbers a sequence."""

    starts: np.ndarray
    per_sequence: np.ndarray
    tokens: np.ndarray
    documents_cut: int

    @property
    def n_sequences(self) -> int:
        return int(self.per_sequence.size)


def _windows(documents: ColumnFile, window: int) -> Iterator[dict[str, np.ndarray]]:
    """The documents file a window at a time, each window's packing reserved while it is held."""
    for first in range(0, documents.rows, window):
        last = min(first + window, documents.rows)
        with memory.current().reserve("packing documents", (last - first) * PACK_BYTES):
            yield documents.read(first, last)


def _pack_best_fit(cfg: Config, documents: ColumnFile, files: _Files) -> _Built:
    """Pass 2 under ``best-fit``: windows of whole groups.

    A window's remainders' sequences follow the last window's; its full pieces (a sequence each) follow every
    remainder's sequence, in document order.
    """
    packing = cfg.packing
    assert packing is not None
    length, eos = packing.length, packing.eos is not None
    window = packing.group * max(1, documents_share(cfg) // PACK_BYTES // packing.group)
    counts: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    full, cut = 0, 0
    for got in _windows(documents, window):
        with_eos = got["length"] + eos
        rest = remainders(with_eos, length, packing.group)
        files.rest.append(files.rows(rest, got, rest.doc))
        counts.append(np.diff(rest.starts))
        tokens.append(np.add.reduceat(rest.size, rest.starts[:-1]) if rest.n_sequences else rest.size[:0])
        full_doc, full_offset = full_pieces(with_eos, length)
        if full_doc.size:
            whole = Packing(length, np.arange(full_doc.size + 1), full_doc, full_offset, np.full(full_doc.size, length))
            files.full.append(files.rows(whole, got, full_doc))
        full += full_doc.size
        cut += int((with_eos // length + (with_eos % length > 0) > 1).sum())
    rest_counts = np.concatenate([*counts, np.zeros(0, dtype=np.int64)])
    return _Built(
        _starts(rest_counts),
        np.concatenate([rest_counts, np.ones(full, dtype=np.int64)]),
        np.concatenate([*tokens, np.full(full, length, dtype=np.int64)]),
        cut,
    )


def _pack_concat(cfg: Config, documents: ColumnFile, files: _Files, total: int) -> _Built:
    """Pass 2 under ``concat``: the stream cut from where the last window ended (``total``: its tokens)."""
    packing = cfg.packing
    assert packing is not None
    length, eos = packing.length, packing.eos is not None
    n = -(-total // length)
    counts, tokens = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    begin, cut = 0, 0
    for got in _windows(documents, max(LEAST_WINDOW, documents_share(cfg) // PACK_BYTES)):
        with_eos = got["length"] + eos
        doc, offset, size, sequence = concat_pieces(with_eos, length, begin)
        begin += int(with_eos.sum())
        if not doc.size:
            continue
        files.rest.append(files.rows(Packing(length, np.zeros(1, np.int64), doc, offset, size), got, doc))
        first = int(sequence[0])  # (a window's first sequence may go on from the window before)
        span = int(sequence[-1]) - first + 1
        counts[first : first + span] += np.bincount(sequence - first, minlength=span)
        tokens[first : first + span] += np.bincount(sequence - first, weights=size, minlength=span).astype(np.int64)
        cut += int((np.bincount(doc) > 1).sum())
    return _Built(_starts(counts), counts, tokens, cut)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each sequence's pieces begin among the pieces, and their end."""
    starts = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


__all__ = ["Count", "Counting", "SpilledPieces", "documents_share", "spilled_pieces"]
