"""Train a tiny model for a few steps per epoch on the demo epochs, through EpochDataset, on the CPU.

Run after `pgprefetch demo` (which dumps epoch 0 of configs/demo.toml):

    python examples/train.py --config configs/demo.toml --epochs 0 --steps 30

Each sample is a 64-step window of two features; the model predicts every step's label (5 classes).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from pgprefetch import EpochDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--epochs", default="0", help="comma-separated epochs to train on")
    parser.add_argument("--steps", type=int, default=30, help="training steps per epoch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 5)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in (int(e) for e in args.epochs.split(",")):
        ds = EpochDataset.from_config(args.config, epoch=epoch)
        first = last = None
        for step, batch in enumerate(ds.to_device(args.device, prefetch=2)):
            logits = model(batch["x"])  # (batch, 64, 5)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 5), batch["y"].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            first = loss.item() if first is None else first
            last = loss.item()
            if step + 1 == args.steps:
                break
        print(
            f"epoch {epoch}: {step + 1} steps of {len(ds)}, loss {first:.4f} -> {last:.4f}, "
            f"resume state {ds.state_dict()}"
        )


if __name__ == "__main__":
    main()
