"""The one choice of a scan strategy, made before the table is read, and a wrong estimate recovered midway (#52)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch import load_config
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy import Estimate, ScanJob, choose
from pgprefetch.write.scan.strategy.inmemory import InMemory
from pgprefetch.write.scan.strategy.keysonly import KeysOnly
from pgprefetch.write.scan.strategy.passes import InPasses
from pgprefetch.write.scan.strategy.stretches import InStretches

from .harness.configs import scan_config
from .harness.db import fetch
from .harness.dumps import chunk_bytes, dump
from .harness.faults import seq_read
from .harness.spill import TINY_SOURCE, load_tables

ROWS = {"table": "flat", "key": "id", "fields": {"v": (["v"], "float32"), "w": (["w"], "int64")}}
WINDOWS = {"table": "big", "key": ["series_id"], "order": "t", "window": 16, "stride": 3}

# ---- the choice, from the estimate alone -----------------------------------------------------------------------


def _job(tmp_path: Path, samples: dict[str, Any], memory: str, guess: Estimate) -> ScanJob:
    cfg = load_config(scan_config(tmp_path, **samples, extra=f'memory = "{memory}"'), dsn="postgresql:///unused")
    window = "window" in samples
    shape = ScanShape(
        relation="t",
        plain_table=True,
        key_names=("series_id", "t") if window else ("id",),
        key_wire=(np.dtype(">i4"),),
        order_wire=np.dtype(">i4") if window else None,
        order_offset=0,
        columns=(),
        by_field={},
    )
    return ScanJob(cfg, None, 0, shape, None, guess, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("samples", "guess", "write", "expected"),
    [
        (ROWS, Estimate(), True, InMemory),  # nothing known: read whole, beyond memory if it outgrows it
        (ROWS, Estimate(1e6, 20), True, InMemory),  # 20 MB: fits 512 MiB
        (ROWS, Estimate(1e8, 20), True, InStretches),  # 2 GB: past it
        (WINDOWS, Estimate(1e8, 20), True, InPasses),
        (WINDOWS, Estimate(1e8, 20), False, KeysOnly),  # a check
        (ROWS, Estimate(1e8, 20), False, KeysOnly),
    ],
)
def test_the_strategy_is_chosen_from_the_estimate_before_the_table_is_read(
    tmp_path: Path, samples: dict[str, Any], guess: Estimate, write: bool, expected: type
) -> None:
    strategy = choose(
        _job(tmp_path, samples, "512MiB", guess).cfg, _job(tmp_path, samples, "512MiB", guess), write=write, keep=[]
    )
    assert type(strategy) is expected
    if isinstance(strategy, InMemory):  # its fallback takes an outgrown read over, in the way of its kind
        assert type(strategy.fallback) is (InPasses if "window" in samples else InStretches if write else KeysOnly)


def test_a_table_that_fits_is_read_in_memory_however_large(tmp_path: Path) -> None:
    """By fit, not by a size: a 1.5 GB table that fits was read faster in memory than in stretches (measured)."""
    rows = 2e7
    job = _job(tmp_path, ROWS, "64GiB", Estimate(rows, 76))
    assert type(choose(job.cfg, job, write=True, keep=[])) is InMemory
    small = _job(tmp_path, ROWS, "2GiB", Estimate(rows, 76))
    assert type(choose(small.cfg, small, write=True, keep=[])) is InStretches


# ---- an estimate too low: the read goes on beyond memory, the table read once ----------------------------------


@pytest.mark.parametrize("kind", ["rows", "windows"])
def test_a_read_that_outgrows_memory_goes_on_beyond_it_and_reads_the_table_once(
    db: str, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A table given as a SELECT has no estimate: read as if it fit, it outgrows 1 MiB and is handed over."""
    load_tables(db, series=200, rows=120_000)
    table = "flat" if kind == "rows" else "big"
    samples = {**(ROWS if kind == "rows" else WINDOWS), "table": f"SELECT * FROM {table}"}
    rows = int(fetch(db, f"SELECT count(*) FROM {table}")[0][0])
    before = seq_read(db, table)
    with caplog.at_level(logging.DEBUG, logger="pgprefetch"):
        spilled = dump(scan_config(tmp_path / "s", **samples, extra=TINY_SOURCE), db)
    assert seq_read(db, table) - before == rows  # read once, as the server counts it
    assert spilled.rows_read == rows
    assert any("read as the table in memory" in r.getMessage() for r in caplog.records)
    assert any("outgrew [source] memory" in r.getMessage() for r in caplog.records)  # and went on beyond it
    whole = dump(scan_config(tmp_path / "w", **samples), db)
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)


def test_a_read_coded_again_with_a_new_category_then_handed_over_records_the_lists_it_coded_with(
    db: str, tmp_path: Path
) -> None:
    """The store's lists lack a value: the read coded against them outgrows 1 MiB, and is read beyond memory.

    The read coded against the store's lists is given up (rows kept on disk must be coded for good); the
    values are read and the table read again beyond memory. The epoch's plan (and manifest) must carry the
    lists the rows were coded with, not the store's older ones.
    """
    from .harness.db import execute

    execute(
        db,
        "CREATE TABLE tagged (id bigint NOT NULL, v real NOT NULL, tag text NOT NULL)",
        "INSERT INTO tagged SELECT i, i * 0.5, 't' || (i % 3) FROM generate_series(1, 60000) i",
    )
    samples = {
        "table": "SELECT * FROM tagged",  # no estimate: read as if it fit
        "key": "id",
        "fields": {"v": (["v"], "float32"), "tag": (["tag"], "int8")},
    }

    def config(folder: Path, extra: str) -> Path:
        path = scan_config(folder, **samples, extra=extra)
        path.write_text(path.read_text().replace('columns = ["tag"]', 'columns = ["tag"]\ncategories = "auto"'))
        return path

    tiny, whole = config(tmp_path / "s", TINY_SOURCE), config(tmp_path / "w", "")
    for cfg in (tiny, whole):
        dump(cfg, db, 0, memory="1GiB")  # the store's lists: t0, t1, t2
    execute(db, "UPDATE tagged SET tag = 'new' WHERE id = 5")
    spilled, held = dump(tiny, db, 1), dump(whole, db, 1)
    assert 2 * 60000 < spilled.rows_read < 3 * 60000  # part of a read given up, the distinct values, the read
    stored = json.loads((spilled.path / "zarr.json").read_text())["attributes"]["pgprefetch"]
    assert stored["fields"]["tag"]["categories"] == ["t0", "t1", "t2", "new"]
    assert chunk_bytes(spilled.path) == chunk_bytes(held.path)
