"""Links planted in a shared store's ``.pgprefetch`` (#36.5, I2), object-store prefixes and endpoints
(#36.12, #36.13), and keys beyond ``[source] memory`` ordered in folders for their user only (I3).

Dumps, consumer records and prune never write through, or delete beyond, a link someone planted in a copy
of a real dumped epoch (the ``hostile_store`` fixture, tests/harness/hostile.py); what the readers refuse in a
hostile store is tests/test_security_store.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgprefetch import EpochArrays
from pgprefetch.cli import cli
from pgprefetch.errors import StoreError
from pgprefetch.store.local import LocalStore
from pgprefetch.store.maintenance import prune
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.dumps import dump
from .harness.s3 import S3


# --- #36.5: writes through planted links ---------------------------------------------------------------------
def test_a_lock_file_planted_as_a_link_is_not_written_through(
    hostile_db: str, hostile_store: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, store)
    shutil.copy(hostile_store.parent / "test.toml", tmp_path / "test.toml")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    locks = store / ".pgprefetch" / "locks"
    (locks / "epoch-00001.lock").symlink_to(victim)
    (locks / "categories.json.lock").unlink(missing_ok=True)
    with pytest.raises(StoreError, match=r"epoch-00001\.lock is a symbolic link, not a file of the store"):
        dump(tmp_path / "test.toml", hostile_db, epoch=1)
    assert victim.read_text() == "precious"


def test_a_consumer_record_is_written_through_no_planted_temporary_link(hostile_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, store)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    consumers = store / ".pgprefetch" / "consumers"
    consumers.mkdir(parents=True, exist_ok=True)
    (consumers / f".default.{os.getpid()}.tmp").symlink_to(victim)  # the name the record went through
    EpochArrays(store, 0)
    assert victim.read_text() == "precious"
    record = consumers / "default.json"
    assert record.is_file()
    assert not record.is_symlink()
    assert json.loads(record.read_text())["epoch"] == 0


# --- #36.12, #36.13: object stores ---------------------------------------------------------------------------
def test_stores_whose_prefixes_differ_only_in_slash_or_double_underscore_stage_apart(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    first = open_store(f"s3://{bucket}/coll/a")
    first.create()
    other = f"s3://{bucket}/coll__a"
    assert first.staging != open_store(other).staging
    with first.writer_lock(0) as held:  # a dump of coll/a is writing epoch 0 ...
        assert held
        result = dump(s_config(tmp_path, store=other), s_table)  # ... and one of coll__a is not held up by it
    assert result.status == "written"
    assert open_store(other).epochs() == [0]


def test_an_endpoint_url_with_a_password_is_shown_without_it(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:Endpoint-Secret-77@127.0.0.1:9")  # nothing listens there
    result = CliRunner().invoke(cli, ["ls", "--store", "s3://bucket/x"])
    assert result.exit_code == 1
    assert "cannot reach the object store at http://127.0.0.1:9" in result.output
    assert "Endpoint-Secret-77" not in result.output
    assert "user" not in result.output


# --- I2: prune and links ---------------------------------------------------------------------------------------
@pytest.fixture
def linked(hostile_store: Path, tmp_path: Path) -> tuple[LocalStore, Path]:
    """A store whose partial epoch 7 has its keys folder linked outside, with epoch 8's partial folder a link."""
    store = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, store)
    outside = tmp_path / "outside"
    for name in ("keys7", "partial8", "trash"):
        (outside / name).mkdir(parents=True)
        (outside / name / "precious").write_text("precious")
    partial = store / ".pgprefetch" / "partial"
    (partial / "epoch-00007").mkdir(parents=True)
    (partial / "epoch-00007.spill").symlink_to(outside / "keys7")
    (partial / "epoch-00008").symlink_to(outside / "partial8")
    (store / ".pgprefetch" / "trash").symlink_to(outside / "trash")
    return LocalStore(store), outside


def test_prune_removes_links_in_the_store_not_what_they_point_at_and_lists_each_epoch_once(
    linked: tuple[LocalStore, Path],
) -> None:
    store, outside = linked
    result = prune(store, keep=1, partials=True)
    assert result.partials == [7, 8]
    assert "deleted partial epochs 7, 8 (no dump is writing them)" in result.lines(1)
    partial = store.meta / "partial"
    assert not (partial / "epoch-00007.spill").is_symlink()  # reported deleted: it is gone
    assert not (partial / "epoch-00007").exists()
    assert not (partial / "epoch-00008").is_symlink()
    for name in ("keys7", "partial8", "trash"):  # nothing outside moved or deleted
        assert sorted(p.name for p in (outside / name).iterdir()) == ["precious"]
    assert store.orphaned_spills() == []


def test_prune_dry_run_names_one_epoch_in_the_singular(linked: tuple[LocalStore, Path]) -> None:
    store, _ = linked
    (store.meta / "partial" / "epoch-00008").unlink()
    lines = prune(store, keep=1, partials=True, dry_run=True).lines(1)
    assert lines[0] == "would delete partial epoch 7 (no dump is writing them)"
    assert lines[1].startswith("kept epoch 0: no consumer has opened an epoch yet")


# --- I3: keys beyond [source] memory are ordered in a folder for this user only --------------------------------
def _watch_modes(root: Path, stop: threading.Event, seen: dict[str, int]) -> None:
    """Record the mode of every folder that appears under ``root`` until ``stop``, polling (the run is short)."""
    while not stop.is_set():
        for folder, _, _ in os.walk(root):
            with contextlib.suppress(OSError):  # gone meanwhile: the run removes its scratch
                seen.setdefault(folder, stat.S_IMODE(os.stat(folder).st_mode))
        time.sleep(0.001)


def _run_watched(root: Path, run: object) -> dict[str, int]:
    """Run ``run()`` under umask 022, watching ``root``; the mode of each folder seen under it."""
    seen: dict[str, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_modes, args=(root, stop, seen), daemon=True)
    old = os.umask(0o022)
    watcher.start()
    try:
        run()  # type: ignore[operator]
    finally:
        stop.set()
        watcher.join()
        os.umask(old)
    return seen


def test_keys_a_check_orders_on_disk_are_in_a_folder_only_their_user_can_read(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgprefetch import load_config
    from pgprefetch.write.check import check_config

    from .harness.spill import numbers_config

    scratch = tmp_path / "tmp"  # where `check` orders the keys: the temporary folder
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cfg = load_config(numbers_config(tmp_path / "c"), dsn=db, memory="1MiB")
    seen = _run_watched(scratch, lambda: asyncio.run(check_config(cfg)))
    top = {folder: oct(mode) for folder, mode in seen.items() if Path(folder).parent == scratch}
    assert top, "the keys were not ordered on disk"
    assert set(top.values()) == {"0o700"}, top


def test_the_spill_folder_of_a_scan_dump_beyond_memory_and_its_folders_only_their_user_can_read(
    db: str, tmp_path: Path
) -> None:
    from .harness.configs import scan_config
    from .harness.spill import TINY_SOURCE as TINY
    from .harness.spill import WINDOWS, load_tables

    load_tables(db)
    cfg = scan_config(tmp_path / "c", **WINDOWS, extra=TINY)
    meta = tmp_path / "c" / "store.zarr" / ".pgprefetch"
    seen = _run_watched(meta, lambda: dump(cfg, db))
    private = {folder: oct(mode) for folder, mode in seen.items() if ".spill" in folder}
    assert any(f.endswith(".spill") for f in private), sorted(seen)
    assert any(Path(f).parent.name.endswith(".spill") for f in private), sorted(seen)  # its algorithms' folders
    assert set(private.values()) == {"0o700"}, private
