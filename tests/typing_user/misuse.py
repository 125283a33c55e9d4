"""Mistakes a user makes with pgprefetch's API: mypy must reject each line marked ``# expect: <code>``.

tests/test_typing.py checks that every marked line, and only those, is an error with that code: the
annotations are checked, not merely present.
"""

from __future__ import annotations

from pathlib import Path

import pgprefetch
from pgprefetch import EpochArrays, EpochDataset, StoreError

store = Path("prefetch/demo.zarr")
EpochDataset(store, epoch="3")  # expect: arg-type
EpochArrays(store, 0, batch_size="64")  # expect: arg-type
EpochDataset(store, 0, shuffle=True)  # expect: call-arg
pgprefetch.dump("configs/demo.toml", epochs=0, dns="postgresql://localhost/train")  # expect: call-arg
pgprefetch.build_config("configs/demo.toml", connections="4")  # expect: arg-type
pgprefetch.prune(store, keep="1")  # expect: arg-type
EpochArrays(store, 0).read_batch(0)  # expect: attr-defined
count: int = pgprefetch.verify(store, 0)  # expect: assignment
n_samples: str = pgprefetch.dump("configs/demo.toml")[0].n_samples  # expect: assignment
StoreError(404)  # expect: arg-type
