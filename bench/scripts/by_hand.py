"""The numpy half of the scripts a user would write by hand: shuffle, gather each batch, ``tofile``.

Shared by ``adbc_script.py`` and ``connectorx_script.py`` (the same code after their reads). ``table`` is a
``pyarrow.Table``. Jobs:

- ``rows``: one sample per row: ``x`` = the 16 ``real`` columns as float32[16], ``y`` = the label (int64),
  ``keys`` = ``id``.
- ``windows``: the rows sorted by (series, t) with ``lexsort``, every window of ``WINDOW`` rows at stride 1
  in each series; ``x`` = (f0, f1) float32[64, 2], ``y`` = the labels int64[64], ``keys`` = (series, first t).

Each field goes to its own raw file in ``out``, batch after batch, in the order of
``np.random.default_rng(seed).permutation``. Nothing is checksummed, synced or published atomically.
"""

import numpy as np

WINDOW = 64


def cut_and_write(table, job: str, out, batch: int, seed: int) -> int:
    """Write every sample of ``table`` in a seeded random order; return the sample count."""
    col = {name: table.column(name).to_numpy() for name in table.column_names}
    if job == "rows":
        x = np.column_stack([col[f"r{i}"] for i in range(16)]).astype(np.float32, copy=False)
        y, keys = col["label"].astype(np.int64), col["id"].astype(np.int64)[:, None]
        starts, offsets = np.arange(len(y)), None
    else:
        order = np.lexsort((col["t"], col["series_id"]))
        s, t = col["series_id"][order].astype(np.int64), col["t"][order].astype(np.int64)
        x = np.column_stack([col["f0"][order], col["f1"][order]]).astype(np.float32, copy=False)
        y = col["label"][order].astype(np.int64)
        first = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        ends = np.append(first[1:], len(s))
        starts = np.concatenate(
            [np.arange(a, b - WINDOW + 1) for a, b in zip(first, ends, strict=True) if b - a >= WINDOW]
        )
        keys, offsets = np.column_stack([s[starts], t[starts]]), np.arange(WINDOW)
    perm = np.random.default_rng(seed).permutation(len(starts))
    with open(out / "x.bin", "wb") as fx, open(out / "y.bin", "wb") as fy, open(out / "keys.bin", "wb") as fk:
        for b in range(0, len(perm), batch):
            idx = perm[b : b + batch]
            rows = starts[idx] if offsets is None else starts[idx][:, None] + offsets
            x[rows].tofile(fx)
            y[rows].tofile(fy)
            keys[idx].tofile(fk)
    return len(perm)
