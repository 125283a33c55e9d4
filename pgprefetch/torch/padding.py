"""Attention masks from the lengths of padded fields, as torch tensors.

Part of the torch layer. Cutting a batch to its longest sample is the reading core's
(:func:`pgprefetch.read.padding.trim`, which works on tensors too).
"""

from __future__ import annotations

import torch


def lengths_to_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """``mask[..., j] = j < lengths[...]``: True over real values, False over padding.

    The attention-mask convention (Hugging Face's ``attention_mask``; pass ``~mask`` as a
    ``key_padding_mask`` to ``torch.nn.MultiheadAttention``). ``max_len`` defaults to the longest length.
    """
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    return torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)
