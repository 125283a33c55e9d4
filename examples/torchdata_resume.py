"""Stop training mid-epoch and resume in a fresh process, with torchdata's StatefulDataLoader.

    python examples/torchdata_resume.py --config configs/demo.toml --steps 20 --state /tmp/state.pt
    python examples/torchdata_resume.py --config configs/demo.toml --state /tmp/state.pt     # the rest
    python examples/torchdata_resume.py --config configs/demo.toml --state /tmp/state.pt --workers 3

The first run trains 20 steps and saves the loader's state; a second run finds the state and goes on from
the next batch, exactly. With the same `--workers` the loader restores itself (each worker gets its own
state back). With another number of workers, or another world size, the saved per-worker states do not fit,
so the whole state goes to the stream instead (`stream.load_state_dict`), and a fresh loader splits what
is left among its workers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from pgprefetch import EpochStream, load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml", help="the dump's config (names the store)")
    parser.add_argument("--store", help="the store itself, instead of --config")
    parser.add_argument("--epochs", type=int, default=1, help="store epochs from epoch 0")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: the end)")
    parser.add_argument("--state", type=Path, required=True, help="saved here when stopping; resumed from if present")
    parser.add_argument("--record", type=Path, help="append the sample keys of each batch here, as JSON lines")
    args = parser.parse_args()

    store = args.store or load_config(args.config).store.path
    stream = EpochStream(store, 0, args.epochs, keys=True)
    saved = torch.load(args.state) if args.state.exists() else None
    if saved is not None and saved["workers"] != args.workers:
        stream.load_state_dict(saved["loader"])  # the position, for any number of workers
    loader = StatefulDataLoader(stream, batch_size=None, num_workers=args.workers)
    if saved is not None and saved["workers"] == args.workers:
        loader.load_state_dict(saved["loader"])  # each worker gets its own state back

    steps = 0
    with open(args.record, "a") if args.record else open("/dev/null", "w") as record:
        for batch in loader:
            record.write(json.dumps(batch["keys"].tolist()) + "\n")  # a training step goes here
            steps += 1
            if steps == args.steps:
                torch.save({"loader": loader.state_dict(), "workers": args.workers}, args.state)
                print(f"stopped after {steps} steps; state saved to {args.state}")
                return
    print(f"{'resumed and ' if saved else ''}finished: {steps} steps")


if __name__ == "__main__":
    main()
