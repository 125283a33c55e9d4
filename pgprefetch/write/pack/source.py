"""A packed epoch's batch source: sequences planned from the documents' lengths, each unit's documents fetched once.

Planning, on the epoch's snapshot: the documents are the config's samples, read and shuffled as any query-mode
epoch's keys (:func:`~pgprefetch.write.query.plan_epoch`, one document a "batch"); their lengths are counted
by the server (:mod:`.lengths`); :mod:`.packer` lays them into sequences and shuffles those. The epoch's
samples are the sequences, and its ``keys`` array holds each sequence's number in the packing before the
shuffle (each piece's document key is in ``segment_keys``).

Serving (:mod:`.serving`, :mod:`.place`): a unit of batches of sequences holds pieces of some documents,
fetched once each in one statement and placed: tokens (``eos`` after a document's last token),
``segment_ids`` (1, 2, ... per piece, 0 on padding), ``position_ids`` (the token's place in its document),
``segment_keys`` and ``segment_offsets`` (-1 past the last piece). A cluster's part is cut by :mod:`.parts`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config, PackingConfig
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.pack.documents import (
    ColumnSpec,
    Documents,
    Tokens,
    TransformTokens,
    column_spec,
    transform_lengths,
)
from pgprefetch.write.pack.lengths import Counted, counter, document_lengths
from pgprefetch.write.pack.packer import PACK_BYTES, Packing, pack
from pgprefetch.write.pack.parts import cut
from pgprefetch.write.pack.pieces import HeldPieces, Identity, Pieces
from pgprefetch.write.pack.plan import documents_config, plan_of, record_of, token_bytes
from pgprefetch.write.pack.serving import served
from pgprefetch.write.pack.spilled import Count, Counting, documents_share, spilled_pieces
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.query import plan_epoch
from pgprefetch.write.spill.folder import SpillFolder
from pgprefetch.write.transform.inputs import check_inputs, sample_key_columns, sample_keys
from pgprefetch.write.transform.stage import stage_for

log = logging.getLogger("pgprefetch")


@asynccontextmanager
async def packed_source(
    cfg: Config,
    snap: Snapshot,
    epoch: int,
    vocabulary: Vocabulary | None,
    spill: SpillFolder,
    transforms_cache: Path | None = None,
) -> AsyncIterator[BatchSource]:
    """The batch source of packed epoch ``epoch`` on ``snap`` (see the module's docstring).

    ``transforms_cache``: where a tokenizing transform's outputs are cached (:mod:`pgprefetch.write.transform`).
    """
    packing = cfg.packing
    assert packing is not None
    field = cfg.field(packing.field)
    if field.transform is not None:
        async with _tokenized(cfg, snap, epoch, vocabulary, spill, transforms_cache) as source:
            yield source
        return
    width = await token_bytes(cfg, snap)
    one = documents_config(cfg, width)
    plan = await plan_epoch(one, snap, epoch, vocabulary, spill.sub("keys"))
    column = plan.by_field[field.name][0]

    spec = column_spec(one, plan.key_columns, column, field, width)

    @asynccontextmanager
    async def counting() -> AsyncIterator[Count]:
        async with counter(one, snap.id, plan.key_columns, column) as reader:

            async def count(keys: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
                return await document_lengths(reader, Counted(keys, plan.key_columns, column), field, width)

            yield count

    async with _pieces(cfg, plan, counting, spill) as (pieces, identity), spec.opened(cfg.source, snap.id) as tokens:
        yield _source(cfg, snap, plan, pieces, identity, tokens, spec)


@asynccontextmanager
async def _tokenized(
    cfg: Config,
    snap: Snapshot,
    epoch: int,
    vocabulary: Vocabulary | None,
    spill: SpillFolder,
    transforms_cache: Path | None,
) -> AsyncIterator[BatchSource]:
    """A packed epoch whose tokens a transform makes: every document's computed (or found) before the plan.

    A document an ``on_error = "skip"`` transform fails on is left out of the plan, as a split's are.
    """
    assert cfg.packing is not None
    field = cfg.field(cfg.packing.field)
    one = documents_config(cfg, 0)
    key_columns = await sample_key_columns(one, snap)
    await check_inputs(one, snap)
    async with stage_for(one, snap.id, key_columns, epoch, transforms_cache) as stage:
        if stage.skips:
            one = dataclasses.replace(one, left_out=await stage.sweep(sample_keys(one, snap, key_columns)))
        plan = await plan_epoch(one, snap, epoch, vocabulary, spill.sub("keys"))

        @asynccontextmanager
        async def counting() -> AsyncIterator[Count]:
            async def count(keys: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
                lengths = await transform_lengths(stage, field.name, keys, first)
                return lengths, np.zeros_like(lengths)

            yield count

        tokens = TransformTokens(stage, field.name, np.dtype(field.dtype))
        async with _pieces(cfg, plan, counting, spill) as (pieces, identity):
            source = _source(cfg, snap, plan, pieces, identity, tokens, None)
            yield dataclasses.replace(source, records=(source.records or {}) | {"transforms": stage.summary})


@asynccontextmanager
async def _pieces(
    cfg: Config, plan: EpochPlan, counting: Counting, spill: SpillFolder
) -> AsyncIterator[tuple[Pieces, Identity]]:
    """The documents of ``plan`` counted, packed and shuffled, and the epoch's hash.

    Held in memory while they fit their share of ``--memory`` (:func:`~.spilled.documents_share`), else on
    disk (:mod:`.spilled`). ``counting()``: opens what counts the documents (:data:`~.spilled.Counting`).
    """
    packing = cfg.packing
    assert packing is not None
    left = cfg.field(packing.field).truncate == "left"
    identity = Identity(packing, plan.keys_sha256)
    held = plan.used * (plan.key_columns.width * 8 + HELD_BYTES)
    if isinstance(plan.keys, OrderedKeys) or held > documents_share(cfg):
        too = ", their keys ordered there too" if isinstance(plan.keys, OrderedKeys) else ""
        log.info(
            "[packing] %s documents beyond their share of --memory: lengths and pieces on disk%s", f"{plan.used:,}", too
        )
        async with spilled_pieces(cfg, plan, counting, spill.sub("documents"), identity, left=left) as pieces:
            yield pieces, identity
        return
    pool = memory.current()
    with pool.reserve("documents", plan.used * (plan.key_columns.width * 8 + 16)):
        keys = np.ascontiguousarray(plan.batch_keys(0, 1, plan.used))
        async with counting() as count:
            lengths, skip = await count(keys, 0)
        identity.update(lengths, skip if left else None)
        docs = Documents(plan.key_columns, keys, lengths, skip=skip if left else None)
        packed = await asyncio.to_thread(_packed, lengths, packing, cfg.batches.seed, plan.epoch, pool)
        yield HeldPieces(docs, packed, eos=packing.eos is not None), identity


def _source(
    cfg: Config,
    snap: Snapshot,
    plan: EpochPlan,
    pieces: Pieces,
    identity: Identity,
    tokens: Tokens,
    spec: ColumnSpec | None,
) -> BatchSource:
    """The batch source that serves the sequences of ``pieces``.

    ``spec``: how a cluster's part fetches a column's documents (None: a transform's, which no part serves).
    """
    packing = cfg.packing
    assert packing is not None
    sequences = plan_of(
        cfg, plan.epoch, pieces, identity.hexdigest(), n_keys=plan.n_keys, repeats=plan.duplicates_dropped
    )
    records = {"packing": record_of(packing, pieces.summary(sequences.used), sequences.used)}
    parts = functools.partial(cut, cfg.batches.size, pieces, sequences.used, spec, None) if spec is not None else None
    snapshot = (snap.id, snap.server_version)
    return served(cfg, sequences, pieces, tokens, snapshot, records, parts, key_width=plan.key_columns.width)


HELD_BYTES = 16 + PACK_BYTES  # beside its key: a document's lengths, and its share of the packer's peak


def _packed(lengths: np.ndarray, cfg: PackingConfig, seed: int, epoch: int, pool: memory.MemoryPool) -> Packing:
    """The documents packed and the sequences shuffled, what they hold reserved (about 32 bytes a piece)."""
    with_eos = lengths + (cfg.eos is not None)
    held = pool.reserve("the packing")
    held.grow(with_eos.size * PACK_BYTES)
    packed = pack(with_eos, cfg.length, cfg.method, cfg.group)
    held.resize(packed.nbytes * 2)
    shuffled = packed.shuffled(seed, epoch)
    held.resize(shuffled.nbytes)
    return shuffled


__all__ = ["packed_source"]
