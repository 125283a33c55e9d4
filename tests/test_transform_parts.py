"""The transforms' parts that need no server (#54): the config's contract, outputs checked and packed, the
cache file, the runner's order over worker processes, keys given on the command line.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgprefetch.config.load import load_config
from pgprefetch.config.model import FieldConfig
from pgprefetch.config.parse import parse_config
from pgprefetch.errors import ConfigError, StoreError, TransformError
from pgprefetch.keys import KeyColumns
from pgprefetch.write.transform.cache import FILE, TransformCache, decode_entries, encode_entries
from pgprefetch.write.transform.loading import fingerprint
from pgprefetch.write.transform.outputs import Packed, fill_field, pack_outputs
from pgprefetch.write.transform.rerun import parse_key
from pgprefetch.write.transform.runner import Runner, Task

BASE: dict[str, Any] = {
    "samples": {"keys": "SELECT id FROM t", "query": "SELECT title, year FROM t WHERE id = $1"},
    "transforms": {"tok": {"function": "prep:tokenize", "inputs": ["title", "year"], "workers": 2, "version": "1"}},
    "fields": {
        "ids": {"transform": "tok", "dtype": "uint16", "max_length": 32},
        "year": {"columns": ["year"], "dtype": "int16"},
    },
    "batches": {"size": 4},
    "store": {"path": "/tmp/x"},
}


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = spec
        for part in path:
            node = node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return spec


def _refused(spec: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(spec)
    return str(e.value)


def test_the_issue_config_parses_as_written(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[samples]\nkeys = "SELECT id FROM movies"\nquery = "SELECT title, year FROM movies WHERE id = $1"\n'
        '[transforms.tok]\nfunction = "prep:tokenize"\ninputs = ["title", "year"]\nrandom = false\nworkers = 2\n'
        'version = "1"\n'
        '[fields.ids]\ntransform = "tok"\ndtype = "uint16"\nmax_length = 32\n'
        '[batches]\nsize = 8\n[store]\npath = "s"\n'
    )
    cfg = load_config(path)
    (t,) = cfg.transforms
    assert (t.name, t.function, t.inputs, t.random, t.workers, t.version) == (
        "tok",
        "prep:tokenize",
        ("title", "year"),
        False,
        2,
        "1",
    )
    assert t.folder == tmp_path  # prep.py beside the config
    (f,) = cfg.fields
    assert (f.transform, f.columns, f.dtype, f.max_length) == ("tok", (), "uint16", 32)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fields.ids.transform": "tk"}, "[fields.ids] transform: no [transforms.tk] (transforms: tok)"),
        (
            {"fields.ids": None},
            '[transforms.tok]: no field stores its output: add a field with transform = "tok"',
        ),
        ({"transforms.tok.function": "prep.tokenize"}, '[transforms.tok] function: expected "module:callable"'),
        ({"transforms.tok.workers": -1}, "[transforms.tok] workers: expected 0 (the dump's own process) to 256"),
        ({"transforms.tok.inputs": []}, "[transforms.tok] inputs: expected a non-empty list of column names"),
        ({"transforms.tok.inptus": ["a"]}, '[transforms.tok]: unknown key "inptus" (did you mean "inputs"?)'),
        ({"transforms.tok.path": "x.json"}, "[transforms.tok] path: belongs to a ready tokenizer: set tokenizer ="),
        ({"fields.ids.columns": ["title"]}, '[fields.ids]: unknown key "columns"'),
        ({"fields.ids.shape": [3], "fields.ids.max_length": 4}, "[fields.ids] shape: give a fixed shape or max_length"),
        ({"samples.rows": 2}, "transforms take samples of one row each"),
        ({"transforms.tok.on_error": "ignore"}, "[transforms.tok] on_error: expected one of error, skip"),
        (
            {"transforms.tok.on_error": "skip", "transforms.tok.random": True},
            '[transforms.tok] on_error: "skip" is for deterministic transforms',
        ),
    ],
)
def test_a_transform_config_mistake_is_one_line(changes: dict[str, Any], message: str) -> None:
    assert message in _refused(_spec(**changes))


def test_a_ready_tokenizer_takes_one_text_and_fills_one_field() -> None:
    tok = {"tokenizer": "tiktoken", "encoding": "cl100k_base", "inputs": ["title", "year"]}
    assert "a ready tokenizer takes one text input and fills one field" in _refused(_spec(**{"transforms.tok": tok}))
    cfg = parse_config(_spec(**{"transforms.tok": tok | {"inputs": ["title"]}}))
    assert cfg.transforms[0].option_values == {"encoding": "cl100k_base", "tokenizer": "tiktoken"}
    wrong = tok | {"inputs": ["title"], "path": "x.json"}
    assert 'a ready tokenizer = "tiktoken" takes encoding, not path' in _refused(_spec(**{"transforms.tok": wrong}))


def test_the_code_version_and_workers_leave_the_config_identity_alone() -> None:
    cfg = parse_config(_spec())
    for changes in ({"transforms.tok.version": "2"}, {"transforms.tok.workers": 0}):
        assert parse_config(_spec(**changes)).sha256() == cfg.sha256()
    assert parse_config(_spec(**{"transforms.tok.inputs": ["title"]})).sha256() != cfg.sha256()


def test_the_fingerprint_follows_version_code_and_declarations(tmp_path: Path) -> None:
    (tmp_path / "prep.py").write_text("def tokenize(batch, ctx):\n    return {}\n")
    path = tmp_path / "c.toml"

    def printed(version: str = "1", dtype: str = "uint16") -> str:
        path.write_text(
            '[samples]\nkeys = "SELECT 1"\nquery = "SELECT $1 AS t"\n'
            f'[transforms.tok]\nfunction = "prep:tokenize"\ninputs = ["t"]\nversion = "{version}"\n'
            f'[fields.ids]\ntransform = "tok"\ndtype = "{dtype}"\nmax_length = 8\n[batches]\nsize = 2\n'
            '[store]\npath = "s"\n'
        )
        cfg = load_config(path)
        return fingerprint(cfg, cfg.transforms[0])

    first = printed()
    assert printed() == first
    assert printed(version="2") != first
    assert printed(dtype="uint32") != first
    (tmp_path / "prep.py").write_text("def tokenize(batch, ctx):\n    return {}  # edited\n")
    assert printed() != first


IDS = FieldConfig(name="ids", columns=(), dtype="uint16", transform="tok", max_length=4)
VEC = FieldConfig(name="vec", columns=(), dtype="float32", transform="tok", shape=(2,))


def _named(i: int) -> str:
    return f"id={i + 100}"


def test_outputs_are_packed_in_their_dtype_and_cut_as_the_field_says() -> None:
    right = FieldConfig(name="ids", columns=(), dtype="uint16", transform="tok", max_length=2, truncate="right")
    left = FieldConfig(name="ids", columns=(), dtype="uint16", transform="tok", max_length=2, truncate="left")
    out = pack_outputs("tok", [right], {"ids": [[1, 2, 3], [], "ab"]}, 3, _named)["ids"]
    assert out.values.dtype == np.uint16
    assert (out.values.tolist(), out.lengths.tolist()) == ([1, 2, 97, 98], [2, 0, 2])
    cut = pack_outputs("tok", [left], {"ids": [[1, 2, 3]]}, 1, _named)["ids"]
    assert cut.values.tolist() == [2, 3]


@pytest.mark.parametrize(
    ("field", "result", "message"),
    [
        (IDS, {"ids": [[70000]]}, "sample (id=100): transform tok, field ids: value 70000 does not fit uint16"),
        (
            IDS,
            {"ids": [[1, 2, 3, 4, 5]]},
            "sample (id=100): transform tok, field ids: 5 values, more than max_length 4",
        ),
        (IDS, {"ids": [[1.5]]}, "value 1.5 does not fit uint16 (not a whole number)"),
        (IDS, {"ids": [None]}, "sample (id=100): transform tok, field ids: returned None; expected a value"),
        (IDS, {"idz": [[1]]}, "transform tok returned no output 'ids' for [fields.ids] (its outputs: idz)"),
        (IDS, {"ids": [[1], [2]]}, "transform tok, field ids: 2 values for 1 samples; expected one per sample"),
        (IDS, [[1]], "transform tok returned list; expected a dict of outputs, one per field"),
        (VEC, {"vec": [[1.0, 2.0, 3.0]]}, "sample (id=100): transform tok, field vec: shape [3]; expected [2]"),
        (IDS, {"ids": [["a"]]}, "field ids: values of type <U1; expected numbers"),
    ],
)
def test_an_output_its_field_cannot_hold_names_the_sample(field: FieldConfig, result: Any, message: str) -> None:
    with pytest.raises(TransformError) as e:
        pack_outputs("tok", [field], result, 1, _named)
    assert message in str(e.value)


def test_a_packed_field_fills_the_batch_padded_with_its_lengths() -> None:
    f = FieldConfig(name="ids", columns=(), dtype="int32", transform="tok", max_length=3, pad=-1)
    packed = pack_outputs("tok", [f], {"ids": [[1, 2], [], [3, 4, 5]]}, 3, _named)["ids"]
    out, lengths = np.zeros((4, 3), np.int32), np.zeros(4, np.int32)
    fill_field(f, packed, out, lengths)
    assert out[:3].tolist() == [[1, 2, -1], [-1, -1, -1], [3, 4, 5]]
    assert lengths[:3].tolist() == [2, 0, 3]


@given(st.lists(st.lists(st.integers(0, 1000), max_size=5), min_size=1, max_size=20), st.randoms())
def test_taking_and_joining_packed_samples_keeps_each_sample_whole(samples: list[list[int]], rnd: Any) -> None:
    packed = Packed(np.array([v for s in samples for v in s], np.int64), np.array([len(s) for s in samples]))
    order = list(range(len(samples)))
    rnd.shuffle(order)
    taken = packed.take(np.array(order))
    starts = taken.starts
    got = [taken.values[s : s + n].tolist() for s, n in zip(starts, taken.lengths, strict=True)]
    assert got == [samples[i] for i in order]
    joined = Packed.join([packed, taken])
    assert joined.lengths.tolist() == [len(s) for s in samples] + [len(samples[i]) for i in order]


def test_cache_entries_round_trip_and_a_damaged_one_is_dropped(tmp_path: Path) -> None:
    fields, dtypes = ("ids", "vec"), (np.dtype(np.uint16), np.dtype(np.float32))
    outputs = {
        "ids": Packed(np.array([1, 2, 3], np.uint16), np.array([2, 1])),
        "vec": Packed(np.array([0.5, 1.5, 2.5, 3.5], np.float32), np.array([2, 2])),
    }
    entries = encode_entries(fields, outputs, np.arange(2))
    decoded = decode_entries(fields, dtypes, entries)
    assert decoded["ids"].values.tolist() == [1, 2, 3]
    assert decoded["vec"].lengths.tolist() == [2, 2]
    with TransformCache.open(tmp_path / "c") as cache:
        cache.put("tok", "fp", [(b"a" * 32, entries[0]), (b"b" * 32, entries[1])])
        assert set(cache.get("fp", [b"a" * 32, b"b" * 32, b"c" * 32])) == {b"a" * 32, b"b" * 32}
        assert cache.get("other", [b"a" * 32]) == {}  # another fingerprint: another code's outputs
    with closing(sqlite3.connect(tmp_path / "c" / FILE)) as conn, conn:
        conn.execute("UPDATE outputs SET data = zeroblob(length(data)) WHERE digest = ?", (b"a" * 32,))
    with TransformCache.open(tmp_path / "c") as cache:
        assert set(cache.get("fp", [b"a" * 32, b"b" * 32])) == {b"b" * 32}
        assert cache.damaged == 1
        assert [(c.name, c.entries) for c in cache.counts()] == [("tok", 1)]
        assert cache.clear(["tok"]) == 1


def test_a_cache_file_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", folder / FILE)
    with pytest.raises(StoreError, match="is a link"), TransformCache.open(folder):
        pass


PREP = """
import os

def tag(batch, ctx):
    return {"pid": [os.getpid()] * len(batch["x"]), "x2": [2 * x for x in batch["x"]]}
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_the_runner_places_outputs_by_position_whoever_ran_them(tmp_path: Path, workers: int) -> None:
    (tmp_path / "prep.py").write_text(PREP)
    path = tmp_path / "c.toml"
    path.write_text(
        '[samples]\nkeys = "SELECT 1"\nquery = "SELECT $1 AS x"\n'
        f'[transforms.t]\nfunction = "prep:tag"\ninputs = ["x"]\nworkers = {workers}\n'
        '[fields.pid]\ntransform = "t"\ndtype = "int64"\n[fields.x2]\ntransform = "t"\ndtype = "int64"\n'
        '[batches]\nsize = 2\n[store]\npath = "s"\n'
    )
    cfg = load_config(path)
    runner = Runner(cfg)
    runner.start()
    try:
        n = 101
        task = Task("t", {"x": list(range(n))}, np.arange(n, dtype=np.int64)[None, :], 0, 0, KeyColumns(("id",)))
        out = asyncio.run(runner.call(task))
    finally:
        runner.close()
    assert out["x2"].values.tolist() == [2 * x for x in range(n)]
    pids = set(out["pid"].values.tolist())
    assert (os.getpid() in pids) == (workers == 0)  # in this process, or only in the workers


@pytest.mark.parametrize(
    ("keys", "text", "slots"),
    [
        (KeyColumns(("id",)), "id=4", [4]),
        (KeyColumns(("id",)), "4", [4]),
        (KeyColumns(("a", "b")), "a=1, b=-2", [1, -2]),
        (KeyColumns.of_types(("d",), ("date",)), "d=1970-01-03", [2]),
    ],
)
def test_a_key_given_as_errors_name_it_is_its_slots(keys: KeyColumns, text: str, slots: list[int]) -> None:
    assert parse_key(keys, text)[:, 0].tolist() == slots


def test_a_key_that_is_not_one_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"--key 'idx=4': 'idx' is not a key column \(id\)"):
        parse_key(KeyColumns(("id",)), "idx=4")
    with pytest.raises(ConfigError, match="expected 2 value"):
        parse_key(KeyColumns(("a", "b")), "1")


def test_keys_left_out_are_compared_whole_over_every_slot() -> None:
    from pgprefetch.write.order.splits import among

    keys = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert among(keys, np.array([[2, 4], [6, 9]])).tolist() == [False, True, False, False]
    assert among(keys[:1], np.array([[2, 4]])).tolist() == [False, True, False, True]


def test_a_sparing_call_keeps_the_samples_that_do_not_fail(tmp_path: Path) -> None:
    (tmp_path / "prep.py").write_text(
        "def odd(batch, ctx):\n"
        "    if any(x % 2 for x in batch['x']):\n"
        "        raise ValueError('odd')\n"
        "    return {'x2': [2 * x for x in batch['x']]}\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[samples]\nkeys = "SELECT 1"\nquery = "SELECT $1 AS x"\n'
        '[transforms.t]\nfunction = "prep:odd"\ninputs = ["x"]\nworkers = 0\non_error = "skip"\n'
        '[fields.x2]\ntransform = "t"\ndtype = "int64"\n[batches]\nsize = 2\n[store]\npath = "s"\n'
    )
    runner = Runner(load_config(path))
    runner.start()
    try:
        task = Task("t", {"x": [0, 1, 2, 3, 4]}, np.arange(5, dtype=np.int64)[None, :], 0, 0, KeyColumns(("id",)))
        spared = asyncio.run(runner.call_sparing(task))
    finally:
        runner.close()
    assert spared.outputs["x2"].values.tolist() == [0, 4, 8]
    assert [i for i, _ in spared.failed] == [1, 3]
    assert "sample (id=1): transform t raised ValueError: odd" in spared.failed[0][1]


def _sparing_runner(tmp_path: Path, body: str) -> Runner:
    (tmp_path / "prep.py").write_text(f"def f(batch, ctx):\n{body}")
    path = tmp_path / "c.toml"
    path.write_text(
        '[samples]\nkeys = "SELECT 1"\nquery = "SELECT $1 AS x"\n'
        '[transforms.t]\nfunction = "prep:f"\ninputs = ["x"]\nworkers = 0\non_error = "skip"\n'
        '[fields.x2]\ntransform = "t"\ndtype = "int64"\n[batches]\nsize = 2\n[store]\npath = "s"\n'
    )
    runner = Runner(load_config(path))
    runner.start()
    return runner


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    return [1] * len(batch['x'])\n", "transform t returned list; expected a dict of outputs"),
        ("    raise NameError('helper')\n", "transform t failed on every one of the 8 samples it was given"),
    ],
)
def test_skipping_never_hides_a_broken_function(tmp_path: Path, body: str, message: str) -> None:
    runner = _sparing_runner(tmp_path, body)
    try:
        task = Task("t", {"x": list(range(8))}, np.arange(8, dtype=np.int64)[None, :], 0, 0, KeyColumns(("id",)))
        with pytest.raises(TransformError, match=re.escape(message)):
            asyncio.run(runner.call_sparing(task))
    finally:
        runner.close()


def test_an_integer_beside_a_float_keeps_every_digit() -> None:
    f = FieldConfig(name="ids", columns=(), dtype="int64", transform="t", max_length=2)
    packed = pack_outputs("t", [f], {"ids": [[2**53 + 1], [1.0]]}, 2, _named)["ids"]
    assert packed.values.tolist() == [2**53 + 1, 1]


def test_a_cleared_transform_s_number_is_never_given_to_another(tmp_path: Path) -> None:
    with TransformCache.open(tmp_path / "c") as cache:
        cache.put("tok", "old", [(b"a" * 32, b"x" * 16)])
        with TransformCache.open(tmp_path / "c") as other:
            other.clear(["tok"])
        cache.put("tok", "new", [(b"b" * 32, b"y" * 16)])
        assert cache.get("old", [b"a" * 32, b"b" * 32]) == {}
        assert cache.get("new", [b"b" * 32]) == {b"b" * 32: b"y" * 16}


def test_a_cache_folder_anyone_may_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(StoreError, match="anyone may write it"), TransformCache.open(folder):
        pass


def test_a_setup_runs_once_per_worker_with_the_options_and_its_result_is_ctx_state(tmp_path: Path) -> None:
    (tmp_path / "prep.py").write_text(
        "import os\n"
        "def load(options):\n"
        "    return {'scale': options['scale'], 'pid': os.getpid()}\n"
        "def scaled(batch, ctx):\n"
        "    return {'y': [x * ctx.state['scale'] for x in batch['x']], 'pid': [ctx.state['pid']] * len(batch['x'])}\n"
    )
    path = tmp_path / "c.toml"
    path.write_text(
        '[samples]\nkeys = "SELECT 1"\nquery = "SELECT $1 AS x"\n'
        '[transforms.t]\nfunction = "prep:scaled"\nsetup = "prep:load"\ninputs = ["x"]\nworkers = 1\n'
        "options = { scale = 3 }\n"
        '[fields.y]\ntransform = "t"\ndtype = "int64"\n[fields.pid]\ntransform = "t"\ndtype = "int64"\n'
        '[batches]\nsize = 2\n[store]\npath = "s"\n'
    )
    runner = Runner(load_config(path))
    runner.start()
    try:
        task = Task("t", {"x": [1, 2, 3]}, np.arange(3, dtype=np.int64)[None, :], 0, 0, KeyColumns(("id",)))
        first, second = asyncio.run(runner.call(task)), asyncio.run(runner.call(task))
    finally:
        runner.close()
    assert first["y"].values.tolist() == [3, 6, 9]
    pids = set(first["pid"].values.tolist()) | set(second["pid"].values.tolist())
    assert len(pids) == 1  # one worker, set up once: the same state for every call
    assert os.getpid() not in pids
