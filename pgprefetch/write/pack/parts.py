"""A packed epoch spread over a cluster: what the driver sends a part, and how the part serves its batches.

The driver plans the epoch (every document's length, the packing, the shuffle); a part is a range of
batches of sequences. It is sent its sequences' pieces and the keys and lengths of the documents they name
(:meth:`~.pieces.Pieces.unit`, read from the spill folder where the packing is there), and the
per-document statement: it opens its own connections on the exported snapshot, fetches its units' documents
and places them with the single process's code, so its bytes are the single process's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.pack.documents import ColumnSpec, MixedSpec
from pgprefetch.write.pack.pieces import HeldPieces, Pieces
from pgprefetch.write.pack.serving import served
from pgprefetch.write.plan import EpochPlan


@dataclass(frozen=True)
class PackedPart:
    """What a part of a packed epoch is sent: its sequences' pieces and their documents."""

    pieces: HeldPieces  # its sequences (from its first), a document row for each piece
    spec: ColumnSpec | MixedSpec  # how the documents are fetched
    sources: np.ndarray | None = None  # a packed mix: each of its sequences' source

    @asynccontextmanager
    async def served(
        self, cfg: Config, plan: EpochPlan, snapshot: str, server_version: str
    ) -> AsyncIterator[BatchSource]:
        """The part's batches on the exported ``snapshot``, fetched on connections of its own."""
        async with self.spec.opened(cfg.source, snapshot) as tokens:
            yield served(
                cfg, plan, self.pieces, tokens, (snapshot, server_version), {},
                sources=self.sources, key_width=self.pieces.docs.keys.shape[0], base=self.pieces.base,
            )  # fmt: skip


@contextmanager
def cut(
    size: int,
    pieces: Pieces,
    used: int,
    spec: ColumnSpec | MixedSpec,
    sources: np.ndarray | None,
    batches: range,
) -> Iterator[PackedPart]:
    """The part of the epoch that writes ``batches`` (``used``: the epoch's sequences; ``sources``: a mix's).

    Its pieces are reserved while it is held (sent to the cluster's object store).
    """
    first, last = batches.start * size, min(batches.stop * size, used)
    own, docs = pieces.unit(first, last)
    mine = None if sources is None else sources[first:last]
    held = own.nbytes + docs.keys.nbytes + docs.lengths.nbytes * 3  # (and skips, sources: at most as large)
    with memory.current().reserve("a part's pieces", held):  # (read back from disk, where the epoch's are there)
        yield PackedPart(HeldPieces(docs, own, base=first, segments=pieces.max_segments), spec, mine)


__all__ = ["PackedPart", "cut"]
