"""The reading core: published epochs memory-mapped and handed out as NumPy arrays, with no framework.

``epoch`` is :class:`EpochArrays` (one epoch), ``stream`` is :class:`ArrayStream` (consecutive epochs);
what they share with the framework layers above (``pgprefetch.torch``, ``pgprefetch.jax``,
``pgprefetch.grain``) is here once: ``view`` (one epoch for one rank: ranks, batch size, resume state,
metadata), ``sequence`` (consecutive epochs: order, waiting, state), ``ranges`` (sample ranges of mapped
files, local or S3), ``mapping`` (private mappings, and how another process names one), ``padding``
(trimming padded fields). Imports ``store`` and ``config``; never the dump, the PostgreSQL side, the
decoder, torch, JAX or Grain.
"""

from pgprefetch.read.epoch import EpochArrays
from pgprefetch.read.padding import lengths_to_mask
from pgprefetch.read.stream import ArrayStream

__all__ = ["ArrayStream", "EpochArrays", "lengths_to_mask"]
