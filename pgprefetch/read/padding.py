"""Padded fields: batches cut to their longest sample, and attention masks from lengths.

A field with ``max_length`` is stored padded, with each sample's real length in ``<field>_length``; with
``[samples] max_rows`` every sample is padded to ``max_rows`` rows, with its real count in ``n_rows``.
:func:`trim` needs only slicing and ``max()``, so the NumPy reader and the torch layer share it: one rule
for what a trimmed batch is, whatever array type it holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

import numpy as np


class Sliced(Protocol):
    """What a batch's arrays are to the readers: sliced like a NumPy array (a torch tensor is too)."""

    def __getitem__(self, index: Any, /) -> Any: ...


A = TypeVar("A", bound=Sliced)  # a NumPy array or a torch tensor: anything sliced like one, with max()


def lengths_to_mask(lengths: np.ndarray, max_len: int | None = None) -> np.ndarray:
    """``mask[..., j] = j < lengths[...]``: True over real values, False over padding (NumPy).

    ``max_len`` defaults to the longest length. ``pgprefetch.lengths_to_mask`` is the same for torch tensors.
    """
    if max_len is None:
        max_len = int(lengths.max()) if lengths.size else 0
    return np.arange(max_len) < np.asarray(lengths)[..., None]


def _longest(values: Any) -> int:
    return int(values.max()) if math.prod(values.shape) else 0


def trim(batch: Mapping[str, A], manifest: Mapping[str, Any]) -> dict[str, A]:
    """``batch`` with each padded field cut to its longest sample (and rows to the most rows): views.

    The lengths come with the batch, so nothing more is read; the cut is a slice, so nothing is copied.
    """
    out = dict(batch)
    fields = manifest["fields"]
    rows = None
    if manifest.get("n_rows") in batch and int(manifest.get("max_rows", 1)) > 1:
        rows = _longest(batch[manifest["n_rows"]])
    for name, field in fields.items():
        if name not in batch:
            continue
        mask = field.get("null", {}).get("mask")
        lengths = field.get("lengths")
        parts = [p for p in (name, mask) if p in batch]
        if lengths in batch:
            longest = _longest(batch[lengths])
            for part in parts:
                out[part] = out[part][..., :longest]
        if rows is not None:
            for part in (*parts, lengths):
                if part in batch:
                    out[part] = out[part][:, :rows]
    return out


VALID = "valid"  # the array pad_rows adds: True over a batch's real samples, False over its padded rows


def pad_rows(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``batch`` with every array zero-padded to ``rows`` samples, and ``batch["valid"]`` marking the real ones.

    For readers that need every batch the same shape (a JAX global array, one compiled step): an epoch
    dumped with ``drop_last = false`` ends in a short batch, which this pads as the store pads it on disk,
    with zeros after the real samples. ``valid`` is bool ``(rows,)``, True over real samples: multiply the
    per-sample loss by it. A full batch gets an all-True ``valid`` and no copy, so every batch has the same
    arrays. Only a short batch is copied (once an epoch).
    """
    if VALID in batch:
        raise ValueError(f"a batch with an array named {VALID!r} cannot be padded: pad_rows adds that mask")
    real = next(iter(batch.values())).shape[0] if batch else rows
    if real > rows:
        raise ValueError(f"a batch of {real} samples is longer than the {rows} it is padded to")
    valid = np.zeros(rows, dtype=bool)
    valid[:real] = True
    if real == rows:
        return {**batch, VALID: valid}
    out = {}
    for name, array in batch.items():
        padded = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
        padded[:real] = array
        out[name] = padded
    out[VALID] = valid
    return out
