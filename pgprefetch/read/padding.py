"""Padded fields in torch: attention masks from lengths, and batches cut to their longest sample.

Part of the reader (the modules that import torch). A field with ``max_length`` is stored padded, with
each sample's real length in ``<field>_length``; with ``[samples] max_rows`` every sample is padded to
``max_rows`` rows, with its real count in ``n_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def lengths_to_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """``mask[..., j] = j < lengths[...]``: True over real values, False over padding.

    The attention-mask convention (Hugging Face's ``attention_mask``; pass ``~mask`` as a
    ``key_padding_mask`` to ``torch.nn.MultiheadAttention``). ``max_len`` defaults to the longest length.
    """
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    return torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)


def trim(batch: dict[str, torch.Tensor], manifest: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``batch`` with each padded field cut to its longest sample (and rows to the most rows): views.

    The lengths come with the batch, so nothing more is read; the cut is a slice, so nothing is copied.
    """
    out = dict(batch)
    fields = manifest["fields"]
    rows = None
    if manifest.get("n_rows") in batch and int(manifest.get("max_rows", 1)) > 1:
        n_rows = batch[manifest["n_rows"]]
        rows = int(n_rows.max()) if n_rows.numel() else 0
    for name, field in fields.items():
        if name not in batch:
            continue
        mask = field.get("null", {}).get("mask")
        lengths = field.get("lengths")
        parts = [p for p in (name, mask) if p in batch]
        if lengths in batch:
            longest = int(batch[lengths].max()) if batch[lengths].numel() else 0
            for part in parts:
                out[part] = out[part][..., :longest]
        if rows is not None:
            for part in (*parts, lengths):
                if part in batch:
                    out[part] = out[part][:, :rows]
    return out
