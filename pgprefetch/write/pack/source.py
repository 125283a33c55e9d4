"""A packed epoch's batch source: sequences planned from the documents' lengths, each unit's documents fetched once.

Planning, on the epoch's snapshot: the documents are the config's samples, read and shuffled as any query-mode
epoch's keys (:func:`~pgprefetch.write.query.plan_epoch`, one document a "batch"); their lengths are counted
by the server (:mod:`.lengths`); :mod:`.packer` lays them into sequences and shuffles those. The epoch's
samples are the sequences, and its ``keys`` array holds each sequence's number in the packing before the
shuffle (each piece's document key is in ``segment_keys``).

Serving: a unit of batches of sequences holds pieces of some documents; ``fetch`` runs the per-document
statement once for those documents (a document cut across two sequences of one unit is fetched once), and
``produce`` decodes their tokens flat (:mod:`pgprefetch.decode.flat`) and places every piece with one
vectorised gather: tokens (``eos`` after a document's last token), ``segment_ids`` (1, 2, ... per piece, 0 on
padding), ``position_ids`` (the token's place in its document), ``segment_keys`` and ``segment_offsets`` (-1
past the last piece).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import Config, FieldConfig, PackingConfig, SamplesConfig, ScanConfig
from pgprefetch.decode.flat import flat_column
from pgprefetch.decode.layout import BatchLayout, FieldLayout
from pgprefetch.errors import SampleError, SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.pg.statement import Fetched
from pgprefetch.sqltext import quote_ident
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, unit_batches
from pgprefetch.write.order.shuffle import n_batches
from pgprefetch.write.pack.lengths import document_lengths
from pgprefetch.write.pack.packer import Packing, pack
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.query import layout_from, plan_epoch
from pgprefetch.write.scan.shape import scan_relation
from pgprefetch.write.spill.folder import SpillFolder

SEGMENT_IDS = "segment_ids"
POSITION_IDS = "position_ids"
SEGMENT_KEYS = "segment_keys"
SEGMENT_OFFSETS = "segment_offsets"
SEQUENCE_KEY = KeyColumns(("sequence",))  # a packed epoch's keys array: each sequence's number in the packing


@dataclass(frozen=True)
class Documents:
    """The epoch's documents: their plan (keys in the epoch's order, the statement), layout and token counts."""

    plan: EpochPlan
    layout: BatchLayout
    lengths: np.ndarray  # tokens each, as the field keeps them (no eos)
    keys: np.ndarray  # (key slots, documents), in memory


@asynccontextmanager
async def packed_source(
    cfg: Config, snap: Snapshot, epoch: int, vocabulary: Vocabulary | None, spill: SpillFolder
) -> AsyncIterator[BatchSource]:
    """The batch source of packed epoch ``epoch`` on ``snap`` (see the module's docstring)."""
    packing = cfg.packing
    assert packing is not None
    one = documents_config(cfg)
    plan = await plan_epoch(one, snap, epoch, vocabulary, spill.sub("keys"))
    pool = memory.current()
    # The documents' keys are held for the epoch: a unit looks up those of its pieces by their place.
    pool.reserve("documents' keys", plan.used * plan.key_columns.width * 8)
    keys = np.ascontiguousarray(plan.batch_keys(0, 1, plan.used))
    pool.reserve("documents' lengths", plan.used * 8 * 2)  # theirs, and with eos as packed
    lengths = await document_lengths(one, snap.id, plan, plan.by_field[packing.field][0])
    packed = await asyncio.to_thread(_packed, lengths, packing, cfg.batches.seed, epoch, pool)
    async with BatchReader.open(cfg.source, snap.id, plan.sql, plan.params, row_wise=plan.row_wise) as reader:
        layout = layout_from(one, plan, await reader.fetch(0, keys[:, :1]))
        documents = Documents(plan, layout, lengths, keys)
        yield _source(cfg, documents, packed, reader, snap)


def documents_config(cfg: Config) -> Config:
    """The documents as a query-mode config of one document a batch: what plans, counts and fetches them.

    A scan table's documents are looked up by their key (its index), a unit's at a time: the pieces of a
    unit come from all over the table, so reading the table whole would mean holding it, or spilling it,
    to gather from; a lookup reads each document a unit needs once, and nothing else.
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
    return dataclasses.replace(cfg, samples=samples, batches=batches)


def _packed(lengths: np.ndarray, cfg: PackingConfig, seed: int, epoch: int, pool: memory.MemoryPool) -> Packing:
    """The documents packed and the sequences shuffled, what they hold reserved (about 32 bytes a piece)."""
    with_eos = lengths + (cfg.eos is not None)
    held = pool.reserve("the packing")
    held.grow(with_eos.size * 40)  # the packer's arrays and sorts: pieces are about the documents
    packed = pack(with_eos, cfg.length, cfg.method, cfg.group)
    held.resize(packed.nbytes * 2)
    shuffled = packed.shuffled(seed, epoch)
    held.resize(shuffled.nbytes)
    if not shuffled.n_sequences:
        raise SourceError("[packing]: the documents hold no tokens: no sequence to write")
    return shuffled


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


def _source(cfg: Config, docs: Documents, packed: Packing, reader: BatchReader, snap: Snapshot) -> BatchSource:
    """The writer's view of the packed epoch: units of sequences, their documents fetched and placed."""
    packing = cfg.packing
    assert packing is not None
    size = cfg.batches.size
    used_batches = n_batches(packed.n_sequences, size, cfg.batches.drop_last)
    if not used_batches:
        raise SourceError(
            f"[packing]: {packed.n_sequences} sequences of {packing.length} tokens, fewer than one batch of {size}"
        )
    used = min(packed.n_sequences, used_batches * size)
    assert packed.numbers is not None, "the sequences were shuffled"
    numbers = packed.numbers[:used]
    plan = EpochPlan(
        epoch=docs.plan.epoch,
        keys=numbers[None].astype(np.int64),
        key_columns=SEQUENCE_KEY,
        n_keys=docs.plan.n_keys,
        duplicates_dropped=docs.plan.duplicates_dropped,
        used=used,
        n_batches=used_batches,
        keys_sha256=_identity(docs.plan, packed, packing),
        columns=(),
        by_field={},
        categories={},
        sql="",
        params=(),
    )
    layout = sequence_layout(cfg, docs.keys.shape[0], max(1, packed.max_segments))
    place = Placer(cfg, docs, packed, used)
    # (a unit's documents hold about its tokens again, as sent and decoded: the sequences' bytes or fewer)
    unit = min(unit_batches(size, layout.sample_bytes), used_batches)

    async def fetch(batch: int, count: int) -> object:
        rows = place.documents(batch * size, min((batch + count) * size, used))
        return rows, await reader.fetch(batch, docs.keys[:, rows], count)

    def produce(batch: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        rows, blobs = cast("tuple[np.ndarray, Fetched]", fetched)
        place.fill(batch * size, min((batch + count) * size, used), rows, blobs, buffers)

    records = {"packing": _record(packing, docs, packed, used)}
    return BatchSource(
        plan, layout, snap.id, snap.server_version, None, fetch, produce, reader.size, unit=unit, records=records
    )


class Placer:
    """Places a unit's pieces: from the flat tokens of its documents into its sequences' arrays."""

    def __init__(self, cfg: Config, docs: Documents, packed: Packing, used: int) -> None:
        assert cfg.packing is not None
        self.packing = cfg.packing
        self.field = cfg.field(cfg.packing.field)
        self.docs, self.packed, self.used = docs, packed, used

    def documents(self, first: int, last: int) -> np.ndarray:
        """The documents (their places in the epoch's order) with a piece in sequences ``first ... last - 1``."""
        return np.unique(self.packed.doc[self.packed.pieces(first, last)])

    def fill(self, first: int, last: int, rows: np.ndarray, blobs: Fetched, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with sequences ``first ... last - 1`` (and padding past them) from their documents' rows."""
        n = self.packing.length
        tokens, counts = flat_column(self.docs.layout, blobs, self.docs.keys[:, rows], np.dtype(self.field.dtype))
        expected = self.docs.lengths[rows]
        if not np.array_equal(counts, expected):  # the same snapshot: only a volatile query gives another count
            i = int(np.flatnonzero(counts != expected)[0])
            raise SampleError(
                f"sample ({self.docs.plan.key_columns.show(self.docs.keys[:, rows[i]])}): field {self.field.name} "
                f"has {counts[i]} tokens, where its length was {expected[i]} when the epoch was packed "
                "(a per-document query must return the same rows each time it runs)"
            )
        p = self.packed
        at = p.pieces(first, last)
        doc, offset, size = p.doc[at], p.offset[at], p.size[at]
        per = np.diff(p.starts[first : last + 1])
        sequence = np.repeat(np.arange(last - first), per)  # each piece's sequence in the unit
        segment = np.arange(doc.size) - np.repeat(p.starts[first:last] - p.starts[first], per)  # its place there
        begins = np.cumsum(size) - size
        within = begins - np.repeat(begins[p.starts[first:last] - p.starts[first]], per)  # its first token's place
        piece = np.repeat(np.arange(doc.size), size)  # each token's piece
        j = np.arange(int(size.sum()), dtype=np.int64) - np.repeat(begins, size)
        position = offset[piece] + j  # in its document
        row = np.searchsorted(rows, doc)[piece]  # its document's place among the unit's
        starts = np.cumsum(counts) - counts
        real = position < counts[row]  # the others are the eos after the last token
        value = np.full(position.size, self.packing.eos or 0, dtype=tokens.dtype)
        value[real] = tokens[starts[row[real]] + position[real]]
        slot = sequence[piece] * n + within[piece] + j
        _reset(out, self.field.name, self.packing.pad)
        out[self.field.name].reshape(-1)[slot] = value
        out[SEGMENT_IDS].reshape(-1)[slot] = (segment + 1)[piece]
        out[POSITION_IDS].reshape(-1)[slot] = position
        out[SEGMENT_KEYS][sequence, segment] = self.docs.keys[:, doc].T
        out[SEGMENT_OFFSETS][sequence, segment] = offset


def _reset(out: dict[str, np.ndarray], tokens: str, pad: int) -> None:
    """A unit's buffers as padding: ``pad`` tokens, segment 0, position 0, no key (-1), no offset (-1)."""
    out[tokens].fill(pad)
    out[SEGMENT_IDS].fill(0)
    out[POSITION_IDS].fill(0)
    out[SEGMENT_KEYS].fill(-1)
    out[SEGMENT_OFFSETS].fill(-1)


def _identity(plan: EpochPlan, packed: Packing, cfg: PackingConfig) -> str:
    """The epoch's hash: its documents' order and every piece's place (a partial epoch resumes only under it)."""
    digest = hashlib.sha256(b"pgprefetch-packing")
    digest.update(plan.keys_sha256.encode())
    digest.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    for array in (packed.starts, packed.doc, packed.offset, packed.size):
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def _record(cfg: PackingConfig, docs: Documents, packed: Packing, used: int) -> dict[str, Any]:
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


__all__ = ["POSITION_IDS", "SEGMENT_IDS", "SEGMENT_KEYS", "SEGMENT_OFFSETS", "packed_source", "sequence_layout"]
