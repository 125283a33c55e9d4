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
import hashlib
import json
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
from pgprefetch.write.order.shuffle import n_batches
from pgprefetch.write.pack.documents import (
    ColumnSpec,
    Documents,
    Tokens,
    TransformTokens,
    column_spec,
    transform_lengths,
)
from pgprefetch.write.pack.lengths import Counted, document_lengths
from pgprefetch.write.pack.packer import Packing, pack
from pgprefetch.write.pack.parts import cut
from pgprefetch.write.pack.place import POSITION_IDS, SEGMENT_IDS, SEGMENT_KEYS, SEGMENT_OFFSETS
from pgprefetch.write.pack.serving import SEQUENCE_KEY, served
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.query import plan_epoch
from pgprefetch.write.scan.shape import scan_relation
from pgprefetch.write.spill.folder import SpillFolder
from pgprefetch.write.transform.inputs import check_inputs, sample_key_columns, sample_keys
from pgprefetch.write.transform.stage import stage_for


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
    keys = _held_keys(plan)
    column = plan.by_field[field.name][0]
    lengths, skip = await document_lengths(one, snap.id, Counted(keys, plan.key_columns, column), field, width)
    spec = column_spec(one, plan.key_columns, column, field, width)
    async with spec.opened(cfg.source, snap.id) as tokens:
        docs = Documents(plan.key_columns, keys, lengths, skip=skip if field.truncate == "left" else None)
        yield await _source(cfg, snap, plan, docs, tokens, spec)


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
        keys = _held_keys(plan)
        lengths = await transform_lengths(stage, field.name, plan)
        tokens = TransformTokens(stage, field.name, np.dtype(field.dtype))
        source = await _source(cfg, snap, plan, Documents(plan.key_columns, keys, lengths), tokens, None)
        yield dataclasses.replace(source, records=(source.records or {}) | {"transforms": stage.summary})


def _held_keys(plan: EpochPlan) -> np.ndarray:
    """The documents' keys, held for the epoch (a unit looks up those of its pieces by their place), reserved."""
    memory.current().reserve("documents' keys", plan.used * plan.key_columns.width * 8)
    return np.ascontiguousarray(plan.batch_keys(0, 1, plan.used))


async def _source(
    cfg: Config, snap: Snapshot, plan: EpochPlan, docs: Documents, tokens: Tokens, spec: ColumnSpec | None
) -> BatchSource:
    """The documents packed, the sequences planned, and the batch source that serves them.

    ``spec``: how a cluster's part fetches a column's documents (None: a transform's, which no part serves).
    """
    packing = cfg.packing
    assert packing is not None
    pool = memory.current()
    pool.reserve("documents' lengths", plan.used * 8 * 2)  # theirs, and with eos as packed
    packed = await asyncio.to_thread(_packed, docs.lengths, packing, cfg.batches.seed, plan.epoch, pool)
    sequences = plan_of(cfg, plan.epoch, docs, packed, n_keys=plan.n_keys, repeats=plan.duplicates_dropped)
    records = {"packing": record_of(packing, docs, packed, sequences.used)}
    size, used, most = cfg.batches.size, sequences.used, max(1, packed.max_segments)
    parts = functools.partial(cut, size, docs, packed, used, spec, None) if spec is not None else None
    snapshot = (snap.id, snap.server_version)
    return served(cfg, sequences, docs, packed, tokens, snapshot, most, records, parts)


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


PACKING_BYTES = 200  # a document's share of the packer's peak: its lists of Python ints and a dozen arrays


def _packed(lengths: np.ndarray, cfg: PackingConfig, seed: int, epoch: int, pool: memory.MemoryPool) -> Packing:
    """The documents packed and the sequences shuffled, what they hold reserved (about 32 bytes a piece)."""
    with_eos = lengths + (cfg.eos is not None)
    held = pool.reserve("the packing")
    held.grow(with_eos.size * PACKING_BYTES)
    packed = pack(with_eos, cfg.length, cfg.method, cfg.group)
    held.resize(packed.nbytes * 2)
    shuffled = packed.shuffled(seed, epoch)
    held.resize(shuffled.nbytes)
    if not shuffled.n_sequences:
        raise SourceError("[packing]: the documents hold no tokens: no sequence to write")
    return shuffled


def plan_of(cfg: Config, epoch: int, docs: Documents, packed: Packing, n_keys: int, repeats: int = 0) -> EpochPlan:
    """The epoch's plan of sequences: the packing's, in its order, in batches of ``[batches] size`` sequences.

    ``n_keys`` and ``repeats``: what the documents' keys queries returned, and the repeated keys dropped.
    """
    packing = cfg.packing
    assert packing is not None
    size = cfg.batches.size
    batches = n_batches(packed.n_sequences, size, cfg.batches.drop_last)
    if not batches:
        raise SourceError(
            f"[packing]: {packed.n_sequences} sequences of {packing.length} tokens, fewer than one batch of {size}"
        )
    used = min(packed.n_sequences, batches * size)
    assert packed.numbers is not None, "the sequences were shuffled"
    return EpochPlan(
        epoch=epoch,
        keys=packed.numbers[None, :used].astype(np.int64),
        key_columns=SEQUENCE_KEY,
        n_keys=n_keys,
        duplicates_dropped=repeats,
        used=used,
        n_batches=batches,
        keys_sha256=_identity(docs, packed, packing),
        columns=(),
        by_field={},
        categories={},
        sql="",
        params=(),
    )


def _identity(docs: Documents, packed: Packing, cfg: PackingConfig) -> str:
    """The epoch's hash: its documents and every piece's place (a partial epoch resumes only under it)."""
    digest = hashlib.sha256(b"pgprefetch-packing")
    digest.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    for array in (docs.keys, packed.starts, packed.doc, packed.offset, packed.size):
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def record_of(cfg: PackingConfig, docs: Documents, packed: Packing, used: int) -> dict[str, Any]:
    """What the manifest records of the packing: its settings and figures (``ls`` and ``check`` show them)."""
    kept = slice(0, int(packed.starts[used]))
    tokens = int(packed.size[kept].sum())
    return {
        **dataclasses.asdict(cfg),
        "documents": int(docs.lengths.size),
        "empty_documents": int((docs.lengths + (cfg.eos is not None) == 0).sum()),
        "sequences": int(packed.n_sequences),
        "sequences_written": used,
        "tokens": tokens,
        "padding": used * cfg.length - tokens,
        "padding_share": round((used * cfg.length - tokens) / max(1, used * cfg.length), 8),
        "pieces": int(kept.stop),
        "documents_cut": packed.documents_cut,
        "max_segments": max(1, packed.max_segments),
        "segment_ids": SEGMENT_IDS,
        "position_ids": POSITION_IDS,
        "segment_keys": SEGMENT_KEYS,
        "segment_offsets": SEGMENT_OFFSETS,
    }


__all__ = ["documents_config", "packed_source", "plan_of", "record_of", "token_bytes"]
