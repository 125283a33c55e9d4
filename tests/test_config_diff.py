"""A refused config names what differs: the keys changed since a store's epochs, or a key put in the wrong table.

#51.15: a changed config was refused with two hashes (``config sha256 5a636bb7b9e5, this config:
74c358e2d97b``), which say that something changed but not what; and a stray ``[samples] fraction`` beside
``[samples.NAME]`` sources was reported against ``[mix]``. Each epoch now records the settings its hash
covers (``config_content``: no DSN, no path), and the refusal names the dotted keys that differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgprefetch import load_config
from pgprefetch.config import model, parse_config
from pgprefetch.errors import ConfigError
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.db import execute
from .harness.dumps import dump
from .harness.mixing import CODE, MIX_TABLES, WEB, mix_config


def process(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as its own process, as cron runs it: the exit status is the real one."""
    return subprocess.run([sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, check=False)


def refusal(store: Path, change: str) -> str:
    return (
        f"Error: {store} holds epochs of another config (epoch 0: {change}); use another [store] path, or --force "
        "to write there anyway\n"
    )


def test_a_changed_config_is_refused_naming_the_keys_that_differ(s_table: str, tmp_path: Path) -> None:
    dump(s_config(tmp_path, name="c.toml"), s_table)
    store = tmp_path / "store.zarr"
    manifest = open_store(store).manifest(0)
    assert "dsn" not in json.dumps(manifest["config_content"])
    assert s_table not in json.dumps(manifest)
    edited = s_config(
        tmp_path,
        name="edited.toml",
        dtype="float64",
        size=32,
        query="SELECT v, v AS w FROM s WHERE id = $1 AND v >= 0",
        fields={"v": (["v"], "float64"), "w": (["w"], "float32")},
    )
    for command in (["dump", "--epoch", "1"], ["dump", "--ahead", "2"]):
        done = process(*command, "--config", str(edited), "--dsn", s_table)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == refusal(
            store,
            'differs in samples.query, fields.v.dtype ("float32" there, "float64" in this config), fields.w (only in '
            "this config), batches.size (16 there, 32 in this config)",
        )
    assert open_store(store).epochs() == [0]  # nothing written
    forced = process("dump", "--epoch", "1", "--config", str(edited), "--dsn", s_table, "--force", "-q")
    assert forced.returncode == 0, forced.stderr


def test_a_store_written_before_configs_were_recorded_says_only_hashes_are_known(s_table: str, tmp_path: Path) -> None:
    dump(s_config(tmp_path, name="c.toml"), s_table)
    store = tmp_path / "store.zarr"
    group = store / "epoch-00000" / "zarr.json"
    meta = json.loads(group.read_text())
    del meta["attributes"]["pgprefetch"]["config_content"]  # as an epoch of an earlier pgprefetch has it
    group.write_text(json.dumps(meta))
    edited = s_config(tmp_path, name="edited.toml", size=32)
    done = process("dump", "--epoch", "1", "--config", str(edited), "--dsn", s_table)
    assert done.returncode == 2
    theirs, mine = meta["attributes"]["pgprefetch"]["config_sha256"][:12], load_config(edited).sha256()[:12]
    assert done.stderr == refusal(
        store,
        f"config sha256 {theirs}, this config: {mine}; that epoch records only the hash of its config, so which "
        "keys differ is not known",
    )


def test_a_changed_mixed_config_names_the_source_and_its_key(db: str, tmp_path: Path) -> None:
    execute(db, *MIX_TABLES)
    dump(mix_config(tmp_path, {"web": WEB, "code": CODE}, size=10), db)
    edited = mix_config(
        tmp_path, {"web": {**WEB, "fraction": 0.5, "weight": 3}, "code": CODE}, size=10, name="edited.toml"
    )
    done = process("dump", "--epoch", "1", "--config", str(edited), "--dsn", db)
    assert done.returncode == 2
    # The weight is not part of the identity (it may change between epochs): only fraction is named.
    assert done.stderr == refusal(
        tmp_path / "store.zarr", "differs in samples.web.fraction (1.0 there, 0.5 in this config)"
    )
    added = mix_config(tmp_path, {"web": WEB, "code": CODE, "more": CODE}, size=10, name="added.toml")
    done = process("dump", "--epoch", "1", "--config", str(added), "--dsn", db)
    assert done.stderr == refusal(tmp_path / "store.zarr", "differs in samples.more (only in this config)")


def content(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "samples": {"keys": "SELECT id FROM s", "query": "SELECT v FROM s WHERE id = $1"},
        "fields": {"v": {"columns": ["v"], "dtype": "float32"}, "w": {"columns": ["v"], "dtype": "float32"}},
        "batches": {"size": 16},
        "store": {"path": "/tmp/store.zarr"},
    }
    for key, value in changes.items():
        raw[key] = value
    return raw


def test_what_differs_is_named_for_every_kind_of_change_and_a_damaged_record() -> None:
    cfg = parse_config(content())
    recorded = cfg.content()
    assert (
        model.config_change(recorded, cfg.sha256(), cfg)
        == f"config sha256 {cfg.sha256()[:12]}, this config: {cfg.sha256()[:12]}"
    )
    reordered = parse_config(
        content(fields={"w": {"columns": ["v"], "dtype": "float32"}, "v": {"columns": ["v"], "dtype": "float32"}})
    )
    assert model.config_change(recorded, "x", reordered) == "differs in the order of the fields (v, w there)"
    stored = parse_config(content(store={"path": "/tmp/store.zarr", "compression": "zstd"}))
    assert (
        model.config_change(stored.content(), "x", cfg)
        == 'differs in store.compression ("zstd" there, "none" in this config)'
    )
    fewer = parse_config(content(fields={"v": {"columns": ["v"], "dtype": "float32"}}))
    assert model.config_change(recorded, "x", fewer) == "differs in fields.w (only there)"
    many = parse_config(
        content(
            batches={"size": 8, "seed": 1, "drop_last": False},
            fields={"v": {"columns": ["v"], "dtype": "int8", "cast": "unsafe", "null": 0}},
        )
    )
    said = model.config_change(recorded, "x", many)
    assert said.startswith('differs in fields.v.dtype ("float32" there, "int8" in this config), fields.v.cast (not')
    assert said.endswith("batches.drop_last (true there, false in this config) and 1 more")  # fields.w: counted
    # The DSN and the store's path are not what decides an epoch's bytes: neither is compared, nor recorded.
    elsewhere = parse_config(
        {**content(store={"path": "/elsewhere.zarr"}), "source": {"dsn": "postgresql://u:secret@h/d"}}
    )
    assert elsewhere.sha256() == cfg.sha256()
    assert "secret" not in json.dumps(elsewhere.content())
    for damaged in (
        None,
        "text",
        {"fields": "no list"},
        {"fields": [{"dtype": "int8"}]},
        {"mix": {"sources": 3}},
        {"fields": [{"name": "x\ny"}]},
    ):
        assert model.config_change(damaged, "5a636bb7b9e5aa", cfg).endswith("so which keys differ is not known")


# ---------------------------------------------------------------- a key in the wrong table is named


MIXED = """\
[samples]
{stray}
[samples.web]
keys = "SELECT id FROM web"
query = "SELECT a, b, tag FROM web WHERE id = $1"
[samples.code]
keys = "SELECT id FROM code_docs"
query = "SELECT a, b, tag FROM code_docs WHERE id = $1"
{mix}
[batches]
size = 10
[store]
path = "store.zarr"
[fields.x]
columns = ["a", "b"]
dtype = "float64"
"""


@pytest.mark.parametrize("mix", ["", "[mix]\nsamples = 100"], ids=["no-mix", "mix"])
@pytest.mark.parametrize(
    ("stray", "message"),
    [
        (
            "fraction = 0.5",
            "[samples] fraction: a key beside [samples.NAME] sources: it is a source's setting: put it under each "
            "[samples.NAME] that needs it ([samples.web], [samples.code])",
        ),
        (
            "weight = 2",
            "[samples] weight: a key beside [samples.NAME] sources: it is a source's setting: put it "
            "under each [samples.NAME] that needs it ([samples.web], [samples.code])",
        ),
        (
            "samples = 100",
            "[samples] samples: a key beside [samples.NAME] sources: a mixed epoch's length is [mix] samples",
        ),
        (
            "colour = 1",
            "[samples] colour: a key beside [samples.NAME] sources: a [samples] with [samples.NAME] sources "
            "holds only those tables",
        ),
    ],
    ids=["fraction", "weight", "samples", "unknown"],
)
def test_a_stray_samples_key_beside_sources_is_named(
    db: str, tmp_path: Path, mix: str, stray: str, message: str
) -> None:
    execute(db, *MIX_TABLES)
    path = tmp_path / "mix.toml"
    path.write_text(MIXED.format(stray=stray, mix=mix))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: {message}"
    for command in (["check"], ["dump", "--epoch", "0"]):
        done = process(*command, "--config", str(path), "--dsn", db)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"Error: {path}: {message}\n")
    assert not (tmp_path / "store.zarr").exists()
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(MIXED.format(stray="", mix=mix).replace("[samples.web]\n", f"[samples.web]\n{stray}\n"))
    if stray in ("fraction = 0.5", "weight = 2"):  # where it belongs, it is taken
        assert load_config(fixed).mix is not None
