"""The *mixed* windows dataset: a second windows shape for the scan mode's ceiling ratio (issue 29).

``sensors`` holds ``SERIES`` series of ``steps(scale)`` rows, five columns besides the key and the order:
``f0 double precision``, ``f1 real``, ``f2 smallint`` (cast into one float32[48, 3] field) and a ``flag
boolean`` (a bool[48] field). The *windows* dataset (64 rows of ``real``, ``double precision`` and
``smallint`` into float32 and int64) is the other shape: narrower windows of wider, mixed rows cost the scan
more per byte, which is why a second shape is measured at all (4.4x the ceiling where 64-row windows made
6.0x). ``sensor_samples`` holds the query mode's start points (every ``STRIDE``-th step, four series in
five), as ``train_samples`` does for *windows*; the scan dumps every window at stride 1.
"""

from __future__ import annotations

import asyncpg
import numpy as np

from .datasets import Dataset

SERIES = 300  # a few hundred series, whatever the scale: the scale sets their length
WINDOW = 48
STRIDE = 4
STEPS_PER_SCALE = 256  # scale 16 (the default) -> 4,096 steps a series, 1.2M rows

MIXED_FIELDS = """
[fields.x]
columns = ["f0", "f1", "f2"]
dtype = "float32"

[fields.flag]
columns = ["flag"]
dtype = "bool"
"""


def steps(scale: float) -> int:
    """Rows per series at ``scale`` (at least two windows' worth)."""
    return max(2 * WINDOW, round(STEPS_PER_SCALE * scale))


def train_count(scale: float) -> int:
    """Query-mode start points at ``scale``: every ``STRIDE``-th step of four series in five."""
    return (SERIES - SERIES // 5) * ((steps(scale) - WINDOW) // STRIDE + 1)


def scan_count(scale: float) -> int:
    """Windows the scan dumps at ``scale``: every start of every series (stride 1)."""
    return SERIES * (steps(scale) - WINDOW + 1)


async def load(conn: asyncpg.Connection, scale: float) -> int:
    """(Re)create ``sensors`` and ``sensor_samples``; return the query mode's sample count."""
    await conn.execute(
        """
        DROP TABLE IF EXISTS sensors, sensor_samples;
        CREATE TABLE sensors (
            series_id integer NOT NULL,
            t integer NOT NULL,
            f0 double precision NOT NULL,
            f1 real NOT NULL,
            f2 smallint NOT NULL,
            flag boolean NOT NULL,
            PRIMARY KEY (series_id, t)
        );
        CREATE TABLE sensor_samples (series_id integer, start_t integer, PRIMARY KEY (series_id, start_t));
        """
    )
    await conn.execute(
        """
        INSERT INTO sensors
        SELECT s, t,
               (hashint8extended(s::bigint * 1000003 + t, 11) % 1000000) / 1e4,
               cos(s * 0.13 + t * 0.07)::real,
               (hashint8extended(s::bigint * 1000003 + t, 13) % 30000)::smallint,
               hashint8extended(s::bigint * 1000003 + t, 17) % 3 = 0
        FROM generate_series(1, $1::int) AS s, generate_series(0, $2::int - 1) AS t
        ORDER BY s, t
        """,
        SERIES,
        steps(scale),
    )
    await conn.execute(
        "INSERT INTO sensor_samples SELECT series_id, t FROM sensors "
        "WHERE t % $1::int = 0 AND t <= $2::int AND series_id % 5 <> 0",
        STRIDE,
        steps(scale) - WINDOW,
    )
    await conn.execute("ANALYZE sensors, sensor_samples")
    return int(await conn.fetchval("SELECT count(*) FROM sensor_samples"))


def _blog_query(record: asyncpg.Record) -> str:
    a, b = record
    return f"SELECT f0, f1, f2, flag FROM sensors WHERE series_id = {a} AND t >= {b} ORDER BY t LIMIT {WINDOW}"


def _blog_array(rows: list[asyncpg.Record]) -> np.ndarray:
    return np.array([tuple(r) for r in rows], dtype=np.float32)  # (48, 4)


MIXED = Dataset(
    name="mixed",
    keys="SELECT series_id, start_t FROM sensor_samples",
    query=f"SELECT f0, f1, f2, flag FROM sensors WHERE series_id = $1 AND t >= $2 ORDER BY t LIMIT {WINDOW}",
    rows=WINDOW,
    batch_size=256,
    drop_last=True,
    fields=MIXED_FIELDS,
    blog_keys="SELECT series_id, start_t FROM sensor_samples TABLESAMPLE SYSTEM (100)",
    blog_query=_blog_query,
    blog_array=_blog_array,
    loader=load,
    counter=train_count,
)
