"""Host to GPU, ahead of the step: a ring of reused pinned buffers copied on a side stream.

Part of the torch layer. A batch read straight from the page cache into pinned
memory (``preadv``: one copy, no page faults) can be copied to the GPU asynchronously; the training step's
stream then waits for that one copy only, while the next batches are already being read and copied.
The device is checked before any of it (:func:`usable_device`): torch would say what is missing only at
the first copy, in its own words.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import torch

from pgprefetch.errors import ConfigError

ReadInto = Callable[[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, once it is known to be one this torch and this machine have.

    torch says a device is missing at the first copy to it, from inside the iterator (``torch.cuda.Stream
    requires CUDA support``, or an assertion, or a list of every backend's kernels); a user needs to hear
    which device was asked for and what is missing: CUDA in this build of torch, a GPU or its driver, or
    that device's number.

    Raises:
        ConfigError: not a device name, or one torch cannot use here (one line naming it).
    """
    shown = f"to_device({str(device)!r})"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"{shown}: not a torch device ({_first_line(e)})") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            raise ConfigError(
                f"{shown}: this torch ({torch.__version__}) is built without CUDA; install a CUDA build of torch, "
                'or read on the CPU with to_device("cpu")'
            )
        if not torch.cuda.is_available():
            raise ConfigError(f"{shown}: torch finds no CUDA device on this machine (no GPU, or no driver for it)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{shown}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
        return dev
    try:  # another backend (mps, xpu, ...): an empty tensor on it says whether torch can use it here
        torch.empty(0, device=dev)
    except Exception as e:
        raise ConfigError(f"{shown}: torch cannot use {dev.type} here ({_first_line(e)})") from None
    return dev


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


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
