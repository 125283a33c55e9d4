"""A packed epoch spread over a cluster: what the driver sends a part, and how the part serves its batches.

The driver plans the epoch (every document's length, the packing, the shuffle); a part is a range of
batches of sequences. It is sent its sequences' pieces, the keys and lengths of the documents they name (each
once), and the per-document statement: it opens its own connections on the exported snapshot, fetches its
units' documents and places them with the single process's code, so its bytes are the single process's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.pack.documents import ColumnSpec, Documents, MixedSpec
from pgprefetch.write.pack.packer import Packing
from pgprefetch.write.pack.serving import served
from pgprefetch.write.plan import EpochPlan


@dataclass(frozen=True)
class PackedPart:
    """What a part of a packed epoch is sent: its sequences' pieces and their documents."""

    first: int  # the part's first sequence
    packed: Packing  # its sequences' pieces, each naming its document by its place in ``docs``
    docs: Documents
    max_segments: int  # the epoch's
    spec: ColumnSpec | MixedSpec  # how the documents are fetched
    sources: np.ndarray | None = None  # a packed mix: each of its sequences' source

    @asynccontextmanager
    async def served(
        self, cfg: Config, plan: EpochPlan, snapshot: str, server_version: str
    ) -> AsyncIterator[BatchSource]:
        """The part's batches on the exported ``snapshot``, fetched on connections of its own."""
        async with self.spec.opened(cfg.source, snapshot) as tokens:
            yield served(
                cfg, plan, self.docs, self.packed, tokens, (snapshot, server_version), self.max_segments, {},
                base=self.first, sources=self.sources,
            )  # fmt: skip


@contextmanager
def cut(
    size: int,
    docs: Documents,
    packed: Packing,
    used: int,
    spec: ColumnSpec | MixedSpec,
    sources: np.ndarray | None,
    batches: range,
) -> Iterator[PackedPart]:
    """The part of the epoch that writes ``batches`` (``used``: the epoch's sequences; ``sources``: a mix's)."""
    first, last = batches.start * size, min(batches.stop * size, used)
    at = packed.pieces(first, last)
    rows, doc = np.unique(packed.doc[at], return_inverse=True)
    starts = packed.starts[first : last + 1] - packed.starts[first]
    own = Packing(packed.length, starts, doc.astype(np.int64), packed.offset[at], packed.size[at])
    mine = None if sources is None else sources[first:last]
    yield PackedPart(first, own, docs.take(rows), max(1, packed.max_segments), spec, mine)


__all__ = ["PackedPart", "cut"]
