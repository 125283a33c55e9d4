"""A packed epoch's plan: its documents as a query-mode config, and its sequences as the epoch's samples.

Shared by a lone source's epoch (:mod:`.source`) and a packed mix's (:mod:`.mixed`): the documents' config
that plans, counts and fetches them (:func:`documents_config`, :func:`token_bytes`), the epoch's plan of
sequences (:func:`plan_of`) and what the manifest records of the packing (:func:`record_of`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, PackingConfig, SamplesConfig, ScanConfig
from pgprefetch.errors import SourceError
from pgprefetch.pg.session import Snapshot
from pgprefetch.sqltext import quote_ident
from pgprefetch.write.order.shuffle import n_batches
from pgprefetch.write.pack.pieces import Pieces, Summary
from pgprefetch.write.pack.place import POSITION_IDS, SEGMENT_IDS, SEGMENT_KEYS, SEGMENT_OFFSETS
from pgprefetch.write.pack.serving import SEQUENCE_KEY
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.shape import scan_relation


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


__all__ = ["documents_config", "plan_of", "record_of", "token_bytes"]
