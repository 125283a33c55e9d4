"""``pgprefetch check`` reports what a dump would decide, finds what would stop it, and writes nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgprefetch.cli import cli

from .harness.configs import s_config, write_config
from .harness.db import execute


def check(cfg: Path, dsn: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["check", "--config", str(cfg), "--dsn", dsn, *extra])
    return result.exit_code, result.output


def test_check_of_a_good_config_reports_the_epoch_and_writes_nothing(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path)
    code, out = check(cfg, s_table)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:4] == [
        "keys: 480",
        "epoch: 480 samples in 30 batches, about 5.76 kB of arrays, uncompressed",  # 480 x (4 B of v + 8 B of key)
        "field v: float32 () per sample",
        "checked 8 batch(es) with every type, cast and NULL check of the dump",
    ]
    seconds = r"[\d.]+ s"
    assert re.fullmatch(
        rf"expected: about {seconds} \({seconds} to {seconds}\) at [\d,]+ samples/s on 2 connection\(s\) \(the "
        r"check's plan and 8 batch\(es\), timed with the dump's batches in flight, times the epoch's\)",
        lines[4],
    )
    # 480 keys: the working set is the writer's buffers, far below the default 512 MiB
    assert re.fullmatch(
        r"memory: a dump's expected peak about \d+ MiB \(keys in memory\): 56 MiB for the interpreter, \d+ MiB of "
        r"--memory 512 MiB; at most 600 MiB with 32 MiB of slack",
        lines[5],
    )
    assert len(lines) == 6
    assert not (tmp_path / "store.zarr").exists()


def test_check_json_has_the_sizes(s_table: str, tmp_path: Path) -> None:
    code, out = check(s_config(tmp_path), s_table, "--json")
    report = json.loads(out)
    assert code == 0
    assert (report["n_samples"], report["n_batches"], report["epoch_bytes"], report["ok"]) == (480, 30, 480 * 12, True)


def test_check_collects_every_bad_batch(s_table: str, tmp_path: Path) -> None:
    execute(s_table, "ALTER TABLE s ALTER COLUMN v DROP NOT NULL", "UPDATE s SET v = NULL")
    code, out = check(s_config(tmp_path), s_table, "--batches", "3")
    lines = out.splitlines()
    # One line over the batches alike (#37: one line per checked batch, all alike, was noise) ...
    (error,) = [line for line in lines if line.startswith("error: ")]
    assert code == 1
    assert error.startswith("error: 3 of 3 checked batches (0, 14, 29), e.g. batch 0: ")
    assert "column v is NULL (16 NULLs in this batch)" in error
    assert lines[-1] == f"Error: {tmp_path / 'test.toml'}: 1 problem(s) found"
    # ... and each batch's under --verbose.
    code, out = check(s_config(tmp_path), s_table, "--batches", "3", "--verbose")
    each = [line for line in out.splitlines() if line.startswith("error in batch ")]
    assert [line.split(":")[0] for line in each] == ["error in batch 0", "error in batch 14", "error in batch 29"]
    assert all("column v is NULL (16 NULLs in this batch)" in line for line in each)


def test_check_reports_a_misfit_value_and_repeated_keys(s_table: str, tmp_path: Path) -> None:
    execute(s_table, "UPDATE s SET v = 1e6 WHERE id = 1")
    code, out = check(s_config(tmp_path, dtype="float16", size=480), s_table)
    assert code == 1
    assert "column v value 1000000.0 does not fit float16" in out
    code, out = check(s_config(tmp_path, keys="SELECT id FROM s UNION ALL SELECT 1"), s_table)
    assert code == 1
    assert "error: the keys query returned 1 repeated key(s), e.g. (id=1)" in out


def test_check_of_a_query_that_does_not_fit_the_config_says_and_exits_what_dump_does(
    s_table: str, tmp_path: Path
) -> None:
    cfg = s_config(tmp_path, query="SELECT v AS w FROM s WHERE id = $1")
    argv = [sys.executable, "-m", "pgprefetch"]
    checked = subprocess.run([*argv, "check", "--config", str(cfg), "--dsn", s_table], capture_output=True, text=True)
    dumped = subprocess.run(
        [*argv, "dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "0"], capture_output=True, text=True
    )
    assert 'the query returns no column "v" (it returns w)' in dumped.stderr
    assert (checked.returncode, checked.stderr, checked.stdout) == (dumped.returncode, dumped.stderr, "")
    assert checked.returncode == 2
    code, out = check(cfg, s_table, "--json")
    assert (code, json.loads(out.splitlines()[-1])["exit_code"]) == (2, 2)


def test_check_dump_and_ls_show_an_epochs_size_one_way(s_table: str, tmp_path: Path) -> None:
    """The arrays' size is the same words in check and dump; ls shows the disk's in the same units."""
    cfg = s_config(tmp_path)
    planned = check(cfg, s_table)[1].splitlines()[1]
    result = CliRunner().invoke(cli, ["dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "0"])
    assert result.exit_code == 0, result.output
    assert "about 5.76 kB of arrays" in planned
    assert ", 5.76 kB in " in result.output
    listed = CliRunner().invoke(cli, ["ls", "--config", str(cfg)]).output.splitlines()
    assert listed[0].split()[4:6] == ["on", "disk"]
    for row in listed[1:]:
        assert re.search(r" \d+(\.\d+)? (B|kB|MB|GB) ", row), row


WINDOWS = (
    "CREATE TABLE tnx (s int, t int, v real)",
    "INSERT INTO tnx SELECT i % 40, i / 40, i * 0.5 FROM generate_series(0, 39999) i",
    "ANALYZE tnx",
)


def windows_config(folder: Path, query: str) -> Path:
    keys = "SELECT s, t FROM tnx WHERE t % 50 = 0"
    return write_config(folder, keys=keys, query=query, fields={"v": (["v"], "float32")}, size=16, rows=8)


@pytest.mark.parametrize(
    ("query", "per"),
    [
        ("SELECT v FROM tnx WHERE s = $1 AND t >= $2 ORDER BY t LIMIT 8", "scans and sorts all of tnx for each sample"),
        ("SELECT v FROM tnx WHERE s = $1 AND t >= $2 AND t < $2 + 8", "for each"),
    ],
)
def test_check_names_the_index_a_per_sample_query_lacks_and_dump_logs_it_once(
    db: str, tmp_path: Path, query: str, per: str
) -> None:
    execute(db, *WINDOWS)
    cfg = windows_config(tmp_path, query)
    code, out = check(cfg, db)
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert code == 0, out
    assert len(warnings) == 1, out
    assert per in warnings[0]
    assert warnings[0].endswith("CREATE INDEX ON tnx (s, t) would make each sample a few page reads")
    dumped = subprocess.run(
        [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--dsn", db, "--epoch", "0"],
        capture_output=True,
        text=True,
    )
    assert dumped.returncode == 0, dumped.stderr
    assert dumped.stderr.count("CREATE INDEX ON tnx (s, t)") == 1
    execute(db, "CREATE INDEX ON tnx (s, t)", "ANALYZE tnx")
    code, out = check(cfg, db)
    assert (code, [line for line in out.splitlines() if line.startswith("warning: ")]) == (0, [])
