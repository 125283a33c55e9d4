"""Logs cron and Kubernetes can keep: progress lines when stderr is not a terminal, text or JSON."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from pathlib import Path

import pytest

from .harness.configs import s_config
from .harness.dumps import dump_argv, journal_lines, start_dump, wait_for


def test_a_piped_dump_logs_its_progress(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path, slow=True)
    done = subprocess.run(dump_argv(cfg, s_table, 0, "--log-every", "0.3"), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "samples/s, ETA" in line]
    assert len(lines) >= 2
    assert re.fullmatch(
        r"\S+ \S+ pgprefetch INFO: epoch 0: [\d,]+ of 480 samples \(\d+%\), [\d,]+ samples/s, ETA \d+ s", lines[0]
    ), lines[0]


def test_json_log_lines_carry_the_figures_and_the_resume(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    victim = start_dump(cfg, s_table)
    wait_for(lambda: journal_lines(store) >= 3)
    victim.kill()
    victim.communicate()  # reaped, its pipes closed
    argv = dump_argv(cfg, s_table, 0, "--log-format", "json", "--log-every", "0.3")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert records[0]["level"] == "info"
    assert records[0]["message"].startswith("epoch 0: checking the ")  # said before the kept batches are read
    assert records[0]["message"].endswith(" batches an interrupted dump wrote")
    assert records[1]["message"].startswith("epoch 0: resuming: ")
    progress = [r for r in records if "samples" in r]
    assert progress
    assert {"time", "epoch", "samples", "total", "samples_per_s", "eta_s"} <= set(progress[0])
    assert progress[0]["total"] == 480


def run(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from pgprefetch.cli import cli

    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_with_json_an_error_is_one_object_on_stdout(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert run("dump", "--config", str(missing), "--epoch", "0", "--json") == (
        2,
        json.dumps({"error": f"{missing}: no such config file", "exit_code": 2}) + "\n",
    )
    for command in (["ls"], ["verify", "--epoch", "0"], ["prune", "--keep", "1"]):
        code, out = run(*command, "--store", str(tmp_path / "absent.zarr"), "--json")
        assert code == 2
        assert json.loads(out) == {"error": f"no store at {tmp_path / 'absent.zarr'} (nothing there)", "exit_code": 2}


def test_a_folder_that_is_not_a_store_is_one_line_exit_2(tmp_path: Path) -> None:
    assert run("ls", "--store", str(tmp_path)) == (
        2,
        f"Error: no store at {tmp_path} (a folder that is not a pgprefetch store)\n",
    )


def test_checksums_live_in_an_array_and_the_manifest_stays_small(s_table: str, tmp_path: Path) -> None:
    import warnings

    import zarr

    from .harness.dumps import dump

    result = dump(s_config(tmp_path, size=1), s_table)  # 480 batches
    assert (result.path / "zarr.json").stat().st_size < 8192
    checksums = zarr.open_array(result.path / "_checksums", mode="r")
    assert checksums.shape == (2, 480)  # v and keys, a CRC32C per batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing in the epoch's group that zarr does not know
        assert sorted(zarr.open_group(result.path, mode="r").array_keys()) == ["_checksums", "keys", "v"]
    assert run("verify", "--store", str(result.path.parent), "--epoch", "0")[0] == 0
    zarr.open_array(result.path / "_checksums", mode="r+")[0, 7] = 12345
    code, out = run("verify", "--store", str(result.path.parent), "--epoch", "0")
    assert (code, out.splitlines()[0]) == (1, "v batch 7: checksum mismatch")


def test_batches_kept_from_an_interrupted_dump_are_not_counted_in_the_rate(caplog: pytest.LogCaptureFixture) -> None:
    from pgprefetch.cli.progress import LogProgress

    progress = LogProgress(interval=0)
    progress.start(0, 1000)
    progress.advance(900, 0)  # kept: on disk before this run started
    time.sleep(0.2)
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        progress.advance(10, 4096)
    record = [r for r in caplog.records if hasattr(r, "samples_per_s")][-1]  # the line after the new samples
    assert record.samples == 910
    assert record.samples_per_s < 10 / 0.2 * 1.01  # ten new samples in 0.2 s, not 910
