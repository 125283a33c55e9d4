"""A unit of a packed epoch placed: its documents' tokens, decoded flat, laid into its sequences' arrays.

A unit holds sequences ``first ... last - 1``; their pieces name documents by their place in the epoch's
order. :meth:`Placer.documents` says which documents a unit needs (each once, however many of its pieces
they have); :meth:`Placer.fill` takes their tokens (:mod:`.documents`) and computes, for every token
of every piece at once, the slot it goes to and the place in its document it comes from: one gather and a
scatter per array, no loop over pieces or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import FieldConfig, PackingConfig
from pgprefetch.errors import SampleError
from pgprefetch.keys import KeyColumns
from pgprefetch.write.pack.packer import Packing

SEGMENT_IDS = "segment_ids"
POSITION_IDS = "position_ids"
SEGMENT_KEYS = "segment_keys"
SEGMENT_OFFSETS = "segment_offsets"


@dataclass(frozen=True)
class Documents:
    """A packed epoch's documents (or a part's), by their place in the epoch's order: keys and token counts."""

    key_columns: KeyColumns
    keys: np.ndarray  # (key slots, documents)
    lengths: np.ndarray  # tokens each, as the field keeps them (no eos)
    sources: np.ndarray | None = None  # a mixed epoch: each document's source code

    def take(self, rows: np.ndarray) -> Documents:
        """The documents ``rows`` alone (a unit's, or what a cluster's part is sent)."""
        sources = None if self.sources is None else self.sources[rows]
        return Documents(self.key_columns, self.keys[:, rows], self.lengths[rows], sources)


@dataclass(frozen=True)
class _Where:
    """Where each token of a unit's pieces goes and comes from (every array is one entry a token)."""

    piece: np.ndarray  # its piece, by its place in the unit's pieces
    slot: np.ndarray  # its place in the unit's flattened ``(sequences, length)`` array
    position: np.ndarray  # its place in its document (its eos counted)
    sequence: np.ndarray  # (a piece each) the piece's sequence in the unit
    segment: np.ndarray  # (a piece each) the piece's place in its sequence, from 0

    @classmethod
    def of(cls, p: Packing, first: int, last: int) -> _Where:
        """The tokens of sequences ``first ... last - 1`` of ``p``."""
        at = p.pieces(first, last)
        offset, size = p.offset[at], p.size[at]
        per = np.diff(p.starts[first : last + 1])
        heads = p.starts[first:last] - p.starts[first]  # each sequence's first piece, in the unit
        sequence = np.repeat(np.arange(last - first), per)
        segment = np.arange(size.size) - np.repeat(heads, per)
        begins = np.cumsum(size) - size  # each piece's first token among the unit's tokens
        within = begins - np.repeat(begins[heads], per)  # ... and in its sequence
        piece = np.repeat(np.arange(size.size), size)
        j = np.arange(int(size.sum()), dtype=np.int64) - np.repeat(begins, size)  # its place in its piece
        return cls(piece, sequence[piece] * p.length + within[piece] + j, offset[piece] + j, sequence, segment)


class Placer:
    """Places the pieces of a packed epoch's sequences (or of a part's: ``base`` is its first sequence)."""

    def __init__(self, packing: PackingConfig, field: FieldConfig, docs: Documents, packed: Packing, base: int = 0):
        self.packing, self.field = packing, field
        self.docs, self.packed, self.base = docs, packed, base

    def documents(self, first: int, last: int) -> np.ndarray:
        """The documents (their places in ``docs``) with a piece in sequences ``first ... last - 1``, each once."""
        return np.unique(self.packed.doc[self.packed.pieces(first - self.base, last - self.base)])

    def fill(
        self, first: int, last: int, rows: np.ndarray, got: tuple[np.ndarray, np.ndarray], out: dict[str, np.ndarray]
    ) -> None:
        """Fill ``out`` with sequences ``first ... last - 1`` (padding past them) from documents ``rows``.

        ``got``: their tokens back to back, and each one's count (:meth:`~.documents.Tokens.decode`).
        """
        tokens, starts = self._checked(rows, *got)
        p, lo, hi = self.packed, first - self.base, last - self.base
        where = _Where.of(p, lo, hi)
        doc = p.doc[p.pieces(lo, hi)]
        row = np.searchsorted(rows, doc)[where.piece]  # each token's document among the fetched
        real = where.position < self.docs.lengths[rows][row]  # the others: the eos after a document's last token
        value = np.full(where.position.size, self.packing.eos or 0, dtype=tokens.dtype)
        value[real] = tokens[starts[row[real]] + where.position[real]]
        out[self.field.name].fill(self.packing.pad)
        for name in (SEGMENT_IDS, POSITION_IDS):
            out[name].fill(0)
        for name in (SEGMENT_KEYS, SEGMENT_OFFSETS):
            out[name].fill(-1)
        out[self.field.name].reshape(-1)[where.slot] = value
        out[SEGMENT_IDS].reshape(-1)[where.slot] = (where.segment + 1)[where.piece]
        out[POSITION_IDS].reshape(-1)[where.slot] = where.position
        out[SEGMENT_KEYS][where.sequence, where.segment] = self.docs.keys[:, doc].T
        out[SEGMENT_OFFSETS][where.sequence, where.segment] = p.offset[p.pieces(lo, hi)]

    def _checked(self, rows: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The documents' tokens, and where each begins; their counts checked against the lengths packed."""
        keys = self.docs.keys[:, rows]
        expected = self.docs.lengths[rows]
        if not np.array_equal(counts, expected):  # one snapshot: only a query that is not a function of its key
            i = int(np.flatnonzero(counts != expected)[0])
            raise SampleError(
                f"sample ({self.docs.key_columns.show(keys[:, i])}): field {self.field.name} has {counts[i]} tokens, "
                f"where its length was {expected[i]} when the epoch was packed (the per-document query must return "
                "the same row each time it runs)"
            )
        return tokens, np.cumsum(counts) - counts


__all__ = ["POSITION_IDS", "SEGMENT_IDS", "SEGMENT_KEYS", "SEGMENT_OFFSETS", "Documents", "Placer"]
