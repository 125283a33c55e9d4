"""Real schemas: values that do not fit their dtype, repeated keys, NULL policies and categorical labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgprefetch import EpochDataset
from pgprefetch.errors import SampleError

from .harness.configs import s_config, scan_config, write_config
from .harness.db import execute, fetch
from .harness.dumps import dump, read_arrays


@pytest.fixture
def odd(db: str) -> str:
    """``o``: 64 rows of in-range values, and one misfit each at ids 5 to 9."""
    execute(
        db,
        "CREATE TABLE o (id int PRIMARY KEY, n numeric, ts timestamptz, f float8, label text)",
        """INSERT INTO o SELECT i, i, timestamptz '2023-11-14 22:13:20+00' + i * interval '1 s', i / 4.0,
           CASE WHEN i % 3 = 0 THEN 'M' ELSE 'B' END FROM generate_series(1, 64) i""",
        "UPDATE o SET n = 339 WHERE id = 5",
        "UPDATE o SET f = 70000 WHERE id = 6",
        "UPDATE o SET f = 'NaN' WHERE id = 7",
        "UPDATE o SET n = 2.5 WHERE id = 8",
        "UPDATE o SET label = 'X' WHERE id = 9",
    )
    return db


def one_sample(tmp_path: Path, key: int, column: str, dtype: str, **options: object) -> Path:
    """A config whose epoch is the single sample ``key`` of ``o``, field ``x`` from ``column``."""
    return write_config(
        tmp_path,
        keys=f"SELECT id FROM o WHERE id = {key}",
        query=f"SELECT {column} FROM o WHERE id = $1",
        fields={"x": ([column], dtype, options)},
        size=1,
    )


def one_sample_scanned(tmp_path: Path, key: int, column: str, dtype: str) -> Path:
    """:func:`one_sample` in scan mode: the sample is a row of a SELECT read whole, cut on the client."""
    return scan_config(
        tmp_path,
        table=f"SELECT id, {column} FROM o WHERE id = {key}",
        key="id",
        fields={"x": ([column], dtype)},
        size=1,
    )


@pytest.mark.parametrize("mode", ["query", "scan"])
@pytest.mark.parametrize(
    ("key", "column", "dtype", "shown", "advice"),
    [
        (5, "n", "int8", "value 339.0 does not fit int8 (range -128..127)", '"int16" to hold it'),
        (1, "ts", "int32", "value 1700000001000000 (µs since 1970-01-01) does not fit int32 (range ", '"int64"'),
        (
            6,
            "f",
            "float16",
            "value 70000.0 does not fit float16 (largest 65504)",
            '"float32" to hold it, or cast = "unsafe" to store it as infinity',
        ),
        (7, "f", "int32", "value nan does not fit int32 (range ", '"float32" to hold it'),
        (8, "n", "int64", "value 2.5 does not fit int64 (not a whole number)", '"float32" to hold it'),
        (2, "n", "bool", "value 2.0 does not fit bool (only 0 and 1 fit bool)", '"int8" to hold it'),
    ],
    ids=["whole-int8", "timestamp-int32", "large-float16", "nan-int32", "fraction-int64", "two-bool"],
)
def test_value_that_does_not_fit_the_dtype_stops_the_dump_naming_the_dtype_that_holds_it(
    odd: str, tmp_path: Path, mode: str, key: int, column: str, dtype: str, shown: str, advice: str
) -> None:
    make = one_sample if mode == "query" else one_sample_scanned
    with pytest.raises(SampleError) as excinfo:
        dump(make(tmp_path, key, column, dtype), odd)
    message = str(excinfo.value)
    assert message.startswith(f"sample (id={key}): field x, column {column} {shown}")
    assert f"; set [fields.x] dtype = {advice}" in message
    assert message.endswith("to hold it" if "infinity" not in advice else "as infinity")
    assert ("unsafe" in message) == (dtype == "float16")  # never advised where it would wrap or make up a value
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()


@pytest.mark.parametrize(
    ("column", "dtype", "value", "advised"),
    [("n", "int8", 3300, "int16"), ("n", "int16", -40000, "int32"), ("n", "uint8", -1, "int8"),
     ("n", "int32", 2**40, "int64"), ("n", "int64", 2.0**70, "float32"), ("f", "int8", 0.5, "float32"),
     ("f", "float32", 1e300, "float64")],
)  # fmt: skip
def test_following_the_advice_dumps_the_value_unchanged(
    odd: str, tmp_path: Path, column: str, dtype: str, value: float, advised: str
) -> None:
    execute(odd, f"UPDATE o SET {column} = {value!r} WHERE id = 10")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(SampleError, match=f'dtype = "{advised}" to hold it'):
        dump(one_sample(tmp_path / "a", 10, column, dtype), odd)
    x = read_arrays(dump(one_sample(tmp_path / "b", 10, column, advised), odd))["x"]
    assert (x.dtype.name, x.reshape(-1)[0].item()) == (advised, value)


@pytest.mark.parametrize(
    ("key", "column", "dtype", "expected"),
    [(5, "n", "int8", 339 - 256), (6, "f", "float16", np.inf), (8, "n", "int64", 2)],
)
def test_unsafe_cast_lets_a_lossy_value_through(
    odd: str, tmp_path: Path, key: int, column: str, dtype: str, expected: float
) -> None:
    result = dump(one_sample(tmp_path, key, column, dtype, cast="unsafe"), odd)
    assert read_arrays(result)["x"].reshape(-1)[0] == expected


def test_values_that_fit_narrow_dtypes_pass_unchanged(odd: str, tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        keys="SELECT id FROM o WHERE id NOT IN (5, 6, 7, 8)",
        query="SELECT n, f FROM o WHERE id = $1",
        fields={"n": (["n"], "int8"), "f": (["f"], "float16")},
        size=4,
    )
    arrays = read_arrays(dump(path, odd))
    keys = arrays["keys"].reshape(-1)
    truth = {r["id"]: (r["n"], r["f"]) for r in fetch(odd, "SELECT id, n, f FROM o")}
    assert arrays["n"].reshape(-1).tolist() == [int(truth[k][0]) for k in keys]
    assert arrays["f"].reshape(-1).tolist() == [float(np.float16(truth[k][1])) for k in keys]


# ---------------------------------------------------------------- repeated keys

REPEATED = "SELECT id FROM s UNION ALL SELECT id FROM s WHERE id <= 3"


@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_repeated_keys_fail_naming_the_first_ones(s_table: str, tmp_path: Path, fraction: float) -> None:
    with pytest.raises(SampleError) as excinfo:
        dump(s_config(tmp_path, keys=REPEATED, fraction=fraction), s_table)
    assert str(excinfo.value) == (
        "the keys query returned 3 repeated key(s), e.g. (id=1); (id=2); (id=3): each sample must come once per "
        'epoch; fix the keys query, or set [samples] duplicates = "drop" to keep one of each'
    )


def test_drop_keeps_one_sample_per_repeated_key(s_table: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clean = dump(s_config(tmp_path / "a", keys="SELECT id FROM s"), s_table)
    dropped = dump(s_config(tmp_path / "b", keys=REPEATED, extra_samples='duplicates = "drop"'), s_table)
    assert dropped.duplicates_dropped == 3
    assert dropped.to_json()["duplicates_dropped"] == 3
    assert dropped.n_samples == clean.n_samples == 480
    a, b = read_arrays(clean), read_arrays(dropped)
    assert sorted(b["keys"].reshape(-1).tolist()) == list(range(1, 481))
    for name in ("keys", "v"):
        np.testing.assert_array_equal(a[name], b[name])


# ---------------------------------------------------------------- NULL policies


@pytest.fixture
def gaps(s_table: str) -> str:
    """``s`` with NULL gaps in ``v`` (every 7th id) and an integer column ``q`` NULL every 5th id."""
    execute(
        s_table,
        "ALTER TABLE s ALTER COLUMN v DROP NOT NULL, ADD COLUMN q int",
        "UPDATE s SET q = id * 3",
        "UPDATE s SET v = NULL WHERE id % 7 = 0",
        "UPDATE s SET q = NULL WHERE id % 5 = 0",
    )
    return s_table


def test_null_nan_and_fill_value_keep_the_gaps_with_a_mask(gaps: str, tmp_path: Path) -> None:
    fields = {"v": (["v"], "float32", {"null": "nan"}), "q": (["q"], "int32", {"null": -1})}
    path = s_config(tmp_path, query="SELECT v, q FROM s WHERE id = $1", fields=fields)
    arrays = read_arrays(dump(path, gaps))
    keys = arrays["keys"].reshape(-1)
    truth = {r["id"]: (r["v"], r["q"]) for r in fetch(gaps, "SELECT id, v, q FROM s")}
    v, q = arrays["v"].reshape(-1), arrays["q"].reshape(-1)
    np.testing.assert_array_equal(arrays["v_null"].reshape(-1), [truth[k][0] is None for k in keys])
    np.testing.assert_array_equal(arrays["q_null"].reshape(-1), [truth[k][1] is None for k in keys])
    np.testing.assert_array_equal(v, [np.nan if truth[k][0] is None else truth[k][0] for k in keys])
    np.testing.assert_array_equal(q, [-1 if truth[k][1] is None else truth[k][1] for k in keys])
    assert arrays["v_null"].dtype == bool


def test_null_fill_keeps_the_width_of_a_smallint_column(gaps: str, tmp_path: Path) -> None:
    execute(gaps, "ALTER TABLE s ADD COLUMN h smallint", "UPDATE s SET h = id % 300 WHERE id % 4 <> 0")
    path = s_config(tmp_path, query="SELECT h FROM s WHERE id = $1", fields={"h": (["h"], "int16", {"null": -1})})
    arrays = read_arrays(dump(path, gaps))
    expected = [-1 if k % 4 == 0 else k % 300 for k in arrays["keys"].reshape(-1)]
    assert arrays["h"].reshape(-1).tolist() == expected


def test_null_policy_in_multi_row_samples(gaps: str, tmp_path: Path) -> None:
    path = s_config(
        tmp_path,
        keys="SELECT id FROM s WHERE id <= 470",
        query="SELECT v FROM s WHERE id >= $1 ORDER BY id LIMIT 4",
        rows=4,
        fields={"v": (["v"], "float64", {"null": 0.5})},
    )
    arrays = read_arrays(dump(path, gaps))
    truth = {r["id"]: r["v"] for r in fetch(gaps, "SELECT id, v FROM s")}
    for key, v, mask in zip(
        arrays["keys"].reshape(-1), arrays["v"].reshape(-1, 4), arrays["v_null"].reshape(-1, 4), strict=True
    ):
        rows = [truth[key + i] for i in range(4)]
        assert mask.tolist() == [r is None for r in rows]
        assert v.tolist() == [0.5 if r is None else r for r in rows]


def test_reader_returns_the_mask_with_its_field(gaps: str, tmp_path: Path) -> None:
    path = s_config(tmp_path, fields={"v": (["v"], "float32", {"null": "nan"})})
    result = dump(path, gaps)
    ds = EpochDataset(result.path.parent, 0, fields=["v"], consumer=None)
    batch = ds[0]
    assert set(batch) == {"v", "v_null"}
    np.testing.assert_array_equal(batch["v_null"].numpy(), np.isnan(batch["v"].numpy()))


def test_a_column_shared_with_an_error_field_still_fails_on_null(gaps: str, tmp_path: Path) -> None:
    fields = {"v": (["v"], "float32", {"null": "nan"}), "w": (["v"], "float32")}
    with pytest.raises(SampleError, match=r"field w, column v is NULL \(\d+ NULLs? in this batch\)"):
        dump(s_config(tmp_path, fields=fields), gaps)


# ---------------------------------------------------------------- categories


def test_categories_store_codes_and_the_vocabulary(odd: str, tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        keys="SELECT id FROM o WHERE id <> 9",
        query="SELECT label FROM o WHERE id = $1",
        fields={"label": (["label"], "int8", {"categories": ["B", "M"]})},
        size=9,
    )
    result = dump(path, odd)
    arrays = read_arrays(result)
    truth = {r["id"]: r["label"] for r in fetch(odd, "SELECT id, label FROM o")}
    expected = [["B", "M"].index(truth[k]) for k in arrays["keys"].reshape(-1)]
    assert arrays["label"].reshape(-1).tolist() == expected
    ds = EpochDataset(result.path.parent, 0, consumer=None)
    assert ds.categories == {"label": ["B", "M"]}


def test_value_outside_the_categories_is_named(odd: str, tmp_path: Path) -> None:
    with pytest.raises(SampleError) as excinfo:
        dump(one_sample(tmp_path, 9, "label", "int32", categories=["B", "M"]), odd)
    assert str(excinfo.value) == "sample (id=9): field x, column label value 'X' is not in [fields.x] categories"


def test_auto_categories_are_sorted_and_the_same_every_epoch(odd: str, tmp_path: Path) -> None:
    execute(odd, "UPDATE o SET label = NULL WHERE id = 10")
    path = write_config(
        tmp_path,
        keys="SELECT id FROM o",
        query="SELECT label FROM o WHERE id = $1",
        fields={"label": (["label"], "int16", {"categories": "auto", "null": -1})},
        size=8,
        fraction=0.5,
    )
    truth = {r["id"]: r["label"] for r in fetch(odd, "SELECT id, label FROM o")}
    for epoch in (0, 1):
        result = dump(path, odd, epoch=epoch)
        ds = EpochDataset(result.path.parent, epoch, consumer=None)
        assert ds.categories == {"label": ["B", "M", "X"]}
        arrays = read_arrays(result)
        keys = arrays["keys"].reshape(-1)
        codes = [-1 if truth[k] is None else ["B", "M", "X"].index(truth[k]) for k in keys]
        assert arrays["label"].reshape(-1).tolist() == codes
        assert arrays["label_null"].reshape(-1).tolist() == [truth[k] is None for k in keys]


def test_a_column_named_with_a_dollar_is_not_a_parameter(s_table: str, tmp_path: Path) -> None:
    execute(s_table, "ALTER TABLE s ADD COLUMN col$1 real", "UPDATE s SET col$1 = v * 2")
    arrays = read_arrays(dump(s_config(tmp_path, query="SELECT col$1 AS v FROM s WHERE id = $1"), s_table))
    np.testing.assert_array_equal(arrays["v"].reshape(-1), arrays["keys"].reshape(-1).astype(np.float32))
