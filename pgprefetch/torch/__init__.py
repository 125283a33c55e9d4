"""The torch layer: published epochs as torch tensors, over the NumPy reading core (``pgprefetch.read``).

``dataset`` is :class:`EpochDataset` (one epoch), ``stream`` is :class:`EpochStream` (consecutive epochs,
DataLoader workers, torchdata's loader state), ``tensors`` turns the core's mapped sample ranges into
tensors without copying, ``workers`` hands mapped batches from DataLoader workers by reference,
``transfer`` overlaps copies to the GPU, ``padding`` makes attention masks. The only package that imports
torch; it imports the reading core, ``store`` and ``config``, never the dump, JAX or Grain.
"""

from pgprefetch.torch.dataset import EpochDataset
from pgprefetch.torch.packed import attention_inputs
from pgprefetch.torch.padding import lengths_to_mask
from pgprefetch.torch.stream import EpochStream

__all__ = ["EpochDataset", "EpochStream", "attention_inputs", "lengths_to_mask"]
