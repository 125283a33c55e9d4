"""Folder links planted inside a local store are never written through (#51.2, review N1).

For every folder a local store keeps (``.pgprefetch`` itself, its ``locks``, ``consumers``, ``partial``,
``trash``, a partial epoch's own folder, its arrays' folders, its spill folder), a link to a
folder outside the store is planted, holding what the store's folder held (so that a write through it would
land among real-looking files), and the command that writes there is run as users run it: ``pgprefetch
dump``, a reader opening an epoch (which records its consumer), ``dump --consumer NAME --new``, ``prune``,
``dump --ahead --keep``, ``forget``; and an object store's staging folder on the dump host. Nothing outside
changes, byte, name or time; where the command writes, the link is replaced by a real folder (with a
warning) and the command does its work; a partial epoch with a link in it is started over, never resumed
through it, as docs/security.md promises. What the store cannot replace (a link where it keeps a lock file,
a file where it keeps a folder) is refused in one line.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgprefetch import EpochArrays
from pgprefetch.store.local import LocalStore
from pgprefetch.store.s3 import S3Store

from .harness.configs import s_config, scan_config, write_config
from .harness.db import execute, own_database
from .harness.dumps import run_cli
from .harness.files import tree
from .harness.s3 import S3
from .harness.spill import TINY_SOURCE, WINDOWS, load_tables, numbers_config

REPLACED = "was a symbolic link (planted?): replaced by a folder, what it pointed at left alone"


def plant(store: Path, folder: str, outside: Path) -> None:
    """Put a link at ``store/folder`` to a folder in ``outside`` holding what the store's folder held, and bait.

    The bait is what the commands write (a lock, a record, an epoch's folder), so that a write through the
    link would change a file rather than only add one.
    """
    target = outside / folder.replace("/", "_")
    place = store / folder
    if place.is_dir():
        shutil.copytree(place, target, symlinks=True)
        shutil.rmtree(place)
    target.mkdir(parents=True, exist_ok=True)
    (target / "precious").write_text("precious")
    for bait in ("default.json", "runA.json", "epoch-00001.lock", "epoch-00001.journal", "categories.json"):
        (target / bait).write_text(f"bait {bait}")
    (target / "epoch-00001").mkdir(exist_ok=True)
    (target / "epoch-00001" / "zarr.json").write_text("bait")
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(target, target_is_directory=True)


@dataclass(frozen=True)
class Run:
    """What a command left: its exit code, its output (stdout and stderr) and what it logged or warned, by line."""

    code: int
    output: str
    said: list[str]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run(command: Callable[[], tuple[int, str]]) -> Run:
    """Run ``command``: the CLI logs to its stderr (in the output), the library to the ``pgprefetch`` logger."""
    logger, lines = logging.getLogger("pgprefetch"), _Lines()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, output = command()
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    return Run(code, output, [*output.splitlines(), *lines.lines, *(str(w.message) for w in caught)])


# --- the stores the commands run on ------------------------------------------------------------------------
@pytest.fixture
def copied(hostile_store: Path, tmp_path: Path) -> Path:
    """A copy of a dumped store (epoch 0 of ``r``) and its config ``test.toml``, beside ``outside``."""
    store = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, store)
    shutil.copy(hostile_store.parent / "test.toml", tmp_path / "test.toml")
    (tmp_path / "outside").mkdir()
    return store


@pytest.fixture(scope="module")
def scan_db(pg_dsn: str) -> Iterator[str]:
    """The scan-spill tables ``big`` and ``flat`` in a database of the module's own."""
    with own_database(pg_dsn) as dsn:
        load_tables(dsn)
        yield dsn


def _dump(config: Path, dsn: str, *extra: str) -> Callable[[], tuple[int, str]]:
    return lambda: run_cli("dump", "--config", str(config), "--dsn", dsn, *extra)


def _read(store: Path) -> Callable[[], tuple[int, str]]:
    def read() -> tuple[int, str]:
        EpochArrays(store, 0, consumer="runA")  # records rank 0 of runA as having opened epoch 0
        return 0, ""

    return read


# --- every command that writes, every folder it writes in ----------------------------------------------------
DUMP = [".pgprefetch", ".pgprefetch/locks", ".pgprefetch/partial", ".pgprefetch/partial/epoch-00001"]
READ = [".pgprefetch", ".pgprefetch/consumers"]
PRUNE = [".pgprefetch", ".pgprefetch/trash", ".pgprefetch/locks", ".pgprefetch/partial", ".pgprefetch/consumers"]
AHEAD = [".pgprefetch", ".pgprefetch/trash", ".pgprefetch/locks", ".pgprefetch/partial"]


@pytest.mark.parametrize("folder", DUMP)
def test_a_dump_replaces_a_linked_folder_and_writes_nothing_through_it(
    hostile_db: str, copied: Path, folder: str
) -> None:
    outside = copied.parent / "outside"
    plant(copied, folder, outside)
    before = tree(outside)
    run = _run(_dump(copied.parent / "test.toml", hostile_db, "--epoch", "1"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert not (copied / folder).is_symlink()
    assert LocalStore(copied).epochs() == [0, 1]
    assert (copied / "epoch-00001" / "zarr.json").is_file()
    if not folder.endswith("epoch-00001"):  # (a partial epoch's own folder is made afresh, whatever was there)
        assert any(REPLACED in line for line in run.said), run.said


@pytest.mark.parametrize("folder", READ)
def test_a_reader_records_its_consumer_in_a_real_folder_never_through_a_link(copied: Path, folder: str) -> None:
    outside = copied.parent / "outside"
    plant(copied, folder, outside)
    before = tree(outside)
    run = _run(_read(copied))
    assert tree(outside) == before
    assert any(REPLACED in line for line in run.said), run.said
    record = copied / ".pgprefetch" / "consumers" / "runA.json"
    assert record.is_file()
    assert not record.is_symlink()
    assert not (copied / ".pgprefetch" / "consumers").is_symlink()
    assert LocalStore(copied).consumers() == {"runA": 0}


@pytest.mark.parametrize("folder", READ)
def test_registering_a_new_consumer_writes_its_record_in_a_real_folder(
    hostile_db: str, copied: Path, folder: str
) -> None:
    outside = copied.parent / "outside"
    plant(copied, folder, outside)
    before = tree(outside)
    config = copied.parent / "test.toml"
    run = _run(_dump(config, hostile_db, "--ahead", "1", "--consumer", "runB", "--new"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert (copied / ".pgprefetch" / "consumers" / "runB.json").is_file()
    assert LocalStore(copied).epochs() == [0]  # runB starts at epoch 0: already there


@pytest.mark.parametrize("folder", PRUNE)
def test_prune_deletes_inside_the_store_only_whatever_folder_is_a_link(copied: Path, folder: str) -> None:
    store = LocalStore(copied)
    store.record_consumer("runA", 1)  # epoch 0 is one behind: --keep 0 deletes it
    (copied / ".pgprefetch" / "partial" / "epoch-00004").mkdir(parents=True)  # a dead dump's, for --partials
    outside = copied.parent / "outside"
    plant(copied, folder, outside)
    before = tree(outside)
    run = _run(lambda: run_cli("prune", "--store", str(copied), "--keep", "0", "--partials"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    if folder in (".pgprefetch", ".pgprefetch/consumers"):  # the records are out there, not the store's
        assert store.epochs() == [0]
        assert "no consumer has opened an epoch yet" in run.output
    else:
        assert store.epochs() == []
        assert "deleted epoch 0" in run.output
    if folder in (".pgprefetch/trash", ".pgprefetch/locks"):  # where prune writes, a real folder now
        assert not (copied / folder).is_symlink()
    # The dead partial epoch is the store's unless its folder was moved out with the link.
    assert ("deleted partial epoch 4" in run.output) == (folder not in (".pgprefetch", ".pgprefetch/partial"))


@pytest.mark.parametrize("folder", AHEAD)
def test_cron_dump_ahead_and_keep_writes_and_deletes_inside_the_store_only(
    hostile_db: str, copied: Path, folder: str
) -> None:
    LocalStore(copied).record_consumer("runA", 1)  # reads epoch 1: --ahead 1 dumps 2, --keep 0 deletes 0
    outside = copied.parent / "outside"
    plant(copied, folder, outside)
    if folder == ".pgprefetch":  # the record went out with the folder: the run records again (a real folder)
        LocalStore(copied).record_consumer("runA", 1)
    before = tree(outside)
    run = _run(_dump(copied.parent / "test.toml", hostile_db, "--ahead", "1", "--keep", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert not (copied / folder).is_symlink()
    assert LocalStore(copied).epochs() == [2]


def test_forget_removes_no_record_through_a_linked_folder(copied: Path) -> None:
    LocalStore(copied).record_consumer("runA", 0)
    outside = copied.parent / "outside"
    plant(copied, ".pgprefetch/consumers", outside)  # runA.json is out there now, with the bait
    before = tree(outside)
    run = _run(lambda: run_cli("forget", "--store", str(copied), "runA"))
    assert "Traceback" not in run.output
    assert tree(outside) == before


# --- the folders only some dumps write: a spill folder, the vocabulary, a resumed epoch --------
@pytest.mark.parametrize("folder", [".pgprefetch/partial", ".pgprefetch/partial/epoch-00000.spill"])
def test_keys_ordered_on_disk_are_never_written_through_a_link(db: str, tmp_path: Path, folder: str) -> None:
    config = numbers_config(tmp_path / "c", n=120_000, extra_source='memory = "1MiB"')
    store = tmp_path / "c" / "store.zarr"
    (store / ".pgprefetch").mkdir(parents=True)  # a store a first dump is about to make
    outside = tmp_path / "outside"
    plant(store, folder, outside)
    before = tree(outside)
    run = _run(_dump(config, db, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert not (store / folder).is_symlink()
    assert LocalStore(store).epochs() == [0]
    assert any("keys outgrew [source] memory" in line for line in run.said), run.said


@pytest.mark.parametrize("folder", [".pgprefetch/partial", ".pgprefetch/partial/epoch-00000.spill"])
def test_a_scan_beyond_memory_spills_in_real_folders_only(scan_db: str, tmp_path: Path, folder: str) -> None:
    config = scan_config(tmp_path / "c", **WINDOWS, extra=TINY_SOURCE)
    store = tmp_path / "c" / "store.zarr"
    (store / ".pgprefetch").mkdir(parents=True)
    outside = tmp_path / "outside"
    plant(store, folder, outside)
    before = tree(outside)
    run = _run(lambda: run_cli("dump", "--config", str(config), "--dsn", scan_db, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert not (store / folder).is_symlink()
    assert LocalStore(store).epochs() == [0]


def test_the_vocabulary_is_written_in_the_stores_own_folder_never_through_a_link(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE k (id int, v bigint, c text)",
        "INSERT INTO k SELECT i, i, 'k' || (i % 3) FROM generate_series(1, 64) i",
    )
    fields = {"v": (["v"], "int64"), "c": (["c"], "int8", {"categories": "auto"})}
    config = write_config(
        tmp_path, keys="SELECT id FROM k", query="SELECT v, c FROM k WHERE id = $1", fields=fields, size=16
    )
    store = tmp_path / "store.zarr"
    (store / ".pgprefetch").mkdir(parents=True)
    outside = tmp_path / "outside"
    plant(store, ".pgprefetch", outside)
    before = tree(outside)
    run = _run(_dump(config, db, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    vocabulary = store / ".pgprefetch" / "categories.json"
    assert vocabulary.is_file()
    assert not (store / ".pgprefetch").is_symlink()
    assert LocalStore(store).vocabulary() == {"c": ["k0", "k1", "k2"]}


@pytest.mark.parametrize(
    "folder",
    [
        ".pgprefetch/partial/epoch-00000",
        ".pgprefetch/partial/epoch-00000/v",
        ".pgprefetch/partial/epoch-00000/v/c",
        ".pgprefetch/partial/epoch-00000/keys/c/0",
    ],
)
def test_a_partial_epoch_with_a_link_in_it_is_started_over_not_resumed_through_it(
    s_table: str, interrupted: tuple[Path, Path], folder: str
) -> None:
    config, store = interrupted
    outside = store.parent / "outside"
    plant(store, folder, outside)
    before = tree(outside)
    run = _run(_dump(config, s_table, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert LocalStore(store).epochs() == [0]
    if folder.count("/") > 2:  # a link inside the partial epoch: the whole epoch is started over
        assert any("started over" in line and "link planted" in line for line in run.said), run.said


def test_a_journal_planted_as_a_link_is_replaced_not_appended_to(s_table: str, interrupted: tuple[Path, Path]) -> None:
    config, store = interrupted
    journal = store / ".pgprefetch" / "partial" / "epoch-00000.journal"
    victim = store.parent / "outside" / "victim.journal"
    shutil.move(journal, victim)
    journal.symlink_to(victim)
    before = tree(store.parent / "outside")
    run = _run(_dump(config, s_table, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(store.parent / "outside") == before
    assert LocalStore(store).epochs() == [0]
    assert any("started over" in line and "epoch-00000.journal" in line for line in run.said), run.said


@pytest.mark.parametrize("folder", ["partial", "locks"])
def test_an_object_stores_staging_folder_is_written_with_no_link_followed(
    s_table: str, s3: S3, tmp_path: Path, folder: str
) -> None:
    location = f"s3://{s3.bucket()}/links"
    staging = S3Store(location).staging
    staging.mkdir(parents=True)
    outside = tmp_path / "outside"
    plant(staging, folder, outside)
    before = tree(outside)
    run = _run(_dump(s_config(tmp_path, store=location), s_table, "--epoch", "0"))
    assert run.code == 0, run.output
    assert tree(outside) == before
    assert not (staging / folder).is_symlink()
    assert S3Store(location).epochs() == [0]


# --- what the store cannot replace: refused in one line ------------------------------------------------------
def _one_line_refusal(run: Run, *words: str) -> None:
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert run.code == 1, run.output
    assert "Traceback" not in run.output
    assert len(lines) == 1, run.output
    assert lines[0].startswith("Error: "), run.output
    for word in words:
        assert word in lines[0], lines[0]


def test_a_lock_file_planted_as_a_link_is_refused_in_one_line(hostile_db: str, copied: Path) -> None:
    victim = copied.parent / "outside" / "victim"
    victim.write_text("precious")
    (copied / ".pgprefetch" / "locks" / "epoch-00001.lock").symlink_to(victim)
    run = _run(_dump(copied.parent / "test.toml", hostile_db, "--epoch", "1"))
    _one_line_refusal(run, "epoch-00001.lock is a symbolic link", "remove it")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("folder", [".pgprefetch/locks", ".pgprefetch/partial"])
def test_a_file_where_the_store_keeps_a_folder_is_refused_in_one_line_and_kept(
    hostile_db: str, copied: Path, folder: str
) -> None:
    shutil.rmtree(copied / folder)
    (copied / folder).write_text("someone's notes")
    run = _run(_dump(copied.parent / "test.toml", hostile_db, "--epoch", "1"))
    _one_line_refusal(run, f"{folder}: it is a file, where the store keeps a folder")
    assert (copied / folder).read_text() == "someone's notes"
