"""Data never becomes SQL: the security review's D1 attack, and the limits on category values (D10).

Scan mode used to paste category values into its COPY's text, which runs over the simple-query protocol.
With ``standard_conforming_strings = off`` for the database, a value ending in ``\\`` left the literal open
and the next value ran as SQL: ``COMMIT; UPDATE victim ...`` with the dump role's rights, from ``dump`` and
from ``check``. The values are now bound on each worker (``set_config``) and read back by the COPY; every
connection pins ``standard_conforming_strings = on`` as well.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import zarr

from pgprefetch import EpochDataset

from .harness.db import execute, fetch

BREAK_OUT = (
    ']::text[], "label"::text) - 1, -1)::int4, "x" FROM labels) TO STDOUT (FORMAT binary); '
    "COMMIT; UPDATE victim SET v = v + 7; --"
)


def _config(folder: Path, categories: str = '"auto"', store: str = "store.zarr") -> Path:
    """A scan config over ``labels``; ``categories`` as TOML."""
    lines = [
        "[source]",
        "connections = 2",
        "[samples]",
        'table = "labels"',
        'key = "id"',
        "[fields.label]",
        'columns = ["label"]',
        'dtype = "int16"',
        f"categories = {categories}",
        "[fields.x]",
        'columns = ["x"]',
        'dtype = "float32"',
        "[batches]",
        "size = 8",
        "drop_last = false",
        "[store]",
        f'path = "{store}"',
    ]
    path = folder / "scs.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def hostile(db: str) -> str:
    """A database whose ``labels.label`` holds the review's break-out, with the precondition set for the database."""
    name = urlsplit(db).path.lstrip("/")
    execute(
        db,
        "CREATE TABLE victim (v int8 NOT NULL)",
        "INSERT INTO victim VALUES (55)",
        "CREATE TABLE labels (id int PRIMARY KEY, label text NOT NULL, x real NOT NULL)",
        "INSERT INTO labels SELECT i, 'cat', i FROM generate_series(1, 50) i",
        "UPDATE labels SET label = E'A\\\\' WHERE id = 1",
        f"UPDATE labels SET label = $${BREAK_OUT}$$ WHERE id = 2",
        f"ALTER DATABASE {name} SET standard_conforming_strings = off",
    )
    # The precondition holds: a plain session of the database reads backslashes as escapes.
    assert fetch(db, "SHOW standard_conforming_strings")[0][0] == "off"
    return db


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgprefetch", *argv], capture_output=True, text=True, cwd=cwd)


def _decoded(store: Path) -> dict[int, str]:
    """Each sample's label as the epoch's codes and its category list decode it, by key."""
    ds = EpochDataset(store, 0, consumer=None)
    group = zarr.open_group(str(store / "epoch-00000"), mode="r")
    n = ds.n_samples
    keys, codes = group["keys"][:].reshape(-1)[:n].tolist(), group["label"][:].reshape(-1)[:n].tolist()
    vocabulary = ds.categories["label"]
    return {k: vocabulary[c] for k, c in zip(keys, codes, strict=True)}


def _victim(dsn: str) -> int:
    return int(fetch(dsn, "SELECT sum(v) FROM victim")[0][0])


def test_a_category_value_from_the_data_never_runs_as_sql_from_dump_or_check(hostile: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    checked = _run("check", "--config", str(cfg), "--dsn", hostile, cwd=tmp_path)
    assert _victim(hostile) == 55, "check ran the data as SQL"
    assert checked.returncode == 0, checked.stdout + checked.stderr
    dumped = _run("dump", "--config", str(cfg), "--dsn", hostile, "--epoch", "0", cwd=tmp_path)
    assert _victim(hostile) == 55, "dump ran the data as SQL"
    assert dumped.returncode == 0, dumped.stdout + dumped.stderr
    # The epoch's codes are right: the store's vocabulary (sorted) indexes every sample's own value.
    assert _decoded(tmp_path / "store.zarr") == {i: {1: "A\\", 2: BREAK_OUT}.get(i, "cat") for i in range(1, 51)}


def test_an_explicit_category_list_with_a_backslash_is_coded_too(hostile: str, tmp_path: Path) -> None:
    listed = json.dumps(["A\\", "cat", BREAK_OUT])  # a TOML array of basic strings
    cfg = _config(tmp_path, categories=listed)
    dumped = _run("dump", "--config", str(cfg), "--dsn", hostile, "--epoch", "0", cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stdout + dumped.stderr
    assert _victim(hostile) == 55
    decoded = _decoded(tmp_path / "store.zarr")
    assert decoded == {i: {1: "A\\", 2: BREAK_OUT}.get(i, "cat") for i in range(1, 51)}


def test_every_connection_pins_standard_conforming_strings_on(hostile: str) -> None:
    """Over the database's ``off`` and the DSN's own ``off``: the snapshot and every worker read it ``on``."""
    from pgprefetch.config.model import SourceConfig
    from pgprefetch.pg.session import BatchReader, Snapshot

    sep = "&" if "?" in hostile else "?"
    source = SourceConfig(dsn=f"{hostile}{sep}standard_conforming_strings=off", connections=2)

    async def settings() -> list[str]:
        async with Snapshot.open(source) as snap:
            seen = [(await snap.fetch("SHOW standard_conforming_strings", "test"))[0][0]]
            async with BatchReader.open(source, snap.id, "SELECT current_setting('standard_conforming_strings')") as r:
                seen += [str((await r.fetch(0, np.empty((0, 0), np.int64)))[0]) for _ in range(2)]
        return seen

    assert asyncio.run(settings()) == ["on", "on", "on"]


def test_the_copy_text_holds_no_category_value() -> None:
    """Whatever a session's settings: the COPY's text names the bound lists, never a value of them."""
    from pgprefetch.pg.columns import Column
    from pgprefetch.write.scan.shape import ScanShape, copy_select, vocabularies

    label = Column(name="label", pg_type="int4", is_array=False, nullable=True, vocabulary=1)
    values = ["A\\", BREAK_OUT, "it's", "cat"]
    shape = ScanShape(
        relation="labels",
        plain_table=True,
        key_names=("id",),
        key_wire=(np.dtype(">i4"),),
        order_wire=None,
        order_offset=0,
        columns=(label,),
        by_field={"label": (label,)},
        categories={"label": values},
    )
    sql = copy_select(shape)
    assert not any(v in sql for v in ("A\\", "victim", "it's", "cat")), sql
    assert "current_setting('pgprefetch.vocabulary_0')" in sql
    assert vocabularies(shape) == [values]


@pytest.mark.parametrize("mode", ["scan", "query"])
def test_a_category_value_past_1_kib_stops_the_dump_in_one_line(db: str, tmp_path: Path, mode: str) -> None:
    execute(
        db,
        "CREATE TABLE labels (id int PRIMARY KEY, label text NOT NULL, x real NOT NULL)",
        "INSERT INTO labels SELECT i, 'cat', i FROM generate_series(1, 50) i",
        "UPDATE labels SET label = repeat('é', 513) WHERE id = 3",  # 1,026 bytes of UTF-8
    )
    cfg = _config(tmp_path)
    if mode == "query":
        text = cfg.read_text().replace(
            'table = "labels"\nkey = "id"',
            'keys = "SELECT id FROM labels"\nquery = "SELECT label, x FROM labels WHERE id = $1"',
        )
        cfg.write_text(text)
    dumped = _run("dump", "--config", str(cfg), "--dsn", db, "--epoch", "0", cwd=tmp_path)
    assert dumped.returncode == 1
    errors = [line for line in dumped.stderr.splitlines() if "INFO" not in line]
    assert errors == [
        "Error: [fields.label] categories: a value of the data is longer than 1024 bytes ('" + "é" * 40 + "...'); "
        "categories are labels: use a uint8 field with max_length for long text"
    ]
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()
    assert not (tmp_path / "store.zarr" / ".pgprefetch" / "categories.json").exists()


def test_a_vocabulary_past_65536_values_stops_the_dump_in_one_line(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE labels (id int PRIMARY KEY, label text NOT NULL, x real NOT NULL)",
        "INSERT INTO labels SELECT i, 'v' || i, i FROM generate_series(1, 65537) i",
    )
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text().replace('dtype = "int16"', 'dtype = "int32"'))
    dumped = _run("dump", "--config", str(cfg), "--dsn", db, "--epoch", "0", cwd=tmp_path)
    assert dumped.returncode == 1
    assert dumped.stderr.splitlines()[-1] == (
        "Error: [fields.label] categories: 65537 distinct values are more than the limit of 65,536 values; "
        "a column of that many values is an id, not a label: use it as a number"
    )
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()
