"""Where an epoch's batches are written: by the dump's own process (the default), or spread over a cluster.

The pipeline (:mod:`pgprefetch.write.pipeline`) plans the epoch, holds its snapshot and lock, opens its
writer and publishes it, whoever writes the batches. An :class:`Executor` is the other way to write them:
:mod:`pgprefetch.write.ray` spreads them over a Ray cluster's workers. The pipeline knows it only through
this protocol, so the single-process dump never imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.base import Store
from pgprefetch.write.batches import BatchSource, Progress
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.plan import Vocabulary


@dataclass(frozen=True)
class Spread:
    """How an executor wrote an epoch's batches."""

    parts: int  # the epoch's parts (each a batch range, written by one task)
    retries: tuple[int, ...]  # per part: how many times its task was run again (a worker or node lost)
    elsewhere: tuple[str, ...] = ()  # files uploaded from other machines (object stores), relative to the epoch
    kept: int = 0  # batches kept from parts an interrupted dump finished (recorded in an object store)
    restarted: str | None = None  # why parts an interrupted dump recorded were not kept
    snapshots: tuple[str, ...] = ()  # the snapshots the kept parts read


class Executor(Protocol):
    """Writes the pending batches of an epoch whose plan, snapshot, writer and lock the pipeline holds."""

    name: str

    def check(self, cfg: Config) -> None:
        """Refuse, in one line, a config this executor cannot run (before anything is locked or written)."""

    def driver_owns(self, store: Store) -> range | None:
        """The batches whose shard files the driver's writer creates (None: all; ``range(0)``: none)."""

    async def read_scan(
        self, cfg: Config, snap: Snapshot, progress: Progress | None, vocabulary: Vocabulary | None
    ) -> object:
        """Read a scan config's table on ``snap`` where its parts will cut it (kept for the run's next epochs)."""

    def scan_source(self, cfg: Config, read: object, epoch: int) -> BatchSource:
        """Epoch ``epoch`` of what :meth:`read_scan` read: its plan and layout, with ``spread`` set to ``read``."""

    def starts_over(self, store: Store) -> bool:
        """Whether a partial epoch in ``store`` is discarded rather than resumed."""

    async def write(
        self,
        cfg: Config,
        store: Store,
        source: BatchSource,
        writer: EpochWriter,
        todo: list[int],
        progress: Progress | None,
        fresh: bool = False,
    ) -> Spread:
        """Write batches ``todo`` of ``source`` into ``writer``'s partial epoch; fill its checksums and stats.

        ``fresh``: keep nothing an earlier dump of the epoch left (``--force``), wherever the executor keeps it.
        """
