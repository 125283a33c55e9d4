"""One rank of the Accelerate check in test_frameworks.py; run under torchrun with 2 processes on the CPU.

Usage: accelerate_ranks.py STORE OUT.json. Rank 0 writes every rank's sample keys (the loader kept out of
prepare(), as the README says) and the errors prepare()'s two wrappers met. Run alone (one process), it
also writes the keys of the prepared loader.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from pgprefetch import ConfigError, EpochStream


def first_error(loader: DataLoader) -> str:
    try:
        next(iter(loader))
    except ConfigError as e:
        return str(e)
    return "no error"


def main() -> None:
    store, out = sys.argv[1], sys.argv[2]
    accelerator = Accelerator(cpu=True)  # a gloo group of torchrun's processes
    model = torch.nn.Linear(2, 5)
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    # The recommended setting: the loader stays out of prepare(); the stream splits by rank itself.
    loader = DataLoader(EpochStream(store, 0, 1, keys=True, consumer=None), batch_size=None)
    keys = [row for b in loader for row in b["keys"].tolist()]
    everyone: list[list[list[int]]] = [keys]
    if accelerator.num_processes > 1:
        everyone = [[] for _ in range(accelerator.num_processes)]
        dist.all_gather_object(everyone, keys)

    if accelerator.num_processes == 1:  # prepare() on one process changes nothing: the same batches
        # Its loader calls set_epoch(0), a count of its passes: the stream of epoch 1 stays in epoch 1.
        prepared = accelerator.prepare(DataLoader(EpochStream(store, 1, 1, keys=True, consumer=None), batch_size=None))
        everyone.append([row for b in prepared for row in b["keys"].tolist()])
    errors = {
        "dispatch": first_error(
            accelerator.prepare(DataLoader(EpochStream(store, 0, 1, consumer=None), batch_size=None))
        ),
        "shard": first_error(
            prepare_data_loader(
                DataLoader(EpochStream(store, 0, 1, consumer=None), batch_size=None),
                num_processes=accelerator.num_processes,
                process_index=accelerator.process_index,
                put_on_device=False,
                dispatch_batches=False,
            )
        ),
    }
    if accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump({"keys": everyone, "errors": errors, "world": accelerator.num_processes}, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
