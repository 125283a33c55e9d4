"""Windows stored as starts (``[store] windows = "starts"``): the rows once, each window its first row.

The ``wt`` table holds series of 1..60 rows in random heap order: a float array column, a nullable float
(``null = "nan"``: a mask), an int array of any length (``max_length``: lengths, ``_longest``). One dump of
each layout, and the query-mode twin, serve every reader's test: each reader hands out, from the starts
layout, the bytes of the ``"batches"`` layout and of the twin.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from pgprefetch import ArrayStream, EpochArrays, EpochDataset, EpochStream, StoreError

from .harness.db import execute, fetch, own_database
from .harness.dumps import dump, dump_argv, journal_lines, run_cli, wait_for
from .harness.s3 import S3

WINDOW, STRIDE, SIZE = 8, 2, 16
TABLE = (
    """CREATE TABLE wt (sid int, t int, a real[] NOT NULL, v float8, tok int[] NOT NULL, label smallint NOT NULL)""",
    """INSERT INTO wt SELECT s, t, ARRAY[s + t * 0.25, -t, s * 0.5],
              CASE WHEN (s + t) % 7 = 0 THEN NULL ELSE s * 10 + t END,
              (SELECT coalesce(array_agg(s * 100 + k), '{}') FROM generate_series(1, (s * t) % 6) k), (s * 3 + t) % 5
       FROM generate_series(1, 30) s, generate_series(1, (s * 17) % 60 + 1) t ORDER BY random()""",
)
BIG = """CREATE TABLE IF NOT EXISTS wt_big AS
         SELECT sid + 100 * k AS sid, t, a, v, tok, label FROM wt, generate_series(0, 29) k"""  # 30 times wt
FIELDS = """
[fields.a]
columns = ["a"]
dtype = "float32"
[fields.v]
columns = ["v"]
dtype = "float64"
null = "nan"
[fields.tok]
columns = ["tok"]
dtype = "int32"
max_length = 4
truncate = "right"
[fields.label]
columns = ["label"]
dtype = "int64"
"""


def config(
    folder: Path, layout: str = "starts", *, store: str = "store.zarr", extra: str = "", **samples: object
) -> Path:
    """A scan config of ``wt``'s windows (``layout`` their store layout), or its query-mode twin (``keys``...)."""
    settings = samples or {"table": "wt", "key": ["sid"], "order": "t", "window": WINDOW, "stride": STRIDE}
    lines = ["[source]", "connections = 2", extra, "[samples]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += ["[batches]", f"size = {SIZE}", "seed = 3", "drop_last = false", "[store]", f"path = {json.dumps(store)}"]
    lines += [f'windows = "{layout}"'] if "table" in settings else []
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.toml").write_text("\n".join(lines) + "\n" + FIELDS)
    return folder / "c.toml"


def twin(folder: Path) -> Path:
    keys = f"""SELECT sid, t FROM (
                 SELECT sid, t, row_number() OVER w - 1 AS i, count(*) OVER (PARTITION BY sid) AS n
                 FROM wt WINDOW w AS (PARTITION BY sid ORDER BY t)) s
               WHERE i % {STRIDE} = 0 AND i + {WINDOW} <= n"""
    query = f"SELECT a, v, tok, label FROM wt WHERE sid = $1 AND t >= $2 ORDER BY t LIMIT {WINDOW}"
    return config(folder, keys=keys, query=query, rows=WINDOW)


@pytest.fixture(scope="module")
def wt(pg_dsn: str) -> Iterator[str]:
    with own_database(pg_dsn) as dsn:
        execute(dsn, *TABLE)
        yield dsn


@pytest.fixture(scope="module")
def stores(wt: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Epochs 0 and 1 in each layout (one read: two epochs cut from it), epoch 0 of the query-mode twin."""
    root = tmp_path_factory.mktemp("windows")
    paths = {}
    for layout in ("starts", "batches"):
        cfg = config(root / layout, layout)
        code, out = run_cli("dump", "--config", str(cfg), "--epochs", "0-1", "--dsn", wt)
        assert code == 0, out
        paths[layout] = root / layout / "store.zarr"
    paths["twin"] = Path(dump(twin(root / "twin"), wt).path).parent
    return paths


def every_batch(reader: EpochArrays | EpochDataset) -> list[dict[str, bytes]]:
    return [{k: np.asarray(v).tobytes() for k, v in reader.batch(i, keys=True).items()} for i in range(len(reader))]


def test_the_starts_epoch_is_the_rows_once_and_a_start_a_window(stores: dict[str, Path], wt: str) -> None:
    starts = zarr.open_group(stores["starts"])["epoch-00000"]
    manifest = starts.attrs["pgprefetch"]
    record = manifest["windows"]
    # A series of n >= WINDOW rows has windows up to the last start (n - WINDOW) // STRIDE * STRIDE.
    covered = f"""SELECT count(*) FROM (SELECT row_number() OVER w - 1 AS i, count(*) OVER (PARTITION BY sid) AS n
                  FROM wt WINDOW w AS (PARTITION BY sid ORDER BY t)) s
                  WHERE n >= {WINDOW} AND i < (n - {WINDOW}) / {STRIDE} * {STRIDE} + {WINDOW}"""
    n = fetch(wt, "SELECT count(*) FROM wt")[0][0]
    assert record["rows"] == fetch(wt, covered)[0][0] < n  # short series and tails no window reaches: not kept
    assert starts["a"].shape == (manifest["n_batches"], record["rows_per_batch"], 3)
    assert starts["_starts"].shape == (manifest["n_batches"], SIZE)
    batches = zarr.open_group(stores["batches"])["epoch-00000"].attrs["pgprefetch"]
    assert manifest["bytes"] < batches["bytes"] / 2
    assert manifest["n_samples"] == batches["n_samples"] > 0


def test_epoch_arrays_hand_out_the_batches_bytes_and_the_twins(stores: dict[str, Path]) -> None:
    for epoch in (0, 1):
        got = every_batch(EpochArrays(stores["starts"], epoch, consumer=None))
        assert got == every_batch(EpochArrays(stores["batches"], epoch, consumer=None))
    assert every_batch(EpochArrays(stores["starts"], 0, consumer=None)) == every_batch(
        EpochArrays(stores["twin"], 0, consumer=None)
    )


def test_other_batch_sizes_ranks_read_into_and_a_stream_give_the_batches_bytes(stores: dict[str, Path]) -> None:
    for kwargs in ({"batch_size": 5}, {"batch_size": 40}, {"rank": 1, "world_size": 3}):
        a, b = (EpochArrays(stores[k], 0, consumer=None, **kwargs) for k in ("starts", "batches"))  # type: ignore[arg-type]
        assert every_batch(a) == every_batch(b), kwargs
    a, b = (EpochArrays(stores[k], 1, consumer=None) for k in ("starts", "batches"))
    buffers = a.new_buffers()
    for i in range(len(a)):
        got = a.read_into(i, buffers)
        assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in b[i].items()}
    streams = [list(ArrayStream(stores[k], 0, 2, consumer=None, batch_size=7)) for k in ("starts", "batches")]
    assert [{k: v.tobytes() for k, v in s.items()} for s in streams[0]] == [
        {k: v.tobytes() for k, v in s.items()} for s in streams[1]
    ]


@pytest.mark.filterwarnings("ignore:pgprefetch. batches are already shuffled:UserWarning")
def test_torch_readers_give_the_batches_bytes_in_workers_too(stores: dict[str, Path]) -> None:
    import torch

    def through(loader: object) -> list[dict[str, bytes]]:
        return [{k: v.numpy().tobytes() for k, v in b.items()} for b in loader]  # type: ignore[attr-defined]

    a, b = (EpochDataset(stores[k], 0, consumer=None) for k in ("starts", "batches"))
    assert through(a) == through(b)
    loaders = [torch.utils.data.DataLoader(EpochDataset(stores[k], 1, consumer=None), batch_size=None, num_workers=2)
               for k in ("starts", "batches")]  # fmt: skip
    assert through(loaders[0]) == through(loaders[1])
    buffers = a.new_buffers()
    assert {k: v.numpy().tobytes() for k, v in a.read_into(3, buffers).items()} == {
        k: v.numpy().tobytes() for k, v in b[3].items()
    }
    streams = [EpochStream(stores[k], 0, 2, consumer=None, batch_size=9) for k in ("starts", "batches")]
    assert through(streams[0]) == through(streams[1])


def test_grain_and_jax_give_the_batches_bytes(stores: dict[str, Path]) -> None:
    from pgprefetch.grain import EpochSource
    from pgprefetch.jax import device_batches

    records = [list(EpochSource(stores[k], 0, keys=True, consumer=None)) for k in ("starts", "batches")]
    assert [{k: v.tobytes() for k, v in r.items()} for r in records[0]] == [
        {k: v.tobytes() for k, v in r.items()} for r in records[1]
    ]
    on_device = [list(device_batches(EpochArrays(stores[k], 1, consumer=None))) for k in ("starts", "batches")]
    assert [{k: np.asarray(v).tobytes() for k, v in b.items()} for b in on_device[0]] == [
        {k: np.asarray(v).tobytes() for k, v in b.items()} for b in on_device[1]
    ]


def test_a_resume_state_taken_mid_epoch_continues_with_the_batches_bytes(stores: dict[str, Path]) -> None:
    reader = EpochArrays(stores["starts"], 0, consumer=None, rank=0, world_size=2)
    it = iter(reader)
    for _ in range(3):
        next(it)
    state = reader.state_dict()
    rest = EpochArrays(stores["starts"], 0, consumer=None, batch_size=6)
    rest.load_state_dict(state)
    twin = EpochArrays(stores["batches"], 0, consumer=None, batch_size=6)
    twin.load_state_dict(state)
    assert len(rest) > 0
    assert every_batch(rest) == every_batch(twin)


def test_the_statistics_and_each_batchs_longest_are_the_windows_own(stores: dict[str, Path]) -> None:
    starts, batches = (EpochArrays(stores[k], 0, consumer=None) for k in ("starts", "batches"))
    assert {k: v.tolist() for k, v in starts.longest.items()} == {k: v.tolist() for k, v in batches.longest.items()}
    assert starts.longest["tok_length"].max() == 4
    for field, columns in batches.stats.items():
        for column, figures in columns.items():
            got = starts.stats[field][column]
            assert got["count"] == figures["count"]
            assert (got["min"], got["max"]) == (figures["min"], figures["max"])
            assert got["mean"] == pytest.approx(figures["mean"], rel=1e-12)
            assert got["std"] == pytest.approx(figures["std"], rel=1e-9)


def test_verify_checks_the_rows_and_the_starts(stores: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    store = tmp_path / "copy.zarr"
    shutil.copytree(stores["starts"], store)
    assert run_cli("verify", "--store", str(store), "--epoch", "0") == (
        0,
        "epoch 0: every chunk matches its checksum\n",
    )
    rows = next((store / "epoch-00000" / "a").rglob("c/*/*/*"))
    data = bytearray(rows.read_bytes())
    data[12] ^= 0x01
    rows.write_bytes(bytes(data))
    code, out = run_cli("verify", "--store", str(store), "--epoch", "0")
    assert code == 1
    assert "a batch 0: checksum mismatch" in out.splitlines()


def test_a_start_outside_the_rows_is_a_store_error_for_readers_and_verify(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from pgprefetch.store.layout import checksum

    store = tmp_path / "forged.zarr"
    shutil.copytree(stores["starts"], store)
    group = zarr.open_group(store)["epoch-00000"]
    starts = group["_starts"]
    forged = np.array(starts[0])
    forged[2] = 10**9  # beyond every row
    starts[0] = forged
    names = group.attrs["pgprefetch"]["checksums"]["arrays"]
    sums = np.array(group["_checksums"][:])
    sums[names.index("_starts"), 0] = checksum(forged.astype("<i8").tobytes())  # a forger's own checksum
    group["_checksums"][:] = sums
    with pytest.raises(StoreError, match="starts outside the epoch's"):
        EpochArrays(store, 0, consumer=None)[0]
    code, out = run_cli("verify", "--store", str(store), "--epoch", "0")
    assert code == 1
    assert "_starts batch 0: 1 window(s) start outside the epoch's" in out


@pytest.mark.parametrize("compression", ["zstd"])
def test_compressed_starts_give_the_batches_bytes(wt: str, tmp_path: Path, compression: str) -> None:
    cfg = config(tmp_path / "z", extra="")
    text = cfg.read_text().replace('windows = "starts"', f'windows = "starts"\ncompression = "{compression}"')
    cfg.write_text(text)
    got = dump(cfg, wt)
    want = dump(config(tmp_path / "b", "batches"), wt)
    assert every_batch(EpochArrays(Path(got.path).parent, 0, consumer=None)) == every_batch(
        EpochArrays(Path(want.path).parent, 0, consumer=None)
    )


@pytest.mark.parametrize("held", [True, False])
def test_starts_in_s3_give_the_batches_bytes(
    wt: str, tmp_path: Path, s3: S3, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """Rows held (fetched whole once, in blocks) or fetched as each batch's windows need them."""
    import pgprefetch.read.windows

    monkeypatch.setattr(pgprefetch.read.windows, "HELD_BYTES", 1 << 30 if held else 0)
    monkeypatch.setattr(pgprefetch.read.windows, "BLOCK_ROWS_BYTES", 1000)  # many blocks, fetched concurrently
    monkeypatch.setattr(pgprefetch.read.windows, "MERGE_BYTES", 2000)  # several runs a batch, fetched concurrently
    bucket = s3.bucket()
    remote = dump(config(tmp_path / "s3", store=f"s3://{bucket}/w"), wt)
    local = dump(config(tmp_path / "b", "batches"), wt)
    reader = EpochArrays(f"s3://{bucket}/w", 0, consumer=None)
    assert every_batch(reader) == every_batch(EpochArrays(Path(local.path).parent, 0, consumer=None))
    assert remote.n_samples == local.n_samples
    fetched = reader.bytes_fetched
    assert list(reader)  # iteration fetches ahead, concurrently
    record = reader.manifest["windows"]
    row_bytes = 4 * 3 + 8 + 1 + 4 * 4 + 4 + 8  # a, v, v_null, tok, tok_length, label
    if held:  # the rows once in this process, however many passes: then only the keys and the starts
        assert reader.bytes_fetched - fetched < record["rows"] * row_bytes
    else:
        assert reader.bytes_fetched - fetched > record["rows"] * row_bytes  # each batch's windows' rows again


def test_kill_9_while_writing_a_starts_epoch_then_rerun_resumes_to_the_clean_bytes(wt: str, tmp_path: Path) -> None:
    # Batches of one window, compressed: milliseconds each through zarr, so the dump is still writing when killed.
    sparse = {"table": "wt", "key": ["sid"], "order": "t", "window": WINDOW, "stride": 9}  # about 220 windows
    slow = config(tmp_path / "a", **sparse).read_text().replace(f"size = {SIZE}", "size = 1")
    slow = slow.replace('windows = "starts"', 'windows = "starts"\ncompression = "zstd"')
    cfg = tmp_path / "a" / "c.toml"
    cfg.write_text(slow)
    store = tmp_path / "a" / "store.zarr"
    proc = subprocess.Popen(dump_argv(cfg, wt), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_lines(store) >= 30)
    proc.kill()
    proc.communicate()
    assert not (store / "epoch-00000").exists()
    rerun = subprocess.run([*dump_argv(cfg, wt), "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["resumed_batches"] > 0
    clean = tmp_path / "b" / "c.toml"
    clean.parent.mkdir()
    clean.write_text(slow)
    dump(clean, wt)
    a, b = (zarr.open_group(p)["epoch-00000"] for p in (store, tmp_path / "b" / "store.zarr"))
    for name in ("a", "v", "v_null", "tok", "tok_length", "label", "_starts", "keys"):
        assert np.array_equal(a[name][:], b[name][:], equal_nan=name == "v"), name
    assert every_batch(EpochArrays(store, 0, consumer=None)) == every_batch(
        EpochArrays(tmp_path / "b" / "store.zarr", 0, consumer=None)
    )


def test_a_time_cut_split_stores_its_own_rows(wt: str, tmp_path: Path) -> None:
    splits = '\n[splits]\nby = "order"\ntrain = {}\nval = { from = 30 }\n'
    got, want = (config(tmp_path / k, k) for k in ("starts", "batches"))
    for cfg in (got, want):
        cfg.write_text(cfg.read_text() + splits)
        for split in ("train", "val"):
            dump(cfg, wt, split=split)
    for split in ("train", "val"):
        a, b = (EpochArrays(c.parent / "store.zarr", 0, consumer=None, split=split) for c in (got, want))
        assert every_batch(a) == every_batch(b), split


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"keys": "SELECT sid, t FROM wt", "query": "SELECT a FROM wt WHERE sid = $1 AND t = $2"}, "needs scan-mode"),
        ({"table": "wt", "key": ["sid", "t"]}, "needs scan-mode windows"),
    ],
)
def test_starts_outside_scan_mode_windows_are_refused_in_one_line(tmp_path: Path, settings: dict, message: str) -> None:
    cfg = config(tmp_path, **settings)
    if "keys" in settings:
        cfg.write_text(cfg.read_text().replace('path = "store.zarr"', 'path = "store.zarr"\nwindows = "starts"'))
    code, out = run_cli("check", "--config", str(cfg), "--dsn", "postgresql://nowhere.invalid/x")
    assert code == 2
    assert message in out
    assert len(out.strip().splitlines()) == 1


def test_a_table_beyond_memory_is_refused_naming_the_memory_that_holds_it(wt: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, extra='memory = "1MiB"')
    execute(wt, BIG)
    cfg.write_text(cfg.read_text().replace('table = "wt"', 'table = "wt_big"'))
    code, out = run_cli("dump", "--config", str(cfg), "--epoch", "0", "--dsn", wt)
    assert code == 2, out
    error = out.strip().splitlines()[-1]
    assert error.startswith('Error: [store] windows = "starts" cuts an epoch from the table held in memory')
    assert "give --memory" in error
    assert out.count("Error") == 1
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()


def test_ray_refuses_a_starts_epoch_in_one_line(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    code, out = run_cli(
        "dump", "--config", str(cfg), "--epoch", "0", "--executor", "ray", "--dsn", "postgresql://x.invalid/x"
    )
    assert code == 2
    assert '--executor ray does not dump [store] windows = "starts"' in out


def test_check_plans_a_starts_epoch_and_names_its_bytes(wt: str, tmp_path: Path, stores: dict[str, Path]) -> None:
    code, out = run_cli("check", "--config", str(config(tmp_path)), "--dsn", wt, "--json")
    assert code == 0, out
    report = json.loads(out.splitlines()[-1])
    published = zarr.open_group(stores["starts"])["epoch-00000"].attrs["pgprefetch"]
    assert report["n_samples"] == published["n_samples"]
    assert report["epoch_bytes"] == published["bytes"]


def test_check_says_the_dumps_refusal_of_a_table_beyond_memory(wt: str, tmp_path: Path) -> None:
    execute(wt, BIG)
    cfg = config(tmp_path, extra='memory = "1MiB"')
    cfg.write_text(cfg.read_text().replace('table = "wt"', 'table = "wt_big"'))
    code, out = run_cli("check", "--config", str(cfg), "--dsn", wt)
    assert code != 0, out
    assert 'windows = "starts" cuts an epoch from the table held in memory' in out


def test_xarray_opens_a_starts_epoch_and_its_rows_gather_into_the_windows(stores: dict[str, Path]) -> None:
    import xarray

    epoch = xarray.open_zarr(stores["starts"], group="epoch-00000", consolidated=False)
    assert epoch["a"].dims == ("batch", "row", "a_dim0")
    assert epoch["_starts"].dims == ("batch", "sample")
    rows = epoch["a"].values.reshape(-1, 3)  # the rows, chunk after chunk
    starts = epoch["_starts"].values.reshape(-1)
    window = EpochArrays(stores["batches"], 0, consumer=None)[0]["a"][5]
    assert np.array_equal(rows[starts[5] : starts[5] + WINDOW], window)


def _forged(stores: dict[str, Path], tmp_path: Path, edit: Any, array: tuple[str, Any] | None = None) -> Path:
    """A copy of the starts store, its manifest (and an array's metadata, rehashed) edited as a forger would."""
    import shutil

    from .harness.hostile import edit_array, edit_manifest, rehash

    store = tmp_path / "forged.zarr"
    shutil.copytree(stores["starts"], store)
    edit_manifest(store, edit)
    if array is not None:
        edit_array(store, *array)
        rehash(store)
    return store


def _huge_window(m: dict[str, Any]) -> None:
    m["windows"]["window"] = m["windows"]["rows"] = m["rows"] = 10**12
    for entry in m["fields"].values():
        entry["shape"][0] = 10**12


@pytest.mark.parametrize(
    ("edit", "array"),
    [
        (lambda m: m["windows"].update(starts="keys"), None),
        (lambda m: m["windows"]["arrays"].append("keys"), None),
        (lambda m: m["windows"].update(arrays=["_starts"]), None),
        (_huge_window, None),  # no allocation of what it promises
        (lambda m: None, ("_starts", lambda meta: meta.update(data_type="float64"))),
        (lambda m: m["windows"].update(rows_per_batch=10**9), ("a", lambda meta: meta["shape"].__setitem__(1, 10**9))),
    ],
    ids=["starts-named-keys", "keys-as-rows", "starts-as-rows", "huge-window", "float-starts", "rows-beyond-files"],
)
def test_a_forged_windows_record_is_a_store_error_for_readers_and_verify(
    stores: dict[str, Path], tmp_path: Path, edit: Any, array: tuple[str, Any] | None
) -> None:
    store = _forged(stores, tmp_path, edit, array)

    def read_first() -> None:
        reader = EpochArrays(store, 0, consumer=None)
        reader.read_into(0, reader.new_buffers())

    with pytest.raises(StoreError):
        read_first()
    code, out = run_cli("verify", "--store", str(store), "--epoch", "0")
    assert code != 0, out
    assert "Traceback" not in out


def test_a_fraction_of_the_windows_stores_only_the_rows_they_cover(wt: str, tmp_path: Path) -> None:
    sampled = {"table": "wt", "key": ["sid"], "order": "t", "window": 16, "stride": 3, "fraction": 0.4}
    got, want = (dump(config(tmp_path / k, k, **sampled), wt) for k in ("starts", "batches"))
    assert 0 < got.n_samples == want.n_samples
    starts = EpochArrays(Path(got.path).parent, 0, consumer=None)
    assert every_batch(starts) == every_batch(EpochArrays(Path(want.path).parent, 0, consumer=None))
    all_windows = dump(config(tmp_path / "all", **{**sampled, "fraction": 1.0}), wt)
    assert (
        starts.manifest["windows"]["rows"]
        < EpochArrays(Path(all_windows.path).parent, 0, consumer=None).manifest["windows"]["rows"]
    )


def test_connections_killed_while_a_starts_epoch_reads_are_retried_to_the_clean_bytes(wt: str, tmp_path: Path) -> None:
    """The one COPY stream's retry: a new snapshot, the table read again, the same rows and starts placed."""
    import asyncio
    import threading

    from pgprefetch import dump_epoch, load_config
    from pgprefetch.pg.retry import RetryPolicy

    from .harness.faults import kill_every_connection

    slow = "SELECT sid, t, a, v, tok, label, pg_sleep(0.001) AS pause FROM wt"  # a COPY of about 1.5 s
    cfg = config(tmp_path / "slow", table=slow, key=["sid"], order="t", window=WINDOW, stride=STRIDE)
    killer = threading.Timer(0.8, kill_every_connection, args=(wt,))
    killer.start()
    result = asyncio.run(dump_epoch(load_config(cfg, dsn=wt), 0, retries=RetryPolicy(first_wait=0.1)))
    killer.join()
    assert result.retries == 1
    clean = dump(config(tmp_path / "clean"), wt)
    a, b = (EpochArrays(Path(r.path).parent, 0, consumer=None) for r in (result, clean))
    assert every_batch(a) == every_batch(b)
    assert a.manifest["windows"] == b.manifest["windows"]
