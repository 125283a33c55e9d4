"""What a dump reads, as the server counts it (``pg_stat_user_tables.seq_tup_read``), against ``rows_read``.

Scan mode with ``categories = "auto"`` used to read the table once more per auto field every epoch (3x
for two fields), while ``rows_read`` said 1x. The values are now found in one read for all the fields,
and only when the store's vocabulary lacks one: an epoch of a store that knows every value reads the table
once. ``rows_read`` counts every row the server was asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump
from .harness.faults import seq_read

N = 600


@pytest.fixture
def labelled(db: str) -> str:
    """``t(id, a, b, x)``: N rows, two label columns of a few values each; ``k(id)``, their keys."""
    execute(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, a text NOT NULL, b text, x real NOT NULL)",
        f"INSERT INTO t SELECT i, 'a' || (i % 3), CASE WHEN i % 7 = 0 THEN NULL ELSE 'b' || (i % 5) END, i "
        f"FROM generate_series(1, {N}) i",
        "CREATE TABLE k AS SELECT id FROM t",  # query mode's keys: only the keys query reads it
    )
    return db


def _config(folder: Path, mode: str) -> Path:
    if mode == "scan":
        samples = ['table = "t"', 'key = "id"']
    else:
        samples = ['keys = "SELECT id FROM k"', 'query = "SELECT a, b, x FROM t WHERE id = $1"']
    lines = [
        "[source]",
        "connections = 2",
        "[samples]",
        *samples,
        "[fields.a]",
        'columns = ["a"]',
        'dtype = "int8"',
        'categories = "auto"',
        "[fields.b]",
        'columns = ["b"]',
        'dtype = "int8"',
        'categories = "auto"',
        "null = -1",
        "[fields.x]",
        'columns = ["x"]',
        'dtype = "float32"',
        "[batches]",
        "size = 32",
        "[store]",
        'path = "store.zarr"',
    ]
    path = folder / f"{mode}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_scan_mode_reads_the_table_once_when_the_store_knows_every_value(labelled: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, "scan")
    before = seq_read(labelled, "t")
    first = dump(cfg, labelled, 0)
    after_first = seq_read(labelled, "t")
    # A fresh store: one read for both fields' values, one COPY; and rows_read says so.
    assert after_first - before == 2 * N
    assert first.rows_read == 2 * N
    second = dump(cfg, labelled, 1)
    after_second = seq_read(labelled, "t")
    assert after_second - after_first == N  # exactly once: the vocabulary had every value
    assert second.rows_read == N
    # A value the store lacks: found, and every row read counted.
    execute(labelled, "UPDATE t SET a = 'new' WHERE id = 5")
    before = seq_read(labelled, "t")
    third = dump(cfg, labelled, 2)
    assert third.rows_read == seq_read(labelled, "t") - before
    vocabulary = fetch_vocabulary(tmp_path / "store.zarr")
    assert vocabulary["a"] == ["a0", "a1", "a2", "new"]


def test_query_mode_finds_every_auto_field_in_one_statement(labelled: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, "query")
    before = seq_read(labelled, "k")
    dump(cfg, labelled, 0)
    # The keys query runs once for the keys, once in the one statement of both fields' values (it ran once
    # per field). (The batches' own reads of t depend on the planner, so k, which only the keys query reads.)
    assert seq_read(labelled, "k") - before == 2 * N


def fetch_vocabulary(store: Path) -> dict[str, list[str]]:
    from pgprefetch.store.open import open_store

    return open_store(store).vocabulary()


def _check(cfg: Path, dsn: str, *extra: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from pgprefetch.cli import cli

    result = CliRunner().invoke(cli, ["check", "--config", str(cfg), "--dsn", dsn, *extra])
    return result.exit_code, result.output


def test_check_in_scan_mode_reads_the_keys_and_the_checked_batches_only(labelled: str, tmp_path: Path) -> None:
    import json

    cfg = _config(tmp_path, "scan")
    code, out = _check(cfg, labelled, "--json")
    assert code == 0, out
    report = json.loads(out)
    # 600 rows' keys, the values of the two auto fields in one read, and 8 batches of 32 rows: not the table.
    assert report["batches_checked"] == 8
    assert report["rows_read"] == N + N + 8 * 32
    code, out = _check(cfg, labelled)
    assert (
        "read: the key columns of every row and the checked batches' rows (1,456 table rows in all); "
        "a dump reads the whole table"
    ) in out.splitlines()


def test_check_prints_only_what_it_measured(labelled: str, tmp_path: Path) -> None:
    """Stopped by an error before the epoch was planned: no "keys: 0", "epoch: 0 samples" header."""
    execute(labelled, "UPDATE t SET a = repeat('x', 2000) WHERE id = 9")
    code, out = _check(_config(tmp_path, "scan"), labelled)
    assert code == 1
    lines = out.splitlines()
    assert not [line for line in lines if line.startswith(("keys:", "epoch:", "checked "))], out
    assert lines[0].startswith("error: [fields.a] categories: a value of the data is longer than 1024 bytes")


def test_epochs_read_in_passes_code_like_a_whole_read(db: str, tmp_path: Path) -> None:
    """The store knows the values, but the table outgrows memory: the passes still get the whole lists."""
    execute(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, a text NOT NULL, b text, x real NOT NULL)",
        "INSERT INTO t SELECT i, 'a' || (i % 3), CASE WHEN i % 7 = 0 THEN NULL ELSE 'b' || (i % 5) END, i "
        "FROM generate_series(1, 100000) i",
    )
    whole_cfg = _config(tmp_path, "scan")
    (tmp_path / "small").mkdir()
    small_cfg = tmp_path / "small" / "scan.toml"
    small_cfg.write_text(whole_cfg.read_text().replace("connections = 2", 'connections = 2\nmemory = "1MiB"'))
    for epoch in (0, 1):
        dump(whole_cfg, db, epoch)
        if epoch == 1:
            execute(db, "UPDATE t SET b = 'late' WHERE id = 11")  # a value the store lacks, met in a pass
        small = dump(small_cfg, db, epoch)
        assert small.rows_read is not None
        assert small.rows_read >= 100_000  # (a first read given up, the values,) the one read the passes split
    assert fetch_vocabulary(tmp_path / "small" / "store.zarr")["b"][-1] == "late"
    assert chunk_bytes(tmp_path / "store.zarr" / "epoch-00000") == chunk_bytes(
        tmp_path / "small" / "store.zarr" / "epoch-00000"
    )
