"""Windows stored as starts (``[store] windows = "starts"``): the rows once, each window its first row.

Every reader hands out the ``"batches"`` layout's bytes, from a scan epoch and its query-mode twin alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgprefetch import EpochArrays

from .harness.configs import scan_config
from .harness.dumps import dump
from .test_scan import twin_config


def windows(folder: Path, layout: str, **extra: object) -> Path:
    settings: dict[str, object] = {"table": "ticks", "key": ["series_id"], "order": "t", "window": 8, "stride": 1}
    settings.update(extra)
    if layout == "starts":
        settings["windows"] = "starts"
    return scan_config(folder, **settings)  # type: ignore[arg-type]


def batches_of(path: Path) -> list[dict[str, np.ndarray]]:
    reader = EpochArrays(path.parent, int(path.name.split("-")[1]), consumer=None)
    return [{k: np.array(v) for k, v in reader.batch(i, keys=True).items()} for i in range(len(reader))]


def same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert (x[k].dtype, x[k].shape) == (y[k].dtype, y[k].shape), k
            assert x[k].tobytes() == y[k].tobytes(), k


@pytest.mark.parametrize(("window", "stride", "fraction"), [(8, 1, 1.0), (16, 5, 0.6)])
def test_starts_hand_out_the_batches_bytes(
    ticks: str, tmp_path: Path, window: int, stride: int, fraction: float
) -> None:
    starts = dump(windows(tmp_path / "s", "starts", window=window, stride=stride, fraction=fraction), ticks)
    batches = dump(windows(tmp_path / "b", "batches", window=window, stride=stride, fraction=fraction), ticks)
    twin = dump(twin_config(tmp_path / "twin", window, stride, fraction), ticks)
    assert starts.n_samples == batches.n_samples == twin.n_samples > 0
    same(batches_of(Path(starts.path)), batches_of(Path(batches.path)))
    same(batches_of(Path(starts.path)), batches_of(Path(twin.path)))
    assert starts.bytes < batches.bytes
