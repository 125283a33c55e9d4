"""`pgprefetch.jax.device_batches` on the CPU with two devices, and across two processes.

JAX reads ``XLA_FLAGS`` once, when it is imported, so each check runs in a process of its own
(``tests/harness/scripts/jax_checks.py``) with two host devices forced; two processes meet through ``jax.distributed``
on 127.0.0.1. The store holds ``s(id, v = id)``: a sample's value is its key, so a batch names its samples.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pgprefetch import EpochArrays

from .harness.configs import SEQUENCES, write_config
from .harness.dumps import dump
from .harness.epochs import counting_store_fixture
from .harness.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parents[1]
N, SIZE = 470, 16  # 29 full batches an epoch (drop_last): every batch splits over two devices


store = counting_store_fixture("jax", n=N, size=SIZE, epochs=(0, 1), shard_batches=4)


def env() -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def one_process(store: Path) -> dict:
    """Every single-process check, run in one process with two CPU devices: they share its start-up."""
    cmd = [sys.executable, str(SCRIPTS / "jax_checks.py"), "all", str(store)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["devices"] == 2
    return result


def batches(store: Path, epochs: range, size: int = SIZE, rank: int = 0, world: int = 1) -> list[list[int]]:
    out = []
    for epoch in epochs:
        ep = EpochArrays(store, epoch, batch_size=size, rank=rank, world_size=world, consumer=None)
        out += [b["v"].tolist() for b in ep]
    return out


def test_device_batches_are_the_streams_batches_put_two_ahead_of_the_consumer(store: Path, one_process: dict) -> None:
    result = one_process["ahead"]
    expected = batches(store, range(2))
    assert result["got"] == expected
    n = len(expected)
    # When the consumer holds batch i, batches i+1 and i+2 are already on the device: i+3 pulled in all.
    assert result["pulled"] == [min(i + 3, n) for i in range(n)]


def test_a_named_sharding_gives_global_arrays_split_over_both_devices_and_resumes_exactly(
    store: Path, one_process: dict
) -> None:
    result = one_process["sharded"]
    assert result["got"] == batches(store, range(2), 8)  # ten consumed, then the rest after the resume
    assert result["shards"] == [[[0, 4], [1, 4]]]  # every batch of 8: 4 samples on each device
    assert result["state"] == {"epoch": 0, "next_global_batch": 10, "next_sample": 80, "batch_size": 8}
    assert result["stream_state"]["next_sample"] == 8 * 13  # the stream itself ran three batches ahead


def test_reused_buffers_other_ranks_and_short_batches_are_refused_with_the_fix(one_process: dict) -> None:
    result = one_process["refusals"]
    assert result["buffers"].startswith("device_batches needs the stream's views (buffers=0)")
    assert result["world"] == (
        "the batches are split for 2 ranks but JAX runs 1 processes: "
        "read with rank=jax.process_index(), world_size=jax.process_count()"
    )
    # Refused at open (device_batches itself), from the manifest: 464 samples in batches of 10 end in one of 4.
    assert result["short"].startswith("epoch 0 ends in a batch of 4 samples after batches of 10: a global array needs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_through_jax_distributed_each_contribute_their_ranks_batches(store: Path) -> None:
    port = str(free_port())
    cmd = [sys.executable, str(SCRIPTS / "jax_checks.py"), "distributed", str(store)]
    procs = [
        subprocess.Popen([*cmd, str(p), port], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        for p in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    whole = batches(store, range(1))
    for process, result in enumerate(results):
        assert result["process"] == process
        assert result["ranks"] == [process, 2]  # the stream took JAX's process index and count
        assert result["got"] == batches(store, range(1), SIZE, process, 2)  # its rank's batches, on its devices
    for i, (a, b) in enumerate(zip(results[0]["sums"], results[1]["sums"], strict=True)):
        expected = sum(whole[2 * i]) + sum(whole[2 * i + 1])  # global batch i: rank 0's and rank 1's
        assert a == b == [expected, expected, [2 * SIZE]]


def test_without_jax_or_grain_the_import_names_the_extra() -> None:
    for module, missing in (("pgprefetch.jax", "jax"), ("pgprefetch.grain", "grain")):
        code = (
            f"import sys; sys.modules[{missing!r}] = None  # as if not installed\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        name = "JAX" if missing == "jax" else "Grain"
        assert done.stdout == f"{module} needs {name}: pip install 'pgprefetch[jax]'\n"


@pytest.fixture(scope="module")
def sequences(demo_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epochs 0 and 1 of the demo sequences in full batches of 32 (drop_last), for the README's example."""
    folder = tmp_path_factory.mktemp("jax-example")
    config = write_config(folder, **{**SEQUENCES, "size": 32, "drop_last": True})
    for epoch in (0, 1):
        dump(config, demo_db, epoch=epoch)
    return folder / "store.zarr"


@pytest.mark.parametrize("loader", ["stream", "grain"])
def test_the_readmes_jax_example_trains_on_every_batch_once_as_a_plain_script(
    sequences: Path, tmp_path: Path, loader: str
) -> None:
    record = tmp_path / "keys.json"
    args = ["--store", str(sequences), "--epochs", "2", "--record", str(record)]
    cmd = [sys.executable, str(ROOT / "examples" / "jax_train.py"), *args, *(["--grain"] if loader == "grain" else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = sum(len(EpochArrays(sequences, e, consumer=None)) for e in range(2))
    assert f"trained {steps} steps on 2 devices" in done.stdout
    seen = json.loads(record.read_text())
    epochs = [EpochArrays(sequences, e, consumer=None) for e in range(2)]
    expected = [ep.batch_keys(i).tolist() for ep in epochs for i in range(len(ep))]
    assert seen == expected  # every batch of both epochs, once, in order
