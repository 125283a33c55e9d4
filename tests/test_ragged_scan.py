"""Variable-length data in scan mode: padded arrays, text and bytea byte-identical to the query mode's twin.

A rows scan of ``seqs`` (the ``seqs`` fixture, tests/harness/ragged.py) and its query-mode twin config give
the same samples in the same order, so their chunks must be equal byte for byte; what does not fit, or is
NULL, stops the dump naming the sample, and the fix the error names dumps in both modes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgprefetch.errors import SampleError

from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays
from .harness.ragged import N, by_key, database


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
