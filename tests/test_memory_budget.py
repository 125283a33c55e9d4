"""``--memory`` is the dump process's memory: its peak RSS stays within floor + budget + slack, in every mode.

Each dump runs as users run it (``python -m pgprefetch dump``, its own process) and reports its peak RSS
(``peak_rss`` in ``--json``: the kernel's ``VmHWM``). The *floor* is the same config's dump of a tiny table,
measured in the same test: the interpreter, the imports and the fixed buffers, which the budget sits on.
Each job is several times the budget (the table, the keys or the epoch), so an allocation that escapes the
account (a pass's samples gathered at once, a COPY's stream held whole, the keys beside the table) shows
as a peak above the line. The same jobs give the bytes of the dump in memory (every chunk's bytes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgprefetch.write.memory.policy import (
    FLOOR,
    ORDER_BYTES_PER_ROW,
    SLACK,
    STRETCH_COPIES,
    STRETCH_MOST,
    Policy,
    heap_bytes,
)

from .harness.configs import scan_config, write_config
from .harness.db import execute
from .harness.dumps import chunk_bytes

MIB = 1 << 20
BUDGET = "8MiB"
ROWS17 = ", ".join(f"f{i} real NOT NULL" for i in range(16))
ROWS17_VALUES = ", ".join(f"(i % {97 + i}) * 0.5" for i in range(16))
WIDE_FIELDS = {"x": ([f"f{i}" for i in range(16)], "float32"), "y": (["label"], "int64")}


def _dump(cfg: Path, dsn: str, memory: str) -> dict[str, Any]:
    """``python -m pgprefetch dump`` of epoch 0 under ``--memory``: its ``--json`` summary (with ``peak_rss``)."""
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--epoch", "0", "--force", "--json"]
    p = subprocess.run([*argv, "--dsn", dsn, "--memory", memory], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return summary


def _peaks(
    folder: Path, dsn: str, config: Callable[[Path, str], Path], table: str, small: str, budget: str = BUDGET
) -> tuple[int, dict[str, Any], Path]:
    """The floor (a dump of ``small``, the same config) and the dump of ``table`` under ``budget``."""
    floor = _dump(config(folder / "floor", small), dsn, "1GiB")
    cfg = config(folder / "budget", table)
    return int(floor["peak_rss"]), _dump(cfg, dsn, budget), cfg


def _within(floor: int, summary: dict[str, Any], budget: str = BUDGET) -> None:
    peak = int(summary["peak_rss"])
    limit = floor + int(budget.removesuffix("MiB")) * MIB + SLACK
    assert peak <= limit, f"peak {peak / MIB:.0f} MiB > floor {floor / MIB:.0f} + {budget} + slack {SLACK // MIB}"


@pytest.mark.parametrize("budget", [1 * MIB, 2 * MIB, 8 * MIB, 32 * MIB, 512 * MIB, 8192 * MIB])
def test_a_stretch_takes_what_the_heap_leaves_of_the_budget_and_never_less_than_half_the_datas_share(
    budget: int,
) -> None:
    """Under the least budgets the heap's fixed part is more than the budget: a stretch then has the data's share.

    However large the budget, a stretch holds at most ``STRETCH_MOST`` of rows (its gather stays cache-friendly).
    """
    account = Policy.for_scan(budget)
    room = max(account.data, budget - heap_bytes(budget))
    for row_bytes in (8, 76, 4096):
        stretch = account.stretch_bytes(row_bytes)
        held = STRETCH_COPIES * stretch + ORDER_BYTES_PER_ROW * stretch / row_bytes
        assert held <= room, (row_bytes, stretch)
        assert stretch == STRETCH_MOST or account.data / 2 <= held, (row_bytes, stretch)


def test_a_scan_of_a_table_eight_times_the_budget_peaks_within_it_and_gives_the_bytes_in_memory(
    db: str, tmp_path: Path
) -> None:
    """Rows: 900,000 rows of 16 ``real`` and a label (72 MB decoded) under 8 MiB: read in passes."""
    for name, n in (("tiny", 1_000), ("wide", 900_000)):
        execute(
            db,
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, {ROWS17}, label int NOT NULL)",
            f"INSERT INTO {name} SELECT i, {ROWS17_VALUES}, i % 7 FROM generate_series(1, {n}) i ORDER BY random()",
            f"ANALYZE {name}",
        )

    def config(folder: Path, table: str) -> Path:
        return scan_config(folder, table=table, key=["id"], fields=WIDE_FIELDS, size=256)

    floor, summary, _ = _peaks(tmp_path, db, config, "wide", "tiny")
    _within(floor, summary)
    assert summary["rows_read"] == 900_000  # read once: the passes come from local disk
    whole = _dump(config(tmp_path / "whole", "wide"), db, "2GiB")
    assert chunk_bytes(Path(str(whole["path"]))) == chunk_bytes(Path(str(summary["path"])))


def test_windows_whose_epoch_is_ten_times_the_budget_peak_within_it(db: str, tmp_path: Path) -> None:
    """Windows of 200 rows at stride 1: each pass's samples are 65 times its rows, so they are gathered a chunk at
    a time (at once, a pass's 50,000 windows were 40 MB past a 16 MiB budget). A 200 MB epoch from a 3 MB table.
    """
    for name, n in (("tiny", 3_000), ("ticks", 250_000)):
        execute(
            db,
            f"CREATE TABLE {name} (series_id int NOT NULL, t int NOT NULL, f0 real NOT NULL)",
            f"INSERT INTO {name} SELECT i / 5000, i % 5000, i * 0.5 FROM generate_series(0, {n} - 1) i "
            "ORDER BY random()",
            f"ANALYZE {name}",
        )

    def config(folder: Path, table: str) -> Path:
        windows = {"key": ["series_id"], "order": "t", "window": 200, "stride": 1}
        return scan_config(folder, table=table, **windows, fields={"x": (["f0"], "float32")}, size=256)

    floor, summary, _ = _peaks(tmp_path, db, config, "ticks", "tiny", "16MiB")
    _within(floor, summary, "16MiB")
    assert summary["bytes"] > 10 * 16 * MIB


def test_query_mode_keys_beyond_the_budget_peak_within_it(db: str, tmp_path: Path) -> None:
    """Query mode: 600,000 keys (24 MB to order in memory) and their two columns, under 8 MiB."""
    for name, n in (("tiny", 5_000), ("q", 600_000)):
        execute(
            db,
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL)",
            f"INSERT INTO {name} SELECT i, i % 1000, i % 77 FROM generate_series(1, {n}) i",
        )

    def config(folder: Path, table: str) -> Path:
        folder.mkdir()
        return write_config(
            folder,
            keys=f"SELECT id FROM {table}",
            query=f"SELECT a, b FROM {table} WHERE id = $1",
            fields={"x": (["a", "b"], "int32")},
            size=1024,
        )

    floor, summary, _ = _peaks(tmp_path, db, config, "q", "tiny")
    _within(floor, summary)


@pytest.mark.parametrize(("memory", "keys"), [("16MiB", 200_000), ("512MiB", 200_000)])
def test_the_summary_reports_the_peak_and_check_states_the_expected_one(
    db: str, tmp_path: Path, memory: str, keys: int
) -> None:
    """``check`` expects query mode's keys as they are ordered (200,000: 8 MB, in the data's share) by the writer."""
    execute(
        db,
        "CREATE TABLE t (id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL)",
        f"INSERT INTO t SELECT i, i, i FROM generate_series(1, {keys}) i",
    )
    cfg = write_config(
        tmp_path,
        keys="SELECT id FROM t",
        query="SELECT a, b FROM t WHERE id = $1",
        fields={"x": (["a", "b"], "int32")},
        size=1024,
        extra_source=f'memory = "{memory}"',
    )
    argv = [sys.executable, "-m", "pgprefetch"]
    p = subprocess.run(
        [*argv, "dump", "--config", str(cfg), "--epoch", "0", "--dsn", db], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert re.search(r"\(peak memory \d+ MiB\)$", p.stdout.strip()), p.stdout
    check = [*argv, "check", "--config", str(cfg), "--dsn", db]
    p = subprocess.run([*check, "--json"], capture_output=True, text=True, check=False)
    report = json.loads(p.stdout)
    budget = int(memory.removesuffix("MiB")) * MIB
    assert report["way"] == "keys in memory"  # 6.4 MB to order: within either budget
    assert FLOOR + 4 * MIB < report["expected_peak"] <= FLOOR + min(budget, 64 * MIB)
    assert report["peak_bound"] == FLOOR + budget + SLACK
    p = subprocess.run(check, capture_output=True, text=True, check=False)
    assert "memory: a dump's expected peak about" in p.stdout, p.stdout


def test_a_series_larger_than_any_pass_under_the_budget_is_refused_naming_the_least_budget(
    db: str, tmp_path: Path
) -> None:
    """A series' windows cannot be split from its rows: one line, exit 1, the budget that would read it."""
    execute(
        db,
        "CREATE TABLE long (series_id int NOT NULL, t int NOT NULL, f0 real NOT NULL, f1 real NOT NULL, "
        "label smallint NOT NULL)",
        "INSERT INTO long SELECT CASE WHEN i < 150000 THEN 1 ELSE 2 + i % 50 END, i, i, i, i % 5 "
        "FROM generate_series(0, 199999) i",
        "ANALYZE long",
    )  # series 1: 150,000 rows (2.7 MB decoded), against passes of about 0.25 MB under 8 MiB
    windows = {"key": ["series_id"], "order": "t", "window": 4, "stride": 4}
    cfg = scan_config(tmp_path, table="long", **windows)
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--epoch", "0", "--dsn", db]
    p = subprocess.run([*argv, "--memory", "8MiB"], capture_output=True, text=True, check=False)
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip().splitlines()[-1]  # after the progress log's lines: no traceback
    need = re.search(r"the least budget that reads it is --memory (\d+)MiB$", line)
    assert need, line
    assert line.startswith("Error: [samples] table: series (series_id=1) has 150,000 rows"), line
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()
    ok = subprocess.run([*argv, "--memory", f"{need[1]}MiB"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr  # the budget it named reads it
