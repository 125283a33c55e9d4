"""An epoch's arrays checked against its manifest before a byte of a batch is read (#36.11).

A reader sizes its buffers and views from each array's ``zarr.json`` and from the manifest's batch size.
Both are files in the store, and a store may be damaged, or written by someone else: a dtype changed from
``float32`` to ``float64`` would read silently wrong values, a huge shape or batch size would allocate
GiBs, an object dtype would not be numbers at all. So every array must say what the manifest says:
``(n_batches, batch_size, *field shape)`` and the field's dtype, a plain numeric dtype for the others.
An epoch's manifest also records the SHA-256 of each array's ``zarr.json`` (``metadata_sha256``, written
at publication): any change to an array's metadata (a codec, a fill value, a chunk grid, not only what
the manifest describes) is refused by name. Epochs of an older pgprefetch have no such record and are
checked as above only.
This is a consistency check, not a signature: someone who can rewrite the manifest too can still make
the two agree. What they cannot rewrite without rewriting the data is the chunks: an uncompressed chunk is
one batch of the shape, so a batch size changed consistently in the manifest, the metadata and its hashes
is caught where the chunks are read (the reader's mapping, ``verify``'s checksums, an object store's file
sizes) by :meth:`~pgprefetch.store.layout.ArrayLayout.wrong_size`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pgprefetch.errors import StoreError
from pgprefetch.store.base import STARTS_ARRAY
from pgprefetch.store.layout import ArrayLayout, metadata_sha256, plain_name

_NUMERIC = "biuf"  # bool, signed, unsigned, float: the kinds pgprefetch writes


def manifest_int(manifest: Mapping[str, Any], key: str, where: str, *, least: int = 0) -> int:
    """The manifest's integer ``key`` (``batch_size``, ``n_batches``, ``n_samples``), checked."""
    value = manifest.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise StoreError(f"{where}: the manifest's {key} is {value!r}, not an integer >= {least} (a damaged store)")
    return value


def manifest_fields(manifest: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The manifest's fields, checked: plain names, each entry a table with a table (or nothing) as ``null``.

    A reader takes array names and options from these entries before it opens an array; a damaged entry is
    a StoreError naming the epoch, never an AttributeError from deep inside the reader.
    """
    fields = manifest.get("fields")
    if not isinstance(fields, dict) or not fields:
        raise StoreError(f"{where}: the manifest lists no fields (a damaged store)")
    for name, entry in fields.items():
        plain_name(name, where)
        if not isinstance(entry, dict) or not isinstance(entry.get("null", {}), dict):
            raise StoreError(f"{where}: the manifest's entry of field {name} is not an object (a damaged store)")
    return fields


def manifest_sources(manifest: Mapping[str, Any], where: str) -> list[str]:
    """A mixed epoch's source names in code order (empty for one source), checked: the store may be anyone's."""
    names = manifest.get("sources")
    if names is None:
        return []
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise StoreError(f"{where}: the manifest's sources are not a list of source names (a damaged store)")
    if len(names) > 127 or len(set(names)) != len(names):
        raise StoreError(f"{where}: the manifest names {len(names)} sources, some twice or too many (a damaged store)")
    return list(names)


def windows_record(manifest: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The manifest's record of windows stored as starts (``[store] windows``), checked; None for batches.

    ``window``, ``rows`` (stored), ``rows_per_batch`` (a chunk's), ``starts`` (the array of each sample's first
    row) and ``arrays`` (those that hold rows, not samples).
    """
    record = manifest.get("windows")
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("layout") != "starts":
        raise StoreError(
            f"{where}: the manifest's windows record is {record!r:.80}, not a starts layout (a damaged store)"
        )
    window = manifest_int(record, "window", where, least=1)
    rows = manifest_int(record, "rows", where)
    if manifest.get("rows") != window or (rows and window > rows):
        raise StoreError(
            f"{where}: the manifest's windows of {window} rows do not fit its samples' {manifest.get('rows')!r} "
            f"rows or its {rows} stored rows (a damaged store)"
        )
    if record.get("starts") != STARTS_ARRAY:
        raise StoreError(f"{where}: the manifest's windows start in {record.get('starts')!r:.40}, not {STARTS_ARRAY}")
    arrays = record.get("arrays")
    rowwise = _rowwise_arrays(manifest, where)
    if not isinstance(arrays, list) or not arrays or not all(isinstance(a, str) and a in rowwise for a in arrays):
        raise StoreError(
            f"{where}: the manifest's windows record names arrays {arrays!r:.80}, not its fields' (a damaged store)"
        )
    per_batch = manifest_int(record, "rows_per_batch", where, least=1)
    return {"window": window, "rows": rows, "rows_per_batch": per_batch, "starts": STARTS_ARRAY, "arrays": arrays}


def _rowwise_arrays(manifest: Mapping[str, Any], where: str) -> set[str]:
    """The arrays a window's rows fill: the fields, their NULL masks and lengths (never keys or starts)."""
    out = set()
    for name, entry in manifest_fields(manifest, where).items():
        out.add(name)
        null = entry.get("null")
        out |= {n for n in (null.get("mask") if isinstance(null, dict) else None, entry.get("lengths")) if n}
    return {plain_name(n, where) for n in out}


def check_layouts(manifest: Mapping[str, Any], layouts: Mapping[str, ArrayLayout], where: str) -> None:
    """Raise StoreError naming the first array whose metadata disagrees with the manifest.

    Windows stored as starts: their arrays hold ``rows_per_batch`` rows a chunk, enough for every stored row,
    a row being a sample's shape less the window; ``_starts`` is one int64 a sample.
    """
    windows = windows_record(manifest, where)
    size = manifest_int(manifest, "batch_size", where, least=1)
    n_batches = manifest_int(manifest, "n_batches", where)
    n_samples = manifest_int(manifest, "n_samples", where)
    if n_samples > n_batches * size:
        raise StoreError(f"{where}: the manifest's n_samples {n_samples} exceeds its {n_batches} batches of {size}")
    fields = manifest.get("fields")
    if not isinstance(fields, dict):
        raise StoreError(f"{where}: the manifest lists no fields (a damaged store)")
    digests = metadata_digests(manifest, where)
    for name, layout in layouts.items():
        if digests is not None and digests.get(name) != layout.metadata_sha256:
            raise StoreError(
                f"{where}/{name}: the array's zarr.json is not the one the manifest records (its SHA-256 "
                "differs; a damaged or altered store)"
            )
        per, window = (
            (windows["rows_per_batch"], windows["window"]) if windows and name in windows["arrays"] else (size, 0)
        )
        if layout.dtype.kind not in _NUMERIC or layout.shape[:2] != (n_batches, per):
            raise StoreError(
                f"{where}/{name}: the array is {layout.dtype} {list(layout.shape)}; the manifest says "
                f"{n_batches} batches of {per} (a damaged store)"
            )
        if windows is not None:
            _check_windowed(name, layout, windows, (n_batches, size), where)
        entry = fields.get(name)
        if isinstance(entry, dict):
            want = (str(entry.get("dtype")), (n_batches, per, *_stored_shape(entry, name, window, where)))
            if (str(layout.dtype), layout.shape) != want:
                raise StoreError(
                    f"{where}/{name}: the array is {layout.dtype} {list(layout.shape)}; the manifest says "
                    f"{want[0]} {list(want[1])} (a damaged store)"
                )


def _check_windowed(
    name: str, layout: ArrayLayout, windows: dict[str, Any], batches: tuple[int, int], where: str
) -> None:
    """An array of windows stored as starts: the starts one int64 a sample, the rows enough for the record's."""
    if name == STARTS_ARRAY and (str(layout.dtype), layout.shape) != ("int64", batches):
        raise StoreError(f"{where}/{name}: the array is {layout.dtype} {list(layout.shape)}; each sample's start "
                         f"is one int64, {batches[0]} batches of {batches[1]} (a damaged store)")  # fmt: skip
    if name in windows["arrays"] and layout.shape[0] * layout.shape[1] < windows["rows"]:
        raise StoreError(f"{where}/{name}: {layout.shape[0]} chunks of {layout.shape[1]} rows hold fewer than the "
                         f"manifest's {windows['rows']} rows (a damaged store)")  # fmt: skip


def _stored_shape(entry: dict[str, Any], name: str, window: int, where: str) -> list[Any]:
    """A field's item shape as stored: its sample's, less the window for rows of windows stored as starts."""
    shape = entry.get("shape", [])
    if not isinstance(shape, list):
        raise StoreError(f"{where}: the manifest's shape of field {name} is {shape!r:.60}, not a list")
    if not window:
        return shape
    if shape[:1] != [window]:
        raise StoreError(f"{where}: field {name}'s shape {shape} is not of {window}-row windows (a damaged store)")
    return shape[1:]


def metadata_digests(manifest: Mapping[str, Any], where: str) -> dict[str, str] | None:
    """The manifest's SHA-256 of each array's ``zarr.json``; None for an epoch of an older pgprefetch."""
    digests = manifest.get("metadata_sha256")
    if digests is None:
        return None
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise StoreError(f"{where}: the manifest's metadata_sha256 is not a table of digests (a damaged store)")
    return digests


def check_metadata_files(manifest: Mapping[str, Any], read: Callable[[str], Any], where: str) -> None:
    """Raise StoreError naming the first array whose ``zarr.json`` is not the one the manifest records.

    For ``verify``: every recorded array, ``_checksums`` included, before zarr opens it (a reader checks
    the arrays it opens, in :func:`check_layouts`). ``read(name)``: the bytes of ``<name>/zarr.json`` in
    the epoch, or None. An epoch of an older pgprefetch records none: nothing to compare.
    """
    for name, digest in (metadata_digests(manifest, where) or {}).items():
        raw = read(plain_name(name, where))
        if raw is None:
            raise StoreError(f"{where}/{name}: the array is missing (the epoch is damaged)")
        if metadata_sha256(raw) != digest:
            raise StoreError(
                f"{where}/{name}: the array's zarr.json is not the one the manifest records (its SHA-256 "
                "differs; a damaged or altered store)"
            )
