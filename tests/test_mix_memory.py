"""A mixed epoch's budget is shared by what each source needs, and a refusal names the least ``--memory`` (#52).

The new user's case, scaled down: a large scan source beside two small query sources. Dividing the budget
equally among three sources refused the scan source a share that its table fits once the query sources'
keys (a few KB) are counted for what they are.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, dump_argv
from .harness.mixing import CODE, MIX_TABLES, WEB, mix_config

ROWS = 250_000  # about 9 MB decoded, 22 MB while read and cut (twice the table and its plan)
BIG = {"table": "events", "key": "id"}


@pytest.fixture
def big_mix_db(db: str) -> str:
    execute(
        db,
        *MIX_TABLES,
        "CREATE TABLE events (id bigint PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        f"INSERT INTO events SELECT i, 3000000 + i, i * 0.125, i % 3 FROM generate_series(1, {ROWS}) i",
        "ANALYZE events",
    )
    return db


def _config(tmp_path: Path, memory: str, store: str) -> Path:
    """The mix under ``[source] memory = memory``, into its own store."""
    sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}, "events": {"weight": 2, **BIG}}
    config = mix_config(tmp_path, sources, size=100, samples=2000, store=store, name=f"{store}.toml")
    config.write_text(config.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1))
    return config


def test_a_scan_source_takes_what_the_query_sources_leave_not_a_third(big_mix_db: str, tmp_path: Path) -> None:
    """Under 48 MiB a third (16 MiB, 10 for data) does not hold the table (17 MiB as read); what is left does."""
    shared = dump(_config(tmp_path, "48MiB", "shared.zarr"), big_mix_db)
    whole = dump(_config(tmp_path, "4GiB", "whole.zarr"), big_mix_db)
    assert shared.sources == whole.sources
    assert chunk_bytes(shared.path) == chunk_bytes(whole.path)


def test_a_scan_source_beyond_its_share_is_refused_naming_the_least_memory_that_holds_it(
    big_mix_db: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, "24MiB", "small.zarr")
    proc = subprocess.run([*dump_argv(config, big_mix_db), "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    error = json.loads(proc.stdout)["error"]
    assert "Traceback" not in proc.stderr
    m = re.fullmatch(
        r"\[samples\.events\] table: 250,000 rows need about (\d+) MiB in memory, more than its share of \[source\] "
        r"memory \(24 MiB beside the other sources\); a mixed epoch's scan sources are read whole: the least "
        r"budget that holds it is --memory (\d+)MiB",
        error,
    )
    assert m is not None, error
    least = int(m.group(2))
    assert 24 < least <= 256
    named = dump(_config(tmp_path, f"{least}MiB", "least.zarr"), big_mix_db)
    whole = dump(_config(tmp_path, "4GiB", "whole.zarr"), big_mix_db)
    assert chunk_bytes(named.path) == chunk_bytes(whole.path)  # the budget it names is enough
