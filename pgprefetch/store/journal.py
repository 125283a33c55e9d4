"""The journal of a partial epoch: what it holds, and the checksums of every batch written so far.

A journal is a text file beside the partial folder: a JSON header (the epoch's identity: config and key
hashes, sizes, arrays), then a line per batch written (``batch crc32c...``, one checksum per array) and a
``#snapshot`` line per dump that wrote into it. An epoch spread over several processes
(:mod:`pgprefetch.write.ray`) has a journal per part beside it (:func:`part_journal`), each opening with the
same header; resuming reads them all (:func:`read_journal`).

It lives with the store, below the dump, because two sides read it: the dump that resumes a partial
epoch and ``pgprefetch ls``, which says how far one got. Both count the batches with :func:`kept`, so
``ls`` shows what a rerun keeps (less any batch whose bytes on disk no longer match their checksum, which
only the rerun reads them all to find out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pgprefetch.store.folders import Folder


def part_journal(journal: Path, part: int) -> Path:
    """The journal of one part of an epoch written by several processes, beside the epoch's own."""
    return journal.with_name(f"{journal.name}.part-{part:05d}")


def part_journals(journal: Path) -> list[Path]:
    """The part journals beside ``journal`` (none for a dump by one process)."""
    return sorted(journal.parent.glob(f"{journal.name}.part-*")) if journal.parent.is_dir() else []


def remove_journals(folder: Folder, journal: str) -> None:
    """Delete the journal ``journal`` in ``folder`` and its parts' journals (the epoch was published, or discarded).

    By the folder's descriptor (:mod:`pgprefetch.store.folders`): the partial epochs' folder is the store's.
    """
    folder.unlink(journal)
    for name in folder.names():
        if name.startswith(f"{journal}.part-"):
            folder.unlink(name)


def read_journal(journal: Path, n_arrays: int) -> tuple[dict[str, Any], dict[int, list[int]], list[str]] | None:
    """The header, each batch's journaled checksums and the snapshots read, from ``journal`` and its parts.

    None when there is no journal or its header is unreadable. A line cut short or garbled by a crash is
    skipped (that batch is fetched again); so are part journals with another header (another epoch's).
    """
    if not journal.exists():
        return None
    lines = journal.read_text(errors="replace").splitlines()
    try:
        header = json.loads(lines[0])
    except (IndexError, ValueError):
        return None
    for part in part_journals(journal):
        more = part.read_text(errors="replace").splitlines()
        if more and more[0] == lines[0]:  # a part rerun by Ray repeats the header: not a batch line
            lines += [line for line in more[1:] if not line.startswith("{")]
    done: dict[int, list[int]] = {}
    snapshots = []
    for line in lines[1:]:
        if line.startswith("#snapshot "):
            snapshots.append(line.split(" ", 1)[1])
            continue
        parts = line.split()
        try:
            if len(parts) == 1 + n_arrays:
                done[int(parts[0])] = [int(p) for p in parts[1:]]
        except ValueError:
            continue
    return header, done, snapshots


def kept(header: dict[str, Any], done: dict[int, list[int]]) -> dict[int, list[int]]:
    """The journaled batches a rerun under ``header`` checks and keeps: those inside the epoch."""
    n_batches = header.get("n_batches")
    if not isinstance(n_batches, int):
        return {}
    return {batch: crcs for batch, crcs in done.items() if 0 <= batch < n_batches}


def journaled(journal: Path) -> tuple[dict[str, Any], dict[int, list[int]]] | None:
    """The header of ``journal`` and the batches it and its parts' journals record that a rerun keeps.

    What ``ls`` reads of a partial epoch; None when there is no journal or no readable header.
    """
    arrays = _header_arrays(journal)
    found = read_journal(journal, arrays) if arrays is not None else None
    if found is None:
        return None
    header, done, _ = found
    return header, kept(header, done)


def _header_arrays(journal: Path) -> int | None:
    """How many arrays the journal's header names (each batch line holds a checksum per array)."""
    try:
        with journal.open(errors="replace") as f:
            arrays = json.loads(f.readline()).get("arrays")
    except (OSError, ValueError, AttributeError):
        return None
    return len(arrays) if isinstance(arrays, dict) else None


def samples(header: dict[str, Any], batches: Iterable[int]) -> int:
    """The samples ``batches`` of the epoch hold: ``batch_size`` each, less for a short last one.

    The header's ``n_keys`` is the epoch's samples (the keys used: full batches only under ``drop_last``).
    """
    size, total = header.get("batch_size"), header.get("n_keys")
    if not isinstance(size, int) or not isinstance(total, int):
        return 0
    return sum(max(0, min(total, (b + 1) * size) - b * size) for b in batches)


def difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Why a partial epoch cannot be resumed, in words."""
    if old.get("n_keys") != new.get("n_keys") or old.get("keys_sha256") != new.get("keys_sha256"):
        return f"the keys changed ({old.get('n_keys')} keys then, {new.get('n_keys')} now)"
    if old.get("config_sha256") != new.get("config_sha256"):
        return "the config changed"
    if old.get("categories") != new.get("categories"):
        return "the category lists changed (the store's vocabulary grew)"
    return "it was written with other settings"
