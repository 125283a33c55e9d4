"""A short round of the soak (tests/soak): cron dumping ahead while two training ranks read, with faults.

``make soak`` runs this short round, then the soak at length (about 15 minutes, both stores). This round
strikes each fault of a local store once in half a minute, and the S3 store's own faults (throttled and
refused requests, a lease that expires, a dump killed) in about as long: a change to the loop is seen
working end to end in about a minute.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from .soak.run import run_soak

SEED = int(os.environ.get("PGPREFETCH_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))


@pytest.mark.soak
@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_short_soak_reads_every_epoch_once_byte_identical_through_faults_and_leaves_nothing(
    store: str, tmp_path: Path
) -> None:
    print(f"soak seed {SEED} (PGPREFETCH_SOAK_SEED={SEED} replays it)")
    report = run_soak(store, 30 if store == "local" else 45, tmp_path / store, SEED, min_epochs=2, short=True)
    print(report.summary())


pytestmark = pytest.mark.server  # starts servers of its own (tests/conftest.py, SERVER_FIXTURES)
