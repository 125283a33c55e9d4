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
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, PackingConfig, SamplesConfig, ScanConfig
from pgprefetch.errors import SourceError
from pgprefetch.pg.session import Snapshot
from pgprefetch.sqltext import quote_ident
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.shuffle import n_batches
from pgprefetch.write.pack.documents import (
    ColumnSpec,
    Documents,
    Tokens,
    TransformTokens,
    column_spec,
    transform_lengths,
)
from pgprefetch.write.pack.lengths import Counted, counter, document_lengths
from pgprefetch.write.pack.packer import Packing, pack
from pgprefetch.write.pack.parts import cut
from pgprefetch.write.pack.pieces import HeldPieces, Identity, Pieces, Summary
from pgprefetch.write.pack.place import POSITION_IDS, SEGMENT_IDS, SEGMENT_KEYS, SEGMENT_OFFSETS
from pgprefetch.write.pack.serving import SEQUENCE_KEY, served
from pgprefetch.write.pack.spilled import PACK_BYTES, Count, Counting, documents_share, spilled_pieces
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.query import plan_epoch
from pgprefetch.write.scan.shape import scan_relation
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


async def token_bytes(cfg: Config, snap: Snapshot) -> int:
    """The bytes of a token in the packed column: 0 for an array (each element a token), else the dtype's size.

    A ``bytea`` column holds its document's tokens little-endian, ``[fields] dtype`` each: a quarter of an
    ``int4[]``'s bytes on the wire (each element of an array is sent with a length word), and nothing for
    the server to unpack; the server reads such a table several times faster (``docs/packing.md``).
    """
    assert cfg.packing is not None
    field = cfg.field(cfg.packing.field)
    type_name, _ = (await snap.describe(documents_config(cfg, 0))).returned.get(field.columns[0], ("", ""))
    return np.dtype(field.dtype).itemsize if type_name == "bytea" else 0


def documents_config(cfg: Config, width: int) -> Config:
    """The documents as a query-mode config of one document a batch: what plans, counts and fetches them.

    A scan table's documents are looked up by their key (its index), a unit's at a time: the pieces of a
    unit come from all over the table, so reading the table whole would mean holding it, or spilling it,
    to gather from; a lookup reads each document a unit needs once, and nothing else. ``width``: a token's
    bytes in a ``bytea`` column (:func:`token_bytes`), which is then read as bytes, ``max_length`` tokens'
    worth (0: an array column, read as it is).
    """
    samples = cfg.samples
    if isinstance(samples, ScanConfig):
        relation = scan_relation(samples)
        names = [quote_ident(k) for k in samples.key]
        where = " AND ".join(f"{n} = ${i}" for i, n in enumerate(names, 1))
        samples = SamplesConfig(
            keys=f"SELECT {', '.join(names)} FROM {relation}",
            query=f"SELECT * FROM {relation} WHERE {where}",
            fraction=samples.fraction,
            duplicates=samples.duplicates,
        )
    batches = dataclasses.replace(cfg.batches, size=1, drop_last=False)
    fields = cfg.fields
    if width:
        assert cfg.packing is not None
        field = cfg.field(cfg.packing.field)
        assert field.max_length is not None, "a packed field has a max_length (config.packing)"
        fields = (dataclasses.replace(field, dtype="uint8", max_length=field.max_length * width),)
    return dataclasses.replace(cfg, samples=samples, batches=batches, fields=fields)


PACKING_BYTES = PACK_BYTES  # a document's share of the packer's peak: its lists of Python ints and a dozen arrays
HELD_BYTES = 16 + PACKING_BYTES  # beside its key: a document's lengths, and its share of the packer's peak


def _packed(lengths: np.ndarray, cfg: PackingConfig, seed: int, epoch: int, pool: memory.MemoryPool) -> Packing:
    """The documents packed and the sequences shuffled, what they hold reserved (about 32 bytes a piece)."""
    with_eos = lengths + (cfg.eos is not None)
    held = pool.reserve("the packing")
    held.grow(with_eos.size * PACKING_BYTES)
    packed = pack(with_eos, cfg.length, cfg.method, cfg.group)
    held.resize(packed.nbytes * 2)
    shuffled = packed.shuffled(seed, epoch)
    held.resize(shuffled.nbytes)
    return shuffled


def plan_of(cfg: Config, epoch: int, pieces: Pieces, identity: str, n_keys: int, repeats: int = 0) -> EpochPlan:
    """The epoch's plan of sequences: the packing's, in its order, in batches of ``[batches] size`` sequences.

    ``identity``: the epoch's hash (:class:`~.pieces.Identity`); ``n_keys`` and ``repeats``: what the
    documents' keys queries returned, and the repeated keys dropped.

    Raises:
        SourceError: the documents hold no tokens, or too few for one batch.
    """
    packing = cfg.packing
    assert packing is not None
    size, n = cfg.batches.size, pieces.n_sequences
    if not n:
        raise SourceError("[packing]: the documents hold no tokens: no sequence to write")
    batches = n_batches(n, size, cfg.batches.drop_last)
    if not batches:
        raise SourceError(f"[packing]: {n} sequences of {packing.length} tokens, fewer than one batch of {size}")
    used = min(n, batches * size)
    return EpochPlan(
        epoch=epoch,
        keys=pieces.numbers[None, :used].astype(np.int64),
        key_columns=SEQUENCE_KEY,
        n_keys=n_keys,
        duplicates_dropped=repeats,
        used=used,
        n_batches=batches,
        keys_sha256=identity,
        columns=(),
        by_field={},
        categories={},
        sql="",
        params=(),
    )


def record_of(cfg: PackingConfig, summary: Summary, used: int) -> dict[str, Any]:
    """What the manifest records of the packing: its settings and figures (``ls`` and ``check`` show them)."""
    room = used * cfg.length
    return {
        **dataclasses.asdict(cfg),
        "documents": summary.documents,
        "empty_documents": summary.empty_documents,
        "sequences": summary.sequences,
        "sequences_written": used,
        "tokens": summary.tokens,
        "padding": room - summary.tokens,
        "padding_share": round((room - summary.tokens) / max(1, room), 8),
        "pieces": summary.pieces,
        "documents_cut": summary.documents_cut,
        "max_segments": summary.max_segments,
        "segment_ids": SEGMENT_IDS,
        "position_ids": POSITION_IDS,
        "segment_keys": SEGMENT_KEYS,
        "segment_offsets": SEGMENT_OFFSETS,
    }


__all__ = ["documents_config", "packed_source", "plan_of", "record_of", "token_bytes"]
