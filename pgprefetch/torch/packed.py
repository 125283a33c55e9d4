"""A packed batch's attention inputs as torch tensors (:mod:`pgprefetch.read.packed` derives them).

``cu_seqlens`` and ``max_seqlen`` are what ``flash_attn_varlen_func`` takes over the batch's real tokens
(``tokens.reshape(-1)[indices]``); ``labels`` feed ``cross_entropy`` as they are (-100 is its ignore index).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pgprefetch.read.packed import attention_inputs as _derived


def attention_inputs(tokens: torch.Tensor, segment_ids: torch.Tensor) -> dict[str, Any]:
    """``cu_seqlens`` (int32), ``max_seqlen``, ``indices``, ``labels``, ``loss_mask``, ``token_mask``: on its device."""
    device = tokens.device
    derived = _derived(tokens.detach().cpu().numpy(), segment_ids.detach().cpu().numpy())
    return {k: torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v for k, v in derived.items()}


__all__ = ["attention_inputs"]
