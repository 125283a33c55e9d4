"""Writing one epoch into its partial folder, crash-safely, then publishing it.

Uncompressed arrays are sharded: each shard file holds ``S`` consecutive batches (inner chunks of one batch
each) followed by zarr's shard index. Every chunk has the same size, so the index is known up front: the
files are created with their index, and each batch is ``pwrite``-n at its own offset, in any order, with
no read-modify-write and nothing buffered (byte for byte what zarr writes; :mod:`pgprefetch.write.files.shardfiles`
creates the files and keeps their descriptors). Compressed chunks vary in
size, so compressed arrays keep one file per batch and go through zarr's codecs. The metadata documents
(``zarr.json``) are written by :mod:`pgprefetch.store.zarrjson`, so an uncompressed dump never imports zarr.

After each batch (or run of small batches) the writer appends their CRC32C per array to a journal
beside the partial folder (no fsync: a lost line only means a batch fetched again). A dump that dies
(``kill -9``, Ctrl-C, a full disk) leaves the partial folder and its journal; the next dump of the epoch
resumes it if the journal's header, which holds the key list's count and sha256, matches: batches whose
bytes on disk still match their journal checksum are kept, the rest are fetched again. The checksums end
up beside the manifest for ``verify``.

The partial folder, its journal and its files are written through :mod:`pgprefetch.store.folders` (the
folder held open, every file created relative to it, no link followed), as they lie in the store's
``.pgprefetch``, which others may write. Compressed chunks go through zarr's codecs onto a zarr store over
that same open folder (:class:`pgprefetch.store.zarrlocal.FolderStore`), and a partial epoch holding a
link is not resumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np

from pgprefetch.store.base import ArraySpec, Store, Uploader
from pgprefetch.store.folders import Folder
from pgprefetch.store.journal import difference, kept, part_journal, read_journal, remove_journals
from pgprefetch.store.layout import ArrayLayout, checksum, metadata_record, read_batch_bytes
from pgprefetch.store.zarrjson import ZARR_JSON, array_json, group_attributes, group_json, write_array
from pgprefetch.write.files.io import io_errors
from pgprefetch.write.files.shardfiles import OpenFiles, create_shard, remove_partial_chunks, shard_batches
from pgprefetch.write.files.stats import EpochStats

if TYPE_CHECKING:
    import zarr

CHECKSUMS_ARRAY = "_checksums"  # (n_arrays, n_batches) uint32 CRC32C, in the epoch's group
LONGEST_ARRAY = "_longest"  # (n_lengths_arrays, n_batches) int32: each batch's longest sample, or most rows
# The most bytes one pwrite joins from several small batches. Larger writes would save nothing more, and
# the page cache would hold them in large folios (ext4 and xfs since Linux 6.x), which a reader's first
# touch maps whole: a rank reading one batch in four would make the others' batches resident too.
WRITE_BYTES = 64 << 10

log = logging.getLogger("pgprefetch")


class EpochWriter:
    """Writes one epoch's batches into its partial folder (resuming one a dead dump left); publishes it.

    Args:
        store: the store.
        epoch: the epoch.
        n_batches: batches in the epoch.
        batch_size: samples per batch.
        arrays: the fields and the keys array.
        compression: ``none``, ``zstd`` or ``lz4``.
        identity: what makes a partial epoch resumable (config hash, key count and hash, ...): a journal
            whose header differs is discarded and the epoch starts over.
        fresh: discard any partial epoch instead of resuming it (``--force``: one snapshot for the epoch).
        uploader: where each file goes as soon as it is final, while the dump goes on: up to an object store,
            or back to a local disk (:class:`pgprefetch.store.durable.WriteBack`).
        owned: the batches whose shard files this writer creates (None: all of them).
        part: this writer is one part of an epoch spread over several processes (:mod:`pgprefetch.write.ray`):
            it writes into a partial epoch a driver created, journals into a journal of its own beside the
            epoch's (:func:`part_journal`; the driver's resume reads it), and never discards anything.
    """

    def __init__(
        self,
        store: Store,
        epoch: int,
        *,
        n_batches: int,
        batch_size: int,
        arrays: list[ArraySpec],
        compression: str,
        identity: dict[str, Any],
        fresh: bool = False,
        uploader: Uploader | None = None,
        stats: EpochStats | None = None,
        owned: range | None = None,
        part: int | None = None,
    ) -> None:
        self.store = store
        self.epoch = epoch
        self.path = store.partial_path(epoch)
        self.journal_path = store.journal_path(epoch) if part is None else part_journal(store.journal_path(epoch), part)
        self._staged = store.place(self.path.parent)  # the partial epochs' folder, with the journals
        self.dir: Folder | None = None  # the partial epoch's folder, open while it is written
        self.owned = range(n_batches) if owned is None else owned
        self.part = part
        self.compressed = compression != "none"
        self.names = [a.name for a in arrays]
        self.sizes = {a.name: a.per_batch or batch_size for a in arrays}  # items per chunk (rows: their own)
        self.header = {
            **identity,
            "n_batches": n_batches,
            "batch_size": batch_size,
            "compression": compression,
            "arrays": {a.name: [a.dtype.str, list(a.sample_shape), *([a.per_batch] if a.per_batch else [])]
                       for a in arrays},
        }  # fmt: skip
        self.checksums = np.zeros((len(arrays), n_batches), dtype=np.uint32)
        self._journal_lock = threading.Lock()
        self.done = np.zeros(n_batches, dtype=bool)
        self.restarted: str | None = None  # why a partial epoch found here was discarded
        self.snapshots: list[str] = []  # the snapshots earlier dumps of this partial epoch read
        self.uploader = uploader
        self.replace = fresh  # --force: publishing replaces a complete epoch
        self._files = OpenFiles()
        self._submitted: set[tuple[str, int]] = set()  # (array, file number) finished: closed, handed to an uploader
        self.stats = stats  # each batch's field statistics, as it is written or kept
        self._zarr_arrays: dict[str, zarr.Array[Any]] | None = None  # compressed arrays, opened on first use
        try:
            with io_errors(self.path):
                if part is None:
                    self._open(arrays, fresh)
                else:
                    self._open_part(arrays)
        except BaseException:  # refused half-way (a planted journal): nothing it opened is left open
            self.close()
            raise

    def _open_part(self, arrays: list[ArraySpec]) -> None:
        """Join the partial epoch a driver created: its arrays, the shard files this part owns, its journal."""
        with self._staged.open(create=True) as staged:
            self.dir = staged.folder(self.path.name)
            self._files.open_in(self.dir, self.path)
            self.layouts = {name: self._layout(name) for name in self.names}
            for layout in self.layouts.values():
                if layout.sharded:
                    self._create_files(layout, only_missing=True)
            self.resumed = 0
            fresh = staged.kind(self.journal_path.name) is None
            self._journal = self._open_journal(staged, append=True)
        self._journal.write(("" if fresh else "\n") + json.dumps(self.header, sort_keys=True) + "\n")
        self._journal.flush()

    def _open_journal(self, staged: Folder, *, append: bool) -> TextIO:
        """The journal, opened to append to (or emptied first) through the partial epochs' folder."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        return os.fdopen(staged.open(self.journal_path.name, flags), "a")

    def _layout(self, name: str) -> ArrayLayout:
        """Array ``name`` of the partial epoch, from its ``zarr.json`` as read through the open folder."""
        assert self.dir is not None
        raw = self.dir.read(f"{name}/{ZARR_JSON}")
        if raw is None:
            raise FileNotFoundError(2, "the array's zarr.json is missing", str(self.path / name / ZARR_JSON))
        return ArrayLayout.from_bytes(raw, self.path / name)

    def _create_files(self, layout: ArrayLayout, only_missing: bool = False) -> None:
        """Create the shard files (with their index) of the batches this writer owns."""
        if not self.owned:
            return
        assert self.dir is not None
        n_batches, per_shard = self.header["n_batches"], layout.per_file
        for shard in range(self.owned.start // per_shard, -(-self.owned.stop // per_shard)):
            path = PurePosixPath(layout.file(shard * per_shard)[0].relative_to(self.path))
            if only_missing and self.dir.kind(path) is not None:
                continue
            valid = min(per_shard, n_batches - shard * per_shard)
            create_shard(self.dir, path, per_shard, valid, layout.batch_bytes)

    def _open(self, arrays: list[ArraySpec], fresh: bool) -> None:
        """Resume the partial epoch a dead dump left (if its journal matches) or create a new one."""
        n_batches, batch_size, compression = (self.header[k] for k in ("n_batches", "batch_size", "compression"))
        previous = None if fresh else self._read_journal()
        if previous is not None and previous[0] != self.header:
            self.restarted = difference(previous[0], self.header)
            previous = None
            self.snapshots = []
        if previous is None:
            self.discard()
        with self._staged.open(create=True) as staged:  # a link planted for it is replaced, never followed
            if previous is None:
                self.dir = staged.fresh(self.path.name, mode=0o777)
                self._files.open_in(self.dir, self.path)
                self.dir.write(ZARR_JSON, group_json())
                for a in arrays:
                    self._create_array(a, n_batches, batch_size, compression)
            else:
                self.dir = staged.folder(self.path.name)
                self._files.open_in(self.dir, self.path)
            self.layouts = {name: self._layout(name) for name in self.names}
            if previous is not None:
                remove_partial_chunks(self.dir)
                self._keep_verified(previous[1])

            self.resumed = int(self.done.sum())  # batches kept from a partial epoch a previous dump left
            self._journal = self._open_journal(staged, append=previous is not None)
            if previous is None:
                self._journal.write(json.dumps(self.header, sort_keys=True) + "\n")
                self._journal.flush()
            elif not (staged.read(self.journal_path.name) or b"").endswith(b"\n"):
                self._journal.write("\n")  # a last line a crash cut short must not swallow this dump's first one
        if not self.resumed:
            self.snapshots = []  # nothing kept: the epoch reads only the new snapshot

    def __enter__(self) -> EpochWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        """On any failure (Ctrl-C included) stop writing and keep the partial epoch for the next dump."""
        if kind is not None:
            self.close()

    def begin(self, snapshot: str) -> None:
        """Note the snapshot this dump reads, so a resumed epoch lists every snapshot its batches came from."""
        self.snapshots.append(snapshot)
        self._journal.write(f"#snapshot {snapshot}\n")
        self._journal.flush()

    def _create_array(self, spec: ArraySpec, n_batches: int, batch_size: int, compression: str) -> None:
        """Create an array of the epoch: its ``zarr.json`` (zarr's own bytes) and, uncompressed, its shard files."""
        chunk = (1, spec.per_batch or batch_size, *spec.sample_shape)
        # An array of rows (windows stored as starts) is one file: a window may begin at any row, and one
        # mapping of the file serves every window of a batch.
        per_shard = n_batches if spec.per_batch else shard_batches(int(np.prod(chunk)) * spec.dtype.itemsize, n_batches)
        assert self.dir is not None
        meta = array_json(
            (n_batches, *chunk[1:]),
            spec.dtype,
            chunk,
            # Each array's own axes get names of their own: arrays sharing "dim0" with other sizes make
            # xarray refuse the epoch (pydata/xarray#9685).
            [
                "batch",
                "row" if spec.per_batch else "sample",
                *(f"{spec.name}_dim{i}" for i in range(len(spec.sample_shape))),
            ],
            shards=None if self.compressed else (per_shard, *chunk[1:]),
            compression=compression,
        )
        self.dir.write(f"{spec.name}/{ZARR_JSON}", meta)  # the array's folder made with it
        if not self.compressed:
            self._create_files(self._layout(spec.name))

    @property
    def arrays(self) -> dict[str, zarr.Array[Any]]:
        """The epoch's arrays opened through zarr, for compressed chunks: the only part of a dump that imports it."""
        if self._zarr_arrays is None:
            import zarr

            from pgprefetch.store.zarrlocal import FolderStore

            assert self.dir is not None
            group = zarr.open_group(FolderStore(self.dir), mode="r+")  # by the folder's descriptor, never by path
            self._zarr_arrays = {name: _reopened(group, name) for name in self.names}
        return self._zarr_arrays

    def _read_journal(self) -> tuple[dict[str, Any], dict[int, list[int]]] | None:
        """What the journal of a partial epoch found here holds, if it can be resumed; None: start over.

        A partial epoch with a link in it (or in its own or its journal's place) is started over: the
        link may lead out of the store, and resuming would write through it (:mod:`pgprefetch.store.folders`).
        """
        staged = self._staged.find()
        if staged is None:
            return None
        with staged:
            epoch = staged.find(self.path.name)
            if epoch is None:
                return None
            with epoch:
                links = epoch.links()
            if staged.kind(self.journal_path.name) not in ("file", None):
                links.insert(0, f"../{self.journal_path.name}")
        if links:
            self.restarted = f"it held {links[0]}, which is not a file or folder of the dump's own (a link planted?)"
            return None
        found = read_journal(self.journal_path, len(self.names))
        if found is None:
            return None
        header, done, snapshots = found
        self.snapshots += snapshots
        return header, kept(header, done)  # what ``ls`` counts of a partial epoch too

    def _keep_verified(self, journal: dict[int, list[int]]) -> None:
        """Keep the journal's batches whose bytes on disk still have their recorded checksums.

        Each kept batch is read once: its checksum and its statistics (the figures a fresh dump would
        publish) come from the same bytes. Reading it back through zarr for the statistics made a resume
        with three quarters kept slower than starting over.
        """
        if journal:
            log.info("epoch %d: checking the %d batches an interrupted dump wrote", self.epoch, len(journal))
        for batch, crcs in journal.items():
            if not 0 <= batch < self.done.size:
                continue
            stored = {name: read_batch_bytes(self.layouts[name], batch, self.dir) for name in self.names}
            if [checksum(data) for data in stored.values()] != crcs:
                continue
            self.checksums[:, batch] = crcs
            self.done[batch] = True
            if self.stats is not None:
                self.stats.add(batch, 1, {name: self._values(name, batch, data) for name, data in stored.items()})

    def _values(self, name: str, batch: int, stored: bytes | None) -> np.ndarray:
        """Batch ``batch`` of array ``name`` from its stored bytes (decoded by zarr when compressed)."""
        layout = self.layouts[name]
        if not layout.raw or stored is None:
            return np.asarray(self.arrays[name][batch])
        return np.frombuffer(stored, dtype=layout.dtype.newbyteorder("<")).reshape(layout.batch_shape)

    def write_batch(self, batch: int, arrays: dict[str, np.ndarray]) -> int:
        """Write batch ``batch`` of every array (blocking: call it from one worker thread); return bytes."""
        return self.write_batches(batch, 1, arrays)

    def write_batches(self, first: int, count: int, arrays: dict[str, np.ndarray]) -> int:
        """Write ``count`` consecutive batches from ``first`` on; return bytes. Blocking: run it on a thread.

        Each array in ``arrays`` holds at least ``count`` chunks of its items (``batch_size`` samples, or its
        ``per_batch`` rows), the batches one after another.
        """
        with io_errors(self.path):
            return self._write_batches(first, count, arrays)

    def _write_batches(self, first: int, count: int, arrays: dict[str, np.ndarray]) -> int:
        written = 0
        crcs = np.empty((len(self.names), count), dtype=np.uint32)
        for j, name in enumerate(self.names):
            size = self.sizes[name]
            data = arrays[name][: count * size]
            raw = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
            layout = self.layouts[name]
            if self.compressed:
                for i in range(count):
                    self.arrays[name][first + i] = raw[i * size : (i + 1) * size]
                    crcs[j, i] = checksum(read_batch_bytes(layout, first + i, self.dir))
            else:
                # Consecutive batches of one shard file are consecutive bytes: small batches share a pwrite.
                batch, most = first, max(1, WRITE_BYTES // layout.batch_bytes)
                while batch < first + count:
                    number, slot = divmod(batch, layout.per_file)
                    run = min(first + count - batch, layout.per_file - slot, most)
                    lo = (batch - first) * size
                    self._files.pwrite(layout, number, raw[lo : lo + run * size], slot * layout.batch_bytes)
                    batch += run
                for i, chunk in enumerate(raw.reshape(count, -1)):
                    crcs[j, i] = checksum(chunk)
            written += data.nbytes
        self.checksums[:, first : first + count] = crcs
        if self.stats is not None:
            self.stats.add(first, count, arrays)
        lines = "".join(f"{first + i} {' '.join(map(str, crcs[:, i].tolist()))}\n" for i in range(count))
        with self._journal_lock:  # units may be written from two threads (scan mode, uncompressed)
            self._journal.write(lines)
            self._journal.flush()
            self.done[first : first + count] = True
            finished = self._finished_files(first, count)
        if self.uploader is not None:
            for path in finished:
                self.uploader.submit(path)
        return written

    def _finished_files(self, first: int, count: int) -> list[Path]:
        """The files whose every batch is now written, among those batches ``first..first+count-1`` touch.

        Their descriptors are closed here: nothing writes to them again.
        """
        out = []
        for name in self.names:
            layout = self.layouts[name]
            for number in range(first // layout.per_file, (first + count - 1) // layout.per_file + 1):
                lo = number * layout.per_file
                if (name, number) not in self._submitted and self.done[lo : lo + layout.per_file].all():
                    self._submitted.add((name, number))
                    self._files.close(layout, number)
                    out.append(layout.file(lo)[0])
        return out

    def finish_part(self) -> list[str]:
        """A part's end: every file it finished closed and uploaded; returns them, relative to the epoch."""
        self._files.close_all()
        if self.uploader is not None:
            with io_errors(self.path):
                self.uploader.finish()
        self._journal.close()
        if self.dir is not None:
            self.dir.close()
        return sorted(
            self.layouts[name].file(number * self.layouts[name].per_file)[0].relative_to(self.path).as_posix()
            for name, number in self._submitted
        )

    def publish(self, manifest: dict[str, Any], elsewhere: Collection[str] = ()) -> Path | str:
        """Record the checksums and the manifest, and publish the epoch atomically.

        The per-chunk checksums go to an array of their own in the epoch (``_checksums``: a row per array,
        a column per batch), not into the manifest: an epoch of 10^5 batches would otherwise carry
        megabytes of JSON that every reader and ``ls`` parses. (A plain file beside the manifest would
        make zarr and xarray warn about an unknown object in the group.) So do each batch's longest sample
        and most rows, for fields of any length (``_longest``, a row per lengths array).

        ``elsewhere``: files of the epoch that parts on other machines uploaded (:mod:`pgprefetch.write.ray`).
        """
        manifest["checksums"] = {"algorithm": "crc32c", "array": CHECKSUMS_ARRAY, "arrays": self.names}
        longest = self.stats.longest() if self.stats is not None else {}
        if longest:
            manifest["longest"] = {"array": LONGEST_ARRAY, "arrays": list(longest)}
        self._files.close_all()
        with io_errors(self.path):
            if self.uploader is not None:
                self.uploader.finish()  # every file sent (or written back to disk) before the epoch is visible
            # Replaced if there (a publish that failed after this, an upload, is simply run again).
            assert self.dir is not None
            write_array(self.dir, CHECKSUMS_ARRAY, self.checksums, [f"{CHECKSUMS_ARRAY}_array", "batch"])
            if longest:
                write_array(
                    self.dir,
                    LONGEST_ARRAY,
                    np.array(list(longest.values()), dtype="<i4"),
                    [f"{LONGEST_ARRAY}_array", "batch"],
                )
            arrays = [*self.names, CHECKSUMS_ARRAY, *([LONGEST_ARRAY] if longest else [])]
            manifest["metadata_sha256"] = metadata_record(self.path, arrays)
            self.dir.replace(ZARR_JSON, group_json(group_attributes(self.dir) | {"pgprefetch": manifest}))
            self._journal.close()
            self.dir.close()
            final = self.store.publish(self.epoch, self.path, replace=self.replace, elsewhere=elsewhere)
            with self._staged.open() as staged:
                remove_journals(staged, self.journal_path.name)
        return final

    def close(self) -> None:
        """Stop writing, keeping the partial epoch and its journal for the next dump to resume.

        Never raises: it runs on the way out of a failure (a full disk may refuse the journal's last
        buffered line too), and a lost line only means a batch fetched again.
        """
        self._files.close_all()
        if getattr(self, "_journal", None) is not None:
            with contextlib.suppress(OSError):
                self._journal.close()
        if self.dir is not None:
            self.dir.close()

    def discard(self) -> None:
        """Remove the partial epoch and its journal (a link in the place of either: the link, never its target)."""
        self._files.close_all()
        if getattr(self, "_journal", None) is not None:
            self._journal.close()
        if self.dir is not None:
            self.dir.close()
            self.dir = None
        staged = self._staged.find()
        if staged is not None:
            with staged:
                staged.remove(self.path.name)
                remove_journals(staged, self.journal_path.name)


def _reopened(group: zarr.Group, name: str) -> zarr.Array[Any]:
    """An array of a partial epoch opened again: a chunk for every batch, zeros included, as when created.

    (``write_empty_chunks`` is a setting of the opened array, not stored with it.)
    """
    return cast("zarr.Array[Any]", group[name]).with_config({"write_empty_chunks": True})  # created as arrays
