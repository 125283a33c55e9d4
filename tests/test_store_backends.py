"""The store contract (tests/store_contract.py) run on each backend: a local folder, and S3 (moto on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness.s3 import S3
from .store_contract import StoreTests


class TestLocalStore(StoreTests):
    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        return str(tmp_path / "store.zarr")


class TestS3Store(StoreTests):
    @pytest.fixture
    def location(self, s3: S3) -> str:
        return f"s3://{s3.bucket()}/runs/a"
