"""Mixed epochs against the database: shares in every batch, passes across epochs, random access, edits.

Each sample's ``a`` column names its source and key (tests/harness/mixing.py), so the tests read what
every batch holds from the values themselves, and compare them with the tables.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from pgprefetch import EpochArrays, dump_epochs, load_config

from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays, run_cli
from .harness.mixing import CODE, CODE_SCAN, MIX_TABLES, WEB, assert_passes, by_source, mix_config, source_runs


@pytest.fixture
def mix_db(db: str) -> str:
    execute(db, *MIX_TABLES)
    return db


def _run(config: Path, dsn: str, epochs: range) -> list[dict[str, np.ndarray]]:
    results = asyncio.run(dump_epochs(load_config(config, dsn=dsn), epochs))
    return [read_arrays(r) for r in results]


def test_every_batch_holds_each_sources_share_of_the_databases_samples(mix_db: str, tmp_path: Path) -> None:
    config = mix_config(tmp_path, {"web": {"weight": 3, **WEB}, "code": {"weight": 1, **CODE}}, size=8)
    result = dump(config, mix_db)
    arrays = read_arrays(result)
    # one pass of code_docs (90 samples at a quarter of 8 a batch): 45 batches, 6 of web and 2 of code each
    assert (result.n_batches, result.n_samples, result.sources) == (45, 360, {"web": 270, "code": 90})
    assert (arrays["source"] == 0).sum(axis=1).tolist() == [6] * 45
    number, ids = by_source(arrays)
    assert (number == arrays["source"] + 1).all()  # the source array names each sample's source
    assert (ids == arrays["keys"][..., 0]).all()
    web = {r["id"]: (r["b"], r["tag"]) for r in fetch(mix_db, "SELECT id, b, tag FROM web")}
    code = {r["id"]: (r["b"], r["tag"]) for r in fetch(mix_db, "SELECT id, b, tag FROM code_docs")}
    for s, i, b, tag in zip(
        number.ravel(), ids.ravel(), arrays["x"][..., 1].ravel(), arrays["tag"].ravel(), strict=True
    ):
        assert (b, tag) == pytest.approx((web if s == 1 else code)[int(i)])
    assert len(set(ids[number == 2].tolist())) == 90  # the whole pass of code_docs, each once
    assert len(set(ids[number == 1].tolist())) == 270
    epoch = EpochArrays(tmp_path / "store.zarr", 0)
    assert epoch.sources == ["web", "code"]
    assert epoch[3]["source"].tolist() == arrays["source"][3].tolist()
    code_slots = {tuple(np.flatnonzero(arrays["source"][b] == 1).tolist()) for b in range(45)}
    assert len(code_slots) > 20  # the sources interleave within batches, differently in each


def test_each_source_walks_its_own_passes_across_epochs(mix_db: str, tmp_path: Path) -> None:
    # web has 300 samples and gives 240 an epoch: a pass spans epochs; code has 90 and gives 80: it cycles
    config = mix_config(tmp_path, {"web": {"weight": 3, **WEB}, "code": {"weight": 1, **CODE}}, size=8, samples=320)
    epochs = _run(config, mix_db, range(5))
    assert assert_passes(source_runs(epochs, 0), set(range(1, 301))) == 4  # 1,200 samples: 4 whole passes
    assert assert_passes(source_runs(epochs, 1), set(range(1, 91))) == 4  # 400: 4 passes and 40


def test_an_epoch_dumped_alone_is_the_bytes_of_a_run_that_dumped_the_epochs_before_it(
    mix_db: str, tmp_path: Path
) -> None:
    # a schedule and a small source that cycles: the positions at epoch 3 come from records in one store,
    # from counting in the other
    sources = {"web": {"weight": {"0": 3, "2": 1}, **WEB}, "code": {"weight": 1, **CODE_SCAN}}
    run = mix_config(tmp_path, sources, size=8, samples=200, store="run.zarr")
    alone = mix_config(tmp_path, sources, size=8, samples=200, store="alone.zarr", name="alone.toml")
    _run(run, mix_db, range(4))
    dump(alone, mix_db, 3)
    assert chunk_bytes(tmp_path / "run.zarr" / "epoch-00003") == chunk_bytes(tmp_path / "alone.zarr" / "epoch-00003")
    manifests = [EpochArrays(tmp_path / s, 3).manifest["mix"] for s in ("run.zarr", "alone.zarr")]
    assert (manifests[0]["continues"], manifests[1]["continues"], manifests[1]["counted"]) == (2, None, 3)
    shares = [s["share"] for s in manifests[0]["sources"]]
    assert shares == [0.5, 0.5]  # from epoch 2 on, web's weight is 1
    assert EpochArrays(tmp_path / "run.zarr", 1).manifest["mix"]["sources"][0]["share"] == 0.75


def test_edited_weights_continue_every_source_where_the_stores_epochs_left_it(mix_db: str, tmp_path: Path) -> None:
    # cron dumps epochs 0 and 1, someone edits the weights, cron dumps 2 and 3: no source loses or repeats
    # a sample within a pass (Megatron-LM #457's complaint)
    def write(web: int, code: int) -> Path:
        sources = {"web": {"weight": web, **WEB}, "code": {"weight": code, **CODE}}
        return mix_config(tmp_path, sources, size=8, samples=120)

    config = write(1, 1)
    for epoch in (0, 1):
        assert run_cli("dump", "--config", str(config), "--dsn", mix_db, "--epoch", str(epoch))[0] == 0
    write(1, 3)
    for epoch in (2, 3):
        code, out = run_cli("dump", "--config", str(config), "--dsn", mix_db, "--epoch", str(epoch))
        assert code == 0, out
    store = tmp_path / "store.zarr"
    epochs = [read_arrays_of(store, e) for e in range(4)]
    assert [int((e["source"] == 1).sum()) for e in epochs] == [60, 60, 90, 90]
    assert assert_passes(source_runs(epochs, 1), set(range(1, 91))) == 3  # 300 samples: 3 passes and 30
    assert assert_passes(source_runs(epochs, 0), set(range(1, 301))) == 0
    records = [EpochArrays(store, e).manifest["mix"] for e in range(4)]
    assert records[2]["continues"] == 1
    assert records[2]["sources"][1]["start"] == {k: records[1]["sources"][1]["end"][k] for k in ("pass", "index")}


def read_arrays_of(store: Path, epoch: int) -> dict[str, np.ndarray]:
    ep = EpochArrays(store, epoch)
    batches = [ep.batch(i, keys=True) for i in range(len(ep))]
    return {name: np.stack([b[name] for b in batches]) for name in batches[0]}


def test_rows_inserted_between_epochs_are_taken_by_the_next_pass_at_the_latest(mix_db: str, tmp_path: Path) -> None:
    # one code_docs sample a batch: the batches' order is the order its passes took them in, sample by sample
    sources = {"web": {"weight": 7, **WEB}, "code": {"weight": 1, **CODE_SCAN}}
    config = mix_config(tmp_path, sources, size=8, samples=480)
    first = _run(config, mix_db, range(1))
    execute(mix_db, "INSERT INTO code_docs SELECT i, 2000000 + i, i * 0.25, i % 5 FROM generate_series(91, 120) i")
    later = _run(config, mix_db, range(1, 5))
    taken = [k for run in source_runs(first + later, 1) for k in run]
    # where pass 0 ended, as epoch 1 recorded it: the data must then show pass 0 and pass 1 whole
    end = EpochArrays(tmp_path / "store.zarr", 1).manifest["mix"]["sources"][1]["end"]
    assert end["pass"] == 1
    boundary = 60 + 60 - end["index"]
    pass_0, pass_1 = taken[:boundary], taken[boundary : boundary + 120]
    assert len(set(pass_0)) == len(pass_0)  # no row twice in pass 0
    assert set(range(1, 91)) <= set(pass_0)  # every row there from the start, once
    assert 0 < len(set(pass_0) - set(range(1, 91))) < 30  # new rows hashed after the position: this pass
    assert sorted(pass_1) == list(range(1, 121))  # the next pass: every row, the new ones too, once


def test_a_scan_source_gives_the_bytes_of_its_query_twin(mix_db: str, tmp_path: Path) -> None:
    query = mix_config(tmp_path, {"web": {"weight": 2, **WEB}, "code": {"weight": 1, **CODE}}, store="q.zarr")
    scan = mix_config(tmp_path, {"web": {"weight": 2, **WEB}, "code": {"weight": 1, **CODE_SCAN}}, store="s.zarr",
                      name="scan.toml")  # fmt: skip
    a, b = read_arrays(dump(query, mix_db)), read_arrays(dump(scan, mix_db))
    assert a.keys() == b.keys() == {"x", "tag", "keys", "source"}
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_mix_samples_fixes_the_epochs_length_and_a_short_last_batch_is_kept_apportioned(
    mix_db: str, tmp_path: Path
) -> None:
    sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}}
    whole = dump(mix_config(tmp_path, sources, size=8, samples=100, store="a.zarr"), mix_db)
    assert (whole.n_batches, whole.n_samples) == (12, 96)  # drop_last: whole batches
    kept = dump(mix_config(tmp_path, sources, size=8, samples=100, store="b.zarr", name="b.toml",
                           extra="drop_last = false"), mix_db)  # fmt: skip
    assert (kept.n_batches, kept.n_samples, kept.sources) == (13, 100, {"web": 50, "code": 50})
    last = read_arrays(kept)["source"][-1]
    assert last[:4].tolist().count(0) == 2  # the last batch's 4 samples, 2 of each; the rest is padding
