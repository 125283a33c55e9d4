"""A packed epoch's batch source, for the whole epoch or a cluster's part of it: units of sequences placed.

Each unit's pieces are asked for once, in one round trip (:mod:`.documents`), and placed
(:class:`~.place.Placer`). The epoch's samples are sequences; their arrays are described to the writer and
the readers as fields (:func:`sequence_layout`): they come from no column, so they have no statistics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import SOURCE_ARRAY, Config, FieldConfig
from pgprefetch.decode.layout import BatchLayout, FieldLayout
from pgprefetch.keys import KeyColumns
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, SourcePart, unit_batches
from pgprefetch.write.pack.documents import Documents, Tokens, Wanted
from pgprefetch.write.pack.packer import Packing
from pgprefetch.write.pack.pieces import Pieces
from pgprefetch.write.pack.place import POSITION_IDS, SEGMENT_IDS, SEGMENT_KEYS, SEGMENT_OFFSETS, Placer
from pgprefetch.write.plan import EpochPlan

SEQUENCE_KEY = KeyColumns(("sequence",))  # a packed epoch's keys array: each sequence's number in the packing


def sequence_layout(cfg: Config, width: int, max_segments: int) -> BatchLayout:
    """The arrays of a sequence, as fields the readers read: tokens, segment ids and positions, keys, offsets."""
    packing = cfg.packing
    assert packing is not None
    field = cfg.field(packing.field)
    n = packing.length

    def array(name: str, dtype: str, shape: tuple[int, ...]) -> FieldLayout:
        config = FieldConfig(name=name, columns=(), dtype=dtype, shape=shape)
        return FieldLayout(config, np.dtype(dtype), (), shape, int(np.prod(shape)))

    fields = (
        array(field.name, field.dtype, (n,)),
        array(SEGMENT_IDS, "int32", (n,)),
        array(POSITION_IDS, "int32", (n,)),
        array(SEGMENT_KEYS, "int64", (max_segments, width)),
        array(SEGMENT_OFFSETS, "int32", (max_segments,)),
    )
    return BatchLayout((), fields, 1, SEQUENCE_KEY)


def served(
    cfg: Config,
    plan: EpochPlan,
    pieces: Pieces,
    tokens: Tokens,
    snapshot: tuple[str, str],
    records: dict[str, Any],
    cut: Callable[[range], AbstractContextManager[SourcePart]] | None = None,
    sources: np.ndarray | None = None,
    key_width: int = 1,
    base: int = 0,
) -> BatchSource:
    """The writer's view of a packed epoch (or of a cluster's part: ``pieces`` holds its sequences alone).

    Each unit takes its sequences' pieces (:meth:`~.pieces.Pieces.unit`, on a thread: they may be read from
    the spill folder), asks ``tokens`` for them once and places them (:class:`~.place.Placer`). ``sources``: a
    packed mix's source of each sequence from ``base`` on (a part's first), for the ``source`` array; ``key_width``: the
    documents' key slots (the width of ``segment_keys``).
    """
    packing = cfg.packing
    assert packing is not None
    size, used = cfg.batches.size, plan.used
    place = Placer(packing, cfg.field(packing.field))
    layout = sequence_layout(cfg, key_width, pieces.max_segments)
    # (a unit's pieces' tokens are its sequences' tokens, at most: fetched as they are, then decoded flat)
    unit = min(unit_batches(size, layout.sample_bytes), plan.n_batches)

    async def fetch(batch: int, count: int) -> object:
        first, last = batch * size, min((batch + count) * size, used)
        own, docs = await asyncio.to_thread(pieces.unit, first, last)
        wanted = place.wanted(own, docs)
        return own, docs, wanted, await tokens.fetch(batch, wanted, count)

    def produce(batch: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        own, docs, wanted, got = cast("tuple[Packing, Documents, Wanted, object]", fetched)
        first, last = batch * size, min((batch + count) * size, used)
        # the unit's tokens, decoded, and the placement's index arrays (about 8 int64 a token)
        with memory.current().reserve("placing a unit", (last - first) * packing.length * 72):
            place.fill(own, docs, tokens.decode(got, wanted), buffers)
        if sources is not None:
            buffers[SOURCE_ARRAY][: last - first] = sources[first - base : last - base]

    extra = ((SOURCE_ARRAY, np.dtype(np.int8), ()),) if sources is not None else ()
    return BatchSource(
        plan, layout, *snapshot, None, fetch, produce, tokens.size, unit=unit, records=records, cut=cut,
        extra_arrays=extra,
    )  # fmt: skip


__all__ = ["SEQUENCE_KEY", "sequence_layout", "served"]
