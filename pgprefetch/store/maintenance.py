"""Operating a store: which epochs to dump ahead, listing, verifying and pruning epochs.

Training runs record the epoch they open (:meth:`pgprefetch.store.Store.record_consumer`); cron runs
``pgprefetch dump --ahead K --keep N``, which dumps the next K epochs after the newest one a consumer
started and deletes complete epochs more than N behind. Nothing here talks to PostgreSQL.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch.config.model import SOURCE_ARRAY
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.store.base import KEYS_ARRAY, Store, epoch_name
from pgprefetch.store.checks import check_layouts, check_metadata_files, manifest_int, windows_record
from pgprefetch.store.consumers import ConsumerInfo, check_name, damaged, infos, positions, run_of
from pgprefetch.store.journal import journaled, part_journals, samples
from pgprefetch.store.layout import ArrayLayout, checksum, plain_name


@dataclass(frozen=True)
class EpochInfo:
    """One line of ``pgprefetch ls``."""

    epoch: int
    state: str  # complete | partial
    n_batches: int | None
    n_samples: int | None
    bytes: int
    created: str | None
    seconds: float | None
    # Partial epochs: how far the dump got, as a rerun resumes it (the batches its journals record, which
    # a rerun keeps once their bytes check out; ``n_samples`` is then the samples of those batches), and
    # the samples the whole epoch will hold.
    batches_written: int | None = None
    n_samples_total: int | None = None
    sources: dict[str, int] | None = None  # a mixed epoch: each source's samples in it
    left_out: int | None = None  # samples its transforms failed on, left out (on_error = "skip")

    def to_json(self) -> dict[str, object]:
        """The entry ``ls --json`` prints."""
        out = asdict(self)
        if self.state == "complete":
            del out["batches_written"], out["n_samples_total"]
        for optional in ("sources", "left_out"):
            if out[optional] is None:
                del out[optional]
        return out


def source_counts(manifest: dict[str, Any]) -> dict[str, int] | None:
    """A mixed epoch's samples per source, from its manifest's mix record (None: not mixed, or unreadable)."""
    record = manifest.get("mix")
    entries = record.get("sources") if isinstance(record, dict) else None
    if not isinstance(entries, list):
        return None
    counts = {}
    for e in entries:
        if not (isinstance(e, dict) and isinstance(e.get("name"), str) and type(e.get("samples")) is int):
            return None
        counts[e["name"]] = e["samples"]
    return counts


def left_out_count(manifest: dict[str, Any]) -> int | None:
    """The samples an epoch's skipping transforms left out (None: none of its transforms skips, or unreadable)."""
    record = manifest.get("transforms")
    if not isinstance(record, dict):
        return None
    counts = [t.get("left_out") for t in record.values() if isinstance(t, dict) and "left_out" in t]
    whole = [c for c in counts if type(c) is int]
    return max(whole) if whole and len(whole) == len(counts) else None


def list_epochs(store: Store) -> list[EpochInfo]:
    """Every epoch in the store, complete or partial, in epoch order (bytes as allocated on disk)."""
    infos = []
    for epoch in store.epochs():
        m = store.manifest(epoch)
        infos.append(
            EpochInfo(
                epoch,
                "complete",
                m["n_batches"],
                m["n_samples"],
                store.epoch_bytes(epoch),
                m.get("created"),
                m.get("seconds"),
                sources=source_counts(m),
                left_out=left_out_count(m),
            )
        )
    for epoch in store.partial_epochs():
        if store.is_complete(epoch):
            continue  # a --force rewrite in progress: the complete epoch is what readers get
        header, journal = journaled(store.journal_path(epoch)) or ({}, {})
        recorded = _recorded(store, epoch, header)
        written = set(journal) if recorded is None else recorded
        nbytes, mtime = store.partial_info(epoch)
        infos.append(
            EpochInfo(
                epoch,
                "partial",
                header.get("n_batches"),
                samples(header, written),
                nbytes,
                datetime.fromtimestamp(mtime, UTC).isoformat(timespec="seconds"),
                None,
                len(written),
                header.get("n_keys"),
            )
        )
    return sorted(infos, key=lambda i: i.epoch)


def _recorded(store: Store, epoch: int, header: dict[str, Any]) -> set[int] | None:
    """The batches a rerun keeps of an epoch a ``--executor ray`` dump left in an object store; None: not one.

    Those parts stage on their own nodes and leave a record in the bucket (:mod:`pgprefetch.store.records`);
    a rerun keeps only what the records hold (it starts the staged partial epoch over, journals included),
    judged as the rerun judges them (this epoch's header, every file there with its size), less the split
    into parts, which only the rerun knows. Part journals on this machine or records in the bucket say a
    Ray dump wrote it. Nothing is deleted.
    """
    if store.local_root is not None or not header:
        return None
    from pgprefetch.store.records import judged  # here: a local store's ls never loads the S3 client

    if store.object_store is None:
        return None
    kept, dropped, _ = judged(store.object_store, epoch, header, None)
    if not (kept or dropped or part_journals(store.journal_path(epoch))):
        return None  # a single-process dump's partial epoch: its journal is what a rerun resumes
    return {b for record in kept for b in record.owned}


def verify_epoch(store: Store, epoch: int) -> list[str]:
    """Recompute every chunk's CRC32C; return one line per corrupt or missing chunk (empty: all good)."""
    manifest = store.manifest(epoch)
    where = f"{store.location}/{epoch_name(epoch)}"
    check_metadata_files(manifest, lambda name: store.read(f"{epoch_name(epoch)}/{name}/zarr.json"), where)
    recorded = _recorded_checksums(store, epoch, manifest)
    for name in recorded:
        plain_name(name, where)
    check_layouts(manifest, {name: store.array_layout(epoch, name) for name in recorded}, where)
    windows = windows_record(manifest, where)
    # What a reader opens must be what the checksums cover: a manifest edited to name another array
    # (or a file outside the store) would otherwise pass as clean.
    problems = [f"{name}: the manifest names it but no checksum covers it" for name in _read_arrays(manifest, where)
                if name not in recorded]  # fmt: skip
    for name, crcs in recorded.items():
        layout = store.array_layout(epoch, name)
        for batch, expected in enumerate(crcs):
            data = store.batch_bytes(layout, batch)
            if data is None:
                path, _ = layout.file(batch)
                problems.append(
                    f"{name} batch {batch}: missing ({epoch_name(epoch)}/{path.relative_to(layout.path.parent)})"
                )
            elif (wrong := layout.wrong_size(len(data))) is not None:  # a batch size rewritten in the metadata
                problems.append(f"{name} batch {batch}: {wrong}")
            elif checksum(data) != expected:
                problems.append(f"{name} batch {batch}: checksum mismatch")
            elif windows is not None and name == windows["starts"]:
                problems += _starts_outside(layout, batch, data, manifest, windows)
    return problems


def _starts_outside(
    layout: ArrayLayout, batch: int, data: bytes, manifest: dict[str, Any], windows: dict[str, Any]
) -> list[str]:
    """Windows stored as starts: batch ``batch``'s starts (its real samples') must begin windows inside the rows.

    Checksums say the bytes are the dump's; this says the dump's bytes can be gathered (a store written by
    someone else carries checksums of its own making).
    """
    if not layout.raw:
        return []  # (compressed: the readers check each start as they gather)
    size = layout.batch_shape[0]
    real = max(0, min(size, int(manifest["n_samples"]) - batch * size))
    starts = np.frombuffer(data, dtype="<i8")[:real]
    bad = (starts < 0) | (starts > windows["rows"] - windows["window"])
    if not bad.any():
        return []
    outside = f"{int(bad.sum())} window(s) start outside the epoch's {windows['rows']} rows"
    return [f"{windows['starts']} batch {batch}: {outside}"]


def _read_arrays(manifest: dict[str, Any], where: str) -> list[str]:
    """The arrays a reader of the epoch opens (fields, NULL masks, lengths, ``n_rows``, keys), checked plain."""
    fields = manifest.get("fields")
    if not isinstance(fields, dict):
        raise StoreError(f"{where}: the manifest lists no fields (a damaged store)")
    names = [*fields, KEYS_ARRAY]
    for entry in fields.values():
        if not isinstance(entry, dict):
            raise StoreError(f"{where}: a field's manifest entry is not an object (a damaged store)")
        null = entry.get("null")
        names += [n for n in (null.get("mask") if isinstance(null, dict) else None, entry.get("lengths")) if n]
    if manifest.get("n_rows"):
        names.append(manifest["n_rows"])
    if manifest.get("sources") is not None:
        names.append(SOURCE_ARRAY)
    if (windows := windows_record(manifest, where)) is not None:
        names.append(windows["starts"])
    return [plain_name(name, where) for name in names]


def _recorded_checksums(store: Store, epoch: int, manifest: dict[str, Any]) -> dict[str, list[int]]:
    """Each array's per-batch CRC32C: from the epoch's ``_checksums`` array, or an older epoch's manifest."""
    entry = manifest.get("checksums", {})
    if "array" not in entry:
        if not entry.get("arrays"):
            raise StoreError(f"epoch {epoch} has no checksums in its manifest (written by an older pgprefetch)")
        recorded: dict[str, list[int]] = entry["arrays"]  # an older epoch's manifest kept them itself
        return recorded
    path = f"{epoch_name(epoch)}/{entry['array']}"
    import numpy as np  # here, not at the top: ls, prune and the dump's --keep never read an array
    import zarr

    try:
        array = zarr.open_array(store.zarr_store(), path=path, mode="r")
        n_batches = manifest_int(manifest, "n_batches", f"{store.location}/{epoch_name(epoch)}")
        if array.shape != (len(entry["arrays"]), n_batches):  # read whole below: its size must be what it says
            raise StoreError(
                f"{store.location}/{path}: the checksums are {list(array.shape)}; the manifest says "
                f"{len(entry['arrays'])} arrays of {n_batches} batches (a damaged store)"
            )
        table = np.asarray(array[:])
    except (OSError, ValueError, KeyError) as e:
        raise StoreError(f"cannot read the checksums of epoch {epoch} ({store.location}/{path}): {e}") from None
    return {name: table[i].tolist() for i, name in enumerate(entry["arrays"])}


def ahead_window(store: Store, ahead: int, consumer: str | None = None) -> range:
    """The ``ahead`` epochs after the newest one started, complete or not (what "nothing to do" names).

    "Started" means opened by a consumer (all consumers, or just ``consumer``); with none at all, epoch 0
    on: cron is set up before the training job's first run, and each side must be able to begin without
    the other. A name no consumer has, while others exist, is refused as a typo (:func:`check_consumer`);
    a new run registered by :func:`register_consumer` starts at epoch 0.
    """
    started = _started(store, consumer)
    first = max(started.values()) + 1 if started else 0
    return range(first, first + ahead)


@dataclass(frozen=True)
class PruneResult:
    """What ``prune`` removed, and the partial epochs it kept."""

    epochs: list[int]
    partials: list[int]  # partial epochs of dead dumps, removed
    kept_partials: list[int] = field(default_factory=list)  # resumable partial epochs left for the next dump
    dry_run: bool = False
    unread: list[int] = field(default_factory=list)  # complete epochs kept because no consumer has opened one
    slowest: tuple[str, int] | None = None  # the record every deletion went by, and its epoch
    damaged: list[str] = field(default_factory=list)  # unreadable consumer records: no complete epoch deleted

    def lines(self, keep: int) -> list[str]:
        """What happened, in words: one line per kind of action (nothing when nothing was to do)."""
        verb = "would delete" if self.dry_run else "deleted"
        out = []
        if self.epochs and self.slowest is not None:
            name, epoch = self.slowest
            out.append(
                f"{verb} {_listed(self.epochs)} (complete, more than {keep} behind the slowest consumer, "
                f"{name} at epoch {epoch})"
            )
        if self.partials:
            out.append(f"{verb} partial {_listed(self.partials)} (no dump is writing them)")
        if self.kept_partials:
            out.append(
                f"kept partial {_listed(self.kept_partials)}: the next dump of each resumes it "
                "(delete them with --partials)"
            )
        if self.damaged:
            out.append(
                f"kept every complete epoch: consumer record {', '.join(self.damaged)} is damaged, so where its run "
                "is reading is unknown (its next open rewrites it; `pgprefetch forget` removes a run gone for good)"
            )
        if self.unread:
            out.append(
                f"kept {_listed(self.unread)}: no consumer has opened an epoch yet, and prune deletes only "
                "epochs behind what the training runs opened (EpochDataset and EpochStream record it)"
            )
        return out

    def to_json(self) -> dict[str, object]:
        """The object ``prune --json`` prints."""
        return {"deleted_epochs": self.epochs, "deleted_partials": self.partials, "kept_partials": self.kept_partials,
                "dry_run": self.dry_run}  # fmt: skip


def prune(
    store: Store,
    keep: int,
    consumer: str | None = None,
    *,
    partials: bool = False,
    partials_older_than: float | None = None,
    dry_run: bool = False,
) -> PruneResult:
    """Delete complete epochs older than (slowest consumer's epoch - ``keep``), and, if asked, dead partial epochs.

    Every recorded consumer counts, whatever ``consumer`` says: several training runs share a store, each with
    its own cron line (``dump --ahead --keep --consumer RUN``), and one run's cron must never delete an epoch
    another run has yet to read. ``consumer`` is only checked as a name a run has (a typo is refused); it
    steers ``--ahead``, never what is deleted. A run gone for good holds its epochs until a person removes its
    records (:func:`forget_consumer`). With no consumer recorded, no complete epoch is deleted.

    A partial epoch is work a rerun of its dump resumes, so it is kept unless ``partials`` is set or it
    was last written more than ``partials_older_than`` seconds ago; even then it is removed only when
    no dump holds its lock (a live dump's partial epoch is never touched). Two kinds no dump will ever
    resume are removed anyway: the partial epoch of an epoch that is complete (what a dump killed while
    publishing leaves, or one that lost its lease to another dump), and one older than the oldest epoch
    kept (``dump --ahead`` only dumps the epochs after the newest one opened). So is the spill folder a dump
    killed before its first batch left (:meth:`~pgprefetch.store.base.Store.orphaned_spills`).
    """
    if consumer is not None:
        check_consumer(store, consumer)
    records = store.consumer_records()
    started, unknown = positions(records), damaged(records)
    unread = [] if started or unknown else store.epochs()
    slowest = min(started.items(), key=lambda item: (item[1], item[0])) if started and not unknown else None
    oldest_kept = slowest[1] - keep if slowest else None
    removed = [] if oldest_kept is None else [e for e in store.epochs() if e < oldest_kept]
    if not dry_run:
        for epoch in removed:
            store.remove_epoch(epoch)
    now = time.time()

    def asked(written: float) -> bool:  # partial work the caller asked to remove: all, or the old
        return partials or (partials_older_than is not None and now - written > partials_older_than)

    dead, kept = _dead_partials(store, oldest_kept, asked, dry_run)
    for epoch in store.orphaned_spills():  # nothing to resume there: removed as a dead partial epoch would be
        written = _mtime(store.spill_path(epoch))
        if epoch not in dead and written is not None and asked(written) and _remove_partial(store, epoch, dry_run):
            dead.append(epoch)
    return PruneResult(removed, sorted(dead), kept, dry_run, unread, slowest, unknown)


def _dead_partials(
    store: Store, oldest_kept: int | None, asked: Callable[[float], bool], dry_run: bool
) -> tuple[list[int], list[int]]:
    """The partial epochs removed (no dump holds them) and those kept for the next dump to resume.

    Removed whatever was asked: the partial epoch of a complete epoch, or of one older than the oldest kept.
    """
    dead, kept = [], []
    for epoch in store.partial_epochs():
        abandoned = store.is_complete(epoch) or (oldest_kept is not None and epoch < oldest_kept)
        if not (abandoned or asked(store.partial_info(epoch)[1])):
            kept.append(epoch)
        elif _remove_partial(store, epoch, dry_run):
            dead.append(epoch)
    return dead, kept


def _remove_partial(store: Store, epoch: int, dry_run: bool) -> bool:
    """Remove epoch ``epoch``'s partial work if no dump holds its lock; whether it was (or would be)."""
    with store.writer_lock(epoch) as held:
        if held and not dry_run:
            store.remove_partial(epoch)
        return held


def _mtime(path: Path) -> float | None:
    """When ``path`` was last written (None: it is gone)."""
    try:
        return float(path.stat().st_mtime)
    except OSError:
        return None


def _listed(epochs: list[int]) -> str:
    """``epoch 4`` or ``epochs 4, 5``."""
    return ("epoch " if len(epochs) == 1 else "epochs ") + ", ".join(map(str, epochs))


def check_consumer(store: Store, consumer: str) -> None:
    """Refuse (ConfigError, exit 2) a consumer name no training run has, where others exist: a typo.

    ``dump --ahead --keep`` calls it before any work, so that a mistyped name neither dumps epochs from
    0 for a run that does not exist nor fails only after them. With no consumer recorded at all nothing
    can be a typo (cron set up before training's first run): that passes.
    """
    _started(store, consumer)


def register_consumer(store: Store, consumer: str) -> bool:
    """Record ``consumer`` as a run that has opened nothing yet (``dump --consumer NAME --new``); True if new.

    Its record says epoch -1: ``--ahead`` by it dumps from epoch 0, and ``--keep`` (its own or all
    consumers') deletes nothing it may read, until its first open replaces the record with a real one.
    A name already recorded is left as it is; so is a store that does not exist yet (the dump creates it,
    and with no consumer recorded nothing is taken for a typo).
    """
    if not store.exists() or any(run_of(name) == consumer for name in store.consumers()):
        return False
    store.record_consumer(consumer, NOT_STARTED)
    return True


NOT_STARTED = -1  # a registered consumer's epoch before its first open: epoch 0 is the next one


def forget_consumer(store: Store, consumer: str) -> list[str]:
    """Remove every record of training run ``consumer`` (all its ranks); the records removed, by name.

    The only way a run stops holding epochs: ``--keep`` and ``prune`` keep whatever any recorded run may
    still read, so a run gone for good is forgotten on purpose, by a person, never by another run's cron.
    A name with no record is refused as a typo would be (naming the closest run), so that a mistyped
    ``forget`` cannot pass silently while the real record keeps holding the store.
    """
    check_name(consumer, "forget")
    records = sorted(name for name in store.consumer_records() if run_of(name) == consumer)
    if not records:
        _started(store, consumer)  # the typo's message, naming the runs there are
        raise ConfigError(f"no consumer {consumer!r} has a record in {store.location}")
    for name in records:
        store.remove_consumer_record(name)
    return records


def consumer_infos(store: Store) -> list[ConsumerInfo]:
    """Every consumer record of ``store`` as ``ls`` shows it (stale ones marked by :class:`ConsumerInfo`)."""
    return infos(store.consumer_records())


def _started(store: Store, consumer: str | None) -> dict[str, int]:
    """The epoch each consumer's rank (or just ``consumer``'s ranks) opened last, by record.

    ``--ahead`` goes by the furthest of them, ``--keep`` by the slowest (:mod:`pgprefetch.store.consumers`).
    A name no consumer has is an error when others exist (a typo would otherwise prune by nobody and dump
    from epoch 0): exit 2, naming the closest recorded name. With no consumer at all it has started nothing.
    """
    every = store.consumer_records()
    records = positions(every)
    if consumer is not None:
        check_name(consumer)
        mine = {name: epoch for name, epoch in records.items() if run_of(name) == consumer}
        if not every:
            return {}
        if not any(run_of(name) == consumer for name in every):
            runs = sorted({run_of(name) for name in every})
            close = difflib.get_close_matches(consumer, runs, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"no consumer {consumer!r} has opened an epoch of {store.location}: {hint}(consumers: "
                f"{', '.join(runs)}); a new training run that has not read yet: register it with "
                f"`dump --consumer {consumer} --new`"
            )
        records = mine
    return records
