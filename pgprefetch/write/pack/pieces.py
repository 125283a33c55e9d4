"""A packed epoch's pieces as its units take them: a range of sequences at a time, wherever the packing lives.

The writer's units, and a cluster's parts, ask for sequences ``first ... last - 1`` of the epoch's order and
get a small packing of their own (:meth:`Pieces.unit`): those sequences' pieces, each naming its document by
its place in the :class:`~.documents.Documents` given with them. So the placing code is one, whether the
epoch's packing is held in memory (:class:`HeldPieces`) or was written to the spill folder because the
documents outgrew ``--memory`` (:class:`~.spilled.SpilledPieces`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pgprefetch.config.model import PackingConfig
from pgprefetch.write.pack.documents import Documents
from pgprefetch.write.pack.packer import Packing


@dataclass(frozen=True)
class Summary:
    """What the manifest records of a packing (``ls`` and ``check`` show it), for the sequences an epoch writes."""

    documents: int
    empty_documents: int  # no tokens and no eos: no piece
    sequences: int
    tokens: int  # in the sequences written
    pieces: int  # in the sequences written
    documents_cut: int  # documents that span more than one piece
    max_segments: int  # the most pieces one sequence holds


class Pieces(Protocol):
    """An epoch's sequences, in the epoch's (shuffled) order, and the pieces of documents they hold."""

    @property
    def n_sequences(self) -> int:
        """The sequences: the epoch's samples."""

    @property
    def max_segments(self) -> int:
        """The most pieces a sequence holds (the width of ``segment_keys``), at least 1."""

    @property
    def numbers(self) -> np.ndarray:
        """Each sequence's number in the packing before the shuffle (the epoch's ``keys`` array)."""

    def unit(self, first: int, last: int) -> tuple[Packing, Documents]:
        """Sequences ``first ... last - 1``: their pieces (from 0) and the documents those name, by place."""

    def summary(self, used: int) -> Summary:
        """The figures of the packing, tokens and pieces counted over its first ``used`` sequences."""


@dataclass(frozen=True)
class HeldPieces:
    """The packing held in memory, shuffled, and its documents (or a part's: ``base`` is its first sequence)."""

    docs: Documents
    packed: Packing
    eos: bool = False  # each document's length in ``packed`` counts an eos after it
    base: int = 0
    segments: int = 0  # a part's: the epoch's most pieces a sequence (its own sequences may hold fewer)

    @property
    def n_sequences(self) -> int:
        """The sequences held."""
        return self.packed.n_sequences

    @property
    def max_segments(self) -> int:
        """The most pieces a sequence holds, at least 1."""
        return max(1, self.segments or self.packed.max_segments)

    @property
    def numbers(self) -> np.ndarray:
        """Each sequence's number before the shuffle."""
        assert self.packed.numbers is not None, "the sequences were shuffled"
        return self.packed.numbers

    def unit(self, first: int, last: int) -> tuple[Packing, Documents]:
        """Sequences ``first ... last - 1`` of the epoch: a document row a piece, as :mod:`.spilled` reads them."""
        p, lo, hi = self.packed, first - self.base, last - self.base
        at = p.pieces(lo, hi)
        starts = p.starts[lo : hi + 1] - p.starts[lo]
        own = Packing(p.length, starts, np.arange(at.stop - at.start, dtype=np.int64), p.offset[at], p.size[at])
        return own, self.docs.take(p.doc[at])

    def summary(self, used: int) -> Summary:
        """The figures over the first ``used`` sequences."""
        kept = slice(0, int(self.packed.starts[used]))
        return Summary(
            documents=int(self.docs.lengths.size),
            empty_documents=int((self.docs.lengths + self.eos == 0).sum()),
            sequences=self.packed.n_sequences,
            tokens=int(self.packed.size[kept].sum()),
            pieces=kept.stop,
            documents_cut=self.packed.documents_cut,
            max_segments=self.max_segments,
        )


class Identity:
    """A packed epoch's hash, which a partial epoch resumes only under: its packing and its documents.

    The packing is a function of the documents' lengths, in the epoch's order, and of ``[packing]``; the
    documents are their keys' hash (the plan's). So the hash is the same whether the packing was held in
    memory or written to disk: a dump resumed under another ``--memory`` keeps its batches. The lengths may
    come a window at a time: the lengths and where each document's kept tokens begin are hashed apart.
    """

    def __init__(self, cfg: PackingConfig, keys_sha256: str) -> None:
        self._head = hashlib.sha256(b"pgprefetch-packing")
        self._head.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
        self._head.update(keys_sha256.encode())
        self._lengths, self._skips = hashlib.sha256(), hashlib.sha256()

    def update(self, lengths: np.ndarray, skip: np.ndarray | None) -> None:
        """The next documents' token counts and, under ``truncate = "left"``, where their kept tokens begin."""
        self._lengths.update(np.ascontiguousarray(lengths, dtype=np.int64).data)
        if skip is not None:
            self._skips.update(np.ascontiguousarray(skip, dtype=np.int64).data)

    def hexdigest(self) -> str:
        """The hash of everything given."""
        digest = self._head.copy()
        digest.update(self._lengths.digest())
        digest.update(self._skips.digest())
        return digest.hexdigest()


__all__ = ["HeldPieces", "Identity", "Pieces", "Summary"]
