"""Host to GPU, ahead of the step: a ring of reused pinned buffers copied on a side stream.

Part of the torch layer. A batch read straight from the page cache into pinned
memory (``preadv``: one copy, no page faults) can be copied to the GPU asynchronously; the training step's
stream then waits for that one copy only, while the next batches are already being read and copied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import torch

ReadInto = Callable[[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def cuda_batches(
    read_into: ReadInto,
    new_buffers: Callable[[], dict[str, torch.Tensor]],
    indices: range,
    device: torch.device,
    depth: int,
) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """``(i, batch on device)`` for each ``i`` of ``indices``, batches ``i+1 .. i+depth`` in flight.

    Args:
        read_into: fills a dict of host buffers with batch ``i`` and returns views of them (trimmed).
        new_buffers: makes one batch's pinned host buffers (``depth + 1`` sets of them are made).
        indices: the batches, in order.
        device: the CUDA device.
        depth: batches read and copied ahead of the one being consumed.
    """
    stream = torch.cuda.Stream(device)
    n_slots = depth + 1
    pinned: list[dict[str, torch.Tensor] | None] = [None] * n_slots
    copied: list[torch.cuda.Event | None] = [None] * n_slots
    pending: deque[tuple[dict[str, torch.Tensor], torch.cuda.Event]] = deque()

    def submit(n: int) -> None:
        slot = n % n_slots
        event = copied[slot]
        if event is not None:
            event.synchronize()  # the slot's previous copy must be done before it is overwritten
        buffers = pinned[slot]
        if buffers is None:
            buffers = pinned[slot] = new_buffers()
        host = read_into(indices[n], buffers)  # page cache -> pinned with preadv: one copy, no page faults
        out = {}
        with torch.cuda.stream(stream):
            for name, staging in host.items():
                out[name] = staging.to(device, non_blocking=True)  # pinned -> device, on the side stream
            event = torch.cuda.Event()
            event.record(stream)
        copied[slot] = event
        pending.append((out, event))

    submitted = 0
    for n in range(len(indices)):
        while submitted < len(indices) and submitted <= n + depth:
            submit(submitted)
            submitted += 1
        out, event = pending.popleft()
        current = torch.cuda.current_stream(device)
        current.wait_event(event)  # the step waits for this batch only
        for tensor in out.values():
            tensor.record_stream(current)  # allocated on the side stream, used on the step's
        yield indices[n], out
