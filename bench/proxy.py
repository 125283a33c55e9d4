"""A TCP proxy on 127.0.0.1 that delays every chunk by a fixed time in each direction, keeping order."""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _connect(target: str) -> socket.socket:
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target)
        return s
    host, _, port = target.rpartition(":")
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def sleep_overshoot(delay: float, n: int = 200) -> float:
    """The median seconds by which ``time.sleep(delay)`` oversleeps here."""
    if delay <= 0:
        return 0.0
    late = []
    for _ in range(n):
        t = time.monotonic()
        time.sleep(delay)
        late.append(time.monotonic() - t - delay)
    return max(0.0, sorted(late)[n // 2])


def _pipe(
    src: socket.socket, dst: socket.socket, delay: float, early: float, done: threading.Event
) -> list[threading.Thread]:
    """Threads that copy ``src`` to ``dst``, each chunk ``delay`` seconds after it was read.

    ``early``: how much sooner than the deadline to ask ``time.sleep`` to wake up (its usual overshoot).
    """
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def read() -> None:
        try:
            while data := src.recv(CHUNK):
                chunks.put((time.monotonic() + delay, data))
        except OSError:
            pass
        finally:
            chunks.put((time.monotonic() + delay, b""))  # end of stream, delivered in order like the rest

    def write() -> None:
        try:
            while True:
                deliver_at, data = chunks.get()
                wait = deliver_at - time.monotonic() - early
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            done.set()

    return [threading.Thread(target=read, daemon=True), threading.Thread(target=write, daemon=True)]


def _serve_connection(client: socket.socket, target: str, delay: float, early: float) -> None:
    try:
        server = _connect(target)
    except OSError:
        client.close()
        return
    done = [threading.Event(), threading.Event()]
    threads = _pipe(client, server, delay, early, done[0]) + _pipe(server, client, delay, early, done[1])
    for t in threads:
        t.start()
    for event in done:
        event.wait()
    for s in (client, server):
        with contextlib.suppress(OSError):
            s.close()


def serve(target: str, delay: float, early: float, listener: socket.socket) -> None:
    """Accept connections on ``listener`` forever, each forwarded to ``target`` with ``delay``."""
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_connection, args=(client, target, delay, early), daemon=True).start()


def main() -> None:
    """Run as ``python -m bench.proxy --to /path/.s.PGSQL.5432 --delay-ms 0.5`` (or ``--to host:port``).

    Prints ``PORT <n> OVERSHOOT_US <us>`` once listening and exits when its stdin closes, so it never
    outlives the bench. Each direction of a connection has a reader thread (``recv`` -> a queue of
    ``(deliver_at, bytes)``) and a writer thread (sleep until ``deliver_at``, then ``sendall``), so order is
    kept and chunks in flight overlap, as on a network link. Threads rather than asyncio timers: the event
    loop waits in ``epoll``, whose timeout has millisecond resolution (rounded up), so a 0.5 ms asyncio sleep
    lasts about 1 ms. ``time.sleep`` oversleeps by a steady few tens of microseconds, which is measured at
    start and subtracted.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", required=True, help="unix socket path, or host:port")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="added to every chunk, each direction")
    args = parser.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # loopback only
    listener.listen(64)
    delay = args.delay_ms / 1e3
    early = sleep_overshoot(delay)
    threading.Thread(target=serve, args=(args.to, delay, early, listener), daemon=True).start()
    print(f"PORT {listener.getsockname()[1]} OVERSHOOT_US {early * 1e6:.0f}", flush=True)
    sys.stdin.read()  # returns when the bench closes our stdin or exits; daemon threads die with us


if __name__ == "__main__":
    main()
