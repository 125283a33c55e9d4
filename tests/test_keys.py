"""UUID key columns: two int64 slots each, the shuffle a pure function of them, the UUIDs given back."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import numpy as np
import pytest

from pgprefetch import EpochDataset, KeyColumns, uuid_bytes, uuid_slots
from pgprefetch.errors import SampleError

from .harness.configs import write_config
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays

N = 300


def make_items(dsn: str, name: str = "u", order: str = "random()") -> None:
    # md5-made uuids: deterministic, and about half of them have the high bit set (negative int64 halves).
    execute(
        dsn,
        f"CREATE TABLE {name} (id uuid PRIMARY KEY, part int NOT NULL, v real NOT NULL, tag text)",
        f"""INSERT INTO {name} SELECT md5(i::text)::uuid, i % 3, i * 0.5, CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END
            FROM generate_series(1, {N}) i ORDER BY {order}""",
    )


def uuid_config(folder: Path, table: str = "u", **overrides: object) -> Path:
    settings: dict[str, object] = {
        "keys": f"SELECT part, id FROM {table}",
        "query": f"SELECT v FROM {table} WHERE id = $2 AND part = $1",
        "fields": {"v": (["v"], "float32")},
        "size": 32,
        "drop_last": False,
    }
    folder.mkdir(exist_ok=True)
    return write_config(folder, **{**settings, **overrides})  # type: ignore[arg-type]


def test_uuid_slots_and_bytes_round_trip_including_high_bits() -> None:
    values = [uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1), uuid.UUID("80000000-0000-0000-ffff-000000000001")]
    slots = uuid_slots(values)
    assert slots.dtype == np.int64
    assert slots[1].tolist() == [-1, -1]
    assert [bytes(row) for row in uuid_bytes(slots)] == [v.bytes for v in values]
    columns = KeyColumns(("id",), (True,))
    assert [columns.values(row)[0] for row in slots.tolist()] == values


def test_uuid_keys_round_trip_and_each_sample_equals_the_database(db: str, tmp_path: Path) -> None:
    make_items(db)
    result = dump(uuid_config(tmp_path), db)
    manifest = EpochDataset(result.path.parent, 0, consumer=None).manifest
    assert (manifest["key_columns"], manifest["key_types"]) == (["part", "id"], ["int", "uuid"])
    truth = {(r["part"], r["id"]): r["v"] for r in fetch(db, "SELECT part, id, v FROM u")}
    ds = EpochDataset(result.path.parent, 0, consumer=None)
    seen = []
    for i in range(len(ds)):
        keys = ds.sample_keys(i)
        v = ds[i]["v"].tolist()
        assert all(isinstance(k[1], uuid.UUID) for k in keys)
        assert v == [truth[k] for k in keys]
        stored = ds.batch_keys(i).numpy()
        assert [bytes(b) for b in uuid_bytes(stored[:, 1:3])] == [k[1].bytes for k in keys]
        seen += keys
    assert len(seen) == N  # a permutation of the table
    assert set(seen) == set(truth)
    assert read_arrays(result)["keys"].shape[-1] == 3  # part, then the uuid's two slots


def test_the_epoch_is_a_pure_function_of_the_uuid_keys_not_of_their_order(db: str, tmp_path: Path) -> None:
    make_items(db, "u")
    make_items(db, "w", order="i DESC")  # the same rows, in another heap order
    a = dump(uuid_config(tmp_path / "a", "u"), db)
    b = dump(uuid_config(tmp_path / "b", "w"), db)
    assert chunk_bytes(a.path) == chunk_bytes(b.path)
    other = dump(uuid_config(tmp_path / "c", "u"), db, epoch=1)
    assert chunk_bytes(other.path) != chunk_bytes(a.path)  # another epoch, another order


def test_errors_name_a_sample_by_its_uuid(db: str, tmp_path: Path) -> None:
    make_items(db)
    victim = fetch(db, "SELECT id FROM u ORDER BY id LIMIT 1")[0]["id"]
    execute(db, "ALTER TABLE u ALTER COLUMN v DROP NOT NULL", f"UPDATE u SET v = NULL WHERE id = '{victim}'")
    with pytest.raises(SampleError, match=f"sample \\(part=\\d, id={victim}\\): field v, column v is NULL"):
        dump(uuid_config(tmp_path), db)


def test_an_unknown_category_is_looked_up_by_its_uuid_key(db: str, tmp_path: Path) -> None:
    make_items(db)
    fields = {"tag": (["tag"], "int8", {"categories": ["even"]})}
    cfg = uuid_config(tmp_path, query="SELECT tag FROM u WHERE id = $2 AND part = $1", fields=fields)
    with pytest.raises(SampleError, match=r"id=[0-9a-f-]{36}\): field tag, column tag value 'odd' is not in"):
        dump(cfg, db)


def test_repeated_and_null_uuid_keys_are_named(db: str, tmp_path: Path) -> None:
    make_items(db)
    twice = {str(r["id"]) for r in fetch(db, "SELECT id FROM u WHERE v < 2")}  # 3 keys
    repeated = uuid_config(tmp_path, keys="SELECT part, id FROM u UNION ALL SELECT part, id FROM u WHERE v < 2")
    with pytest.raises(SampleError, match=r"returned 3 repeated key\(s\)") as e:
        dump(repeated, db)
    assert set(re.findall(r"id=([0-9a-f-]{36})", str(e.value))) == twice
    nulls = uuid_config(tmp_path, keys="SELECT part, id FROM u UNION ALL SELECT 0, NULL::uuid", name="n.toml")
    with pytest.raises(SampleError, match='NULL in key column "id"'):
        dump(nulls, db)


def test_a_uuid_keys_query_may_end_in_a_comment(db: str, tmp_path: Path) -> None:
    make_items(db)
    result = dump(uuid_config(tmp_path, keys="SELECT part, id FROM u -- every item"), db)
    assert result.n_samples == N
