"""Train with PyTorch Lightning on consecutive pgprefetch epochs: DDP on CPU processes, one EpochStream.

Run after `pgprefetch demo` has dumped epochs 0 and 1 of configs/demo.toml (`pgprefetch dump --config
configs/demo.toml --epoch 1` for the second):

    python examples/lightning_train.py --config configs/demo.toml --epochs 2 --devices 2

The stream is already split by rank, so Lightning injects no DistributedSampler (it never does for an
IterableDataset) and every rank gets the same number of batches: no rank waits on another at the end of an
epoch. `--record DIR` writes the sample keys each rank trained on, in order (the test suite checks them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from pgprefetch import EpochStream, load_config


class Model(L.LightningModule):
    """Predict every step's label (5 classes) of a 64-step window of two features."""

    def __init__(self, record: Path | None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 5))
        self.record = record
        self.seen: list[list[int]] = []

    def training_step(self, batch: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        logits = self.net(batch["x"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 5), batch["y"].reshape(-1))
        self.log("loss", loss, prog_bar=True)
        if self.record is not None:
            self.seen += batch["keys"].tolist()
        return loss

    def on_train_end(self) -> None:
        if self.record is not None:
            self.record.mkdir(parents=True, exist_ok=True)
            (self.record / f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml", help="the dump's config (names the store)")
    parser.add_argument("--store", help="the store itself, instead of --config")
    parser.add_argument("--start-epoch", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2, help="store epochs to train on, one after the other")
    parser.add_argument("--batch-size", type=int, default=None, help="per rank; default: the dump's")
    parser.add_argument("--devices", type=int, default=2, help="DDP processes")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--record", type=Path, help="write each rank's sample keys here")
    args = parser.parse_args()

    store = args.store or load_config(args.config).store.path
    # Ranks come from torch.distributed when the stream is iterated, inside Lightning's DDP processes.
    stream = EpochStream(store, args.start_epoch, args.epochs, batch_size=args.batch_size, keys=args.record is not None)
    loader = DataLoader(stream, batch_size=None, num_workers=args.workers)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=1,  # one pass of the stream: all --epochs store epochs
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(Model(args.record), loader)
    if trainer.global_rank == 0:
        print(f"trained on {args.epochs} epochs of {store} in {trainer.global_step} steps on {args.devices} ranks")


if __name__ == "__main__":
    main()
