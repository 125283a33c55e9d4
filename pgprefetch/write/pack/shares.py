"""A packed mix's shares, in tokens: how long an epoch is, what each source gives it, where each one stands.

Each source walks its own passes (:mod:`pgprefetch.write.mix.passes`: a pass is an order of its documents by
a keyed hash, and a position survives rows added or deleted). A mixed epoch of samples takes a count of samples
from each source; a packed one takes **tokens**:

- the epoch holds ``T`` tokens: ``[mix] samples`` sequences of ``length``, or, without it, as many as make one
  pass of the source with the fewest tokens per unit of weight (its pass's tokens over its share);
- source ``s`` gives ``round(share_s * T)`` tokens: the documents of its pass order from where it stands, up
  to the first whose tokens reach that (a pass that ends goes on into the next);
- where each source stands at an epoch's start comes from the store's record of an earlier epoch of the mix
  (:func:`~pgprefetch.write.mix.positions.recorded`), the epochs after it counted here in tokens, so an epoch
  dumped alone takes the documents it takes in a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import SourceError
from pgprefetch.write.mix.passes import PassOrder, Position
from pgprefetch.write.mix.positions import Starts, recorded, weights_at


@dataclass(frozen=True)
class TokenSource:
    """One source as the shares see it: its passes, and the tokens of each of its chosen documents (eos too)."""

    name: str
    passes: PassOrder
    lengths: np.ndarray  # by the passes' handles (a document's place among the chosen keys)

    @property
    def pass_tokens(self) -> int:
        """The tokens of one pass."""
        return int(self.lengths.sum())


def shares_at(cfg: Config, epoch: int) -> dict[str, Fraction]:
    """Each source's share of the tokens at ``epoch``: its weight over the weights' sum, exactly."""
    assert cfg.mix is not None
    weights = [Fraction(w).limit_denominator(1 << 32) for w in weights_at(cfg, epoch)]
    total = sum(weights, Fraction(0))
    return {s.name: w / total for s, w in zip(cfg.mix.sources, weights, strict=True)}


def epoch_tokens(cfg: Config, epoch: int, sources: Sequence[TokenSource]) -> int:
    """The tokens of epoch ``epoch``: ``[mix] samples`` sequences, or one pass of the slowest source."""
    assert cfg.mix is not None
    assert cfg.packing is not None
    if cfg.mix.samples is not None:
        return cfg.mix.samples * cfg.packing.length
    shares = shares_at(cfg, epoch)
    ends = [Fraction(s.pass_tokens) / shares[s.name] for s in sources if shares.get(s.name, 0) > 0]
    return int(min(ends)) if ends else 0


def quotas(cfg: Config, epoch: int, sources: Sequence[TokenSource]) -> dict[str, int]:
    """Each source's tokens in epoch ``epoch``."""
    total = epoch_tokens(cfg, epoch, sources)
    shares = shares_at(cfg, epoch)
    return {s.name: round(shares[s.name] * total) for s in sources}


def walk(source: TokenSource, at: Position, tokens: int) -> tuple[np.ndarray, Position]:
    """The documents from ``at`` whose tokens first reach ``tokens`` (handles, in pass order), and where that ends.

    Raises:
        SourceError: the source's documents hold no tokens at all, so no number of them reaches a share.
    """
    if tokens <= 0:
        return np.empty(0, dtype=np.int64), at
    if source.pass_tokens == 0:
        raise SourceError(f"[samples.{source.name}]: its documents hold no tokens, and its weight asks for some")
    m = source.passes.m
    taken: list[np.ndarray] = []
    left, here = tokens, at
    while left > 0:
        if here.index >= m:
            here = Position(here.pass_ + 1, 0)
        handles, _ = source.passes.take(here, m - here.index)  # the rest of this pass
        spent = np.cumsum(source.lengths[handles])
        n = int(np.searchsorted(spent, left)) + 1 if spent.size and spent[-1] >= left else handles.size
        taken.append(handles[:n])
        left -= int(spent[n - 1]) if n else 0
        here = source.passes.advance(here, n)
    return np.concatenate(taken), here


def token_starts(
    cfg: Config, epoch: int, sources: Sequence[TokenSource], record: tuple[int, dict[str, object]] | None, where: str
) -> Starts:
    """Each source's position at the start of ``epoch``: the record's, then the epochs since counted in tokens."""
    passes = {s.name: s.passes for s in sources}
    positions, first = recorded(passes, record, where)
    for e in range(first, epoch):
        counted = quotas(cfg, e, sources)
        for s in sources:
            positions[s.name] = walk(s, positions[s.name], counted[s.name])[1]
    return Starts(positions, record[0] if record else None, epoch - first)


__all__ = ["TokenSource", "epoch_tokens", "quotas", "shares_at", "token_starts", "walk"]
