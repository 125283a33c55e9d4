"""Passwords never shown (#36.8, #36.14), and what a refused connection says (#37.10), through the real CLI.

Each DSN holds a password that a URL parser cannot read whole (an unencoded ``/``, ``#`` or ``?`` in the
userinfo) or a ``?password=`` value holding an ``@``, a space or an ``&``: asyncpg's parse errors quote the
piece they choked on, so the test looks for every piece of the password in what the command prints.
The commands run as subprocesses, as a user runs them, against a loopback port where nothing listens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pgprefetch import build_config

from .harness.configs import write_config

ONE_COLUMN = {"v": (["v"], "float32")}
PIECES = ("Alpha1", "Bravo2")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dsns(port: int) -> list[str]:
    base = f"127.0.0.1:{port}/train"
    return [
        f"postgresql://trainer:Alpha1/Bravo2@{base}",
        f"postgresql://trainer:Alpha1#Bravo2@{base}",
        f"postgresql://trainer:Alpha1?Bravo2@{base}",
        f"postgresql://trainer@{base}?password=Alpha1@Bravo2",
        f"postgresql://trainer@{base}?password=Alpha1 Bravo2",
        f"postgresql://trainer@{base}?password=Alpha1&Bravo2",
        f"postgresql://trainer@{base}?sslmode=disable&password=Alpha1@Bravo2&application_name=x",
    ]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, timeout=60, check=False
    )


CASES = [pytest.param(i, id=f"dsn{i}") for i in range(len(dsns(1)))]


@pytest.mark.parametrize("case", CASES)
def test_dump_never_shows_the_password_or_its_pieces(case: int, tmp_path: Path) -> None:
    dsn = dsns(free_port())[case]
    path = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields=ONE_COLUMN, size=1)
    proc = run_cli("dump", "--config", str(path), "--epoch", "0", "--dsn", dsn, "--store", str(tmp_path / "s"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert out.startswith("Error: cannot connect to postgresql://trainer"), out
    assert out.count("\n") == 1, out
    for piece in PIECES:
        assert piece not in out, out


@pytest.mark.parametrize("case", CASES)
def test_demo_data_never_shows_the_password_or_its_pieces(case: int) -> None:
    dsn = dsns(free_port())[case]
    proc = run_cli("demo-data", "--dsn", dsn, "--scale", "0.01")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert out.startswith("Error: cannot connect to postgresql://trainer"), out
    assert "Traceback" not in out, out
    assert out.count("\n") == 1, out
    for piece in PIECES:
        assert piece not in out, out


def test_an_unparsable_dsn_says_to_percent_encode_the_password(tmp_path: Path) -> None:
    path = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields=ONE_COLUMN, size=1)
    dsn = f"postgresql://trainer:Alpha1/Bravo2@127.0.0.1:{free_port()}/train"
    proc = run_cli("dump", "--config", str(path), "--epoch", "0", "--dsn", dsn)
    assert "the DSN cannot be parsed (percent-encode" in proc.stderr
    assert "invalid literal" not in proc.stderr


def test_a_refused_connection_says_what_to_check(tmp_path: Path) -> None:
    path = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields=ONE_COLUMN, size=1)
    port = free_port()
    proc = run_cli("dump", "--config", str(path), "--epoch", "0", "--dsn", f"postgresql://u:pw@127.0.0.1:{port}/db")
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert f"Connect call failed ('127.0.0.1', {port})" in line
    assert "is the server up on that host and port?" in line
    assert "`pgprefetch server` prints the DSN" in line


def test_repr_of_a_config_hides_the_password(tmp_path: Path) -> None:
    path = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields=ONE_COLUMN, size=1)
    cfg = build_config(path, dsn="postgresql://trainer:Alpha1Bravo2@db.example:5432/train")
    assert cfg.source.dsn == "postgresql://trainer:Alpha1Bravo2@db.example:5432/train"  # still there to use
    for text in (repr(cfg), str(cfg), repr(cfg.source)):
        assert "Alpha1Bravo2" not in text
