"""Transforms against PostgreSQL (#54): real tokenizers on real text, compared with the rows read back; the same
bytes for any worker count; a cache that hits, misses exactly what changed and never serves a damaged entry;
errors that are one line before anything is published.

Each tokenized sample is compared with the tokenizer applied to the row as a plain query reads it back, not
with anything the dump computed; a random transform's draws with a generator seeded as the docs say.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch import EpochArrays
from pgprefetch.write.transform.cache import FILE, FOLDER
from pgprefetch.write.transform.runner import rng_seeds

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, journal_lines, run_cli, start_dump, wait_for
from .harness.faults import kill_every_connection
from .harness.texts import ENCODING, bodies, gpt2_tokenizer_file, load_docs

PREP = """
import numpy as np

CALLS = []

def words(batch, ctx):
    with open(ctx.options["log"], "a") as log:
        log.write(f"{len(batch['body'])}\\n")
    first = [[ord(c) for c in b[:5]] for b in batch["body"]]
    return {"n_words": [len(b.split()) for b in batch["body"]], "first": first}

def noise(batch, ctx):
    return {"noise": [ctx.rng(i).random(2) for i in range(len(batch["body"]))]}
"""


@pytest.fixture
def docs(db: str) -> tuple[str, int]:
    return db, load_docs(db)


def _config(
    folder: Path,
    transforms: str,
    fields: str,
    *,
    scan: bool = False,
    size: int = 16,
    extra: str = "",
    prep: str = PREP,
) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "prep.py").write_text(prep)
    samples = (
        '[samples]\ntable = "docs"\nkey = ["id"]\n'
        if scan
        else '[samples]\nkeys = "SELECT id FROM docs"\nquery = "SELECT name, body, year FROM docs WHERE id = $1"\n'
    )
    path = folder / "c.toml"
    path.write_text(
        f"[source]\nconnections = 3\n{samples}{transforms}"
        f'[fields.year]\ncolumns = ["year"]\ndtype = "int16"\n{fields}'
        f'[batches]\nsize = {size}\ndrop_last = false\n{extra}[store]\npath = "store.zarr"\n'
    )
    return path


WORDS = (
    '[transforms.w]\nfunction = "prep:words"\ninputs = ["body"]\nworkers = {workers}\noptions = {{ log = "{log}" }}\n'
)
WORDS_FIELDS = (
    '[fields.n_words]\ntransform = "w"\ndtype = "int32"\n'
    '[fields.first]\ntransform = "w"\ndtype = "uint16"\nmax_length = 5\n'
)
NOISE = '[transforms.aug]\nfunction = "prep:noise"\ninputs = ["body"]\nrandom = true\nworkers = {workers}\n'
NOISE_FIELDS = '[fields.noise]\ntransform = "aug"\ndtype = "float64"\nshape = [2]\n'


def _store(path: Path | str) -> Path:
    """The store of a dump result's epoch path."""
    return Path(path).parent


def _by_key(path: Path | str, epoch: int, field: str) -> dict[int, Any]:
    """Each sample's value of ``field`` (cut to its length where it has one), by key (``path``: the epoch's)."""
    a = EpochArrays(_store(path), epoch)
    out = {}
    for b in range(len(a)):
        batch = a.batch(b, keys=True)
        lengths = batch.get(f"{field}_length")
        for i, key in enumerate(batch["keys"][:, 0].tolist()):
            value = batch[field][i]
            out[key] = value[: lengths[i]].tolist() if lengths is not None else value.tolist()
    return out


def _distinct(db: str) -> int:
    """The distinct texts: the fewest outputs an epoch computes with nothing cached (addressed by content).

    Two samples of one text are computed once when their units follow each other, the later finding the
    earlier's entry, and twice when one unit holds both: where units end depends on how fast fetches are.
    """
    return len(set(bodies(db).values()))


def _manifest(path: Path | str, epoch: int) -> dict[str, Any]:
    return EpochArrays(_store(path), epoch).manifest


@pytest.mark.parametrize("scan", [False, True], ids=["query", "scan"])
def test_tokenized_samples_equal_the_tokenizers_applied_to_the_rows_read_back(
    docs: tuple[str, int], tmp_path: Path, scan: bool
) -> None:
    db, n = docs
    tokenizer = gpt2_tokenizer_file(tmp_path)
    transforms = (
        f'[transforms.gpt2]\ntokenizer = "huggingface"\npath = "{tokenizer}"\ninputs = ["body"]\nworkers = 2\n'
        f'[transforms.cl100k]\ntokenizer = "tiktoken"\nencoding = "{ENCODING}"\ninputs = ["body"]\nworkers = 1\n'
    )
    fields = (  # (cut to their first 4,096: the long texts' ids are many times that)
        '[fields.gpt2]\ntransform = "gpt2"\ndtype = "uint16"\nmax_length = 4096\ntruncate = "right"\n'
        '[fields.cl100k]\ntransform = "cl100k"\ndtype = "uint32"\nmax_length = 4096\ntruncate = "right"\n'
    )
    result = dump(_config(tmp_path / "c", transforms, fields, scan=scan), db)
    assert result.n_samples == n
    import tiktoken
    from tokenizers import Tokenizer

    hf, tk = Tokenizer.from_file(str(tokenizer)), tiktoken.get_encoding(ENCODING)
    texts = bodies(db)
    gpt2, cl100k = _by_key(result.path, 0, "gpt2"), _by_key(result.path, 0, "cl100k")
    assert set(gpt2) == set(texts)
    for key, text in texts.items():
        assert gpt2[key] == hf.encode(text).ids[:4096], key
        assert cl100k[key] == tk.encode_ordinary(text)[:4096], key
    assert sum(len(v) == 4096 for v in gpt2.values()) > 5  # the long tail, cut


def test_an_epoch_is_the_same_bytes_for_any_worker_count_and_connections(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    epochs = {}
    for workers, connections in ((0, 1), (1, 3), (2, 8)):
        log = tmp_path / f"log{workers}"
        transforms = WORDS.format(workers=workers, log=log) + NOISE.format(workers=workers)
        config = _config(tmp_path / f"w{workers}", transforms, WORDS_FIELDS + NOISE_FIELDS)
        result = dump(config, db, epoch=3, connections=connections)
        epochs[workers] = chunk_bytes(result.path)
    assert epochs[0] == epochs[1] == epochs[2]


def test_a_random_transform_draws_from_the_sample_key_and_each_epoch_anew(
    docs: tuple[str, int], tmp_path: Path
) -> None:
    db, _ = docs
    config = _config(tmp_path / "c", NOISE.format(workers=2), NOISE_FIELDS)
    drawn = {e: _by_key(dump(config, db, epoch=e).path, e, "noise") for e in (0, 1)}
    for key, value in drawn[0].items():
        seeds = rng_seeds(0, 0, "aug", np.array([[key]], np.int64))[0]
        expected = np.random.Generator(np.random.Philox(key=[int(s) for s in seeds])).random(2)
        assert value == expected.tolist()
        assert drawn[1][key] != value  # another epoch, other draws
    assert len({tuple(v) for v in drawn[0].values()}) == len(drawn[0])  # each sample its own draws


def test_a_later_epoch_takes_every_output_from_the_cache(docs: tuple[str, int], tmp_path: Path) -> None:
    db, n = docs
    log = tmp_path / "calls"
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=log), WORDS_FIELDS)
    first = dump(config, db, epoch=0)
    called = sum(int(line) for line in log.read_text().split())
    second = dump(config, db, epoch=1)
    assert sum(int(line) for line in log.read_text().split()) == called  # the function was not called again
    assert _manifest(second.path, 1)["transforms"]["w"] | {"fingerprint": ""} == {
        "fingerprint": "",
        "random": False,
        "computed": 0,
        "cached": n,
    }
    assert _by_key(first.path, 0, "n_words") == _by_key(second.path, 1, "n_words")
    keys = [EpochArrays(_store(r.path), e).batch_keys(0) for e, r in enumerate((first, second))]
    assert not np.array_equal(*keys)  # reshuffled


def test_an_updated_row_and_a_new_version_recompute_exactly_what_changed(docs: tuple[str, int], tmp_path: Path) -> None:
    db, n = docs
    log = tmp_path / "calls"
    config = _config(tmp_path / "c", WORDS.format(workers=1, log=log), WORDS_FIELDS)
    dump(config, db, epoch=0)
    execute(db, "UPDATE docs SET body = 'three new words' WHERE id = 7")
    after = dump(config, db, epoch=1)
    assert _manifest(after.path, 1)["transforms"]["w"]["computed"] == 1
    assert _by_key(after.path, 1, "n_words")[7] == 3
    text = config.read_text().replace('inputs = ["body"]', 'inputs = ["body"]\nversion = "2"')
    config.write_text(text)
    bumped = dump(config, db, epoch=2)
    assert _distinct(db) <= _manifest(bumped.path, 2)["transforms"]["w"]["computed"] <= n


def test_an_edited_function_recomputes_in_the_same_store(docs: tuple[str, int], tmp_path: Path) -> None:
    db, n = docs
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=tmp_path / "log"), WORDS_FIELDS)
    dump(config, db, epoch=0)
    prep = config.parent / "prep.py"
    prep.write_text(prep.read_text().replace("len(b.split())", "len(b.split()) + 1"))
    edited = dump(config, db, epoch=1)
    assert _distinct(db) <= _manifest(edited.path, 1)["transforms"]["w"]["computed"] <= n
    words = _by_key(edited.path, 1, "n_words")
    assert all(words[key] == len(text.split()) + 1 for key, text in bodies(db).items())


def test_a_damaged_cache_entry_is_recomputed_never_used(docs: tuple[str, int], tmp_path: Path) -> None:
    db, n = docs
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=tmp_path / "log"), WORDS_FIELDS)
    first = dump(config, db, epoch=0)
    cache = tmp_path / "c" / "store.zarr" / FOLDER / FILE
    with (
        closing(sqlite3.connect(cache)) as conn,
        conn,
    ):  # every entry's bytes changed, their checksums left as they were
        conn.execute("UPDATE outputs SET data = CAST(zeroblob(length(data)) AS BLOB)")
    second = dump(config, db, epoch=1)
    m = _manifest(second.path, 1)["transforms"]["w"]
    assert _distinct(db) <= m["computed"] <= n
    assert _by_key(second.path, 1, "n_words") == _by_key(first.path, 0, "n_words")


def test_a_failing_transform_is_one_line_naming_it_and_the_rerun_resumes(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    failing = PREP + (
        "\ndef fails(batch, ctx):\n"
        "    if any(k[0] == 100 for k in ctx.keys):\n"
        "        raise ValueError('no good')\n"
        "    return words(batch, ctx)\n"
    )
    transforms = WORDS.format(workers=2, log=tmp_path / "log").replace("prep:words", "prep:fails")
    config = _config(tmp_path / "c", transforms, WORDS_FIELDS, prep=failing, size=4)
    code, out = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code == 1
    assert "Traceback" not in out
    line = out.strip().splitlines()[-1]
    assert line == (
        f"Error: sample (id=100): transform w raised ValueError: no good; rerun it alone: pgprefetch transform "
        f"--config {config} --transform w --key id=100"
    )
    store = config.parent / "store.zarr"
    assert not (store / "epoch-00000").exists()  # nothing published
    code, out = run_cli("--debug", "dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code != 0
    assert "in fails" in out  # --debug: the function's own traceback, from the worker that ran it
    code, out = run_cli("transform", "--config", str(config), "--dsn", db, "--transform", "w", "--key", "id=100")
    assert code == 1
    assert 'raise ValueError("no good")' not in out
    assert "ValueError: no good" in out
    assert "in fails" in out  # the function's own traceback
    written = journal_lines(store)
    (config.parent / "prep.py").write_text(failing.replace("== 100", "== -1"))
    result = dump(config, db)
    assert written > 0
    assert result.resumed == written


def test_an_output_its_field_cannot_hold_stops_the_dump_before_the_first_batch(
    docs: tuple[str, int], tmp_path: Path
) -> None:
    db, _ = docs
    big = PREP.replace("[ord(c) for c in b[:5]]", "[70000]")
    assert big != PREP
    config = _config(tmp_path / "c", WORDS.format(workers=1, log=tmp_path / "log"), WORDS_FIELDS, prep=big)
    code, out = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code == 1
    line = out.strip().splitlines()[-1]
    assert "transform w, field first: value 70000 does not fit uint16 (range 0..65535)" in line
    assert 'dtype = "int32"' in line
    assert "--key id=" in line
    assert journal_lines(config.parent / "store.zarr") <= 0  # no batch written (-1: no partial epoch at all)


def test_check_runs_the_transforms_and_names_what_they_return_wrong(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    short = PREP.replace('first = [[ord(c) for c in b[:5]] for b in batch["body"]]', "first = [[1]]")
    assert short != PREP
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=tmp_path / "log"), WORDS_FIELDS, prep=short)
    code, out = run_cli("check", "--config", str(config), "--dsn", db)
    assert code == 1
    assert "transform w, field first: 1 values for 16 samples; expected one per sample" in out
    assert "field first: uint16 (5,) per sample, transform w" in out  # the fields a transform fills, said so


def test_inputs_the_query_does_not_return_are_one_line(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    transforms = WORDS.format(workers=0, log=tmp_path / "log").replace('["body"]', '["bdy"]')
    config = _config(tmp_path / "c", transforms, WORDS_FIELDS)
    code, out = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code == 2
    assert out.strip().endswith(
        '[transforms.w] inputs: [samples] query returns no column "bdy" (it returns name, body, year)'
    )


def test_the_cache_is_counted_by_ls_and_cleared_by_its_command(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=tmp_path / "log"), WORDS_FIELDS)
    dump(config, db)
    n = _distinct(db)
    code, out = run_cli("ls", "--config", str(config), "--json")
    listed = json.loads(out)["transform_cache"]["transforms"]
    assert code == 0
    assert [(t["name"], t["entries"]) for t in listed] == [("w", n)]
    code, out = run_cli("cache", "--config", str(config), "--clear", "--transform", "w")
    assert code == 0
    assert f"removed {n:,} outputs" in out
    code, out = run_cli("cache", "--config", str(config), "--clear")
    assert code == 0
    assert "removed" in out
    assert not list((config.parent / "store.zarr").rglob(FILE))
    code, out = run_cli("cache", "--config", str(config), "--json")
    assert json.loads(out)["transforms"] == []


def test_the_python_api_takes_a_function_object(docs: tuple[str, int], tmp_path: Path) -> None:
    import pgprefetch

    db, n = docs

    def lengths(batch: dict[str, list[Any]], ctx: Any) -> dict[str, list[int]]:
        return {"n": [len(b) for b in batch["body"]]}

    spec = {
        "source": {"dsn": db, "connections": 2},
        "samples": {"keys": "SELECT id FROM docs", "query": "SELECT body, year FROM docs WHERE id = $1"},
        "transforms": {"t": {"function": "prep:placeholder", "inputs": ["body"], "workers": 0}},
        "fields": {"n": {"transform": "t", "dtype": "int64"}},
        "batches": {"size": 10, "drop_last": False},
        "store": {"path": str(tmp_path / "store.zarr")},
    }
    (result,) = pgprefetch.dump(spec, transforms={"t": lengths})
    got = _by_key(result.path, 0, "n")
    assert got == {key: len(text) for key, text in bodies(db).items()}
    assert len(got) == n


def test_an_object_store_keeps_its_cache_in_the_scratch_folder(docs: tuple[str, int], s3: Any, tmp_path: Path) -> None:
    db, n = docs
    config = _config(tmp_path / "c", WORDS.format(workers=0, log=tmp_path / "log"), WORDS_FIELDS)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    store = f"s3://{s3.bucket()}/transformed"
    dump(config, db, epoch=0, store=store, scratch=str(scratch))
    second = dump(config, db, epoch=1, store=store, scratch=str(scratch))
    assert second.n_samples == n
    assert len(list(scratch.glob(f"pgprefetch/*/{FILE}"))) == 1


@pytest.mark.parametrize("scan", [False, True], ids=["query", "scan"])
def test_the_ray_executor_writes_the_same_bytes_and_shares_the_cache_on_one_machine(
    ray_cluster: object, docs: tuple[str, int], tmp_path: Path, scan: bool
) -> None:
    from .harness.raycluster import on_ray

    db, _ = docs
    tokenizer = gpt2_tokenizer_file(tmp_path)
    transforms = (
        f'[transforms.gpt2]\ntokenizer = "huggingface"\npath = "{tokenizer}"\ninputs = ["body"]\nworkers = 1\n'
        + NOISE.format(workers=0)
    )
    fields = '[fields.gpt2]\ntransform = "gpt2"\ndtype = "uint16"\nmax_length = 64\ntruncate = "left"\n' + NOISE_FIELDS
    single = dump(_config(tmp_path / "single", transforms, fields, scan=scan), db, epoch=1)
    config = _config(tmp_path / "ray", transforms, fields, scan=scan)
    spread = on_ray(config, db, epoch=1, parts=3)
    assert chunk_bytes(Path(spread.path)) == chunk_bytes(Path(single.path))
    again = on_ray(config, db, epoch=2, parts=3)
    counts = _manifest(again.path, 2)["transforms"]
    assert counts["gpt2"]["computed"] == 0  # every part found the first epoch's outputs
    assert counts["gpt2"]["cached"] == counts["aug"]["computed"] == single.n_samples


SKIPPING = (
    PREP
    + "\ndef picky(batch, ctx):\n"
    + "    with open(ctx.options['log'] + '.tried', 'a') as tried:\n"
    + "        tried.write(f\"{len(batch['body'])}\\n\")\n"
    + "    if any(len(b) % 7 == 0 for b in batch['body']):\n"
    + "        raise ValueError('a multiple of seven')\n"
    + "    return words(batch, ctx)\n"
)


@pytest.mark.parametrize("scan", [False, True], ids=["query", "scan"])
def test_a_skipping_transform_leaves_out_the_samples_it_fails_on_in_every_epoch(
    docs: tuple[str, int], tmp_path: Path, scan: bool
) -> None:
    db, n = docs
    log = tmp_path / "calls"
    transforms = WORDS.format(workers=2, log=log).replace("prep:words", "prep:picky") + 'on_error = "skip"\n'
    config = _config(tmp_path / "c", transforms, WORDS_FIELDS, prep=SKIPPING, scan=scan)
    failing = {key for key, text in bodies(db).items() if len(text) % 7 == 0}
    assert 0 < len(failing) < n
    first = dump(config, db, epoch=0)
    words = _by_key(first.path, 0, "n_words")
    assert set(words) == set(bodies(db)) - failing  # every other sample, each once
    assert all(words[k] == len(t.split()) for k, t in bodies(db).items() if k not in failing)
    record = _manifest(first.path, 0)["transforms"]["w"]
    assert record["left_out"] == len(failing)
    assert record["left_out_keys"] == [f"id={k}" for k in sorted(failing)]
    code, out = run_cli("ls", "--config", str(config), "--json")
    assert code == 0
    assert json.loads(out)["epochs"][0]["left_out"] == len(failing)
    tried = Path(f"{log}.tried")
    tried.unlink()
    second = dump(config, db, epoch=1)
    assert not tried.exists()  # the outputs were cached and the failures recorded: nothing ran again
    assert set(_by_key(second.path, 1, "n_words")) == set(words)
    fixed = min(failing)
    execute(db, f"UPDATE docs SET body = body || 'x' WHERE id = {fixed}")  # a length no longer a multiple of 7
    third = dump(config, db, epoch=2)
    assert fixed in _by_key(third.path, 2, "n_words")
    assert _manifest(third.path, 2)["transforms"]["w"]["left_out"] == len(failing) - 1


def test_check_notes_the_samples_a_skipping_transform_would_leave_out(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    transforms = WORDS.format(workers=0, log=tmp_path / "log").replace("prep:words", "prep:picky")
    config = _config(tmp_path / "c", transforms + 'on_error = "skip"\n', WORDS_FIELDS, prep=SKIPPING, size=64)
    code, out = run_cli("check", "--config", str(config), "--dsn", db)
    assert code == 0, out
    assert 'hold samples a transform with on_error = "skip" fails on, which the dump leaves out' in out
    assert "ValueError: a multiple of seven" in out


def _mixed_config(folder: Path, transforms: str, fields: str, prep: str = SKIPPING) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "prep.py").write_text(prep)
    path = folder / "c.toml"
    path.write_text(
        "[source]\nconnections = 3\n"
        '[samples.odd]\nkeys = "SELECT id FROM docs WHERE id % 2 = 1"\n'
        'query = "SELECT body, year FROM docs WHERE id = $1"\n'
        '[samples.even]\ntable = "SELECT id, body, year FROM docs WHERE id % 2 = 0"\nkey = ["id"]\n'
        f'{transforms}[fields.year]\ncolumns = ["year"]\ndtype = "int16"\n{fields}'
        '[batches]\nsize = 16\n[store]\npath = "store.zarr"\n'
    )
    return path


def test_a_mixed_epoch_transforms_each_source_and_keeps_its_shares_while_skipping(
    docs: tuple[str, int], tmp_path: Path
) -> None:
    db, _ = docs
    picky = WORDS.format(workers=2, log=tmp_path / "log").replace("prep:words", "prep:picky") + 'on_error = "skip"\n'
    config = _mixed_config(tmp_path / "m", picky + NOISE.format(workers=1), WORDS_FIELDS + NOISE_FIELDS)
    result = dump(config, db, epoch=0)
    texts = bodies(db)
    failing = {k for k, t in texts.items() if len(t) % 7 == 0}
    a = EpochArrays(_store(result.path), 0)
    record = a.manifest["transforms"]["w"]
    assert record["left_out"] == len(failing)
    for b in range(len(a)):
        batch = a.batch(b, keys=True)
        keys, sources = batch["keys"][:, 0].tolist(), batch["source"].tolist()
        assert sources.count(0) == sources.count(1) == 8  # weights 1:1: each batch holds each source's share
        for i, key in enumerate(keys):
            assert key not in failing
            assert key % 2 == (1 if sources[i] == 0 else 0)  # odd from the query source, even from the table
            assert batch["n_words"][i] == len(texts[key].split())
            seeds = rng_seeds(0, 0, "aug", np.array([[key]], np.int64), "odd" if sources[i] == 0 else "even")[0]
            drawn = np.random.Generator(np.random.Philox(key=[int(s) for s in seeds])).random(2)
            assert batch["noise"][i].tolist() == drawn.tolist()
    in_process = picky.replace("workers = 2", "workers = 0") + NOISE.format(workers=0)
    again = _mixed_config(tmp_path / "w0", in_process, WORDS_FIELDS + NOISE_FIELDS)
    assert chunk_bytes(dump(again, db, epoch=0).path) == chunk_bytes(result.path)


def test_a_mixed_epoch_with_transforms_on_ray_is_the_single_process_bytes(
    ray_cluster: object, docs: tuple[str, int], tmp_path: Path
) -> None:
    from .harness.raycluster import on_ray

    db, _ = docs
    picky = WORDS.format(workers=0, log=tmp_path / "log").replace("prep:words", "prep:picky") + 'on_error = "skip"\n'
    transforms, fields = picky + NOISE.format(workers=0), WORDS_FIELDS + NOISE_FIELDS  # (in the parts' processes)
    single = dump(_mixed_config(tmp_path / "single", transforms, fields), db, epoch=1)
    spread = on_ray(_mixed_config(tmp_path / "ray", transforms, fields), db, epoch=1, parts=3)
    assert chunk_bytes(spread.path) == chunk_bytes(single.path)
    ours, theirs = _manifest(spread.path, 1)["transforms"], _manifest(single.path, 1)["transforms"]
    assert ours["w"]["left_out_keys"] == theirs["w"]["left_out_keys"]
    assert ours["aug"]["computed"] == single.n_samples  # a random transform, every sample drawn by its part


def test_a_mixed_epoch_s_error_names_the_source_and_its_rerun_takes_it(docs: tuple[str, int], tmp_path: Path) -> None:
    db, _ = docs
    failing = (
        PREP + "\ndef fails(batch, ctx):\n    if any(k[0] == 100 for k in ctx.keys):\n        raise ValueError('no')\n"
    )
    failing += "    return words(batch, ctx)\n"
    transforms = WORDS.format(workers=0, log=tmp_path / "log").replace("prep:words", "prep:fails")
    config = _mixed_config(tmp_path / "m", transforms, WORDS_FIELDS, prep=failing)
    code, out = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code == 1
    line = out.strip().splitlines()[-1]
    assert line.startswith("Error: sample (id=100) of source even: transform w raised ValueError: no; rerun it")
    assert line.endswith("--transform w --key id=100 --source even")
    code, out = run_cli(
        "transform", "--config", str(config), "--dsn", db, "--transform", "w", "--key", "id=100", "--source", "even"
    )
    assert code == 1
    assert "in fails" in out
    code, out = run_cli("transform", "--config", str(config), "--dsn", db, "--transform", "w", "--key", "id=151")
    assert code == 2
    assert "--source: a mixed config's sample is of one of its sources (odd, even)" in out


SLOW = (
    PREP
    + "\nimport time\n\ndef slow(batch, ctx):\n"
    + "    time.sleep(0.03 * len(batch['body']))\n"
    + "    return words(batch, ctx)\n"
)


def _slow_config(folder: Path, tmp_path: Path) -> Path:
    transforms = WORDS.format(workers=2, log=tmp_path / "log").replace("prep:words", "prep:slow")
    return _config(folder, transforms + NOISE.format(workers=1), WORDS_FIELDS + NOISE_FIELDS, prep=SLOW, size=4)


def test_lost_connections_midway_are_retried_and_the_epoch_is_the_clean_one(
    docs: tuple[str, int], tmp_path: Path
) -> None:
    db, _ = docs
    config = _slow_config(tmp_path / "c", tmp_path)
    store = config.parent / "store.zarr"
    proc = start_dump(config, db, 0, "--json")
    wait_for(lambda: journal_lines(store) >= 3)
    kill_every_connection(db)  # the batches' connections and the transforms' statement's alike
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["retries"] == 1
    clean = dump(_slow_config(tmp_path / "clean", tmp_path), db)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


def test_sigterm_stops_the_dump_and_its_workers_and_the_rerun_resumes(docs: tuple[str, int], tmp_path: Path) -> None:
    import psutil

    db, _ = docs
    config = _slow_config(tmp_path / "c", tmp_path)
    store = config.parent / "store.zarr"
    proc = start_dump(config, db, 0)
    wait_for(lambda: journal_lines(store) >= 2)
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert workers  # the forkserver and its worker processes
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1] == "Terminated."
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers))
    assert not (store / "epoch-00000").exists()  # nothing published
    written = journal_lines(store)
    result = dump(config, db)
    assert result.resumed == written
    clean = dump(_slow_config(tmp_path / "clean", tmp_path), db)
    assert chunk_bytes(Path(result.path)) == chunk_bytes(clean.path)
