"""Golden epochs: the bytes a config dumps are pinned, so that a change of the code's plan cannot change them.

The digests (tests/harness/golden.py, with the table and configs; the Ray tests meet them too) were taken
from the code as it stood before the package was split into subpackages (#24) and must not move: a store
written before an upgrade and one written after hold the same epochs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness.db import execute
from .harness.dumps import dump
from .harness.golden import GOLDEN, QUERY, SCAN_ROWS, SCAN_WINDOWS, TABLE, digest, golden_config


@pytest.mark.parametrize(("name", "body"), [("query", QUERY), ("scan_rows", SCAN_ROWS), ("scan_windows", SCAN_WINDOWS)])
def test_an_epoch_is_byte_identical_to_the_golden_one(db: str, tmp_path: Path, name: str, body: str) -> None:
    execute(db, *TABLE)
    result = dump(golden_config(tmp_path, body, name=f"{name}.toml"), db, epoch=2)
    assert digest(Path(result.path)) == GOLDEN[name]
