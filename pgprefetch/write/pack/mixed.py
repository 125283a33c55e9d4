"""A packed mix: sources weighted by their tokens, each packed into sequences of its own, interleaved fairly.

Each ``[samples.NAME]`` source's documents are read on the epoch's snapshot (a scan table's by key, as a lone
packed table's), their lengths counted, and their passes walked in tokens (:mod:`.shares`): the source gives
the epoch the documents, in its pass order from where it stands, that make its share of the epoch's tokens.

A source's documents are packed into sequences of their own (best-fit or concat, as configured), and its
sequences shuffled by a hash of (seed, epoch, source). The sources' sequences are then interleaved as a fair
queue: each sequence is stamped with its source's tokens up to and including it over the source's share, and
the epoch takes them in stamp order (ties in source order). So every prefix of the epoch's sequences holds each
source's share of its tokens within one sequence's tokens (``length``), whatever the weights: the way
Megatron's blended datasets interleave samples, in tokens. Each sequence's source is in the ``source`` array.

The manifest records the mix as a mixed epoch's (:mod:`pgprefetch.write.mix`): each source's weight, share,
tokens, documents and sequences, and where it starts and ends, which the next epoch continues.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import MIX_VERSION, SOURCE_ARRAY, Config, PackingConfig
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.mix.passes import Chosen, Position
from pgprefetch.write.mix.positions import find_record, needed
from pgprefetch.write.mix.reading import SourceRead, prefixed, read_query_source, source_config, widest
from pgprefetch.write.pack.documents import ColumnSpec, ColumnTokens, Documents, MixedSpec, MixedTokens, column_spec
from pgprefetch.write.pack.lengths import Counted, counter, document_lengths
from pgprefetch.write.pack.packer import PACK_BYTES, PACK_STREAM, Packing, pack
from pgprefetch.write.pack.parts import cut
from pgprefetch.write.pack.pieces import HeldPieces, Identity
from pgprefetch.write.pack.plan import documents_config, plan_of, record_of, token_bytes
from pgprefetch.write.pack.serving import served
from pgprefetch.write.pack.shares import TokenSource, epoch_tokens, quotas, shares_at, token_starts, walk
from pgprefetch.write.plan import Vocabulary
from pgprefetch.write.query import query_statement


@dataclass
class _Source:
    """One source of the mix: its documents read, counted and ready to fetch."""

    read: SourceRead
    tokens: TokenSource
    spec: ColumnSpec
    columns: ColumnTokens  # its reader, open
    skip: np.ndarray  # by handle: where each document's kept tokens begin (``truncate = "left"``)

    @property
    def chosen(self) -> Chosen:
        """Its documents' keys, as its passes walk them."""
        assert isinstance(self.read.chosen, Chosen), "a packed source's keys are held in memory"
        return self.read.chosen


@dataclass(frozen=True)
class _Taken:
    """What a source gives an epoch: its documents (handles, in pass order), where it ends, their sequences."""

    asked: int  # its share of the epoch's tokens
    handles: np.ndarray
    end: Position
    packed: Packing  # its own sequences, shuffled
    written: int = 0  # of them, those the epoch writes (all, unless ``drop_last`` cut the last batch)


@asynccontextmanager
async def mixed_packed_source(
    cfg: Config, snap: Snapshot, epoch: int, vocabulary: Vocabulary | None
) -> AsyncIterator[BatchSource]:
    """The batch source of packed mix epoch ``epoch`` on ``snap`` (see the module's docstring)."""
    assert cfg.mix is not None
    assert cfg.packing is not None
    store = vocabulary.store if vocabulary is not None else None
    where = f"{store.location}/epoch {epoch}" if store is not None else f"epoch {epoch}"
    record = find_record(cfg, store, epoch)
    names = needed(cfg, epoch, record)
    drawn = [(code, s.name) for code, s in enumerate(cfg.mix.sources) if s.name in names]
    async with contextlib.AsyncExitStack() as stack:
        sources = {code: await _read(cfg, snap, code, name, len(drawn), stack) for code, name in drawn}
        counted = [s.tokens for s in sources.values()]
        begun = token_starts(cfg, epoch, counted, record, where)
        given = quotas(cfg, epoch, counted)
        taken = {
            code: _take(cfg, epoch, s, begun.positions[s.read.name], given[s.read.name]) for code, s in sources.items()
        }
        docs, packed, sources_of = _interleaved(cfg, epoch, sources, taken)
        pieces = HeldPieces(docs, packed, eos=cfg.packing.eos is not None)
        repeats = sum(s.chosen.repeats for s in sources.values())
        n_keys = sum(s.chosen.n_keys for s in sources.values())
        plan = plan_of(cfg, epoch, pieces, _identity(cfg.packing, docs), n_keys, repeats)
        written = np.bincount(sources_of[: plan.used], minlength=max(sources) + 1)
        taken = {code: dataclasses.replace(t, written=int(written[code])) for code, t in taken.items()}
        mix = _record(cfg, epoch, sources, begun, taken, record)
        records = {"sources": [s.name for s in cfg.mix.sources], "source_array": SOURCE_ARRAY, "mix": mix}
        records["packing"] = record_of(cfg.packing, pieces.summary(plan.used), plan.used)
        own = {code: s.read.key_columns for code, s in sources.items()}
        tokens = MixedTokens({code: s.columns for code, s in sources.items()}, own)
        snapshot = (snap.id, snap.server_version)
        spec = MixedSpec({code: s.spec for code, s in sources.items()}, own)  # what a cluster's part opens
        parts = functools.partial(cut, cfg.batches.size, pieces, plan.used, spec, sources_of)
        width = docs.keys.shape[0]
        yield served(cfg, plan, pieces, tokens, snapshot, records, parts, sources=sources_of, key_width=width)


def _identity(cfg: PackingConfig, docs: Documents) -> str:
    """The mixed epoch's hash: every source's documents it draws (keys, sources, lengths) and ``[packing]``."""
    digest = hashlib.sha256()
    for array in (docs.keys, docs.sources):
        digest.update(np.ascontiguousarray(array).data)
    identity = Identity(cfg, digest.hexdigest())
    identity.update(docs.lengths, docs.skip)
    return identity.hexdigest()


async def _read(cfg: Config, snap: Snapshot, code: int, name: str, n: int, stack: contextlib.AsyncExitStack) -> _Source:
    """Source ``name``: its keys and passes, each document's tokens counted, its reader open."""
    assert cfg.packing is not None
    own = source_config(cfg, name, cfg.source.memory_bytes // max(1, n), n)
    async with prefixed(name):
        width = await token_bytes(own, snap)
        docs_cfg = documents_config(own, width)
        read = await read_query_source(docs_cfg, name, code, snap)
        assert read.shape is not None, "a packed source is read as a query source"
        assert isinstance(read.chosen, Chosen)
        field = own.field(cfg.packing.field)
        column = (await query_statement(docs_cfg, snap, read.shape, None, {}))["by_field"][field.name][0]
        keys = read.chosen.keys
        memory.current().reserve(f"documents of {name}", keys.nbytes + keys.shape[1] * 24)  # keys, lengths, skips
        async with counter(docs_cfg, snap.id, read.key_columns, column) as reader:
            lengths, skip = await document_lengths(reader, Counted(keys, read.key_columns, column), field, width)
        spec = column_spec(docs_cfg, read.key_columns, column, field, width)
        columns = await stack.enter_async_context(spec.opened(docs_cfg.source, snap.id))
    with_eos = lengths + (cfg.packing.eos is not None)
    return _Source(read, TokenSource(name, read.passes, with_eos), spec, columns, skip)


def _take(cfg: Config, epoch: int, s: _Source, at: Position, asked: int) -> _Taken:
    """Source ``s``'s documents from ``at`` that make its ``asked`` tokens, in sequences of their own, shuffled."""
    assert cfg.packing is not None
    p = cfg.packing
    handles, end = walk(s.tokens, at, asked)
    with memory.current().reserve(f"packing {s.read.name}", handles.size * PACK_BYTES):
        packed = pack(s.tokens.lengths[handles], p.length, p.method, p.group)
        stream = PACK_STREAM ^ zlib.crc32(s.read.name.encode())  # (each source's sequences in an order of its own)
        return _Taken(asked, handles, end, packed.shuffled(cfg.batches.seed, epoch, stream))


def _interleaved(
    cfg: Config, epoch: int, sources: dict[int, _Source], taken: dict[int, _Taken]
) -> tuple[Documents, Packing, np.ndarray]:
    """Every source's sequences in one epoch, as a fair queue by tokens; each sequence's source.

    The documents of every source side by side (a narrower key zero-padded), each source's pieces naming
    them by their place there.
    """
    shares = shares_at(cfg, epoch)
    width = widest([s.read for s in sources.values()]).width  # (a narrower key is zero-padded)
    keys, lengths, codes, skips, stamps, parts = [], [], [], [], [], []
    offset = 0
    for code, s in sources.items():
        p, own = taken[code].packed, s.chosen.keys[:, taken[code].handles]
        keys.append(np.vstack([own, np.zeros((width - own.shape[0], own.shape[1]), dtype=np.int64)]))
        lengths.append(
            s.tokens.lengths[taken[code].handles] - (cfg.packing is not None and cfg.packing.eos is not None)
        )
        codes.append(np.full(own.shape[1], code, dtype=np.int8))
        skips.append(s.skip[taken[code].handles])
        filled = np.add.reduceat(p.size, p.starts[:-1]) if p.n_sequences else np.zeros(0, dtype=np.int64)
        stamps.append(np.cumsum(filled) / float(shares[s.read.name]))
        parts.append(dataclasses.replace(p, doc=p.doc + offset))
        offset += own.shape[1]
    order = np.lexsort((np.concatenate([np.full(len(t), c) for c, t in zip(sources, stamps, strict=True)]),
                        np.concatenate(stamps)))  # fmt: skip
    joined = _joined(cfg, parts)
    key_columns = widest([s.read for s in sources.values()])
    docs = Documents(
        key_columns, np.hstack(keys), np.concatenate(lengths), np.concatenate(codes), np.concatenate(skips)
    )
    by_sequence = np.concatenate([np.full(p.n_sequences, c, np.int8) for c, p in zip(sources, parts, strict=True)])
    return docs, joined.reordered(order), by_sequence[order]


def _joined(cfg: Config, parts: list[Packing]) -> Packing:
    """The sources' packings one after the other (their documents already offset)."""
    assert cfg.packing is not None
    starts = [np.zeros(1, dtype=np.int64)]
    at = 0
    for p in parts:
        starts.append(p.starts[1:] + at)
        at += int(p.starts[-1])
    before = np.cumsum([0] + [p.n_sequences for p in parts])  # each source's first number
    numbers = np.concatenate(
        [(p.numbers if p.numbers is not None else 0) + b for p, b in zip(parts, before, strict=False)]
    )
    return Packing(
        cfg.packing.length,
        np.concatenate(starts),
        np.concatenate([p.doc for p in parts]),
        np.concatenate([p.offset for p in parts]),
        np.concatenate([p.size for p in parts]),
        numbers,
    )


def _record(
    cfg: Config,
    epoch: int,
    sources: dict[int, _Source],
    begun: Any,
    taken: dict[int, _Taken],
    record: tuple[int, dict[str, Any]] | None,
) -> dict[str, Any]:
    """What the manifest records of the mix, as a mixed epoch's record reads (each source's ends continue)."""
    assert cfg.mix is not None
    shares = shares_at(cfg, epoch)
    earlier = {e.get("name"): e for e in (record[1].get("sources", []) if record else []) if isinstance(e, dict)}
    read = {s.read.name: (code, s) for code, s in sources.items()}
    out = []
    for code, m in enumerate(cfg.mix.sources):
        mode = "query" if hasattr(m.samples, "query") else "scan"
        entry: dict[str, Any] = {"name": m.name, "code": code, "mode": mode, "weight": m.weight(epoch),
                                 "share": float(shares[m.name])}  # fmt: skip
        if m.name not in read:
            end = earlier.get(m.name, {}).get("end", {"pass": 0, "index": 0, "after": None})
            out.append(entry | {"samples": 0, "tokens": 0, "start": end, "end": end})
            continue
        c, s = read[m.name]
        t = taken[c]
        at, to = begun.positions[m.name], t.end
        after = s.read.passes.after(to)
        entry.update(
            samples=t.written,  # sequences written (a source's last ones may fall past the last full batch)
            sequences=t.packed.n_sequences,
            tokens=int(s.tokens.lengths[t.handles].sum()),
            asked_tokens=t.asked,
            documents=int(t.handles.size),
            n_keys=s.chosen.n_keys,
            keys=s.chosen.m,
            duplicates_dropped=s.chosen.repeats,
            passes=round(int(t.handles.size) / max(1, s.chosen.m), 6),
            start={"pass": at.pass_, "index": at.index},
            end={"pass": to.pass_, "index": to.index, "after": None if after is None else [str(after[0]), after[1]]},
            **s.read.key_columns.manifest(),
        )
        out.append(entry)
    return {"version": MIX_VERSION, "tokens": epoch_tokens(cfg, epoch, [s.tokens for s in sources.values()]),
            "continues": begun.record, "counted": begun.counted, "sources": out}  # fmt: skip


__all__ = ["mixed_packed_source"]
