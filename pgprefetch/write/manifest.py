"""The manifest of an epoch: the ``pgprefetch`` attribute of its group, written last, at publication.

Everything a reader, an auditor or a resumed dump needs to know about an epoch without reading its
chunks: the format version, what was dumped (seed, sizes, fields with their dtypes, shapes, NULL masks and
categories, key columns and the key list's sha256), from where (mode, snapshot, server version, rows read)
and how (seconds, bytes). The per-chunk checksums are added by the writer, beside it.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from pgprefetch._version import __version__
from pgprefetch.config.model import N_ROWS, Config, VocabularyFrom
from pgprefetch.store.base import FORMAT_VERSION
from pgprefetch.write.batches import BatchSource


def field_entries(source: BatchSource) -> dict[str, dict[str, Any]]:
    """Each field as the manifest describes it (and ``pgprefetch check`` reports it): dtype, shape, policies."""
    plan, layout = source.plan, source.layout
    fields: dict[str, Any] = {}
    for f in layout.fields:
        entry: dict[str, Any] = {
            "dtype": f.dtype.name,
            "shape": list(f.sample_shape),
            "columns": [c.name for c in f.columns],
        }
        if f.config.transform is not None:
            entry["transform"] = f.config.transform
        if f.config.null_mask:
            entry["null"] = {"policy": f.config.null, "mask": f.config.null_mask}
        if f.name in plan.categories:
            entry["categories"] = plan.categories[f.name]
        if isinstance(f.config.categories, VocabularyFrom):  # where the codes came from
            entry["categories_from"] = str(f.config.categories.store)
        if f.config.max_length is not None:
            entry["max_length"] = f.config.max_length
            entry["lengths"] = f.config.length_array
            entry["truncate"] = f.config.truncate
        if f.config.max_length is not None or layout.variable_rows:
            entry["pad"] = f.config.pad
        fields[f.name] = entry
    return fields


def _samples(cfg: Config) -> dict[str, Any]:
    """The ``[samples]`` settings: the one source's, or a mixed config's, by source."""
    if cfg.mix is None:
        return dataclasses.asdict(cfg.samples)
    return {s.name: dataclasses.asdict(s.samples) for s in cfg.mix.sources}


def epoch_manifest(cfg: Config, source: BatchSource, total: int, elapsed: float) -> dict[str, Any]:
    """The epoch's manifest: everything a reader, an auditor or a resumed dump needs to know."""
    plan, layout = source.plan, source.layout
    fields = field_entries(source)
    return {
        "format_version": FORMAT_VERSION,
        "pgprefetch_version": __version__,
        "epoch": plan.epoch,
        "seed": cfg.batches.seed,
        "batch_size": cfg.batches.size,
        "n_batches": plan.n_batches,
        "n_samples": plan.used,
        "drop_last": cfg.batches.drop_last,
        "n_keys": plan.n_keys,
        "duplicates_dropped": plan.duplicates_dropped,
        "fraction": cfg.samples.fraction if cfg.mix is None else 1.0,
        "rows": cfg.samples.rows if cfg.mix is None else layout.rows,
        **(
            {"max_rows": layout.rows, "n_rows": N_ROWS, "truncate_rows": layout.row_truncate}
            if layout.variable_rows
            else {}
        ),
        "fields": fields,
        **layout.keys.manifest(),  # key_columns, and key_types: "uuid" takes two slots of the keys array
        "keys_sha256": plan.keys_sha256,
        "compression": cfg.store.compression,
        "config_sha256": cfg.sha256(),
        "config_content": cfg.content(),  # what the hash covers (no DSN, no path): a refusal names what changed
        "config": _samples(cfg),
        "mode": cfg.mode if cfg.mix is None else "mix",
        "snapshot": source.snapshot,
        "server_version": source.server_version,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(elapsed, 3),
        "bytes": total,
        **({"rows_read": source.rows_read} if source.rows_read is not None else {}),
        **(source.records or {}),
        **({"split": {"name": cfg.split, **cfg.splits.content()}} if cfg.splits is not None else {}),
        "complete": True,
    }
