"""The one choice of how a scan is read, made before the table is read: from the policy and the planner.

The planner's row count (``reltuples``, -1 before the first ``ANALYZE``) times the decoded row's size
(known before reading for fixed-width scalar columns; an array's length is not) estimates the table. The
choice, in order:

- a ``check`` reads the keys only (:class:`~.keysonly.KeysOnly`), whatever the size;
- a table the estimate puts past the budget (with the policy's margin,
  :data:`~pgprefetch.write.memory.policy.ESTIMATE_MARGIN`) is read beyond memory: rows in stretches of the
  epoch's order (:class:`~.stretches.InStretches`), windows in passes of whole series
  (:class:`~.passes.InPasses`);
- anything else is read whole (:class:`~.inmemory.InMemory`), with the beyond-memory strategy of its kind
  as the fallback an estimate too low hands the read to, midway (the table is read once either way).

By fit, not by a size: measured, a table that fits is read fastest in memory (20M rows of 17 columns, 1.5 GB
decoded: 20.2 s in memory, 21.5 s in stretches under 512 MiB; docs/memory.md), so no size sends a table that
fits beyond memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.memory.policy import ESTIMATE_MARGIN, STARTS_ROW_BYTES, Policy
from pgprefetch.write.scan.shape import ScanShape


@dataclass(frozen=True)
class Estimate:
    """What the planner says of the table before it is read: its rows and a decoded row's bytes (0: unknown)."""

    rows: float = 0.0
    row_bytes: float = 0.0

    @property
    def known(self) -> bool:
        """Whether both are known (a plain table of fixed-width scalar columns, analysed)."""
        return self.rows > 0 and self.row_bytes > 0

    @property
    def table_bytes(self) -> float:
        """The decoded table's bytes, as estimated."""
        return self.rows * self.row_bytes


async def estimate(snap: Snapshot, shape: ScanShape) -> Estimate:
    """The planner's row count of a plain table and its decoded row's size where both are known before reading."""
    if not shape.plain_table:
        return Estimate()
    sql = "SELECT reltuples::float8 FROM pg_class WHERE oid = $1::text::regclass"
    rows = float((await snap.fetch(sql, f"row estimate of {shape.relation}", shape.relation))[0][0])
    if any(c.is_array or c.padded is not None for c in shape.columns):
        return Estimate(rows=max(0.0, rows))
    per_row = sum(w.itemsize for w in shape.key_wire) + (shape.order_wire.itemsize if shape.order_wire else 0)
    per_row += sum(c.wire.itemsize + (1 if c.nullable else 0) for c in shape.columns)
    return Estimate(rows=max(0.0, rows), row_bytes=float(per_row))


def beyond_memory(cfg: Config, shape: ScanShape, guess: Estimate) -> bool:
    """Whether the estimate sends the read straight beyond memory: the table and its epoch past the budget."""
    if not guess.known:
        return False
    windows = cfg.scan_samples.window is not None
    n = int(guess.rows / ESTIMATE_MARGIN)
    stride = cfg.scan_samples.stride if windows else 1
    policy = Policy.for_scan(cfg.source.memory_bytes)
    row_bytes = guess.row_bytes + (STARTS_ROW_BYTES if cfg.store.windows == "starts" else 0)
    return not policy.fits_in_memory(n, row_bytes, -(-n // stride), len(shape.key_names))
