"""Variable-length data: arrays of any length, text and bytea as bytes, samples of 1..max_rows rows.

Every sample is compared with what the database holds, its lengths included (the ``seqs`` fixture's tables,
tests/harness/ragged.py); a value that does not fit, a NULL and a config that cannot hold the data stop the
dump naming the sample or the key. Scan mode's twins are tests/test_ragged_scan.py's; the statistics, the
trimming readers and a resumed dump of padded fields tests/test_ragged_stats.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgprefetch.errors import ConfigError, SampleError

from .harness.configs import write_config
from .harness.db import execute, fetch
from .harness.dumps import dump, read_arrays
from .harness.ragged import by_key, database, seqs_config


@pytest.mark.parametrize("truncate", ["right", "left"])
def test_int_arrays_of_any_length_are_padded_with_their_lengths(seqs: str, tmp_path: Path, truncate: str) -> None:
    fields = {"tokens": (["tokens"], "int32", {"max_length": 16, "pad": -7, "truncate": truncate})}
    stored = by_key(read_arrays(dump(seqs_config(tmp_path, fields), seqs)))
    truth = database(seqs, "SELECT id, tokens FROM seqs")
    assert set(stored) == set(truth)
    for key, tokens in truth.items():
        kept = tokens[:16] if truncate == "right" else tokens[-16:] if tokens else []
        got = stored[key]
        assert got["tokens_length"] == len(kept)
        assert got["tokens"][: len(kept)].tolist() == kept
        assert (got["tokens"][len(kept) :] == -7).all()
    assert any(len(t) == 0 for t in truth.values())
    assert any(len(t) > 16 for t in truth.values())
    assert_longest_published(tmp_path / "store.zarr", {"tokens_length": truth}, lambda t: min(len(t), 16))


@pytest.mark.parametrize("max_length", [8, 64])  # most rows fill 8 slots; few fill a third of 64
@pytest.mark.parametrize(("pg_type", "dtype"), [("smallint", "int16"), ("bigint", "int64"), ("float8", "float64")])
def test_arrays_of_every_width_are_gathered_whatever_their_fill(
    seqs: str, tmp_path: Path, pg_type: str, dtype: str, max_length: int
) -> None:
    # 2-byte values lie 6 bytes apart (unaligned), 8-byte ones 12 apart; full rows and short ones take
    # different gathers
    execute(seqs, f"ALTER TABLE seqs ADD COLUMN w {pg_type}[]", f"UPDATE seqs SET w = tokens::{pg_type}[]")
    fields = {"w": (["w"], dtype, {"max_length": max_length, "truncate": "left"})}
    stored = by_key(read_arrays(dump(seqs_config(tmp_path, fields), seqs)))
    for key, values in database(seqs, "SELECT id, w FROM seqs").items():
        kept = values[-max_length:] if values else []
        assert stored[key]["w_length"] == len(kept)
        assert stored[key]["w"].tolist() == kept + [0] * (max_length - len(kept))


def test_an_array_longer_than_max_length_stops_the_dump_naming_the_sample(seqs: str, tmp_path: Path) -> None:
    fields = {"tokens": (["tokens"], "int32", {"max_length": 16})}
    longest = max(database(seqs, "SELECT id, cardinality(tokens) FROM seqs").items(), key=lambda kv: kv[1])
    assert longest[1] > 16
    with pytest.raises(
        SampleError,
        match=r"sample \(id=\d+\): field tokens, column tokens has more elements than "
        r'max_length 16; \[fields.tokens\] truncate = "right" or "left" keeps that many',
    ):
        dump(seqs_config(tmp_path, fields), seqs)


@pytest.mark.parametrize("truncate", ["right", "left"])
def test_text_is_stored_as_utf8_bytes_never_cut_inside_a_character(seqs: str, tmp_path: Path, truncate: str) -> None:
    fields = {"title": (["title"], "uint8", {"max_length": 10, "truncate": truncate})}
    stored = by_key(read_arrays(dump(seqs_config(tmp_path, fields), seqs)))
    for key, title in database(seqs, "SELECT id, title FROM seqs").items():
        data = stored[key]["title"][: stored[key]["title_length"]].tobytes()
        text = data.decode("utf-8")  # the stored bytes always decode
        encoded = title.encode()
        if len(encoded) <= 10:
            assert data == encoded
            continue
        assert len(data) <= 10
        # the most whole characters that fit: one more would not
        chars = len(text)
        if truncate == "right":
            assert title.startswith(text)
            assert len(title[: chars + 1].encode()) > 10
        else:
            assert title.endswith(text)
            assert len(title[len(title) - chars - 1 :].encode()) > 10
        assert (stored[key]["title"][len(data) :] == 0).all()


def test_bytea_is_stored_as_its_bytes(seqs: str, tmp_path: Path) -> None:
    fields = {"blob": (["blob"], "uint8", {"max_length": 12})}
    stored = by_key(read_arrays(dump(seqs_config(tmp_path, fields), seqs)))
    for key, blob in database(seqs, "SELECT id, blob FROM seqs").items():
        assert stored[key]["blob"][: stored[key]["blob_length"]].tobytes() == blob
        assert stored[key]["blob_length"] == len(blob)


def test_the_columns_of_a_field_share_one_length_or_the_dump_stops(seqs: str, tmp_path: Path) -> None:
    query = "SELECT tokens AS a, array(SELECT -x FROM unnest(tokens) x) AS b FROM seqs WHERE id = $1"
    fields = {"ab": (["a", "b"], "int32", {"max_length": 40})}
    config = write_config(tmp_path, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, drop_last=False)
    result = dump(config, seqs)
    stored = by_key(read_arrays(result))
    for key, tokens in database(seqs, "SELECT id, tokens FROM seqs").items():
        assert stored[key]["ab"].shape == (2, 40)
        assert stored[key]["ab"][0, : len(tokens)].tolist() == tokens
        assert stored[key]["ab"][1, : len(tokens)].tolist() == [-t for t in tokens]
    query = "SELECT tokens AS a, tokens[1:1] AS b FROM seqs WHERE id = $1"
    config = write_config(
        tmp_path, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, name="bad.toml", store="bad.zarr"
    )
    with pytest.raises(
        SampleError, match=r"field ab: column a has \d+ elements and b \d+; the columns of a field share"
    ):
        dump(config, seqs)


@pytest.mark.parametrize("truncate", ["right", "left"])
def test_samples_of_1_to_max_rows_rows_are_padded_with_n_rows(seqs: str, tmp_path: Path, truncate: str) -> None:
    fields = {"v": (["v"], "float32", {"pad": -1.0})}
    config = write_config(
        tmp_path,
        keys="SELECT DISTINCT uid FROM events",
        query="SELECT v FROM events WHERE uid = $1 ORDER BY t",
        fields=fields,
        size=16,
        drop_last=False,
        extra_samples=f'max_rows = 8\ntruncate = "{truncate}"',
        rows=None,
    )
    result = dump(config, seqs)
    stored = by_key(read_arrays(result))
    truth = {
        u: [r[1] for r in fetch(seqs, "SELECT t, v FROM events WHERE uid = $1 ORDER BY t", u)] for u in range(1, 121)
    }
    assert {len(v) for v in truth.values()} == set(range(1, 13))  # at 1, at 8 and above it
    for uid, values in truth.items():
        kept = values[:8] if truncate == "right" else values[-8:]
        assert stored[uid]["n_rows"] == len(kept)
        assert stored[uid]["v"][: len(kept)].tolist() == kept
        assert (stored[uid]["v"][len(kept) :] == -1.0).all()
    assert_longest_published(result.path.parent, {"n_rows": truth}, lambda rows: min(len(rows), 8))


def assert_longest_published(store: Path, truth: dict[str, dict[int, Any]], kept: Any) -> None:
    """``EpochDataset.longest`` holds each stored batch's longest kept sample, as the database says."""
    from pgprefetch import EpochDataset

    ds = EpochDataset(store, 0, consumer=None)
    longest = ds.longest
    assert set(longest) == set(truth)
    for name, values in truth.items():
        assert longest[name].shape == (len(ds),)
        for b in range(len(ds)):
            keys = [k for k in ds.batch_keys(b)[:, 0].tolist() if k]
            assert longest[name][b] == max(kept(values[k]) for k in keys), (name, b)


def test_more_rows_than_max_rows_stops_the_dump_naming_the_sample(seqs: str, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        keys="SELECT DISTINCT uid FROM events",
        query="SELECT v FROM events WHERE uid = $1 ORDER BY t",
        fields={"v": (["v"], "float32")},
        size=16,
        extra_samples="max_rows = 8",
        rows=None,
    )
    with pytest.raises(
        SampleError,
        match=r"sample \(uid=\d+\): returned more rows than max_rows 8; "
        r'\[samples\] truncate = "right" or "left" keeps max_rows of them',
    ):
        dump(config, seqs)


def test_variable_rows_of_variable_length_arrays(seqs: str, tmp_path: Path) -> None:
    query = "SELECT array(SELECT generate_series(1, t)) AS steps FROM events WHERE uid = $1 ORDER BY t"
    config = write_config(
        tmp_path,
        keys="SELECT DISTINCT uid FROM events",
        query=query,
        fields={"steps": (["steps"], "int16", {"max_length": 5, "truncate": "right"})},
        size=16,
        drop_last=False,
        extra_samples='max_rows = 6\ntruncate = "left"',
        rows=None,
    )
    stored = by_key(read_arrays(dump(config, seqs)))
    for uid in range(1, 121):
        count = 1 + uid % 12
        kept_rows = list(range(1, count + 1))[-6:]
        got = stored[uid]
        assert got["n_rows"] == len(kept_rows)
        assert got["steps_length"].tolist() == [min(t, 5) for t in kept_rows] + [0] * (6 - len(kept_rows))
        for r, t in enumerate(kept_rows):
            assert got["steps"][r, : min(t, 5)].tolist() == list(range(1, min(t, 5) + 1))
        assert (got["steps"][len(kept_rows) :] == 0).all()


def test_a_null_text_or_array_is_an_error_naming_the_sample(seqs: str, tmp_path: Path) -> None:
    execute(seqs, "ALTER TABLE seqs ALTER COLUMN title DROP NOT NULL", "UPDATE seqs SET title = NULL WHERE id = 77")
    fields = {"title": (["title"], "uint8", {"max_length": 64, "truncate": "right"})}
    with pytest.raises(SampleError, match=r"sample \(id=77\): field title, column title is NULL"):
        dump(seqs_config(tmp_path, fields), seqs)


@pytest.mark.parametrize(
    ("fields", "extra", "message"),
    [
        (
            {"title": (["title"], "uint8")},
            "",
            'column "title" is text; text and bytea go to a uint8 field with max_length',
        ),
        (
            {"t": (["id"], "int32", {"max_length": 4})},
            "",
            r"\[fields.t\] max_length: needs array columns, or text or bytea",
        ),
        ({"t": (["tokens"], "int32", {"truncate": "right"})}, "", r"\[fields.t\] truncate: only max_length has it"),
        (
            {"t": (["tokens"], "uint8", {"max_length": 4, "pad": 300})},
            "",
            r"\[fields.t\] pad: expected a number that fits",
        ),
        ({"t": (["tokens"], "int32", {"max_length": 4, "truncate": "middle"})}, "", "truncate"),
        ({"t": (["tokens"], "int32", {"max_length": 4}), "t_length": (["id"], "int32")}, "", "taken by the lengths"),
        ({"n_rows": (["id"], "int32")}, "max_rows = 3", r'"n_rows" is reserved with max_rows'),
    ],
)
def test_variable_length_config_errors(seqs: str, tmp_path: Path, fields: dict, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dump(seqs_config(tmp_path, fields, extra_samples=extra, rows=None if extra else 1), seqs)


@pytest.mark.parametrize("rows", ["flat", "max_rows"])
@pytest.mark.parametrize("value", ["ARRAY[1, NULL, 3]", "ARRAY[[1, 2], [3, 4]]"])
@pytest.mark.parametrize("where", ["id = 41", "true"])  # every row: the first one fixes the field shapes
def test_an_array_with_a_null_element_or_two_dimensions_is_an_error_naming_its_sample(
    seqs: str, tmp_path: Path, rows: str, value: str, where: str
) -> None:
    execute(seqs, f"UPDATE seqs SET tokens = {value} WHERE {where}")
    fields = {"tokens": (["tokens"], "int32", {"max_length": 64})}
    extra = {} if rows == "flat" else {"extra_samples": "max_rows = 2", "rows": None}
    key = "41" if where == "id = 41" else r"\d+"
    with pytest.raises(SampleError, match=rf"sample \(id={key}\): field tokens, column tokens has a NULL element"):
        dump(seqs_config(tmp_path, fields, **extra), seqs)


@pytest.mark.parametrize("rows", ["flat", "max_rows"])
def test_a_null_array_is_an_error_naming_its_sample(seqs: str, tmp_path: Path, rows: str) -> None:
    execute(seqs, "ALTER TABLE seqs ALTER COLUMN tokens DROP NOT NULL", "UPDATE seqs SET tokens = NULL WHERE id = 78")
    fields = {"tokens": (["tokens"], "int32", {"max_length": 64})}
    extra = {} if rows == "flat" else {"extra_samples": "max_rows = 2", "rows": None}
    with pytest.raises(SampleError, match=r"sample \(id=78\): field tokens, column tokens is NULL"):
        dump(seqs_config(tmp_path, fields, **extra), seqs)
