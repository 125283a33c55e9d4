"""Mixed epochs as users run them: the errors, check/ls/--json per source, kill -9, S3 and the torch reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pgprefetch import EpochDataset, EpochStream

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, kill_9_after, read_arrays, run_cli
from .harness.mixing import CODE, CODE_SCAN, MIX_TABLES, WEB, mix_config
from .harness.s3 import S3, epoch_objects


@pytest.fixture
def mix_db(db: str) -> str:
    execute(db, *MIX_TABLES)
    return db


def _dump_cli(config: Path, dsn: str, *extra: str) -> tuple[int, str]:
    return run_cli("dump", "--config", str(config), "--dsn", dsn, "--epoch", "0", *extra)


# (sources, what the one line says): each refused before a byte is written, exit 2
REFUSED = [
    ({"web": {"weight": -1, **WEB}}, "[samples.web] weight: expected a number >= 0"),
    ({"web": {"weight": 0, **WEB}, "code": {"weight": 0, **CODE}}, "every source's weight is 0"),
    ({"web": {"weight": {"0": 1, "3": 0}, **WEB}, "code": {"weight": 0, **CODE}}, "weight is 0 from epoch 3"),
    ({"web": {"weight": {"2": 1}, **WEB}}, "a schedule starts at epoch 0"),
    ({"web": {"weight": {"soon": 1}, **WEB}}, "a schedule's keys are epochs"),
    ({"web": {"wieght": 1, **WEB}}, 'unknown key "wieght" (did you mean "weight"?)'),
    ({"web": {"dsn": "postgresql://elsewhere/db", **WEB}}, "[samples.web] dsn: every source is read from"),
    ({"web": {**WEB, "query": "SELECT a, tag FROM web WHERE id = $1"}}, "[samples.web]"),  # no column b
    (
        {"web": WEB, "code": {"keys": "SELECT id FROM code_docs WHERE false", "query": CODE["query"]}},
        "[samples.code] returned no keys",
    ),
]


@pytest.mark.parametrize(("sources", "message"), REFUSED)
def test_a_bad_mixed_config_is_one_line_exit_2_and_writes_nothing(
    mix_db: str, tmp_path: Path, sources: dict[str, dict[str, object]], message: str
) -> None:
    code, out = _dump_cli(mix_config(tmp_path, sources), mix_db)
    assert code == 2, out
    assert message in out
    assert len(out.strip().splitlines()) == 1
    assert "Traceback" not in out
    assert not (tmp_path / "store.zarr").exists()


def test_sources_whose_fields_differ_in_shape_are_refused_naming_the_source(mix_db: str, tmp_path: Path) -> None:
    fields = {"v": (["v"], "float32")}
    web = {"keys": WEB["keys"], "query": "SELECT ARRAY[a, b]::real[] AS v FROM web WHERE id = $1"}
    code = {"keys": CODE["keys"], "query": "SELECT ARRAY[a, b, b]::real[] AS v FROM code_docs WHERE id = $1"}
    code_, out = _dump_cli(mix_config(tmp_path, {"web": web, "code": code}, fields=fields), mix_db)
    assert code_ == 2, out
    assert "[samples.code]: field array 'v' is float32 (3,) per sample, [samples.web]'s float32 (2,)" in out
    assert not (tmp_path / "store.zarr").exists()


def test_a_source_named_for_the_source_array_or_a_mix_without_sources_is_refused(tmp_path: Path) -> None:
    fields = {"source": (["a"], "float64")}
    code, out = run_cli("check", "--config", str(mix_config(tmp_path, {"web": WEB}, fields=fields)))
    assert code == 2
    assert '"source" is reserved in a mixed epoch' in out
    lone = tmp_path / "lone.toml"
    text = (
        (tmp_path / "mix.toml")
        .read_text()
        .replace("[samples.web]", "[samples]")
        .replace("[fields.source]", "[mix]\nsamples = 10\n[fields.s]")
    )
    lone.write_text(text)
    code, out = run_cli("check", "--config", str(lone))
    assert code == 2
    assert "[mix]: mixes [samples.NAME] sources" in out


def test_check_ls_and_json_report_each_source(mix_db: str, tmp_path: Path) -> None:
    config = mix_config(tmp_path, {"web": {"weight": 3, **WEB}, "code": {"weight": 1, **CODE_SCAN}}, size=8)
    code, out = run_cli("check", "--config", str(config), "--dsn", mix_db)
    assert code == 0, out
    assert (
        "source web (query): 300 keys, weight 3 (75.0%): 270 samples this epoch (0.90 passes), from pass 0 at 0" in out
    )
    assert "source code (scan): 90 keys, weight 1 (25.0%): 90 samples this epoch (1.00 passes)" in out
    code, out = _dump_cli(config, mix_db, "--json")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["sources"] == {"web": 270, "code": 90}
    run_cli("dump", "--config", str(config), "--dsn", mix_db, "--epoch", "1")
    code, out = run_cli("check", "--config", str(config), "--dsn", mix_db, "--epoch", "2")
    assert (
        "source web (query): 300 keys, weight 3 (75.0%): 270 samples this epoch (0.90 passes), from pass 1 at 240"
        in out
    )
    code, out = run_cli("ls", "--config", str(config))
    assert code == 0
    assert "web 270, code 90" in out
    code, out = run_cli("ls", "--config", str(config), "--json")
    assert [e["sources"] for e in json.loads(out)["epochs"]] == [{"web": 270, "code": 90}] * 2
    assert run_cli("verify", "--config", str(config), "--epoch", "1")[0] == 0


def test_a_killed_mixed_dump_resumes_to_the_bytes_of_a_clean_one(mix_db: str, tmp_path: Path) -> None:
    slow = {**WEB, "query": "SELECT a, b, tag FROM web, pg_sleep(0.01) WHERE id = $1"}
    sources = {"web": {"weight": 3, **slow}, "code": {"weight": 1, **CODE_SCAN}}
    config = mix_config(tmp_path, sources, size=8)
    kill_9_after(config, mix_db, tmp_path / "store.zarr", batches=4)
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()
    resumed = dump(config, mix_db)
    assert resumed.resumed >= 3
    clean = dump(mix_config(tmp_path, sources, size=8, name="clean.toml", store="clean.zarr"), mix_db)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)


def test_a_mixed_epoch_on_s3_holds_the_local_bytes_and_reads_back_alike(mix_db: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    sources = {"web": {"weight": 2, **WEB}, "code": {"weight": 1, **CODE_SCAN}}
    local = dump(mix_config(tmp_path, sources), mix_db)
    dump(mix_config(tmp_path, sources, name="s3.toml", store=f"s3://{bucket}/mix"), mix_db)
    assert epoch_objects(s3, bucket, "mix") == chunk_bytes(local.path)
    remote = EpochDataset(f"s3://{bucket}/mix", 0, consumer=None)
    assert remote.sources == ["web", "code"]
    assert torch.equal(remote[2]["source"], torch.from_numpy(read_arrays(local)["source"][2]))


def test_the_torch_readers_hand_out_the_source_like_any_field(mix_db: str, tmp_path: Path) -> None:
    sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}}
    config = mix_config(tmp_path, sources, size=8, samples=64)
    for epoch in (0, 1):
        dump(config, mix_db, epoch)
    store = tmp_path / "store.zarr"
    ds = EpochDataset(store, 0, consumer=None)
    batch = ds[0]
    assert batch["source"].dtype == torch.int8
    assert batch["source"].shape == (8,)
    assert set(batch) == {"x", "tag", "source"}
    stream = EpochStream(store, epochs=2, consumer=None)
    assert stream.sources == ["web", "code"]
    got = [b["source"] for b in stream]
    assert len(got) == 16
    assert all(int((s == 0).sum()) == 4 for s in got)
    halves = [EpochDataset(store, 1, rank=r, world_size=2, consumer=None) for r in (0, 1)]
    together = np.concatenate([np.stack([h[i]["source"].numpy() for i in range(len(h))]) for h in halves])
    assert sorted(together.ravel().tolist()) == sorted(read_arrays(dump(config, mix_db, 1))["source"].ravel().tolist())


def test_the_documented_penguins_mix_runs_with_its_schedule(db: str, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    execute(db, (root / "configs" / "penguins.sql").read_text())
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "penguins_mix.toml"
    config.write_text((root / "configs" / "penguins_mix.toml").read_text())
    (tmp_path / "prefetch").mkdir()
    first, later = dump(config, db, 0), dump(config, db, 5)
    assert (first.sources, later.sources) == ({"dream": 128, "others": 128}, {"dream": 85, "others": 171})
    dream = (read_arrays(later)["source"] == 0).sum(axis=1)
    assert set(dream.tolist()) <= {10, 11}  # a third of 32 in every batch, and 85 in all
    assert np.abs(np.cumsum(dream) - np.arange(1, 9) * 32 / 3).max() < 1
