"""What a trainer's attention needs from a batch of packed sequences, derived from ``segment_ids``, not stored.

A packed epoch (``[packing]``) stores per sequence its tokens, ``segment_ids`` (1, 2, ... per document piece,
0 on padding) and ``position_ids``. From them, for a batch of ``(batch, length)``:

- ``cu_seqlens`` (int32): the cumulative lengths of the batch's segments over its real tokens laid end to end
  (padding removed: ``indices`` says where each real token sits in the flattened batch), ``[0, ..., n_real]``,
  strictly increasing: every segment has a token, and padding is never a segment. That is the ``varlen``
  layout of flash-attention and Transformer Engine's THD; ``max_seqlen`` is its longest segment.
- ``labels`` (int64): the next token within the same segment, ``-100`` at a segment's last token and on
  padding, so no loss crosses from one document into the next.
- ``loss_mask`` (bool): where ``labels`` is a token; ``token_mask`` (bool): the real tokens (a router's or a
  normalisation's padding mask).

Everything is vectorised NumPy; :func:`pgprefetch.torch.attention_inputs` and
:func:`pgprefetch.jax.attention_inputs` hand the same over as tensors (JAX's with a fixed shape for ``jit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

IGNORE = -100  # the label of a position with no next token in its segment (PyTorch's cross-entropy default)


def attention_inputs(
    tokens: np.ndarray, segment_ids: np.ndarray, *, pad_to: int | None = None
) -> dict[str, np.ndarray | int]:
    """``cu_seqlens``, ``max_seqlen``, ``indices``, ``labels``, ``loss_mask`` and ``token_mask`` of a packed batch.

    ``tokens`` and ``segment_ids``: ``(batch, length)``, as a packed epoch's batch holds them. ``pad_to``: a
    fixed length for ``cu_seqlens`` (each place past the last repeats ``n_real``: empty segments that a
    kernel skips), for compilers that want static shapes; None: its own length.
    """
    segments = np.asarray(segment_ids)
    if segments.ndim != 2 or np.shape(tokens) != segments.shape:
        raise ValueError(f"expected tokens and segment_ids of one (batch, length) shape, got {np.shape(tokens)} "
                         f"and {segments.shape}")  # fmt: skip
    real = segments > 0
    flat = segments.reshape(-1)
    indices = np.flatnonzero(real.reshape(-1))
    # a segment begins where the id changes along the real tokens, or where a row begins
    rows = indices // segments.shape[1]
    ids = flat[indices]
    begins = np.flatnonzero(np.r_[True, (ids[1:] != ids[:-1]) | (rows[1:] != rows[:-1])]) if ids.size else indices
    lengths = np.diff(np.r_[begins, ids.size])
    cu = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    if pad_to is not None:
        if pad_to < cu.size:
            raise ValueError(f"pad_to={pad_to} is shorter than the batch's {cu.size} segment bounds")
        cu = np.concatenate([cu, np.full(pad_to - cu.size, cu[-1], dtype=np.int32)])
    same = (segments[:, 1:] == segments[:, :-1]) & real[:, :-1]
    labels = np.full(segments.shape, IGNORE, dtype=np.int64)
    labels[:, :-1] = np.where(same, np.asarray(tokens)[:, 1:].astype(np.int64), IGNORE)  # (uint16 holds no -100)
    return {
        "cu_seqlens": cu,
        "max_seqlen": int(lengths.max(initial=0)),
        "indices": indices.astype(np.int64),
        "labels": labels,
        "loss_mask": labels != IGNORE,
        "token_mask": real,
    }


def packed_batch(batch: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``batch`` with its :func:`attention_inputs`, for an epoch whose ``manifest`` records a packing."""
    packing = manifest.get("packing")
    if not isinstance(packing, Mapping):
        raise ValueError("this epoch is not packed: it has no [packing] record")
    tokens = batch[packing["field"]]
    return {**batch, **attention_inputs(np.asarray(tokens), np.asarray(batch[packing["segment_ids"]]))}


__all__ = ["IGNORE", "attention_inputs", "packed_batch"]
