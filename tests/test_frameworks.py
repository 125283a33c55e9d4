"""The stream under the real frameworks: Lightning DDP, torchdata across processes, Accelerate.

Each runs as users run it, in processes of its own: the examples as scripts, DDP on two CPU processes with
the gloo backend. Every check compares the sample keys trained on with what the epochs hold.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgprefetch import EpochDataset

from .harness.epochs import sequences_store
from .harness.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parents[1]
SIZE = 32


@pytest.fixture(scope="module")
def store(demo_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epochs 0 and 1 of the demo sequences in batches of 32, 4 batches per shard file."""
    return sequences_store(demo_db, tmp_path_factory.mktemp("frameworks"), size=SIZE, shard_batches=4)


def rank_keys(store: Path, epochs: range, rank: int = 0, world: int = 1) -> list[list[int]]:
    """The sample keys of each of this rank's batches, epoch after epoch, as the store holds them."""
    out = []
    for epoch in epochs:
        ds = EpochDataset(store, epoch, rank=rank, world_size=world, consumer=None)
        out += [row for i in range(len(ds)) for row in ds.batch_keys(i).tolist()]
    return out


def run(*args: str | Path, timeout: float = 240) -> str:
    result = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_lightning_ddp_trains_on_every_batch_exactly_once_across_ranks(store: Path, tmp_path: Path) -> None:
    args = ("--store", store, "--epochs", 2, "--devices", 2, "--workers", 2, "--record", tmp_path)
    out = run("examples/lightning_train.py", *args)  # ranks from torch.distributed, in DataLoader workers too
    assert "on 2 ranks" in out
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in range(2):
        assert seen[rank] == rank_keys(store, range(2), rank, 2)  # this rank's share, in order
    assert len(seen[0]) == len(seen[1])  # no rank waits for another at the end
    for epoch in range(2):
        whole = rank_keys(store, range(epoch, epoch + 1))
        share = [k for r in range(2) for k in rank_keys(store, range(epoch, epoch + 1), r, 2)]
        assert len(share) == len({tuple(k) for k in share}) >= len(whole) - 2 * SIZE  # once; only a remainder left


def test_torchdata_example_resumes_in_a_fresh_process_with_as_many_workers_or_more(store: Path, tmp_path: Path) -> None:
    """One run stopped after 23 steps; its saved state resumed in a fresh process with 2 workers, and with 3."""
    state, record = tmp_path / "state.pt", tmp_path / "keys.jsonl"
    common = ("examples/torchdata_resume.py", "--store", store, "--epochs", 2)
    assert "stopped after 23 steps" in run(*common, "--state", state, "--record", record, "--workers", 2, "--steps", 23)
    for workers_after in (2, 3):  # each from the same saved state (the first run is shared)
        again, kept = tmp_path / f"state-{workers_after}.pt", tmp_path / f"keys-{workers_after}.jsonl"
        shutil.copy(state, again)
        shutil.copy(record, kept)
        assert "resumed and finished" in run(*common, "--state", again, "--record", kept, "--workers", workers_after)
        got = [row for line in kept.read_text().splitlines() for row in json.loads(line)]
        assert got == rank_keys(store, range(2)), f"resumed with {workers_after} workers"


def test_accelerate_without_prepare_splits_once_and_prepare_is_refused(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", 2)
    run(*launcher, SCRIPTS / "accelerate_ranks.py", store, out)
    result = json.loads(out.read_text())
    assert result["world"] == 2
    for rank, keys in enumerate(result["keys"]):
        assert keys == rank_keys(store, range(1), rank, 2)
    for wrapper in ("DataLoaderDispatcher", "IterableDatasetShard"):
        kind = "dispatch" if wrapper == "DataLoaderDispatcher" else "shard"
        assert f"Accelerate's {wrapper} would split it again across 2 processes" in result["errors"][kind]


def test_accelerate_prepare_on_one_process_yields_the_stream_as_it_is(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    run(SCRIPTS / "accelerate_ranks.py", store, out)
    result = json.loads(out.read_text())
    assert result["world"] == 1
    unprepared, prepared = result["keys"]
    assert unprepared == rank_keys(store, range(1))
    assert prepared == rank_keys(store, range(1, 2))
    assert result["errors"] == {"dispatch": "no error", "shard": "no error"}
