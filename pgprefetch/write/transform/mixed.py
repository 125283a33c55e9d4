"""A mixed epoch's transforms: a stage per source, each unit's samples sent to the stage of their source.

Each source reads its inputs with its own statement (its query or table, its key columns), so each has its own
:class:`~pgprefetch.write.transform.stage.Stage`; they share the workers and the cache (the cache is addressed
by content: a text in two sources is transformed once). A unit holds samples of several sources, in slots the
mix decided: each source's samples go to its stage in slot order, and the outputs come back to their slots.

``on_error = "skip"``: each source is swept apart, before the mix is planned, and its failing keys are left
out of that source's keys (``Config.left_out_by_source``) before its samples are chosen, as a split's are. A
source's share is drawn from the samples it keeps, so every batch holds each source's share exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.transform.inputs import check_inputs, sample_key_columns, sample_keys
from pgprefetch.write.transform.outputs import Packed
from pgprefetch.write.transform.stage import LEFT_OUT_SHOWN, Stage, source_stage, transform_tools, wrapped


class MixedStage:
    """The stages of a mixed epoch's sources, by source code (position in ``[samples]``)."""

    def __init__(self, cfg: Config, stages: dict[int, Stage]) -> None:
        self.cfg = cfg  # the whole mixed config (each stage holds its source's)
        self.stages = stages
        self.summary: dict[str, dict[str, Any]] = {}
        self._tally()

    @property
    def skips(self) -> bool:
        """Whether a transform leaves out the samples it fails on (:attr:`Stage.skips`)."""
        return any(s.skips for s in self.stages.values())

    async def sweep(self, cfg: Config, snap: Snapshot) -> Config:
        """Sweep each source (:meth:`Stage.sweep`); ``cfg`` with each one's left-out keys."""
        left = []
        for stage in self.stages.values():
            assert stage.source is not None
            left.append((stage.source, await stage.sweep(sample_keys(stage.cfg, snap, stage.keys))))
        self._tally()
        return dataclasses.replace(cfg, left_out_by_source=tuple(left))

    async def serve(self, source: BatchSource, *, first: bool = True) -> BatchSource:
        """The mixed ``source`` whose units carry the transforms' outputs (:meth:`Stage.serve`)."""
        if first:
            keys = source.plan.batch_keys(0, self.cfg.batches.size)
            codes = source.sources_at(0, keys.shape[1])
            assert codes is not None, "a mixed epoch's source says each sample's source"
            for code, stage in self.stages.items():
                at = np.flatnonzero(codes == code)
                if at.size:
                    await stage.first_batch(np.ascontiguousarray(keys[: stage.keys.width, at]))
        return wrapped(self.cfg, source, self.unit, self.summary)

    async def unit(self, batch: int, keys: np.ndarray, codes: np.ndarray | None) -> dict[str, Packed]:
        """The unit's outputs: each source's samples through its stage, back in their slots."""
        assert codes is not None
        positions, asked = [], []
        for code, stage in self.stages.items():
            at = np.flatnonzero(codes == code)
            if at.size:
                positions.append(at)
                asked.append(stage.unit(batch, np.ascontiguousarray(keys[: stage.keys.width, at])))
        outputs = await asyncio.gather(*asked)
        self._tally()
        order = np.argsort(np.concatenate(positions), kind="stable")
        return {f: Packed.join([o[f] for o in outputs]).take(order) for f in outputs[0]} if outputs else {}

    def _tally(self) -> None:
        """The manifest's figures of each transform over the sources: counts summed, left-out keys by source."""
        for stage in self.stages.values():
            for name, own in stage.summary.items():
                entry = self.summary.setdefault(name, {"fingerprint": own["fingerprint"], "random": own["random"]})
                for key in ("computed", "cached", "left_out"):
                    if key in own:
                        entry[key] = sum(s.summary[name].get(key, 0) for s in self.stages.values())
                if "left_out_keys" in own:
                    shown = [f"{s.source}: {k}" for s in self.stages.values() for k in s.summary[name]["left_out_keys"]]
                    entry["left_out_keys"] = shown[:LEFT_OUT_SHOWN]


@contextlib.asynccontextmanager
async def mixed_stages(cfg: Config, snap: Snapshot, epoch: int, cache_folder: Path | None) -> AsyncIterator[MixedStage]:
    """A stage for each source of mixed ``cfg``, their inputs checked, over one set of workers and one cache."""
    assert cfg.mix is not None
    keys = {}
    for code, s in enumerate(cfg.mix.sources):
        own = cfg.for_source(s.name)
        keys[code] = await sample_key_columns(own, snap)
        await check_inputs(own, snap)
    async with mixed_stages_over(cfg, snap.id, epoch, cache_folder, keys) as stages:
        yield stages


@contextlib.asynccontextmanager
async def mixed_stages_over(
    cfg: Config, snapshot: str, epoch: int, cache_folder: Path | None, keys: dict[int, KeyColumns]
) -> AsyncIterator[MixedStage]:
    """The stages of the sources in ``keys`` (by code: their key columns) on the exported ``snapshot``.

    Their inputs checked already: a cluster's part of a mixed epoch (:mod:`pgprefetch.write.mix.parts`).
    """
    assert cfg.mix is not None
    async with contextlib.AsyncExitStack() as stack:
        runner, cache = await stack.enter_async_context(transform_tools(cfg, cache_folder))
        stages = {}
        for code, columns in sorted(keys.items()):
            name = cfg.mix.sources[code].name
            opened = source_stage(cfg.for_source(name), snapshot, columns, epoch, runner, cache, source=name)
            stages[code] = await stack.enter_async_context(opened)
        yield MixedStage(cfg, stages)
