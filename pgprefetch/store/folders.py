"""The one way to write under a store's local folders: each one opened as a descriptor, no link followed.

A store's ``.pgprefetch`` (locks, consumer records, partial epochs and their journals, spools, keys, trash,
the vocabulary) is written by every dump and reader of the store, so whoever can write it can plant a
symbolic link where pgprefetch keeps a folder. ``O_NOFOLLOW`` on a file guards its last component only: a
link one folder up (``.pgprefetch/locks`` pointing elsewhere) is followed all the same, and a path checked
before it is used can be swapped for a link in between. So nothing below a store is written by path.
:class:`Folder` holds a folder open as a directory descriptor; a folder below it is opened from its parent's
descriptor, one component at a time, with ``O_DIRECTORY | O_NOFOLLOW``; files are created, replaced,
renamed and removed relative to the descriptor (``dir_fd=``). What a name means is then fixed once its
folder is open, and a link is never a step on the way.

Only the anchor is opened as named, links and all: the store's own path (or a staging, scratch or
temporary folder), which is the user's choice, not something planted in the store. :class:`Place` names a
folder as anchor and components below it, so that code far from the store (a spool, a keys folder) opens
its folder the same way.

Readers of published epochs walk the same way from the store's folder, and refuse a link they meet
(:mod:`pgprefetch.store.beneath`): they change nothing.

What a link finds, in one rule:

- **Where the store keeps a folder** (every name below its ``.pgprefetch``, an epoch's partial folder and
  its arrays), a link is not the store's folder. Writing, the link itself is removed (never what it points
  at) and a real folder made in its place, with a warning; reading or removing, it is as if nothing were
  there. Anything else where a folder belongs (a file, a FIFO) may be someone's data: it is refused, one line.
- **Where the store keeps a file**, a link is never written through. A file put in place by a rename
  (records, metadata, the vocabulary) replaces the link itself; a file opened for writing (a lock, a
  journal, a shard) is refused in one line when a link or anything but a regular file is there (a lock
  link replaced instead could leave two dumps each holding a lock of its own).

This is the writing side. Readers reach a published epoch's files through :mod:`pgprefetch.store.beneath`,
which refuses a link outright: an epoch is not theirs to repair.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pgprefetch.errors import StoreError

log = logging.getLogger("pgprefetch")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: opening a planted FIFO cannot hang
_TRIES = 16  # a folder replaced that often while it is opened: another process keeps changing it

Relative = str | PurePosixPath


def _parts(rel: Relative) -> tuple[str, ...]:
    """The components of a relative path below a folder: never absolute, never ``..``."""
    parts = tuple(p for p in PurePosixPath(rel).parts if p != ".")
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{rel!r} is not a path below a folder")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


class Folder:
    """A folder open as a directory descriptor, and the path messages name it by.

    A context manager: leaving the block closes the descriptor. Every path a method takes is relative to
    this folder and may have several components, each opened without following a link.
    """

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def anchor(cls, path: Path, *, create: bool = False, mode: int = 0o777) -> Folder:
        """The folder at ``path`` as the user named it (links followed), made with its parents if ``create``.

        ``mode`` (less the umask) is the folder's own if it is made; its parents get the default.
        """
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the descriptor (once)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"Folder({str(self.path)!r})"

    # --- folders ------------------------------------------------------------------------------------
    def folder(self, rel: Relative, *, create: bool = False, mode: int = 0o777) -> Folder:
        """The folder ``rel`` below this one, opened component by component without following a link.

        ``create``: missing folders are made (``mode`` for the last, less the umask), and a link where a
        folder belongs is replaced by one. Without it a missing folder, or a link or file in its place, is
        FileNotFoundError: the store has no folder there.
        """
        parts = _parts(rel)
        fd, path = self.fd, self.path
        opened = -1
        try:
            for i, name in enumerate(parts):
                path = path / name
                fd = _open_folder(fd, name, path, create, mode if i == len(parts) - 1 else 0o777)
                if opened >= 0:
                    os.close(opened)
                opened = fd
        except BaseException:
            if opened >= 0:
                os.close(opened)
            raise
        return Folder(opened if opened >= 0 else os.dup(self.fd), path)

    def find(self, rel: Relative) -> Folder | None:
        """:meth:`folder` without creating: None when the store has no folder there."""
        try:
            return self.folder(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def fresh(self, name: str, mode: int = 0o700) -> Folder:
        """The folder ``name`` made anew (whatever was there removed, never followed), ``mode`` less the umask.

        Made here, by this process, or refused: the folder handed back is one ``mkdir`` just made, never one
        found in place. A name that could not be removed (another user's folder in a shared sticky folder
        such as /tmp, where the removal fails) or that came back meanwhile is a StoreError naming its owner,
        not a folder to write keys into that its owner can read. A private folder (``mode`` without group
        or other bits) is never someone else's to remove either, root or not: what another user left under
        that name is refused, not deleted, and the folder made is checked to be this user's and private.
        """
        _parts(name)
        private = not mode & 0o077
        if private:
            self._refuse_foreign(name)
        self.remove(name)
        try:
            os.mkdir(name, mode, dir_fd=self.fd)
        except FileExistsError:
            self._refuse_foreign(name)
            raise StoreError(
                f"cannot make {self.path / name}: something is there that pgprefetch could not remove "
                f"(owned by {_owner(name, self.fd)}); remove it or choose another folder"
            ) from None
        made = self.folder(name)
        st = os.fstat(made.fd)
        if st.st_uid != os.geteuid() or (private and st.st_mode & 0o077):
            made.close()
            raise StoreError(
                f"cannot use {made.path}: it was replaced as it was made (owned by {_user(st.st_uid)}, mode "
                f"{stat.S_IMODE(st.st_mode):o}); remove it or choose another folder"
            )
        return made

    def _refuse_foreign(self, name: str) -> None:
        """StoreError naming the owner when ``name`` here (its link not followed) is another user's."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        if st.st_uid != os.geteuid():
            raise StoreError(
                f"{self.path / name} is owned by {_user(st.st_uid)}, not by this user: pgprefetch neither "
                "removes nor writes into another user's folder; remove it or choose another folder"
            )

    @contextlib.contextmanager
    def _parent(self, rel: Relative, create: bool = False) -> Iterator[tuple[int, str, Path]]:
        """The descriptor of ``rel``'s folder (made if ``create``), its last component and its whole path."""
        parts = _parts(rel)
        if not parts:
            raise ValueError("a file needs a name")
        if len(parts) == 1:
            yield self.fd, parts[0], self.path / parts[0]
            return
        with self.folder(PurePosixPath(*parts[:-1]), create=create) as parent:
            yield parent.fd, parts[-1], parent.path / parts[-1]

    # --- what is there ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names in this folder."""
        return os.listdir(self.fd)

    def kind(self, rel: Relative) -> str | None:
        """What ``rel`` is, its link not followed: ``folder``, ``file``, ``link``, ``other``; None: nothing."""
        try:
            with self._parent(rel) as (fd, name, _):
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(mode):
            return "folder"
        if stat.S_ISREG(mode):
            return "file"
        return "link" if stat.S_ISLNK(mode) else "other"

    def read(self, rel: Relative) -> bytes | None:
        """The bytes of the file ``rel``; None when there is none (a link there is not the store's file)."""
        try:
            with self._parent(rel) as (parent, name, _):
                fd = os.open(name, os.O_RDONLY | _FILE, dir_fd=parent)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO):
                return None
            raise
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return f.read()

    def links(self) -> list[str]:
        """Everything below this folder that is neither a folder nor a file (a link planted, a FIFO)."""
        found = []
        for top, folders, files, fd in os.fwalk(".", dir_fd=self.fd):
            for name in (*folders, *files):
                with contextlib.suppress(FileNotFoundError):
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                        found.append(os.path.normpath(os.path.join(top, name)))
        return found

    # --- files --------------------------------------------------------------------------------------
    def open(self, rel: Relative, flags: int, mode: int = 0o666) -> int:
        """Open the file ``rel`` (its folders made first with ``O_CREAT``): a regular file, never through a link.

        A link or anything but a regular file there is refused (StoreError, one line naming it); so is, for
        writing, a file with another name too (a hard link: writing would change the file behind that
        name). ``O_TRUNC`` is applied only once the file is known to be the store's own.
        """
        with self._parent(rel, create=bool(flags & os.O_CREAT)) as (parent, name, path):
            try:
                fd = os.open(name, (flags & ~os.O_TRUNC) | _FILE, mode, dir_fd=parent)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENXIO):
                    what = "a symbolic link" if e.errno == errno.ELOOP else "a FIFO"
                    raise StoreError(_refusal(path, what)) from None
                raise
            st = os.fstat(fd)
            writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
            if not stat.S_ISREG(st.st_mode) or (writing and st.st_nlink != 1):
                os.close(fd)
                what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a hard link (a file with another name)"
                raise StoreError(_refusal(path, what))
            if flags & os.O_TRUNC:
                try:
                    os.ftruncate(fd, 0)
                except BaseException:
                    os.close(fd)
                    raise
            return fd

    def write(self, rel: Relative, data: bytes) -> None:
        """Write ``data`` into the file ``rel``, created or emptied first (its folders made)."""
        fd = self.open(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def replace(self, rel: Relative, data: bytes, *, sync: bool = False) -> None:
        """Put ``data`` at ``rel`` atomically: a new file of a random name beside it, renamed over it.

        A reader sees the old bytes or the new, never half, and a link at ``rel`` is replaced, not written
        through; the new file is created ``O_EXCL``, so no planted name is written through either.
        ``sync``: the file is on disk before the rename (the caller syncs the folder).
        """
        with self._parent(rel, create=True) as (parent, name, _):
            temporary = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE, 0o666, dir_fd=parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())
                os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=parent)
                raise

    def unlink(self, rel: Relative) -> None:
        """Remove the file (or link) ``rel``; nothing there is no error."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), self._parent(rel) as (parent, name, _):
            os.unlink(name, dir_fd=parent)

    def remove(self, rel: Relative) -> None:
        """Remove ``rel`` whatever it is: a folder with all it holds, a file, a link (never what it points at).

        In a sticky folder (/tmp, a shared scratch folder) only what this user owns goes, root or not, as
        the kernel has it for every other user: another user's folder under a name pgprefetch uses is
        theirs (a run of theirs, or a plant that :meth:`fresh` then refuses), not leftovers to clean up.
        """
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), self._parent(rel) as (parent, name, _):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if st.st_uid != os.geteuid() and _sticky(parent):
                log.debug("%s left: another user's in a sticky folder", self.path / _parts(rel)[-1])
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, ignore_errors=True, dir_fd=parent)  # by descriptors: no link followed
            else:
                os.unlink(name, dir_fd=parent)

    def rename(self, rel: Relative, to: Folder, new: Relative) -> None:
        """Move ``rel`` (a folder, a file or a link itself) to ``new`` in ``to``, replacing a file there."""
        with self._parent(rel) as (source, name, _), to._parent(new) as (target, new_name, _):
            os.rename(name, new_name, src_dir_fd=source, dst_dir_fd=target)


def _open_folder(parent: int, name: str, path: Path, create: bool, mode: int) -> int:
    """Open the folder ``name`` in ``parent`` without following a link (see :meth:`Folder.folder`)."""
    for _ in range(_TRIES):
        try:
            return os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile: open that
                os.mkdir(name, mode, dir_fd=parent)
            continue
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        try:
            found = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue  # gone meanwhile: try again
        if stat.S_ISDIR(found):
            continue  # replaced by a folder meanwhile
        if not create:
            raise FileNotFoundError(errno.ENOENT, f"{_kind(found)}, not a folder", str(path))
        if not stat.S_ISLNK(found):
            raise StoreError(f"cannot write {path}: it is {_kind(found)}, where the store keeps a folder; move it away")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)  # the link alone: what it points at is never touched
        log.warning("%s was a symbolic link (planted?): replaced by a folder, what it pointed at left alone", path)
    raise StoreError(f"cannot open {path}: another process keeps replacing it")


def _sticky(folder: int) -> bool:
    """Whether ``folder`` is sticky: shared, each entry its owner's to remove."""
    return bool(os.fstat(folder).st_mode & stat.S_ISVTX)


def _user(uid: int) -> str:
    """A user's name for messages (the number when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _owner(name: str, parent: int) -> str:
    """Who owns ``name`` in ``parent``, its link not followed, for a message."""
    try:
        return _user(os.stat(name, dir_fd=parent, follow_symlinks=False).st_uid)
    except OSError:
        return "unknown: it is gone again"


def _refusal(path: Path, what: str) -> str:
    return (
        f"{path} is {what}, not a file of the store (planted?): pgprefetch never writes through one; "
        "remove it and run again"
    )


@dataclass(frozen=True)
class Place:
    """Where a folder is: an anchor opened as named, and the components below it, each opened without a link.

    A store's places anchor at the store (the local backend) or at its staging folder (an object store), so
    that nothing below ``.pgprefetch`` is followed; a folder of the user's own choosing (``[source]
    scratch``, the temporary folder) anchors at its parent, so that its own name is guarded.
    """

    anchor: Path
    below: PurePosixPath = field(default_factory=PurePosixPath)
    make_anchor: bool = False  # the anchor is made (with its parents) when a folder below it is

    @classmethod
    def under(cls, anchor: Path, path: Path, *, make_anchor: bool = False) -> Place:
        """``path``, a path below ``anchor``, as a place."""
        return cls(anchor, PurePosixPath(path.relative_to(anchor)), make_anchor)

    @classmethod
    def named(cls, path: Path) -> Place:
        """A folder the user named (or a temporary one): its parent is theirs, its own name is guarded."""
        return cls(path.parent, PurePosixPath(path.name), make_anchor=True)

    @property
    def path(self) -> Path:
        """The whole path, for messages."""
        return self.anchor / self.below

    @property
    def name(self) -> str:
        """The last component's name."""
        return self.below.name

    @property
    def parent(self) -> Place:
        """The place one component up (never above the anchor)."""
        if not self.below.parts:
            raise ValueError(f"{self.anchor} is the anchor: its parent is not a place below it")
        return Place(self.anchor, self.below.parent, self.make_anchor)

    def __truediv__(self, name: str) -> Place:
        return Place(self.anchor, self.below / name, self.make_anchor)

    def __str__(self) -> str:
        return str(self.path)

    def open(self, *, create: bool = False, mode: int = 0o777) -> Folder:
        """The folder here, opened (made, if ``create``: see :meth:`Folder.folder`)."""
        made = create and self.make_anchor
        with Folder.anchor(self.anchor, create=made, mode=0o777 if self.below.parts else mode) as anchor:
            return anchor.folder(self.below, create=create, mode=mode)

    def find(self) -> Folder | None:
        """The folder here, if the store has one (None: nothing, or a link or file in its place)."""
        try:
            return self.open()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def fresh(self, mode: int = 0o700) -> Folder:
        """The folder here made anew, ``mode`` less the umask; its parent made too (with ``mode``) if missing.

        Whatever was here goes first (a killed run's leftovers, a planted link: the link only).
        """
        with self.parent.open(create=True, mode=mode) as parent:
            return parent.fresh(self.name, mode)

    def remove(self) -> None:
        """Remove what is here (a folder with all it holds, a file, a link: never what a link points at)."""
        parent = self.parent.find()
        if parent is not None:
            with parent:
                parent.remove(self.name)


def as_place(where: Path | Place) -> Place:
    """``where`` as a place: a Place as it is; a path as a folder its user named (:meth:`Place.named`).

    The dump names the folders below a store as places (:meth:`pgprefetch.store.base.Store.place`); a path
    comes from the user or the temporary folder, whose parent is theirs.
    """
    return where if isinstance(where, Place) else Place.named(where)
