"""A child of the frameworks bench: timed ``EpochDataset`` passes, from whichever pgprefetch is on sys.path.

Run as a script (not ``-m``) with ``PYTHONPATH`` naming a source tree, so the same pass can be timed on the
code of another commit in the same run (``bench.frameworks`` exports the tree before the NumPy core). Reads
one line per pass on stdin and prints the pass's seconds; torch on one thread, as the raw ``preadv`` it is
compared with. Imports nothing of ``bench``: the old tree need not have this file.

Usage: python bench/datasetpass.py STORE EPOCH
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from pgprefetch import EpochDataset


def main() -> None:
    store, epoch = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    ds = EpochDataset(store, epoch, consumer=None)
    shape = tuple(ds[0]["x"].shape)
    block = np.zeros(int(np.prod(shape)) * 4 + 4096, dtype=np.uint8)  # page-aligned, as the parent's buffers
    start = -block.ctypes.data % 4096
    out = torch.from_numpy(block[start : start + int(np.prod(shape)) * 4]).view(torch.float32).view(shape)
    del ds
    print("ready", flush=True)
    for _ in sys.stdin:
        began = time.perf_counter()
        ds = EpochDataset(store, epoch, consumer=None)
        for i in range(len(ds)):
            t = ds[i]["x"]
            out[: t.shape[0]].copy_(t)
        del ds, t
        print(f"{time.perf_counter() - began:.9f}", flush=True)


if __name__ == "__main__":
    main()
