"""``pgprefetch check`` takes the dump's memory options and predicts the peak the dump then has, within 2x.

Each check and each dump runs as users run them, a process of its own (``python -m pgprefetch``), under the
same ``--memory``; the dump's peak RSS is the kernel's for that process alone. The configs are the demo's,
over the demo data, and a table several times the budget, read beyond it in stretches. The check states a
duration too; speed is a benchmark's to measure, not a test's (the figures are in docs/memory.md): here only
that it is stated, as a range around its figure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgprefetch.write.memory.policy import FLOOR, SLACK

from .harness.configs import scan_config, write_config
from .harness.db import execute

MIB = 1 << 20
WIDE = 96  # real columns of a row: 392 bytes decoded with its series and order
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ROWS17 = ", ".join(f"f{i} real NOT NULL" for i in range(16))
ROWS17_VALUES = ", ".join(f"(i % {97 + i}) * 0.5" for i in range(16))


# Runs the command as its only child and writes that child's peak RSS (KiB) and exit code to a file. Linux
# starts a child's peak at its parent's size when it forks: from this small process, not from pytest's.
RSS_WRAPPER = (
    "import pathlib, resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[2:]).returncode\n"
    "pathlib.Path(sys.argv[1]).write_text(f'{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {rc}')\n"
)


def run(folder: Path, *argv: str) -> tuple[int, str, str, int]:
    """``python -m pgprefetch ARGV`` in its own process: exit code, stdout, stderr, and its own peak RSS."""
    out, err, rss = folder / "stdout.txt", folder / "stderr.txt", folder / "rss.txt"
    command = [sys.executable, "-c", RSS_WRAPPER, str(rss), sys.executable, "-m", "pgprefetch", *argv]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        subprocess.run(command, stdout=stdout, stderr=stderr, check=True)
    kib, code = rss.read_text().split()
    return int(code), out.read_text(), err.read_text(), int(kib) * 1024


def check_then_dump(cfg: Path, dsn: str, memory: str) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """The check's ``--json`` report and its peak, then the dump's summary and its peak, both under ``memory``."""
    options = ["--config", str(cfg), "--dsn", dsn, "--memory", memory]
    code, out, err, check_peak = run(cfg.parent, "check", *options, "--json")
    assert code == 0, err[-2000:] + out[-2000:]
    report: dict[str, Any] = json.loads(out)
    code, out, err, dump_peak = run(cfg.parent, "dump", *options, "--epoch", "0", "--force", "--json", "--parents")
    assert code == 0, err[-2000:]
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report, summary, check_peak, dump_peak


def within_twice(predicted: int, measured: int, what: str) -> None:
    ratio = predicted / measured
    assert 0.5 <= ratio <= 2, f"{what}: predicted {predicted / MIB:.0f} MiB, measured {measured / MIB:.0f} MiB"


def demo_config(folder: Path, name: str) -> Path:
    """A copy of ``configs/NAME`` whose store is in ``folder`` (the demo's is under the clone)."""
    text = (CONFIGS / name).read_text(encoding="utf-8")
    text = re.sub(r'(?m)^path = "[^"]*"', f'path = "{folder / "store.zarr"}"', text)
    (folder / name).write_text(text, encoding="utf-8")
    return folder / name


@pytest.mark.parametrize(
    ("name", "way"),
    [("demo-scan.toml", "table in memory"), ("demo.toml", "keys in memory"), ("demo-rows.toml", "keys in memory")],
)
def test_check_predicts_the_peak_of_a_demo_dump_under_the_same_memory(
    demo_db: str, tmp_path: Path, name: str, way: str
) -> None:
    """Scan mode was said to peak at floor + the whole budget + slack (600 MiB at 512 MiB); its dumps peak near 70."""
    report, summary, _, dump_peak = check_then_dump(demo_config(tmp_path, name), demo_db, "64MiB")
    assert report["memory"] == 64 * MIB
    assert report["way"] == way
    within_twice(report["expected_peak"], dump_peak, name)
    assert report["peak_bound"] == FLOOR + 64 * MIB + SLACK
    assert summary["n_samples"] == report["n_samples"]
    low, high = report["expected_range"]
    assert 0 < low <= report["expected_seconds"] <= high


def test_check_predicts_a_dump_of_a_table_beyond_the_budget_and_stays_within_it(db: str, tmp_path: Path) -> None:
    """400,000 rows of 16 ``real`` and a label (30 MB decoded) under 8 MiB: rows in stretches, their peak the budget's.

    The check itself orders the keys on disk and reads the checked batches' rows only: within the budget too.
    """
    execute(
        db,
        f"CREATE TABLE wide (id bigint PRIMARY KEY, {ROWS17}, label int NOT NULL)",
        f"INSERT INTO wide SELECT i, {ROWS17_VALUES}, i % 7 FROM generate_series(1, 400000) i ORDER BY random()",
        "ANALYZE wide",
    )
    fields = {"x": ([f"f{i}" for i in range(16)], "float32"), "y": (["label"], "int64")}
    cfg = tmp_path / "wide.toml"
    cfg.write_text(
        '[samples]\ntable = "wide"\nkey = ["id"]\n\n'
        + "".join(f'[fields.{n}]\ncolumns = {json.dumps(c)}\ndtype = "{d}"\n\n' for n, (c, d) in fields.items())
        + f'[batches]\nsize = 256\nseed = 0\ndrop_last = false\n\n[store]\npath = "{tmp_path / "store.zarr"}"\n'
        'compression = "none"\n',
        encoding="utf-8",
    )
    report, summary, check_peak, dump_peak = check_then_dump(cfg, db, "8MiB")
    assert report["way"] == "rows in stretches"
    assert report["batches_checked"] >= 1
    within_twice(report["expected_peak"], dump_peak, "a table beyond the budget")
    assert summary["rows_read"] == 400_000
    assert check_peak <= report["peak_bound"], f"the check peaked at {check_peak / MIB:.0f} MiB"
    low, high = report["expected_range"]
    assert 0 < low <= report["expected_seconds"] <= high


def test_check_orders_keys_beyond_memory_in_scratch_and_says_so(db: str, tmp_path: Path) -> None:
    """Query mode's keys beyond ``--memory`` are ordered in ``--scratch``, as the dump's; nothing is left there."""
    execute(
        db,
        "CREATE TABLE t (id bigint PRIMARY KEY, a int NOT NULL)",
        "INSERT INTO t SELECT i, i FROM generate_series(1, 60000) i",
    )
    cfg = write_config(
        tmp_path,
        keys="SELECT id FROM t",
        query="SELECT a FROM t WHERE id = $1",
        fields={"a": (["a"], "int32")},
        size=64,
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code, out, err, _ = run(
        tmp_path, "check", "--config", str(cfg), "--dsn", db, "--memory", "1MiB", "--scratch", str(scratch)
    )
    assert code == 0, err
    memory = [line for line in out.splitlines() if line.startswith("memory: ")]
    assert memory == [
        "memory: a dump's expected peak about 57 MiB (keys ordered on disk): 56 MiB for the interpreter, 1 MiB of "
        "--memory 1 MiB; at most 89 MiB with 32 MiB of slack"
    ], out
    assert list(scratch.iterdir()) == []


def test_check_refuses_a_bad_memory_size_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields={"a": (["a"], "int32")}, size=1)
    code, _, err, _ = run(tmp_path, "check", "--config", str(cfg), "--memory", "lots")
    assert code == 2
    assert err.strip().splitlines() == ['Error: --memory: expected a size such as "512MiB" or "2GiB", got "lots"'], err


def test_check_of_windows_whose_keys_fit_reads_the_checked_series_within_the_budget(db: str, tmp_path: Path) -> None:
    """60,000 rows of 96 ``real`` in 120 series under 8 MiB: the keys fit the budget, the checked series do not.

    Windows of a few long series can span the whole table. The check reads the checked batches' series
    within the share it reads them in where the keys are beyond the budget: one batch's where the asked
    batches' outgrow it, none where one batch's do; the dump's way and peak are stated either way.
    """
    columns = ", ".join(f"f{i} real NOT NULL" for i in range(WIDE))
    values = ", ".join(f"(i % {31 + i}) * 0.5" for i in range(WIDE))
    execute(
        db,
        f"CREATE UNLOGGED TABLE wins (series int NOT NULL, t int NOT NULL, {columns})",  # (unlogged: set up fast)
        f"INSERT INTO wins SELECT i % 120, i / 120, {values} FROM generate_series(0, 59999) i",  # (not in key order)
        "ANALYZE wins",
    )
    windows: dict[str, Any] = {"table": "wins", "key": "series", "order": "t", "window": 50, "stride": 50}
    fields = {"x": ([f"f{i}" for i in range(WIDE)], "float32")}
    options = ["--dsn", db, "--memory", "8MiB", "--json"]

    # 64 batches of 4 windows: about 110 series, 22 MB; one batch's 4 series, 0.8 MB.
    cfg = scan_config(tmp_path / "few", fields=fields, size=4, **windows)
    code, out, err, peak = run(cfg.parent, "check", "--config", str(cfg), *options, "--batches", "64")
    assert code == 0, err[-2000:] + out[-2000:]
    report = json.loads(out)
    assert peak <= report["peak_bound"], f"the check peaked at {peak / MIB:.0f} MiB"
    assert report["batches_checked"] == 1
    note = "checked 1 of 64 batches: the series of all 64 do not fit half of --memory's data share (2 MiB)"
    assert note in report["notes"]
    assert report["way"] == "windows in passes"
    assert report["n_samples"] == 120 * 10
    low, high = report["expected_range"]
    assert 0 < low <= report["expected_seconds"] <= high

    # 8 batches of 64 windows: every series; one batch's, about 50 series (10 MB): the keys only.
    cfg = scan_config(tmp_path / "many", fields=fields, size=64, **windows)
    code, out, err, peak = run(cfg.parent, "check", "--config", str(cfg), *options)
    assert code == 0, err[-2000:] + out[-2000:]
    report = json.loads(out)
    assert peak <= report["peak_bound"], f"the check peaked at {peak / MIB:.0f} MiB"
    assert report["batches_checked"] == 0
    note = "one batch's series do not fit half of --memory's data share (2 MiB): checked the keys only"
    assert note in report["notes"]
    assert (report["way"], report["n_samples"], report["expected_seconds"]) == ("windows in passes", 1200, None)
