"""The statistics' fast path (every value real) gives the per-column figures bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from pgprefetch.write.files.stats import _per_batch, _per_batch_columns


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((7, 1024, 1, 17, 1), np.float32),  # rows: 16 reals and a label, one column each
        ((5, 256, 64, 2, 1), np.float32),  # windows of 64 rows, two columns interleaved
        ((5, 256, 64, 1, 1), np.int64),
        ((3, 100, 1, 3, 16), np.float64),  # array columns
        ((4, 7, 3, 4, 5), np.int32),
    ],
)
def test_whole_batch_statistics_equal_the_per_column_figures_bit_for_bit(shape: tuple[int, ...], dtype: type) -> None:
    values = (np.random.default_rng(3).standard_normal(shape) * 1000).astype(dtype)
    if values.dtype.kind == "f":
        values[1, 2, 0, 1 % shape[3], 0] = np.inf  # an infinity makes that batch's mean and M2 NaN, in both
    reference = np.stack([_per_batch(values[:, :, :, j, :], None) for j in range(shape[3])], axis=1)
    fast = _per_batch_columns(np.moveaxis(values, 3, 1))
    assert np.array_equal(fast, reference, equal_nan=True)
