"""What another user, or a race, leaves where a dump writes: never written through, never handed back.

The dump writes its own folders through descriptors (:mod:`pgprefetch.store.folders`). These tests plant
what such a walk could still trust by mistake: a folder of another user's under the predictable name of a
keys folder in a shared sticky scratch folder (``[source] scratch = "/tmp"``), a link swapped in for the
partial epoch's folder while compressed chunks are written, a staged file of an object store replaced by a
link, a FIFO where a partial epoch's shard belongs, a hard link where a lock or journal belongs. Each is
refused in one line or started over; nothing outside the store changes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pgprefetch.config.load import load_config
from pgprefetch.errors import StoreError
from pgprefetch.store.base import ArraySpec
from pgprefetch.store.folders import Place
from pgprefetch.store.local import LocalStore
from pgprefetch.store.open import open_store
from pgprefetch.store.s3 import S3Store
from pgprefetch.store.uploads import Uploads
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.pipeline import spill_folder

from .harness.dumps import dump_argv, run_cli
from .harness.files import tmp_folder, tree
from .harness.s3 import S3
from .harness.spill import numbers_config

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's folder: needs root")


def _uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A shared scratch folder as /tmp is (mode 1777), reachable by every user (its parent is /tmp itself)."""
    with tmp_folder("pgprefetch-sticky-", 0o1777) as folder:
        yield folder


def _foreign(folder: Path, owner: str = "nobody") -> bytes:
    """Make ``folder`` as ``owner``'s, mode 0777, holding a file of theirs; its bytes, to compare after."""
    folder.mkdir()
    (folder / "theirs").write_bytes(b"someone else's")
    os.chown(folder / "theirs", _uid(owner), -1)
    os.chown(folder, _uid(owner), -1)
    folder.chmod(0o777)
    return b"someone else's"


def _untouched(folder: Path, owner: str = "nobody") -> None:
    st = folder.lstat()
    assert stat.S_ISDIR(st.st_mode)
    assert st.st_uid == _uid(owner)
    assert stat.S_IMODE(st.st_mode) == 0o777
    assert sorted(p.name for p in folder.iterdir()) == ["theirs"]
    assert (folder / "theirs").read_bytes() == b"someone else's"


# --- 1: a keys folder of another user's under the predictable name ------------------------------------------
@as_root
def test_a_spill_folder_another_user_left_in_a_shared_scratch_is_refused_not_written_into(
    db: str, tmp_path: Path, sticky: Path
) -> None:
    config = numbers_config(tmp_path / "c", n=120_000, extra_source='memory = "1MiB"')  # keys go to disk
    cfg = load_config(config, dsn=db, scratch=sticky)
    planted = spill_folder(cfg, open_store(cfg.store.path), 0).path
    assert planted.parent == sticky
    _foreign(planted)
    code, output = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0", "--scratch", str(sticky))
    assert code != 0, output
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if str(planted) in line]
    assert "owned by nobody" in line, output
    _untouched(planted)
    assert sorted(p.name for p in sticky.iterdir()) == [planted.name]


@as_root
def test_a_folder_another_user_keeps_in_a_sticky_folder_is_refused_when_it_cannot_be_removed(sticky: Path) -> None:
    """As a user who cannot remove it (the sticky bit): the silent failed removal is not a folder to use.

    Run in a child that drops root for ``daemon``, as an ordinary user's dump would run, against a folder
    ``nobody`` owns; the child reports what ``Place.fresh`` did through its exit status.
    """
    planted = sticky / "pgprefetch-0123456789ab-epoch-00000.spill"
    _foreign(planted)
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        status = 3
        try:
            os.setgid(pwd.getpwnam("daemon").pw_gid)
            os.setuid(_uid("daemon"))
            try:
                with Place.named(planted).fresh(0o700) as made:
                    made.write("keys", b"secret keys")
                status = 1  # handed back a folder: the defect
            except StoreError as e:
                status = 0 if "owned by nobody" in str(e) and "\n" not in str(e) else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _untouched(planted)


def test_a_fresh_private_folder_is_this_users_and_private(tmp_path: Path) -> None:
    with Place.named(tmp_path / "k").fresh(0o700) as made:
        st = os.fstat(made.fd)
    assert st.st_uid == os.geteuid()
    assert not st.st_mode & 0o077


# --- 2: compressed chunks go where the dump opened its partial epoch ----------------------------------------
def _compressed_writer(store: Path) -> EpochWriter:
    spec = ArraySpec("v", np.dtype("<i8"), (3,))
    identity = {"config_sha256": "0" * 64, "n_keys": 32, "keys_sha256": "0" * 64}
    local = LocalStore(store)
    local.create(parents=True)
    writer = EpochWriter(local, 0, n_batches=4, batch_size=8, arrays=[spec], compression="zstd", identity=identity)
    writer.begin("snapshot")
    return writer


def test_compressed_chunks_are_written_into_the_open_partial_epoch_not_through_a_link_swapped_in(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store.zarr"
    outside = tmp_path / "outside"
    batch = {"v": np.arange(8 * 3, dtype="<i8").reshape(8, 3)}
    with _compressed_writer(store) as writer:
        writer.write_batch(0, batch)
        partial = store / ".pgprefetch" / "partial"
        shutil.copytree(partial, outside, symlinks=True)  # a same-layout copy: a write by path lands in it
        partial.rename(store / ".pgprefetch" / "moved")
        partial.symlink_to(outside, target_is_directory=True)
        before = tree(outside)
        writer.write_batch(1, {"v": batch["v"] + 100})
        assert tree(outside) == before
        moved = store / ".pgprefetch" / "moved" / "epoch-00000" / "v" / "c"
        assert sorted(p.name for p in moved.iterdir()) == ["0", "1"]
        assert writer.checksums[0, 1] not in (0, 2**32 - 1)
        writer.close()


# --- 3: an object store's uploads read staged files with no link followed -----------------------------------
def test_a_staged_file_replaced_by_a_link_is_refused_not_uploaded(s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    store = open_store(f"s3://{bucket}/u")
    assert isinstance(store, S3Store)
    staged = store.partial_path(0)
    (staged / "v" / "c").mkdir(parents=True)
    (staged / "v" / "c" / "0").write_bytes(b"the epoch's own bytes")
    secret = tmp_path / "secret"
    secret.write_bytes(b"someone's secret")
    (staged / "v" / "c" / "1").symlink_to(secret)
    uploads = Uploads(store, 0)
    uploads.submit(staged / "v" / "c" / "0")
    uploads.submit(staged / "v" / "c" / "1")
    with pytest.raises(StoreError) as refused:
        uploads.finish()
    assert "symbolic link" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert s3.objects(bucket, "u/epoch-00000/v/c/0") == {"": b"the epoch's own bytes"}
    assert s3.objects(bucket, "u/epoch-00000/v/c/1") == {}
    assert b"secret" not in b"".join(s3.objects(bucket, "u").values())


# --- 4: a FIFO where a file belongs never hangs an open; a link is never followed ----------------------------
def test_a_fifo_planted_as_a_shard_of_a_partial_epoch_neither_hangs_nor_is_resumed_through(
    s_table: str, interrupted: tuple[Path, Path]
) -> None:
    config, store = interrupted
    shards = sorted(p for p in (store / ".pgprefetch" / "partial" / "epoch-00000" / "v").rglob("*") if p.is_file())
    assert shards
    shards[0].unlink()
    os.mkfifo(shards[0])
    done = subprocess.run(dump_argv(config, s_table), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "started over" in done.stderr, done.stderr
    assert LocalStore(store).epochs() == [0]


_OPEN_BY_NAME = """
import sys
from pathlib import Path
from pgprefetch.errors import StoreError
from pgprefetch.read.mapping import map_path
from pgprefetch.store.layout import ArrayLayout
import numpy as np
layout = ArrayLayout(Path(sys.argv[1]), np.dtype("<i8"), (1, 1), 1, False, True, "/", "c")
for open_it in (lambda p: map_path(p), lambda p: layout.open_file(Path(p))):
    for name in sys.argv[2:]:
        try:
            open_it(name)
        except StoreError as e:
            assert "\\n" not in str(e)
            print("refused", name)
        else:
            print("opened", name)
"""


def test_the_writers_and_the_workers_opens_by_name_refuse_a_fifo_and_a_link_without_hanging(tmp_path: Path) -> None:
    fifo, link, outside = tmp_path / "fifo", tmp_path / "link", tmp_path / "outside"
    os.mkfifo(fifo)
    outside.write_bytes(b"x" * 8)
    link.symlink_to(outside)
    argv = [sys.executable, "-c", _OPEN_BY_NAME, str(tmp_path), str(fifo), str(link)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"refused {fifo}", f"refused {link}"] * 2


# --- 5: a hard link where the store keeps a file is not written through --------------------------------------
@pytest.mark.parametrize("planted", ["partial/epoch-00000.journal", "locks/epoch-00000.lock"])
def test_a_hard_link_planted_as_a_journal_or_lock_leaves_the_file_outside_unchanged(
    s_table: str, interrupted: tuple[Path, Path], planted: str
) -> None:
    """The outside file holds what the store's file held (a journal to resume), so a write through it lands."""
    config, store = interrupted
    name = store / ".pgprefetch" / planted
    outside = store.parent / "outside" / "victim"
    outside.write_bytes(name.read_bytes() if name.exists() else b"someone's file\n")
    before = outside.read_bytes()
    name.parent.mkdir(parents=True, exist_ok=True)
    name.unlink(missing_ok=True)
    os.link(outside, name)
    code, output = run_cli("dump", "--config", str(config), "--dsn", s_table, "--epoch", "0")
    assert outside.read_bytes() == before
    assert code != 0, output
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if str(name) in line]
    assert "hard link" in line
