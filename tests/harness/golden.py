"""The golden epochs' table, configs and digests (pinned by tests/test_golden.py, met again on Ray).

The table is built from integer arithmetic only (every value exact in float), so any PostgreSQL server
generates the same rows. A digest covers every chunk file of the epoch (the fields, the keys, the chunk
checksums, the padded lengths), by relative path; the manifest is left out (it records times and the
snapshot).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .dumps import chunk_bytes

TABLE = (
    "CREATE TABLE g (id int PRIMARY KEY, series int, t int, v real, w float8, arr int4[], word text, label int)",
    "INSERT INTO g SELECT i, i / 40, i % 40, (i % 13) * 0.25, CASE WHEN i % 11 = 0 THEN NULL ELSE i / 8.0 END,"
    " array_fill(i % 5, ARRAY[1 + i % 4]), (ARRAY['ant', 'bee', 'cat'])[1 + i % 3], i % 7"
    " FROM generate_series(1, 800) i",
)

QUERY = """
[samples]
keys = "SELECT id FROM g"
query = "SELECT v, w, arr, word, label FROM g WHERE id = $1"
[fields.v]
columns = ["v"]
dtype = "float32"
[fields.w]
columns = ["w"]
dtype = "float64"
null = "nan"
[fields.arr]
columns = ["arr"]
dtype = "int16"
max_length = 4
pad = -1
[fields.word]
columns = ["word"]
dtype = "int8"
categories = "auto"
[fields.label]
columns = ["label"]
dtype = "int64"
[batches]
size = 32
seed = 7
drop_last = false
"""

SCAN_ROWS = """
[samples]
table = "g"
key = ["id"]
[fields.v]
columns = ["v"]
dtype = "float32"
[fields.word]
columns = ["word"]
dtype = "int16"
categories = ["cat", "bee", "ant"]
[fields.label]
columns = ["label"]
dtype = "int32"
[batches]
size = 50
seed = 3
drop_last = true
"""

SCAN_WINDOWS = """
[samples]
table = "g"
key = ["series"]
order = "t"
window = 8
stride = 4
[fields.x]
columns = ["v", "label"]
dtype = "float32"
[batches]
size = 16
seed = 11
drop_last = false
"""

GOLDEN = {
    "query": "9d189e58fef9afeca9fe565c92b3cb0b344574827d7ffc92549fc4b93cad91db",
    "scan_rows": "edf610751c728d1e07ed6d1eee525a2b0a14f6e86eca98052cac06e74dc37b09",
    "scan_windows": "332061867088d3165a831d3b33817ace049200288445d117c5cd13c64a4b28c2",
}


def digest(epoch_path: Path) -> str:
    h = hashlib.sha256()
    for name, data in chunk_bytes(epoch_path).items():
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def golden_config(
    folder: Path,
    body: str = QUERY,
    *,
    store: str = "store.zarr",
    compression: str = "none",
    name: str = "g.toml",
    source: str = "",
) -> Path:
    """A golden config (``body``: QUERY, SCAN_ROWS or SCAN_WINDOWS) with its ``[source]`` (``source`` lines added)."""
    config = folder / name
    lines = "[source]\nconnections = 2\n" + (f"{source}\n" if source else "")
    config.write_text(f'{lines}[store]\npath = "{store}"\ncompression = "{compression}"\n{body}')
    return config
