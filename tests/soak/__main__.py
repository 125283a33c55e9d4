"""``make soak``: the soak of a local store, then of an S3 store; prints each summary and its picture's path.

    python -m tests.soak [--seconds 360] [--stores local,s3] [--seed N] [--out soak-report]

Each store's report, picture and the run's files (records, logs, the store itself) are left in
``<out>/<store>/``. Exit status 1 if anything that must hold did not (the message says what).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

from .run import run_soak


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=360, help="of soak per store (setup and checks come on top)")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 30))
    parser.add_argument("--out", type=Path, default=Path("soak-report"))
    args = parser.parse_args()
    failed = False
    for store in args.stores.split(","):
        folder = args.out.resolve() / store
        started = time.monotonic()
        print(f"soak of a {store} store for {args.seconds:g} s (seed {args.seed}) in {folder} ...", flush=True)
        try:
            report = run_soak(store, args.seconds, folder, args.seed)
            print(report.summary())
        except AssertionError as e:  # the report was written, problems included
            failed = True
            summary = folder / "report.txt"
            print(summary.read_text() if summary.exists() else f"FAILED: {e}", end="")
        except Exception:
            failed = True
            traceback.print_exc()
        picture = folder / "timeline.png"
        print(
            f"timeline: {picture if picture.exists() else '(not drawn)'}; {time.monotonic() - started:.0f} s in all\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
