"""A unit of a packed epoch placed: its documents' tokens, decoded flat, laid into its sequences' arrays.

A unit holds sequences ``first ... last - 1``, as a packing of their own whose pieces name documents by their
place among the unit's (:meth:`~.pieces.Pieces.unit`). :meth:`Placer.wanted` says which tokens a unit needs
(each piece's, without its eos);
:meth:`Placer.fill` takes them (:mod:`.documents`) and computes, for every token
of every piece at once, the slot it goes to and the place in its document it comes from: one gather and a
scatter per array, no loop over pieces or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import FieldConfig, PackingConfig
from pgprefetch.write.pack.documents import Documents, Wanted
from pgprefetch.write.pack.packer import Packing

SEGMENT_IDS = "segment_ids"
POSITION_IDS = "position_ids"
SEGMENT_KEYS = "segment_keys"
SEGMENT_OFFSETS = "segment_offsets"


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
    """Places a unit's sequences: a packing of their own and the documents it names (:meth:`.pieces.Pieces.unit`)."""

    def __init__(self, packing: PackingConfig, field: FieldConfig):
        self.packing, self.field = packing, field

    def wanted(self, p: Packing, docs: Documents) -> Wanted:
        """The tokens the unit's sequences need: each piece's own (not its eos); a piece with none, none."""
        count = np.clip(docs.lengths[p.doc] - p.offset, 0, p.size)  # past a document's last token: its eos
        asked = np.flatnonzero(count)
        return Wanted(docs.take(p.doc[asked]), p.offset[asked], count[asked])

    def fill(self, p: Packing, docs: Documents, tokens: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with the unit's sequences (padding past them).

        ``tokens``: what :meth:`wanted` asked for, back to back (:meth:`~.documents.Tokens.decode`).
        """
        doc, offset = p.doc, p.offset
        where = _Where.of(p, 0, p.n_sequences)
        count = np.clip(docs.lengths[doc] - offset, 0, p.size)  # each piece's tokens asked for
        begins = np.cumsum(count) - count  # where each piece's tokens begin among ``tokens``
        j = where.position - offset[where.piece]  # each token's place in its piece
        real = j < count[where.piece]  # the others: the eos after a document's last token
        value = np.full(where.position.size, self.packing.eos or 0, dtype=tokens.dtype)
        value[real] = tokens[begins[where.piece[real]] + j[real]]
        out[self.field.name].fill(self.packing.pad)
        for name in (SEGMENT_IDS, POSITION_IDS):
            out[name].fill(0)
        for name in (SEGMENT_KEYS, SEGMENT_OFFSETS):
            out[name].fill(-1)
        out[self.field.name].reshape(-1)[where.slot] = value
        out[SEGMENT_IDS].reshape(-1)[where.slot] = (where.segment + 1)[where.piece]
        out[POSITION_IDS].reshape(-1)[where.slot] = where.position
        out[SEGMENT_KEYS][where.sequence, where.segment] = docs.keys[:, doc].T
        out[SEGMENT_OFFSETS][where.sequence, where.segment] = offset


__all__ = ["POSITION_IDS", "SEGMENT_IDS", "SEGMENT_KEYS", "SEGMENT_OFFSETS", "Placer"]
