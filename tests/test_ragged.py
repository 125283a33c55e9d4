"""Variable-length data: arrays of any length, text and bytea as bytes, samples of 1..max_rows rows.

Every sample is compared with what the database holds, its lengths included.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch.errors import ConfigError, SampleError

from .harness.configs import write_config
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, kill_9_after, read_arrays

N = 300
TEXTS = [
    "",
    "a",
    "plain ascii text",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🎉🎊🎈 party",
    "Привет мир",
    "مرحبا بالعالم",
]


@pytest.fixture
def seqs(db: str) -> str:
    """``seqs``: int[] tokens of 0..40 elements (some empty), text titles in several scripts, bytea blobs."""
    rng = random.Random(7)
    rows = []
    for i in range(1, N + 1):
        n = rng.choice([0, 1, 5, 16, 17, 40, rng.randrange(41)])
        tokens = [rng.randrange(-1000, 1000) for _ in range(n)]
        title = rng.choice(TEXTS) * rng.randrange(1, 3)
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
        rows.append(f"({i}, ARRAY{tokens}::int[], {_literal(title)}, '\\x{blob.hex()}'::bytea)")
    execute(
        db,
        "CREATE TABLE seqs (id int PRIMARY KEY, tokens int[] NOT NULL, title text NOT NULL, blob bytea NOT NULL)",
        f"INSERT INTO seqs VALUES {', '.join(rows)}",
        "CREATE TABLE events (uid int, t int, v real NOT NULL, PRIMARY KEY (uid, t))",
        # user u has 1 + (u % 12) events: 1 to 12 of them
        "INSERT INTO events SELECT u, t, u * 100 + t FROM generate_series(1, 120) u, generate_series(1, 1 + u % 12) t",
    )
    return db


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def seqs_config(folder: Path, fields: dict[str, tuple[Any, ...]], **kwargs: Any) -> Path:
    query = "SELECT * FROM seqs WHERE id = $1"
    kwargs = {"drop_last": False, **kwargs}
    return write_config(folder, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, **kwargs)


def by_key(arrays: dict[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    """Each stored sample's arrays by its key (the last batch's padding samples left out)."""
    keys = arrays["keys"].reshape(-1, arrays["keys"].shape[-1])[:, 0]
    out = {}
    for i, k in enumerate(keys.tolist()):
        if k:
            out[k] = {name: a.reshape(-1, *a.shape[2:])[i] for name, a in arrays.items() if name != "keys"}
    return out


def database(dsn: str, sql: str) -> dict[int, Any]:
    return {r[0]: r[1] for r in fetch(dsn, sql)}


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


@pytest.mark.parametrize("mode", ["query", "scan"])
@pytest.mark.parametrize(("column", "empty"), [("title", "''"), ("tokens", "'{}'")])
def test_a_null_text_or_array_names_the_fix_that_works_and_the_fix_dumps(
    seqs: str, tmp_path: Path, mode: str, column: str, empty: str
) -> None:
    """A null policy cannot fill a whole value: the error says to select it as empty, and doing so works."""
    execute(
        seqs, f"ALTER TABLE seqs ALTER COLUMN {column} DROP NOT NULL", f"UPDATE seqs SET {column} = NULL WHERE id = 9"
    )
    dtype = "uint8" if column == "title" else "int32"
    field = f'[fields.f]\ncolumns = ["{column}"]\ndtype = "{dtype}"\nmax_length = 64\ntruncate = "right"\n'
    scan, twin = scan_twin_configs(tmp_path, "right", 0, field)
    advice = f"select coalesce({column}, {empty}) AS {column} in the query"
    with pytest.raises(SampleError, match=re.escape(advice)):
        dump(scan if mode == "scan" else twin, seqs)
    fixed = f"SELECT id, coalesce({column}, {empty}) AS {column} FROM seqs"
    if mode == "scan":
        scan.write_text(scan.read_text().replace('table = "seqs"', f'table = "{fixed}"'))
    else:
        twin.write_text(
            twin.read_text().replace("SELECT tokens, title, blob FROM seqs WHERE id = $1", f"{fixed} WHERE id = $1")
        )
    got = by_key(read_arrays(dump(scan if mode == "scan" else twin, seqs)))
    assert got[9]["f_length"] == 0
    assert (got[9]["f"] == 0).all()


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


# --- statistics, the reader, resume --------------------------------------------------------------------------
def stats_config(folder: Path, name: str = "test.toml", store: str = "store.zarr", slow: bool = False) -> Path:
    query = (
        "SELECT tokens, CASE WHEN id % 7 = 0 THEN NULL ELSE id * 0.25 END AS score, id, -id AS neg"
        + (", pg_sleep(0.02)" if slow else "")
        + " FROM seqs WHERE id = $1"
    )
    fields = {
        "tokens": (["tokens"], "int32", {"max_length": 24, "truncate": "right", "pad": 99}),
        "score": (["score"], "float64", {"null": 123.0}),
        "pair": (["id", "neg"], "int64"),
    }
    return write_config(
        folder, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, drop_last=False,
        name=name, store=store, connections=2,
    )  # fmt: skip


def test_statistics_count_only_real_values_and_match_numpy(seqs: str, tmp_path: Path) -> None:
    from pgprefetch import EpochDataset

    dump(stats_config(tmp_path), seqs)
    stats = EpochDataset(tmp_path / "store.zarr", 0, consumer=None).stats
    tokens = [t for r in fetch(seqs, "SELECT tokens FROM seqs") for t in r[0][:24]]  # padding excluded
    scores = [r[0] * 0.25 for r in fetch(seqs, "SELECT id FROM seqs WHERE id % 7 <> 0")]  # NULLs excluded
    ids = [r[0] for r in fetch(seqs, "SELECT id FROM seqs")]
    for got, values in (
        (stats["tokens"]["tokens"], tokens),
        (stats["score"]["score"], scores),
        (stats["pair"]["id"], ids),
    ):
        x = np.array(values, dtype=np.float64)
        assert got["count"] == x.size
        assert got["mean"] == pytest.approx(x.mean(), rel=1e-9)
        assert got["std"] == pytest.approx(x.std(), rel=1e-9)
        assert (got["min"], got["max"]) == (x.min(), x.max())
    assert set(stats) == {"tokens", "score", "pair"}


def test_trimmed_batches_are_views_cut_to_the_longest_sample(seqs: str, tmp_path: Path) -> None:
    import torch

    from pgprefetch import EpochDataset, lengths_to_mask

    fields = {"tokens": (["tokens"], "int32", {"max_length": 40})}
    dump(seqs_config(tmp_path, fields), seqs)
    full = EpochDataset(tmp_path / "store.zarr", 0, consumer=None, batch_size=4)
    cut = EpochDataset(tmp_path / "store.zarr", 0, consumer=None, batch_size=4, trim=True)
    widths = set()
    for i in range(len(full)):
        a, b = full[i], cut[i]
        longest = int(a["tokens_length"].max())
        widths.add(longest)
        assert b["tokens"].shape == (a["tokens"].shape[0], longest)
        assert b["tokens"].stride() == (40, 1)  # a view of the stored rows of 40: nothing copied
        assert torch.equal(b["tokens"], a["tokens"][:, :longest])
        mask = lengths_to_mask(b["tokens_length"])
        assert mask.shape == b["tokens"].shape
        assert torch.equal(mask.sum(dim=1), b["tokens_length"].long())
        assert (b["tokens"][~mask] == 0).all()
    assert len(widths) > 1


def test_a_resumed_dump_of_padded_fields_has_the_bytes_and_figures_of_a_clean_one(seqs: str, tmp_path: Path) -> None:
    import json

    cfg = stats_config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    kill_9_after(cfg, seqs, store)
    resumed = dump(cfg, seqs)
    assert resumed.resumed >= 2
    clean = dump(stats_config(tmp_path, name="clean.toml", store="clean.zarr"), seqs)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)

    def stats(path: Path) -> dict:
        return json.loads((path / "zarr.json").read_text())["attributes"]["pgprefetch"]["stats"]

    assert stats(resumed.path) == stats(clean.path)


def test_stats_command_prints_the_figures_of_an_epoch(seqs: str, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from pgprefetch.cli import cli

    dump(stats_config(tmp_path), seqs)
    store = str(tmp_path / "store.zarr")
    result = CliRunner().invoke(cli, ["stats", "--store", store, "--epoch", "0", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["epoch"] == 0
    assert figures["stats"]["pair"]["neg"]["max"] == -1
    table = CliRunner().invoke(cli, ["stats", "--config", str(tmp_path / "test.toml"), "--epoch", "0"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split() == ["field", "column", "count", "mean", "std", "min", "max"]
    assert lines[1].split()[:3] == ["tokens", "tokens", f"{figures['stats']['tokens']['tokens']['count']:,}"]
    missing = CliRunner().invoke(cli, ["stats", "--store", store, "--epoch", "5"])
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: epoch 5 is not in")


def test_the_stream_trims_too_also_from_reused_buffers(seqs: str, tmp_path: Path) -> None:
    from pgprefetch import EpochDataset, EpochStream

    fields = {"tokens": (["tokens"], "int32", {"max_length": 40})}
    dump(seqs_config(tmp_path, fields), seqs)
    store = tmp_path / "store.zarr"
    want = [b["tokens"].tolist() for b in EpochDataset(store, 0, consumer=None, batch_size=4, trim=True)]
    for buffers in (0, 2):
        stream = EpochStream(store, 0, 1, batch_size=4, trim=True, buffers=buffers, consumer=None)
        assert [b["tokens"].tolist() for b in stream] == want


# --- scan mode -------------------------------------------------------------------------------------------------
def scan_twin_configs(folder: Path, truncate: str, pad: int, fields: str = "") -> tuple[Path, Path]:
    """A rows scan of ``seqs`` with a padded tokens field (or ``fields``), and its query-mode twin (same samples,
    same order)."""
    tokens = '[fields.tokens]\ncolumns = ["tokens"]\ndtype = "int32"\nmax_length = 16\n'
    field = fields or tokens + f'pad = {pad}\ntruncate = "{truncate}"\n'
    tail = '[batches]\nsize = 32\nseed = 5\ndrop_last = false\n[store]\npath = "store.zarr"\n'
    (folder / "scan").mkdir(parents=True)
    (folder / "twin").mkdir(parents=True)
    scan = folder / "scan" / "c.toml"
    scan.write_text('[samples]\ntable = "seqs"\nkey = "id"\n' + tail + field)
    twin = folder / "twin" / "c.toml"
    twin.write_text(
        '[samples]\nkeys = "SELECT id FROM seqs"\nquery = "SELECT tokens, title, blob FROM seqs WHERE id = $1"\n'
        + tail
        + field
    )
    return scan, twin


@pytest.mark.parametrize(("truncate", "pad"), [("right", 0), ("left", -5)])
def test_scan_mode_pads_arrays_byte_identical_to_the_query_mode(
    seqs: str, tmp_path: Path, truncate: str, pad: int
) -> None:
    scan, twin = scan_twin_configs(tmp_path, truncate, pad)
    from_scan, from_query = dump(scan, seqs), dump(twin, seqs)
    assert from_scan.n_samples == from_query.n_samples == N
    assert chunk_bytes(from_scan.path) == chunk_bytes(from_query.path)
    stored = by_key(read_arrays(from_scan))
    for key, tokens in database(seqs, "SELECT id, tokens FROM seqs").items():
        kept = tokens[:16] if truncate == "right" else tokens[-16:] if tokens else []
        assert stored[key]["tokens_length"] == len(kept)
        assert stored[key]["tokens"].tolist() == kept + [pad] * (16 - len(kept))


def test_scan_mode_stops_at_an_array_longer_than_max_length(seqs: str, tmp_path: Path) -> None:
    scan, _ = scan_twin_configs(tmp_path, "error", 0)
    with pytest.raises(
        SampleError,
        match=r"sample \(id=\d+\): field tokens, column tokens has \d+ elements, more than "
        "max_length 16",
    ):
        dump(scan, seqs)


@pytest.mark.parametrize("truncate", ["right", "left"])
def test_scan_mode_stores_text_and_bytea_byte_identical_to_the_query_mode(
    seqs: str, tmp_path: Path, truncate: str
) -> None:
    # 1..4-byte characters around every cut position: max_length 7 lands inside most of them
    execute(seqs, "UPDATE seqs SET title = repeat('aé日🎉', 1 + id % 3) WHERE id % 5 = 0")
    fields = (
        f'[fields.title]\ncolumns = ["title"]\ndtype = "uint8"\nmax_length = 7\npad = 32\ntruncate = "{truncate}"\n'
        f'[fields.blob]\ncolumns = ["blob"]\ndtype = "uint8"\nmax_length = 5\ntruncate = "{truncate}"\n'
    )
    scan, twin = scan_twin_configs(tmp_path, truncate, 0, fields)
    from_scan, from_query = dump(scan, seqs), dump(twin, seqs)
    assert chunk_bytes(from_scan.path) == chunk_bytes(from_query.path)
    stored = by_key(read_arrays(from_scan))
    for key, title, blob in fetch(seqs, "SELECT id, title, blob FROM seqs"):
        text = stored[key]["title"][: stored[key]["title_length"]].tobytes().decode("utf-8")
        assert text == (_fit(title, 7) if truncate == "right" else _fit(title[::-1], 7)[::-1])
        assert (stored[key]["title"][stored[key]["title_length"] :] == 32).all()
        kept = blob[:5] if truncate == "right" else blob[-5:]
        assert stored[key]["blob_length"] == len(kept)
        assert stored[key]["blob"].tobytes() == kept + bytes(5 - len(kept))
    assert any(len(t.encode()) > 7 for _, t in fetch(seqs, "SELECT id, title FROM seqs"))


def test_text_cut_to_nothing_from_the_left_is_empty_in_both_modes(seqs: str, tmp_path: Path) -> None:
    # max_length 1 keeps the last character only when it is one byte; the others are cut to nothing
    execute(seqs, "UPDATE seqs SET title = (ARRAY['aé', 'é', '日', 'xa', ''])[1 + id % 5]")
    fields = '[fields.title]\ncolumns = ["title"]\ndtype = "uint8"\nmax_length = 1\ntruncate = "left"\n'
    scan, twin = scan_twin_configs(tmp_path, "left", 0, fields)
    from_scan, from_query = dump(scan, seqs), dump(twin, seqs)
    assert chunk_bytes(from_scan.path) == chunk_bytes(from_query.path)
    stored = by_key(read_arrays(from_query))
    for key, title in fetch(seqs, "SELECT id, title FROM seqs"):
        kept = b"a" if title == "xa" else b""
        assert stored[key]["title"][: stored[key]["title_length"]].tobytes() == kept


def _fit(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 fits ``limit`` bytes."""
    while len(text.encode()) > limit:
        text = text[:-1]
    return text


def test_scan_mode_stops_at_text_longer_than_max_length_and_at_a_null(seqs: str, tmp_path: Path) -> None:
    fields = '[fields.title]\ncolumns = ["title"]\ndtype = "uint8"\nmax_length = 8\n'
    scan, _ = scan_twin_configs(tmp_path, "error", 0, fields)
    with pytest.raises(SampleError, match=r"sample \(id=\d+\): field title, column title has \d+ bytes, more than"):
        dump(scan, seqs)
    execute(
        seqs,
        "UPDATE seqs SET title = left(title, 2)",
        "ALTER TABLE seqs ALTER COLUMN title DROP NOT NULL",
        "UPDATE seqs SET title = NULL WHERE id = 9",
    )
    with pytest.raises(SampleError, match='a row has a NULL in column "title"'):
        dump(scan, seqs)


def test_scan_windows_of_rows_whose_arrays_vary(seqs: str, tmp_path: Path) -> None:
    execute(
        seqs, "ALTER TABLE events ADD COLUMN a int[]", "UPDATE events SET a = array(SELECT generate_series(1, t % 4))"
    )
    config = tmp_path / "c.toml"
    config.write_text(
        '[samples]\ntable = "events"\nkey = "uid"\norder = "t"\nwindow = 3\n'
        '[batches]\nsize = 16\ndrop_last = false\n[store]\npath = "s.zarr"\n'
        '[fields.a]\ncolumns = ["a"]\ndtype = "int16"\nmax_length = 2\ntruncate = "left"\n'
    )
    arrays = read_arrays(dump(config, seqs))
    keys = arrays["keys"].reshape(-1, 2)
    a, lengths = arrays["a"].reshape(-1, 3, 2), arrays["a_length"].reshape(-1, 3)
    seen = 0
    for i, (uid, t0) in enumerate(keys.tolist()):
        if not uid:
            continue
        seen += 1
        for r, t in enumerate(range(t0, t0 + 3)):
            kept = list(range(1, t % 4 + 1))[-2:]
            assert lengths[i, r] == len(kept)
            assert a[i, r, : len(kept)].tolist() == kept
    assert seen == sum(max(0, 1 + u % 12 - 2) for u in range(1, 121))


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
