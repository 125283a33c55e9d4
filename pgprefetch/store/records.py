"""Part records: what a part of a spread epoch leaves in an object store once every file it owns is uploaded.

On a filesystem every node mounts, a rerun after the driver died resumes from the parts' journals, which
the next driver reads beside the partial epoch. On an object store each part stages on its own node, where
the next driver cannot look. So a part that has uploaded all its files puts a record beside them, under the
partial epoch's prefix (``epoch-00003/_parts/part-00001.npz``): the epoch's identity (the journal's header:
config and keys sha256, categories, sizes, arrays), the part's batch range, each batch's checksums and
statistics partials, its files with their sizes, and the snapshot it read. This is the single process's
resume on S3 (journal + upload log: a file is skipped when its object is there with the logged size), kept
where any driver can read it.

A rerun's driver (:func:`usable`) keeps the parts whose record has this epoch's identity and one of this
split's ranges and whose files are all in the store with their sizes; it merges them exactly as fresh
results (same checksums, same statistics, in batch order), so the published epoch is byte for byte the
same, and runs only the other parts. A record that does not match is deleted and its part runs again; the
epoch's ``restarted`` says why, as for a journal. Publication deletes every object under the epoch that is
not one of its files, records included (:meth:`~pgprefetch.store.base.Store.publish`), before the manifest.

A record is an ``.npz`` of plain arrays, read without pickles: a bucket holds data, never code to run.
"""

from __future__ import annotations

import io
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.store.base import epoch_name
from pgprefetch.store.journal import difference
from pgprefetch.store.objects import ObjectStore

log = logging.getLogger("pgprefetch")
FOLDER = "_parts"  # under the partial epoch's prefix; never part of a published epoch
READ_THREADS = 8  # records read at once by a rerun's driver


@dataclass(frozen=True)
class PartRecord:
    """One finished part of an epoch, as a rerun's driver merges it."""

    index: int
    owned: range
    header: dict[str, Any]  # the epoch's identity and layout (the journal's header)
    snapshot: str
    batches: np.ndarray  # the batches written: all of ``owned``
    checksums: np.ndarray  # (n_arrays, len(batches))
    figures: tuple[np.ndarray, dict[str, np.ndarray]]  # statistics partials (EpochStats.taken)
    files: dict[str, int]  # relative to the epoch -> size in bytes

    def encode(self) -> bytes:
        """The record's bytes: an ``.npz`` whose ``meta`` is JSON."""
        rows, longest = self.figures
        meta = {
            "index": self.index,
            "owned": [self.owned.start, self.owned.stop],
            "header": self.header,
            "snapshot": self.snapshot,
            "files": self.files,
            "longest": list(longest),
        }
        arrays = {f"longest{i}": values for i, values in enumerate(longest.values())}
        out = io.BytesIO()
        np.savez(
            out, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8),
            batches=self.batches, checksums=self.checksums, rows=rows, **arrays,  # type: ignore[arg-type]  # no allow_pickle in arrays
        )  # fmt: skip
        return out.getvalue()

    @classmethod
    def decode(cls, data: bytes) -> PartRecord | None:
        """The record in ``data``; None when it cannot be read (cut short, another format)."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                meta = json.loads(npz["meta"].tobytes())
                longest = {name: npz[f"longest{i}"] for i, name in enumerate(meta["longest"])}
                return cls(
                    int(meta["index"]), range(*meta["owned"]), meta["header"], str(meta["snapshot"]),
                    npz["batches"], npz["checksums"], (npz["rows"], longest), dict(meta["files"]),
                )  # fmt: skip
        except (ValueError, KeyError, TypeError, OSError, EOFError):
            return None


def record_key(epoch: int, index: int) -> str:
    """Where part ``index``'s record of ``epoch`` goes, relative to the store."""
    return f"{epoch_name(epoch)}/{FOLDER}/part-{index:05d}.npz"


def put_record(store: ObjectStore, epoch: int, record: PartRecord) -> None:
    """Record a finished part (every file it lists already uploaded)."""
    store.put(record_key(epoch, record.index), record.encode())


def usable(
    store: ObjectStore, epoch: int, header: dict[str, Any], ranges: list[range]
) -> tuple[list[PartRecord], str | None]:
    """The records of ``epoch``'s parts a rerun keeps, and why others were not kept (None: all were).

    Kept: the record is readable, has ``header`` (this epoch's identity) and one of ``ranges`` (this
    split) at its own index, and every file it lists is in the store with its size. The others are deleted.
    """
    kept, dropped, reason = judged(store, epoch, header, ranges)
    store.delete(dropped)
    return kept, reason


def judged(
    store: ObjectStore, epoch: int, header: dict[str, Any], ranges: list[range] | None
) -> tuple[list[PartRecord], list[str], str | None]:
    """The records :func:`usable` keeps, the keys of the others, and why; nothing deleted.

    ``ranges`` None (``pgprefetch ls``, which knows no split): a record in any range is kept, as a rerun
    split the same way keeps it.
    """
    header = json.loads(json.dumps(header, sort_keys=True))  # as a record holds it
    prefix = epoch_name(epoch)
    objects = {key.removeprefix(f"{prefix}/"): size for key, size in store.sizes(prefix).items()}
    names = sorted(k for k in objects if k.startswith(f"{FOLDER}/"))
    with ThreadPoolExecutor(READ_THREADS) as pool:  # an epoch of many parts: their records read side by side
        raws = list(pool.map(lambda name: store.read(f"{prefix}/{name}"), names))
    kept: list[PartRecord] = []
    dropped: list[str] = []
    reason: str | None = None
    for name, raw in zip(names, raws, strict=True):
        record = PartRecord.decode(raw) if raw is not None else None
        why = _mismatch(record, header, ranges, objects)
        if why is None and record is not None:  # (no reason: a record there)
            kept.append(record)
            continue
        dropped.append(f"{prefix}/{name}")
        reason = reason or why
    return kept, dropped, reason


def _mismatch(
    record: PartRecord | None, header: dict[str, Any], ranges: list[range] | None, objects: dict[str, int]
) -> str | None:
    """Why ``record`` cannot be kept, in the words of a restarted epoch; None when it can."""
    if record is None:
        return "a part's record is unreadable"
    if record.header != header:
        return difference(record.header, header)
    if ranges is not None and (record.index >= len(ranges) or ranges[record.index] != record.owned):
        return f"it was split into other parts ({len(ranges)} now)"
    if not np.array_equal(record.batches, np.arange(record.owned.start, record.owned.stop)):
        return "a part's record is incomplete"
    missing = [f for f, size in record.files.items() if objects.get(f) != size]
    if missing:
        return f"a part's file is missing from the store ({missing[0]})"
    return None


__all__ = ["FOLDER", "PartRecord", "judged", "put_record", "record_key", "usable"]
