"""Scan mode on a real two-node Ray cluster: the table read once in ranges, routed to the parts, the same bytes.

The cluster is the session's ``ray_cluster`` (tests/conftest.py). The single process's epochs are the
reference: the golden digests, and dumps of the same config side by side. The fault scenarios (a reader
killed, connections lost mid-read, a node removed while the parts write) run under ``make chaos``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pgprefetch
from pgprefetch.errors import SampleError, SourceError
from pgprefetch.write.scan.exchange import Piece, cut_block, join_pieces, merge_keys, route, rows_of
from pgprefetch.write.scan.table import Table

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump
from .harness.faults import kill_every_connection
from .harness.golden import GOLDEN, QUERY, SCAN_ROWS, SCAN_WINDOWS, TABLE, digest, golden_config
from .harness.properties import key_arrays
from .harness.raycluster import fault_mid_dump, manifest, on_ray, part_journal_lines, parts_running
from .harness.s3 import S3

# The golden query config's fields as a scan: a NULL mask, padded arrays, "auto" categories, a padded last batch.
SCAN_ALL = '[samples]\ntable = "g"\nkey = ["id"]\n' + QUERY[QUERY.index("[fields.v]") :]
# New versions of a third of the rows go to the table's end: each range read holds rows from all over the
# key order, and a part's rows come from every block, as in a table that is written to.
SCRAMBLE = "UPDATE g SET label = label WHERE id % 3 = 0"


@pytest.mark.parametrize(("golden", "body"), [("scan_rows", SCAN_ROWS), ("scan_windows", SCAN_WINDOWS)])
def test_scan_epochs_spread_over_ray_are_the_golden_epochs_byte_for_byte(
    ray_cluster: object, db: str, tmp_path: Path, golden: str, body: str
) -> None:
    execute(db, *TABLE, SCRAMBLE)
    spread = golden_config(tmp_path, body, name="r.toml", store="ray.zarr")
    (result,) = pgprefetch.dump(spread, epochs=2, dsn=db, executor="ray", parts=3)
    assert digest(Path(result.path)) == GOLDEN[golden]  # every array, keys, _checksums and _longest
    single = dump(golden_config(tmp_path, body, name="s.toml", store="single.zarr"), db, epoch=2)
    ours, theirs = manifest(result.path), manifest(single.path)
    assert ours["stats"] == theirs["stats"]
    assert (ours["executor"], ours["parts"], result.rows_read, single.rows_read) == ("ray", 3, 800, 800)


def test_memory_bounds_what_each_reader_and_part_holds_with_the_same_bytes(
    ray_cluster: object, db: str, tmp_path: Path
) -> None:
    execute(
        db,
        "CREATE TABLE wide (id int PRIMARY KEY, a float8, b float8, c float8, d float8, e float8, f float8)",
        "INSERT INTO wide SELECT i, i, i * 0.5, -i, i % 7, i % 11, sqrt(i) FROM generate_series(1, 40000) i",
        "UPDATE wide SET a = a WHERE id % 3 = 0",  # out of key order on disk, as a table being written to is
    )
    body = '[samples]\ntable = "wide"\nkey = ["id"]\n[fields.x]\ncolumns = ["a", "b", "c", "d", "e", "f"]\n'
    body += 'dtype = "float32"\n[batches]\nsize = 500\nseed = 1\n'
    spread = golden_config(tmp_path, body, name="r.toml", store="ray.zarr", source='memory = "1MiB"')
    (result,) = pgprefetch.dump(spread, epochs=0, dsn=db, executor="ray", parts=2)
    single = dump(golden_config(tmp_path, body, name="s.toml", store="single.zarr"), db)
    assert chunk_bytes(Path(result.path)) == chunk_bytes(Path(single.path))
    # 2.3 MB of decoded rows: a part holds its pieces and their join, so 2 x 2.3 MB / 1 MiB -> 8 parts
    assert result.parts == 8


def test_a_spread_scan_of_every_field_kind_equals_the_single_process_compressed_locally_and_on_s3(
    ray_cluster: object, db: str, tmp_path: Path, s3: S3
) -> None:
    execute(db, *TABLE, SCRAMBLE)
    single = dump(golden_config(tmp_path, SCAN_ALL, name="s.toml", store="single.zarr", compression="zstd"), db)
    local = golden_config(tmp_path, SCAN_ALL, name="l.toml", store="ray.zarr", compression="zstd")
    (spread,) = pgprefetch.dump(local, epochs=0, dsn=db, executor="ray", parts=3)
    assert chunk_bytes(Path(spread.path)) == chunk_bytes(Path(single.path))
    assert manifest(spread.path)["stats"] == manifest(single.path)["stats"]
    assert manifest(spread.path)["longest"] == manifest(single.path)["longest"]
    bucket = s3.bucket()
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}  # the workers' moto
    remote = golden_config(tmp_path, SCAN_ALL, name="r.toml", store=f"s3://{bucket}/scan", compression="zstd")
    pgprefetch.dump(remote, epochs=0, dsn=db, executor="ray", parts=2, ray_env=env)
    objects = s3.objects(bucket, "scan/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))
    assert json.loads(objects["zarr.json"])["attributes"]["pgprefetch"]["stats"] == manifest(single.path)["stats"]


def test_epochs_of_one_spread_run_are_cut_from_one_read_of_the_table(
    ray_cluster: object, db: str, tmp_path: Path
) -> None:
    execute(db, *TABLE)
    spread = golden_config(tmp_path, SCAN_WINDOWS, name="r.toml", store="ray.zarr")
    results = pgprefetch.dump(spread, epochs=range(3), dsn=db, executor="ray", parts=2)
    assert [r.rows_read for r in results] == [800, 0, 0]
    assert len({manifest(r.path)["snapshot"] for r in results}) == 1  # one snapshot serves the run
    singles = pgprefetch.dump(
        golden_config(tmp_path, SCAN_WINDOWS, name="s.toml", store="single.zarr"), epochs=range(3), dsn=db
    )
    for ours, theirs in zip(results, singles, strict=True):
        assert chunk_bytes(Path(ours.path)) == chunk_bytes(Path(theirs.path))


def test_bad_data_met_on_the_cluster_is_the_single_process_error_and_nothing_is_published(
    ray_cluster: object, db: str, tmp_path: Path
) -> None:
    execute(db, *TABLE, "UPDATE g SET v = NULL WHERE id = 377")  # a NULL where the field takes none
    spread, single = (golden_config(tmp_path, SCAN_ROWS, name=f"{n}.toml", store=f"{n}.zarr") for n in ("r", "s"))
    with pytest.raises(SampleError) as theirs:
        dump(single, db)
    with pytest.raises(SampleError) as ours:
        pgprefetch.dump(spread, epochs=0, dsn=db, executor="ray", parts=2)
    assert str(ours.value) == str(theirs.value)
    assert "377" in str(ours.value)
    assert [e.state for e in pgprefetch.ls(tmp_path / "r.zarr")] == ["partial"]  # kept for a rerun, not published
    execute(db, "UPDATE g SET t = 1 WHERE id = 42")  # two rows of one series at one order value: a reader's sort
    with pytest.raises(SampleError) as theirs:
        dump(golden_config(tmp_path, SCAN_WINDOWS, name="sw.toml", store="sw.zarr"), db)
    with pytest.raises(SampleError) as ours:
        pgprefetch.dump(golden_config(tmp_path, SCAN_WINDOWS, name="rw.toml", store="rw.zarr"), epochs=0, dsn=db,
                        executor="ray", parts=2)  # fmt: skip
    assert str(ours.value) == str(theirs.value)
    execute(db, "TRUNCATE g")
    with pytest.raises(SourceError, match="g has no rows: there is nothing to dump"):
        pgprefetch.dump(spread, epochs=0, dsn=db, executor="ray", parts=2)


@st.composite
def _blocks(draw: st.DrawFn) -> list[np.ndarray]:
    """The key columns of a few read blocks, each sorted in itself; a block may be empty, keys may repeat across."""
    width = draw(st.sampled_from([1, 2]))
    out = []
    for keys in draw(st.lists(key_arrays(widths=(width,), max_keys=40, repeats=False), min_size=1, max_size=4)):
        out.append(np.ascontiguousarray(keys[:, np.lexsort(keys[::-1])]) if keys.shape[1] else keys)
    return out


@given(blocks=_blocks(), data=st.data())
def test_a_part_joins_its_pieces_into_the_rows_its_samples_span_in_the_table_s_order(
    blocks: list[np.ndarray], data: st.DataObject
) -> None:
    n = sum(k.shape[1] for k in blocks)
    window = data.draw(st.integers(1, max(1, min(n, 8))), label="window")
    assume(n >= window)
    merged = merge_keys(blocks)
    concatenated = np.concatenate(blocks, axis=1)
    assert np.array_equal(merged.keys, concatenated[:, np.lexsort(concatenated[::-1])])
    assert np.array_equal(merged.keys, concatenated[:, merged.order])
    column, ids = object(), object()
    tables = []
    for b, k in enumerate(blocks):  # each row's value: its first key slot * 10; and which row it is
        first = int(merged.offsets[b])
        table = Table(keys=k, values={column: k[0] * 10, ids: np.arange(first, first + k.shape[1])})  # type: ignore[dict-item]
        if data.draw(st.booleans(), label=f"block {b} has NULLs"):
            table.masks[column] = data.draw(hnp.arrays(np.bool_, k.shape[1]), label=f"block {b}'s NULLs")  # type: ignore[index]
        tables.append(table)
    starts = np.array(
        data.draw(st.lists(st.integers(0, n - window), min_size=1, max_size=12), label="starts"), dtype=np.int64
    )
    rows = rows_of(starts, window)
    routed = route(rows, merged)
    pieces: list[Piece] = [cut_block(block, [wanted])[0] for block, wanted in zip(tables, routed, strict=True)]
    table, places = join_pieces(pieces)
    assert np.array_equal(places, rows)
    assert np.array_equal(table.values[ids], merged.order[rows])  # type: ignore[index]
    assert np.array_equal(table.values[column], merged.keys[0][rows] * 10)  # type: ignore[index]
    # A block without NULLs in a column sends no mask for it: joined with one that has NULLs, its rows are not NULL.
    every = np.concatenate([t.masks.get(column, np.zeros(t.keys.shape[1], bool)) for t in tables])  # type: ignore[call-overload]
    joined = table.masks.get(column, np.zeros(rows.size, bool))  # type: ignore[call-overload]
    assert np.array_equal(joined, every[merged.order[rows]])
    if not any(column in t.masks for t in tables):
        assert column not in table.masks  # (as the single process keeps none for a table without NULLs)
    local = np.searchsorted(places, starts)
    for s, at in zip(starts, local, strict=True):  # a window's rows are consecutive in the part's table
        assert np.array_equal(table.values[column][at : at + window], merged.keys[0][s : s + window] * 10)  # type: ignore[index]


@pytest.mark.parametrize("window", [1, 3, 64])
@given(data=st.data())
def test_the_rows_a_part_needs_are_each_row_its_samples_span_once_in_table_order(
    window: int, data: st.DataObject
) -> None:
    n_rows = data.draw(st.integers(window, window + 5000), label="rows")
    starts = data.draw(
        hnp.arrays(np.int64, st.integers(0, 400), elements=st.integers(0, n_rows - window)), label="starts"
    )
    spanned = np.zeros(n_rows, dtype=bool)  # repeats and overlaps included
    for offset in range(window):
        spanned[starts + offset] = True
    assert np.array_equal(rows_of(starts, window), np.flatnonzero(spanned))
    assert rows_of(np.empty(0, dtype=np.int64), window).size == 0


def _big(db: str, tmp_path: Path) -> tuple[Path, Path]:
    """A table whose spread dump takes a few seconds (faults land mid-read or mid-write), and its two configs."""
    columns = ", ".join(f"c{i} float8" for i in range(12))
    values = ", ".join(f"i * {i + 1}.5" for i in range(12))
    execute(
        db,
        f"CREATE TABLE big (id int PRIMARY KEY, {columns})",
        f"INSERT INTO big SELECT i, {values} FROM generate_series(1, 400000) i",
        "UPDATE big SET c0 = c0 WHERE id % 5 = 0",
    )
    body = '[samples]\ntable = "big"\nkey = ["id"]\n[fields.x]\ncolumns = ['
    body += ", ".join(f'"c{i}"' for i in range(12)) + ']\ndtype = "float32"\n[batches]\nsize = 256\nseed = 9\n'
    return (golden_config(tmp_path, body, name="r.toml", store="ray.zarr"),
            golden_config(tmp_path, body, name="s.toml", store="single.zarr"))  # fmt: skip


def _faulted(
    db: str, tmp_path: Path, parts: int, when: Callable[[], object], fault: Callable[[], object]
) -> tuple[Any, bytes]:
    """Dump ``_big``'s table on Ray, doing ``fault`` once ``when`` holds; the result, and the single process's bytes."""
    spread, single = _big(db, tmp_path)
    expected = chunk_bytes(Path(dump(single, db).path))
    result = fault_mid_dump(lambda: on_ray(spread, db, parts=parts), when, fault, join=240, step=0.02)
    return result, expected


def _mid_read(cluster: Any) -> Callable[[], bool]:
    """Whether a reader has been reading for a moment."""
    seen: list[float] = []

    def reading() -> bool:
        if not seen and parts_running(cluster, "read_block"):
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() > seen[0] + 0.3

    return reading


@pytest.mark.chaos
def test_a_reader_killed_with_kill_9_mid_read_is_rerun_by_ray_and_the_epoch_is_unchanged(
    ray_cluster: Any, db: str, tmp_path: Path
) -> None:
    kill = lambda: os.kill(parts_running(ray_cluster, "read_block")[0].pid, 9)  # noqa: E731
    result, expected = _faulted(db, tmp_path, 2, _mid_read(ray_cluster), kill)
    assert chunk_bytes(Path(result.path)) == expected


@pytest.mark.chaos
def test_connections_lost_mid_read_retry_the_epoch_on_a_new_snapshot_with_the_same_bytes(
    ray_cluster: Any, db: str, tmp_path: Path
) -> None:
    result, expected = _faulted(db, tmp_path, 2, _mid_read(ray_cluster), lambda: kill_every_connection(db))
    assert result.retries == 1
    assert chunk_bytes(Path(result.path)) == expected


@pytest.mark.chaos
def test_a_node_removed_while_the_parts_write_rebuilds_what_it_held_and_the_epoch_is_unchanged(
    ray_cluster: Any, db: str, tmp_path: Path
) -> None:
    node = ray_cluster.add_node(num_cpus=1)  # a third node: it holds a block, pieces and a part
    ray_cluster.wait_for_nodes()
    writing = lambda: part_journal_lines(tmp_path / "ray.zarr") >= 3  # noqa: E731  (the parts write: the read is over)
    # Its block, its pieces and its part are lost: rebuilt from lineage, rerun.
    result, expected = _faulted(db, tmp_path, 3, writing, lambda: ray_cluster.remove_node(node))
    assert sum(result.part_retries) >= 1
    assert chunk_bytes(Path(result.path)) == expected
