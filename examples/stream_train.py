"""The training side of a deployment: epoch after epoch while cron dumps ahead; checkpoints; resumes.

    python examples/stream_train.py --store s3://training/run-7 --consumer train --state-dir /checkpoints

One process per rank: the rank comes from --rank, else RANK (torchrun), else JOB_COMPLETION_INDEX (a
Kubernetes Indexed Job, deploy/kubernetes/train-job.yaml); the world size from --world-size or WORLD_SIZE.
The rank reads an EpochStream through a DataLoader with workers: it waits for each epoch cron publishes and
records the consumer as it opens one, which is what `pgprefetch dump --ahead 2 --keep 1 --consumer train`
goes by. Every --save-every steps, and on SIGTERM (Kubernetes, systemd), the position is saved in
<state-dir>/rank-N.json, atomically; a process started again resumes from there, so the steps after the
last save are redone, as a training step after the last checkpoint is, and none is skipped.

--record FILE appends a JSON line per step (a digest of the batch's bytes, how long the step waited for it)
and one per save (the position, the reader's memory): an audit of what was trained on, which the soak
(tests/soak) checks against clean dumps. A resumed run cuts the file back to its last save. The training
step itself is a stand-in here (--step-seconds): put the model's in its place.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from pgprefetch import EpochStream


class Stop(Exception):
    """SIGTERM arrived while the step waited for a batch."""


def rank_and_world(args: argparse.Namespace) -> tuple[int, int]:
    env = os.environ
    rank = args.rank if args.rank is not None else int(env.get("RANK", env.get("JOB_COMPLETION_INDEX", "0")))
    world = args.world_size if args.world_size is not None else int(env.get("WORLD_SIZE", "1"))
    return rank, world


def digest(batch: dict[str, torch.Tensor]) -> str:
    """A sha256 of every array of the batch, by name: equal digests, equal bytes."""
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode())
        h.update(batch[name].contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def anonymous_memory_kib(pid: int | str = "self") -> int:
    """Resident anonymous memory of a process (heap, not mapped files): what grows when a reader leaks."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def children_memory_kib(pid: int | str = "self") -> int:
    """The same, summed over this process's descendants (the DataLoader workers, and a forkserver's)."""
    total = 0
    with contextlib.suppress(OSError):  # a process that just exited
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += anonymous_memory_kib(child) + children_memory_kib(child)
    return total


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store: a folder or s3://bucket/prefix")
    parser.add_argument("--consumer", default="train", help="recorded as epochs are opened (dump --consumer)")
    parser.add_argument("--rank", type=int, help="default: RANK, or JOB_COMPLETION_INDEX, or 0")
    parser.add_argument("--world-size", type=int, help="default: WORLD_SIZE, or 1")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--epochs", type=int, help="stop after this many epochs from epoch 0 (default: never)")
    parser.add_argument("--save-every", type=int, default=100, help="steps between saves of the position")
    parser.add_argument("--state-dir", type=Path, required=True, help="where rank-N.json is saved and resumed from")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for an epoch to be published")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="a stand-in for the model's step")
    parser.add_argument("--record", type=Path, help="append a line per step and per save here")
    return parser


def main() -> None:
    args = arguments().parse_args()

    rank, world = rank_and_world(args)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    state_path = args.state_dir / f"rank-{rank}.json"
    saved = json.loads(state_path.read_text()) if state_path.exists() else None
    stream = EpochStream(
        args.store, 0, args.epochs, rank=rank, world_size=world, keys=args.record is not None,
        consumer=args.consumer, timeout=args.timeout,
    )  # fmt: skip
    steps = 0
    if saved is not None:
        stream.load_state_dict(saved["stream"])
        steps = saved["steps"]
    record = open(args.record, "a+b") if args.record else None  # noqa: SIM115
    if record is not None:
        record.truncate(saved["record_bytes"] if saved else 0)  # the steps after the last save are redone
        record.seek(0, os.SEEK_END)
    context = None  # a local store: workers are forked
    if str(args.store).startswith("s3://") and args.workers:
        # obstore cannot run in a forked copy of a process that used it (pgprefetch.store.s3.S3Store.client). A
        # forkserver, a fresh process that imported torch once, forks the workers instead: as safe as spawn,
        # and each worker starts without importing torch again (half the start-up on 2 cores).
        multiprocessing.set_forkserver_preload(["torch"])
        context = "forkserver"
    loader = DataLoader(stream, batch_size=None, num_workers=args.workers, multiprocessing_context=context)
    consumed = 0  # batches this loader handed out: stream.state_dict(batches=...) counts from its start

    def checkpoint() -> None:
        position = stream.state_dict(batches=consumed)
        if record is not None:
            line = {"saved": steps, "epoch": position["epoch"], "sample": position["next_sample"], "t": time.time(),
                    "pid": os.getpid(), "rss_anon_kib": anonymous_memory_kib(),
                    "workers_rss_anon_kib": children_memory_kib()}  # fmt: skip
            record.write((json.dumps(line) + "\n").encode())
            record.flush()
        save(state_path, {"stream": position, "steps": steps, "record_bytes": record.tell() if record else 0})

    waiting, stopping = [False], [False]

    def on_sigterm(signum: int, frame: object) -> None:
        stopping[0] = True
        if waiting[0]:
            raise Stop

    signal.signal(signal.SIGTERM, on_sigterm)
    batches = iter(loader)
    try:
        while not stopping[0]:
            started = time.monotonic()
            waiting[0] = True
            try:
                batch = next(batches)
            except StopIteration:
                break
            finally:
                waiting[0] = False
            waited = time.monotonic() - started
            if record is not None:
                line = {"step": steps, "digest": digest(batch), "wait": round(waited, 4), "t": time.time()}
                record.write((json.dumps(line) + "\n").encode())
                record.flush()
            time.sleep(args.step_seconds)  # the training step
            steps, consumed = steps + 1, consumed + 1
            if steps % args.save_every == 0:
                checkpoint()
    except Stop:  # SIGTERM while waiting: the batch being waited for was not consumed
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    checkpoint()
    print(f"rank {rank}: {steps} steps; position saved in {state_path}", flush=True)


if __name__ == "__main__":
    main()
