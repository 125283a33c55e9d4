"""A packed batch's attention inputs as JAX arrays, of shapes fixed by the epoch (:mod:`pgprefetch.read.packed`).

``jit`` compiles a step once per input shape, so ``cu_seqlens`` is padded to ``batch * max_segments + 1``
(the epoch's most pieces a sequence, from its manifest's ``packing``), each place past the last repeating
the real tokens' count: empty segments a varlen kernel skips. ``indices`` has as many entries as the batch has
real tokens, which changes from batch to batch, so it is not handed over: JAX models mask by ``segment_ids``
and ``token_mask`` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from pgprefetch.read.packed import attention_inputs as _derived


def attention_inputs(tokens: Any, segment_ids: Any, max_segments: int) -> dict[str, Any]:
    """``cu_seqlens`` (fixed length), ``labels``, ``loss_mask`` and ``token_mask`` as JAX arrays.

    ``max_segments``: the epoch's ``manifest["packing"]["max_segments"]``.
    """
    segments = np.asarray(segment_ids)
    derived = _derived(np.asarray(tokens), segments, pad_to=segments.shape[0] * max_segments + 1)
    kept = ("cu_seqlens", "labels", "loss_mask", "token_mask")
    return {k: jnp.asarray(derived[k]) for k in kept}


def packed_inputs(batch: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`attention_inputs` of a batch of the epoch whose ``manifest`` records its packing."""
    packing = manifest["packing"]
    return attention_inputs(batch[packing["field"]], batch[packing["segment_ids"]], int(packing["max_segments"]))


__all__ = ["attention_inputs", "packed_inputs"]
