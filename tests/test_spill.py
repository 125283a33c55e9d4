"""Keys beyond ``[source] memory``: ordered on disk (runs, then hash-range buckets), the same order, the same bytes.

The unit tests compare the external sort with the in-memory one on arrays Hypothesis draws (a few hundred
keys in several runs and buckets; ties forced by a low-entropy hash); the others dump through PostgreSQL
under a small ``--memory`` and compare, byte for byte, with an in-memory dump of the same keys.
``test_two_million_keys_...`` is the scale test (marked ``scale``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import signal
import tempfile
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pgprefetch import dump_epochs, load_config
from pgprefetch.errors import SampleError
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.local import LocalStore
from pgprefetch.store.maintenance import prune
from pgprefetch.write.check import check_config
from pgprefetch.write.order import shuffle, spill
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.spill import KeyRuns, collect_keys
from pgprefetch.write.query import plan_epoch
from pgprefetch.write.spill.folder import SpillFolder

from .harness.dumps import (
    RESUME_HINT,
    chunk_bytes,
    dump,
    dump_argv,
    dump_on_a_full_disk,
    journal_lines,
    start_dump,
    wait_for,
)
from .harness.faults import kill_every_connection
from .harness.properties import distinct_count, epochs, key_arrays, seeds, values
from .harness.spill import KINDS, numbers_config
from .harness.spill import TINY_MEMORY as TINY

SPILL = re.compile(
    r"epoch \d+: ([\d,]+) keys outgrew \[source\] memory \(.+\): ordered on disk in (\d+) runs and (\d+) buckets"
)


# ---- the external sort against the in-memory one, on arrays --------------------------------------------------


async def _chunks(keys: np.ndarray, step: int = 50_000) -> AsyncIterator[np.ndarray]:
    for lo in range(0, keys.shape[1], step):
        yield np.ascontiguousarray(keys[:, lo : lo + step])


def spilled_order(keys: np.ndarray, folder: Path, budget: int, **kw: object) -> tuple[np.ndarray, shuffle.Repeats, int]:
    seed, epoch, fraction = kw.get("seed", 3), kw.get("epoch", 5), kw.get("fraction", 1.0)
    runs = asyncio.run(collect_keys(_chunks(keys), keys.shape[0], budget, SpillFolder(folder), seed=seed, epoch=epoch))  # type: ignore[arg-type]
    assert isinstance(runs, KeyRuns), "the keys should have outgrown the budget"
    ordered, repeats, buckets = runs.order(fraction=fraction, quantum=1)  # type: ignore[arg-type]
    try:
        assert not (folder / "runs").exists()  # the spill file goes once the order is written
        return ordered.columns(0, ordered.n), repeats, buckets
    finally:
        ordered.close()


def in_memory_order(keys: np.ndarray, **kw: object) -> tuple[np.ndarray, shuffle.Repeats]:
    seed, epoch, fraction = kw.get("seed", 3), kw.get("epoch", 5), kw.get("fraction", 1.0)
    index, repeats = shuffle.order_part(keys, seed=seed, epoch=epoch, fraction=fraction)  # type: ignore[arg-type]
    return keys[:, index], repeats


def _spilled(
    keys: np.ndarray, held: int, chunk: int, *, seed: int, epoch: int, fraction: float
) -> tuple[np.ndarray, shuffle.Repeats, int, int]:
    """``keys`` collected ``chunk`` at a time under a budget of ``held`` keys, ordered on disk.

    The order, the repeats found, the buckets and the runs. ``spill.MIN_KEYS`` (4096: no budget gives
    smaller runs or buckets) is lowered to 1 meanwhile, so a few hundred keys make several runs and buckets.
    """
    width = keys.shape[0]
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as scratch:
        mp.setattr(spill, "MIN_KEYS", 1)
        folder = Path(scratch) / "k"
        chunks = _chunks(keys, step=chunk)
        runs = asyncio.run(
            collect_keys(chunks, width, held * spill.bytes_per_key(width), SpillFolder(folder), seed=seed, epoch=epoch)
        )
        if isinstance(runs, np.ndarray):  # they fit: the in-memory path, the keys as they came
            assert keys.shape[1] <= max(held, chunk)  # (one chunk beyond the budget is held whole)
            assert np.array_equal(runs, keys)
            index, repeats = shuffle.order_part(keys, seed=seed, epoch=epoch, fraction=fraction)
            return keys[:, index], repeats, 0, 0
        assert keys.shape[1] > max(held, chunk), "the keys fitted the budget, yet were spilled"
        n_runs = len(runs.runs)
        assert all(r.count <= max(held, chunk) for r in runs.runs)
        assert (folder / "runs").stat().st_mode & 0o777 == 0o600  # the sample keys: this user's alone
        ordered, repeats, buckets = runs.order(fraction=fraction, quantum=1)
        try:
            assert not (folder / "runs").exists()  # the spill file goes once the order is written
            return ordered.columns(0, ordered.n), repeats, buckets, n_runs
        finally:
            ordered.close()


def _least_buckets(keys: np.ndarray, held: int, seed: int, epoch: int) -> int:
    """The fewest buckets ``keys`` can take: each holds ``held`` keys at most, or all the keys of one hash value."""
    if not keys.shape[1]:
        return 0
    crowd = int(np.unique(shuffle.key_hash(keys, seed=seed, epoch=epoch), return_counts=True)[1].max())
    return -(-keys.shape[1] // max(held, crowd))


def _check_repeats(repeats: shuffle.Repeats, expected: shuffle.Repeats, keys: np.ndarray) -> None:
    assert repeats.count == expected.count == keys.shape[1] - distinct_count(keys)
    assert np.array_equal(repeats.examples, expected.examples)


spill_cases = {"seed": seeds, "epoch": epochs}


def _budget(data: st.DataObject, n: int) -> tuple[int, int]:
    """Keys a run and a bucket hold, and keys a cursor chunk brings: mostly several runs and buckets of ``n``."""
    held = data.draw(st.integers(2, max(2, n // 2)) | st.integers(2, n + 2), label="held")
    return held, data.draw(st.integers(1, max(1, n // 3)), label="chunk")


@pytest.mark.parametrize(("columns", "fraction"), [(1, 1.0), (2, 0.3), (3, 1.0)])
@given(data=st.data(), **spill_cases)
def test_the_external_sort_gives_the_in_memory_order(
    columns: int, fraction: float, data: st.DataObject, seed: int, epoch: int
) -> None:
    keys = data.draw(key_arrays(widths=(columns,), max_keys=300, min_keys=8), label="keys")  # repeats across runs
    held, chunk = _budget(data, keys.shape[1])
    got, repeats, buckets, runs = _spilled(keys, held, chunk, seed=seed, epoch=epoch, fraction=fraction)
    expected, expected_repeats = in_memory_order(keys, seed=seed, epoch=epoch, fraction=fraction)
    if runs:
        assert buckets >= _least_buckets(keys, held, seed, epoch)
        assert runs >= -(-keys.shape[1] // max(held, chunk))
    event(f"{min(runs, 5)} runs, {min(buckets, 8)} buckets (capped at 5 and 8)")
    assert np.array_equal(got, expected)
    _check_repeats(repeats, expected_repeats, keys)


@pytest.mark.parametrize("where", ["bottom", "top"])
@given(data=st.data(), few=st.integers(1, 7), **spill_cases)
def test_ties_and_crowded_hash_ranges_still_give_the_in_memory_order(
    where: str, data: st.DataObject, few: int, seed: int, epoch: int
) -> None:
    """``few`` hash values for all the keys: every bucket is a tie broken by key, ranges halved down to one value."""
    real = shuffle.key_hash

    def crowded(keys: np.ndarray, *, seed: int, epoch: int, stream: int = shuffle._ORDER_STREAM) -> np.ndarray:
        if stream != shuffle._ORDER_STREAM:
            return real(keys, seed=seed, epoch=epoch, stream=stream)
        values = (keys[0] % few).astype(np.uint64)
        return values if where == "bottom" else np.uint64(2**64 - 1) - values

    keys = data.draw(key_arrays(widths=(2,), max_keys=300, min_keys=8), label="keys")
    held, chunk = _budget(data, keys.shape[1])
    with pytest.MonkeyPatch.context() as mp:  # (not the monkeypatch fixture: it would span every example)
        mp.setattr(shuffle, "key_hash", crowded)
        got, repeats, buckets, runs = _spilled(keys, held, chunk, seed=seed, epoch=epoch, fraction=0.5)
        expected, expected_repeats = in_memory_order(keys, seed=seed, epoch=epoch, fraction=0.5)
        if runs:
            assert buckets >= _least_buckets(keys, held, seed, epoch)
        event(f"{min(runs, 5)} runs, {min(buckets, 8)} buckets (capped at 5 and 8)")
    assert np.array_equal(got, expected)
    _check_repeats(repeats, expected_repeats, keys)


@pytest.mark.parametrize("quantum", [1, 1000])
@given(data=st.data(), width=st.integers(1, 3), spare=st.integers(0, 100))
def test_the_ordered_file_hashes_like_the_in_memory_keys(
    quantum: int, data: st.DataObject, width: int, spare: int
) -> None:
    n = data.draw(st.integers(0, 3 * quantum + 300), label="n")
    keys = data.draw(hnp.arrays(np.int64, (width, n), elements=values), label="keys")
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=8), label="cuts"))
    with tempfile.TemporaryDirectory() as scratch:
        out = OrderedKeys(SpillFolder(Path(scratch) / "k"), "ordered", width, quantum)
        try:
            for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):  # appended a bucket at a time, hashed as it grows
                if data.draw(st.booleans(), label="through an order"):
                    out.append(keys[:, lo:hi][:, ::-1], np.arange(hi - lo)[::-1].copy())
                else:
                    out.append(keys[:, lo:hi])
            used = data.draw(st.sampled_from([n // quantum * quantum, n]), label="used")
            digest = hashlib.sha256()
            for column in keys:
                digest.update(np.ascontiguousarray(column[:used]))
            assert out.finish(used) == digest.hexdigest()
            start = data.draw(st.integers(0, n), label="start")
            end = data.draw(st.integers(start, n + 50), label="end")
            assert np.array_equal(out.columns(start, end), keys[:, start:end])  # cut at the last sample
            assert out.columns(start, end).shape == (width, min(end, n) - start)
        finally:
            out.close()


def test_removing_a_partial_epoch_removes_its_spill_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store.zarr")
    store.create()
    keys = store.spill_path(3)
    keys.mkdir(parents=True)
    (keys / "runs").write_bytes(b"x" * 100)
    assert keys.parent == store.partial_path(3).parent
    assert store.partial_epochs() == []  # not mistaken for an epoch
    store.remove_partial(3)
    assert not keys.exists()


def test_prune_partials_removes_the_spill_folder_a_dump_killed_before_its_first_batch_left(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store.zarr")
    store.create()
    store.spill_path(5).mkdir(parents=True)  # no partial epoch beside it: the dump died before its first batch
    assert store.orphaned_spills() == [5]
    assert prune(store, keep=1).partials == []  # only when asked, as for partial epochs
    assert store.spill_path(5).exists()
    assert prune(store, keep=1, partials=True).partials == [5]
    assert not store.spill_path(5).exists()


# ---- dumps through PostgreSQL -------------------------------------------------------------------------------------


def spill_line(caplog: pytest.LogCaptureFixture) -> tuple[int, int, int]:
    """(keys, runs, buckets) of the dump's "ordered on disk" line."""
    found = [m for m in map(SPILL.search, caplog.messages) if m]
    assert found, f"the keys were not ordered on disk: {caplog.messages}"
    keys, runs, buckets = found[-1].groups()
    return int(keys.replace(",", "")), int(runs), int(buckets)


@pytest.mark.parametrize("kind", list(KINDS))
def test_keys_beyond_memory_give_the_bytes_of_the_in_memory_dump(
    db: str, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = numbers_config(tmp_path / "c", kind, fraction=0.7, drop_last=False, size=999)
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        spilled = dump(cfg, db, memory=TINY)
    n, runs, buckets = spill_line(caplog)
    assert (n, runs) == (200_000, 4)
    assert buckets >= 8
    whole = dump(numbers_config(tmp_path / "w", kind, fraction=0.7, drop_last=False, size=999), db)
    assert spilled.n_samples == whole.n_samples
    assert 0.69 < whole.n_samples / 200_000 < 0.71
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
    manifests = [json.loads((r.path / "zarr.json").read_text())["attributes"]["pgprefetch"] for r in (spilled, whole)]
    assert manifests[0]["keys_sha256"] == manifests[1]["keys_sha256"]
    assert not list((tmp_path / "c" / "store.zarr" / ".pgprefetch" / "partial").iterdir())  # keys removed


def test_repeated_keys_beyond_memory_are_refused_or_dropped_as_in_memory(db: str, tmp_path: Path) -> None:
    keys = "SELECT i % 195000 AS i FROM generate_series(1, 200000) i"  # 5,000 repeats, across runs
    messages = []
    for memory in (TINY, None):
        with pytest.raises(SampleError) as e:
            dump(numbers_config(tmp_path / "e", keys=keys), db, memory=memory)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("the keys query returned 5000 repeated key(s), e.g. (i=1); (i=2); (i=3);")
    drop = 'duplicates = "drop"'
    spilled = dump(numbers_config(tmp_path / "d", keys=keys, extra_samples=drop), db, memory=TINY)
    whole = dump(numbers_config(tmp_path / "w", keys=keys, extra_samples=drop), db)
    assert spilled.duplicates_dropped == whole.duplicates_dropped == 5_000
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)


def test_the_keys_are_held_within_memory_and_in_memory_when_they_fit(db: str, tmp_path: Path) -> None:
    """Planning 600,000 keys under 4 MiB holds about that (and one cursor chunk's records, ~5 MB), not 20 MB."""
    cfg = numbers_config(tmp_path, n=600_000)

    async def plan(memory: str) -> tuple[object, int]:
        loaded = load_config(cfg, dsn=db, memory=memory)
        async with Snapshot.open(loaded.source) as snap:
            tracemalloc.start()
            try:
                planned = await plan_epoch(loaded, snap, 0, scratch=SpillFolder(tmp_path / f"keys-{memory}"))
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            if isinstance(planned.keys, OrderedKeys):
                planned.keys.close()
            return planned.keys, peak

    bounded, bounded_peak = asyncio.run(plan("4MiB"))
    assert isinstance(bounded, OrderedKeys)
    assert bounded.shape == (1, 600_000)
    assert bounded_peak < 13e6, f"{bounded_peak / 1e6:.1f} MB"
    fits, fits_peak = asyncio.run(plan("1GiB"))
    assert isinstance(fits, np.ndarray)  # today's path: nothing spilled
    assert fits_peak > 18e6  # (what the budget saved)
    assert not (tmp_path / "keys-1GiB").exists()


def test_kill_9_while_keys_are_on_disk_then_resume_gives_the_clean_bytes(db: str, tmp_path: Path) -> None:
    slow = "SELECT $1 % 1000 AS v, pg_sleep(CASE WHEN $1 % 100 = 0 THEN 0.01 ELSE 0 END)"
    cfg = numbers_config(tmp_path, n=60_000, query=slow, extra_source=f'memory = "{TINY}"')
    store = tmp_path / "store.zarr"
    keys = store / ".pgprefetch" / "partial" / "epoch-00000.spill" / "keys"
    victim = start_dump(cfg, db)
    wait_for(lambda: journal_lines(store) >= 5)
    assert (keys / "ordered").exists()  # the batches read their keys from disk
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)  # reaped, its pipes closed
    assert not (store / "epoch-00000").exists()
    resumed = dump(cfg, db)
    assert resumed.resumed >= 4  # the keys ordered again are provably the same list: batches kept
    clean = dump(numbers_config(tmp_path / "clean", n=60_000, query=slow), db)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)
    assert not keys.exists()


def test_a_full_disk_while_ordering_keys_is_one_line_and_nothing_is_published(db: str, tmp_path: Path) -> None:
    cfg = numbers_config(tmp_path, n=120_000, extra_source=f'memory = "{TINY}"')
    store = tmp_path / "store.zarr"
    dump(cfg, db, epoch=1)  # the store exists: a failed dump leaves it, and must leave no keys behind
    proc = dump_on_a_full_disk(dump_argv(cfg, db), 256 << 10)  # writes past 256 KiB fail; the spill is ~2 MB
    assert proc.returncode == 1
    assert re.fullmatch(
        rf"Error: cannot write {re.escape(str(store))}/\.pgprefetch/partial/epoch-00000\.spill/keys: File too large; "
        rf"{RESUME_HINT}\n",
        proc.stderr,
    ), proc.stderr
    assert not (store / "epoch-00000").exists()
    assert not (store / ".pgprefetch" / "partial" / "epoch-00000.spill").exists()
    assert dump(cfg, db).status == "written"


def test_a_connection_lost_while_keys_stream_to_disk_is_retried(db: str, tmp_path: Path) -> None:
    # The cursor stalls at row 110,000, after two chunks: the first run is on disk when the exporter dies.
    keys = "SELECT i FROM generate_series(1, 150000) i WHERE i <> 110000 OR (SELECT true FROM pg_sleep(1.5))"
    cfg = numbers_config(tmp_path, keys=keys, extra_source=f'memory = "{TINY}"')
    store = tmp_path / "store.zarr"
    proc = start_dump(cfg, db, 0, "--json")
    wait_for(lambda: (store / ".pgprefetch" / "partial" / "epoch-00000.spill" / "keys" / "runs").exists())
    kill_every_connection(db)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["retries"] == 1
    clean = dump(numbers_config(tmp_path / "clean", keys=keys), db)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


def test_check_and_several_epochs_from_keys_beyond_memory(db: str, tmp_path: Path) -> None:
    cfg = numbers_config(tmp_path / "s")
    report = asyncio.run(check_config(load_config(cfg, dsn=db, memory=TINY)))
    assert report.errors == []
    assert (report.n_keys, report.n_samples) == (200_000, 200_000)
    assert not list(Path(tempfile.gettempdir()).glob(f"pgprefetch-keys-{os.getpid()}-*"))  # its scratch is gone
    spilled = asyncio.run(dump_epochs(load_config(cfg, dsn=db, memory=TINY), [0, 1]))
    whole = asyncio.run(dump_epochs(load_config(numbers_config(tmp_path / "w"), dsn=db), [0, 1]))
    for a, b in zip(spilled, whole, strict=True):
        assert chunk_bytes(a.path) == chunk_bytes(b.path)
    assert chunk_bytes(spilled[0].path) != chunk_bytes(spilled[1].path)


@pytest.mark.scale
def test_two_million_keys_in_eight_or_more_buckets_give_the_in_memory_bytes(
    db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The scale test (about 30 s on 2 cores): 2,000,000 keys under 8 MiB against the same dump in memory."""
    settings = {"n": 2_000_000, "size": 4096, "connections": 2, "drop_last": False}
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        spilled = dump(numbers_config(tmp_path / "s", **settings), db, memory="8MiB")
    n, runs, buckets = spill_line(caplog)
    assert n == 2_000_000
    assert runs >= 8
    assert buckets >= 8
    whole = dump(numbers_config(tmp_path / "w", **settings), db, memory="1GiB")
    assert spilled.n_samples == whole.n_samples == 2_000_000
    assert chunk_bytes(spilled.path) == chunk_bytes(whole.path)
