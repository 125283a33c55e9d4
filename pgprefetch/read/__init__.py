"""The reader: published epochs memory-mapped and handed to training (torch is imported only here).

``dataset`` is :class:`EpochDataset` (one epoch), ``stream`` is :class:`EpochStream` (consecutive epochs,
waiting, exact resume), ``arrays`` reads sample ranges of a local or remote epoch, ``workers`` shares
mapped batches with DataLoader workers, ``padding`` trims and masks padded fields, ``transfer`` overlaps
copies to the GPU. Imports ``store`` and ``config``; never the dump or the PostgreSQL side.
"""

from pgprefetch.read.dataset import EpochDataset
from pgprefetch.read.padding import lengths_to_mask
from pgprefetch.read.stream import EpochStream

__all__ = ["EpochDataset", "EpochStream", "lengths_to_mask"]
