"""A packed epoch whose documents outgrow their share of ``--memory``: lengths and pieces on disk, the same bytes.

``[source] memory = "1MiB"`` leaves the documents a share of about 1,200 documents held (their keys, lengths
and the packer's lists), so 1,500 are counted, packed and placed from the spill folder
(:mod:`pgprefetch.write.pack.spilled`), in windows: of whole groups of 100 under best-fit, of the stream under
concat (two each); 60,000 short documents' keys are past it too, and ordered on disk. The epoch held in
memory is checked against the table by tests/test_packing.py; here the epoch from disk is checked against
it, byte for byte, with its record and its hash (a dump resumes under either).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump
from .harness.packing import docs_table, documents, packed_config, read_back
from .harness.raycluster import manifest

N = 1500


@pytest.fixture
def many_docs_db(db: str) -> str:
    execute(db, *docs_table(N))
    return db


def _config(tmp_path: Path, method: str, memory: str, packing: str, size: int = 4) -> Path:
    path = packed_config(tmp_path, method=method, eos=7, size=size, store=f"{memory}.zarr", name=f"{memory}.toml")
    text = path.read_text().replace("[source]\n", f'[source]\nmemory = "{memory}"\n', 1)
    path.write_text(text.replace("[batches]\n", f"{packing}[batches]\n", 1))
    return path


@pytest.mark.parametrize(
    ("method", "packing", "field"),
    [
        ("best-fit", "group = 100\n", ""),
        ("best-fit", "group = 100\n", 'truncate = "left"\n'),  # each kept piece begins past the cut tokens
        ("concat", "", ""),
    ],
    ids=["best-fit", "best-fit-truncated-left", "concat"],
)
def test_documents_beyond_memory_pack_on_disk_to_the_bytes_held_in_memory(
    many_docs_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str, packing: str, field: str
) -> None:
    configs = {m: _config(tmp_path, method, m, packing) for m in ("1MiB", "1GiB")}
    if field:
        for path in configs.values():
            path.write_text(path.read_text().replace("max_length = 1000\n", f"max_length = 100\n{field}"))
    with caplog.at_level("INFO", logger="pgprefetch"):
        small = dump(configs["1MiB"], many_docs_db, 1)
    assert f"[packing] {N:,} documents beyond their share of --memory" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="pgprefetch"):
        held = dump(configs["1GiB"], many_docs_db, 1)
    assert "beyond their share" not in caplog.text
    assert chunk_bytes(small.path) == chunk_bytes(held.path)
    a, b = manifest(small.path), manifest(held.path)
    assert a["packing"] == b["packing"]
    assert a["keys_sha256"] == b["keys_sha256"]  # a partial epoch resumes under either budget
    assert a["packing"]["documents"] == N
    assert a["packing"]["sequences_written"] > 100
    assert not list((tmp_path / "1MiB.zarr").rglob("*.spill"))  # the spill folder went with the dump


def test_keys_and_documents_beyond_memory_both_on_disk_pack_to_the_bytes_held_in_memory(
    db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """60,000 short documents: past what 1 MiB holds of their keys too, which are read back from the key file."""
    execute(
        db,
        "CREATE TABLE docs (id bigint PRIMARY KEY, tokens int[] NOT NULL)",
        "INSERT INTO docs SELECT i, ARRAY(SELECT (i * 7 + j) % 50000 FROM generate_series(1, 1 + i % 5) j) "
        "FROM generate_series(1, 60000) i",
    )
    configs = {m: _config(tmp_path, "best-fit", m, "group = 1000\n", size=64) for m in ("1MiB", "1GiB")}
    with caplog.at_level("INFO", logger="pgprefetch"):
        small = dump(configs["1MiB"], db, 2)
    assert "[packing] 60,000 documents beyond their share of --memory" in caplog.text
    assert "their keys ordered there too" in caplog.text
    held = dump(configs["1GiB"], db, 2)
    assert chunk_bytes(small.path) == chunk_bytes(held.path)
    assert manifest(small.path)["keys_sha256"] == manifest(held.path)["keys_sha256"]


@pytest.mark.scale  # make chaos: the Ray worker is make test's longest; a part takes its pieces by Pieces.unit
def test_documents_beyond_memory_spread_over_ray_are_the_single_process_bytes(
    ray_cluster: object, many_docs_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each part is sent its sequences' pieces, read back from the driver's spill folder."""
    from .harness.raycluster import on_ray

    held = dump(_config(tmp_path, "concat", "1GiB", ""), many_docs_db, 1)
    with caplog.at_level("INFO", logger="pgprefetch"):
        spread = on_ray(_config(tmp_path, "concat", "1MiB", ""), many_docs_db, epoch=1, parts=3)
    assert f"[packing] {N:,} documents beyond their share of --memory" in caplog.text
    assert (spread.executor, spread.parts) == ("ray", 3)
    assert chunk_bytes(spread.path) == chunk_bytes(held.path)


def test_a_spilled_packed_epoch_stopped_midway_resumes_held_in_memory_to_the_clean_bytes(
    many_docs_db: str, tmp_path: Path
) -> None:
    """Stopped on disk under 1 MiB, resumed under 1 GiB in memory: the batches written first are kept."""
    from pgprefetch import EpochArrays

    from .harness.dumps import run_cli

    clean = dump(_config(tmp_path, "best-fit", "1GiB", "group = 100\n"), many_docs_db)
    last = int(EpochArrays(tmp_path / "1GiB.zarr", 0)[-1]["segment_keys"][0, 0, 0])  # a document of the last batch
    execute(many_docs_db, f"UPDATE docs SET tokens[1] = 70000 WHERE id = {last}")  # uint16 cannot hold it
    small = _config(tmp_path, "best-fit", "1MiB", "group = 100\n")
    code, out = run_cli("dump", "--config", str(small), "--dsn", many_docs_db, "--epoch", "0")
    assert code != 0
    assert f"sample (id={last}): field tokens, column tokens value 70000 does not fit uint16" in out
    execute(many_docs_db, f"UPDATE docs SET tokens[1] = (({last} * 7919 + 104729) % 50000) WHERE id = {last}")
    resumed = dump(small, many_docs_db, memory="1GiB")
    assert resumed.resumed > 0
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)


def test_a_transforms_documents_beyond_memory_pack_on_disk_to_the_bytes_held_in_memory(
    many_docs_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tokens a transform makes (here: each document's array, reversed) are counted from its outputs."""
    (tmp_path / "prep.py").write_text(
        "def tok(batch, ctx):\n    return {'tokens': [list(reversed(t)) for t in batch['tokens']]}\n"
    )
    stores = {}
    for memory in ("1MiB", "1GiB"):
        path = tmp_path / f"t{memory}.toml"
        path.write_text(
            f'[source]\nmemory = "{memory}"\n[samples]\nkeys = "SELECT id FROM docs"\n'
            'query = "SELECT tokens FROM docs WHERE id = $1"\n'
            '[transforms.tok]\nfunction = "prep:tok"\ninputs = ["tokens"]\nworkers = 0\n'
            '[fields.tokens]\ntransform = "tok"\ndtype = "uint16"\nmax_length = 1000\n'
            '[packing]\nfield = "tokens"\nlength = 64\neos = 7\ngroup = 100\n'
            f'[batches]\nsize = 4\n[store]\npath = "t{memory}.zarr"\n'
        )
        with caplog.at_level("INFO", logger="pgprefetch"):
            stores[memory] = dump(path, many_docs_db, 1)
        assert (f"[packing] {N:,} documents beyond their share" in caplog.text) == (memory == "1MiB")
        caplog.clear()
    assert chunk_bytes(stores["1MiB"].path) == chunk_bytes(stores["1GiB"].path)
    expected = {k: [*reversed(v), 7] for k, v in documents(many_docs_db).items()}
    assert read_back(stores["1MiB"].path, 7) == expected  # every document once, its transform's tokens


def test_lost_connections_while_units_read_spilled_pieces_are_retried_to_the_clean_bytes(
    many_docs_db: str, tmp_path: Path
) -> None:
    """Killed once a batch is written: the retry packs the documents to disk again, on a new snapshot."""
    import json

    from .harness.dumps import journal_lines, start_dump, wait_for
    from .harness.faults import kill_every_connection

    clean = dump(_config(tmp_path, "best-fit", "1GiB", "group = 100\n"), many_docs_db)
    config = _config(tmp_path, "best-fit", "1MiB", "group = 100\n")
    config.write_text(config.read_text().replace("FROM docs WHERE", "FROM docs, pg_sleep(0.004) WHERE"))
    proc = start_dump(config, many_docs_db, 0, "--json")
    wait_for(lambda: journal_lines(tmp_path / "1MiB.zarr") >= 1)
    kill_every_connection(many_docs_db)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "beyond their share of --memory" in err
    assert json.loads(out.strip().splitlines()[-1])["retries"] == 1
    assert chunk_bytes(tmp_path / "1MiB.zarr" / "epoch-00000") == chunk_bytes(clean.path)
    assert not list((tmp_path / "1MiB.zarr").rglob("*.spill"))
