"""What the CLI needs around its commands: one place for errors, ``--json`` errors, SIGTERM and log lines.

:class:`Group` turns a :class:`~pgprefetch.errors.PgprefetchError` into ``Error: <one line>`` with its exit
code (2 for config and usage errors, 1 otherwise), or one JSON object on stdout when the command was
given ``--json``; anything unexpected becomes one line too, unless ``--debug`` asks for the traceback.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from pgprefetch.cli.progress import JsonFormatter
from pgprefetch.errors import PgprefetchError, TransformError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])  # a click command function, under a decorator


class Group(click.Group):
    """A click group that turns library errors into one-line messages and exit codes.

    With ``--json`` the error is one JSON object on stdout instead, ``{"error": ..., "exit_code": ...}``,
    so that a script parsing the output never has to parse an error line.
    """

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; translate what it raises."""
        _JSON.clear()
        if ctx.params.get("debug"):  # the dump's memory pool refuses an over-commit, naming its holders
            from pgprefetch.write.memory.pool import CHECK_VARIABLE

            os.environ.setdefault(CHECK_VARIABLE, "1")
        try:
            return super().invoke(ctx)
        except PgprefetchError as e:
            if ctx.params.get("debug"):
                if isinstance(e, TransformError) and e.traceback:  # the function's, from the process that ran it
                    click.echo(e.traceback.rstrip(), err=True)
                raise
            raise fail(str(e), e.exit_code) from None
        except KeyboardInterrupt:
            terminated = _TERMINATED.is_set()
            message, code = ("Terminated.", 143) if terminated else ("Interrupted.", 130)
            if _JSON.is_set():
                click.echo(json.dumps({"error": message, "exit_code": code}))
            click.echo(message, err=True)
            ctx.exit(code)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:  # a bug or an environment problem: still one line, unless --debug
            if ctx.params.get("debug"):
                raise
            detail = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror else str(e)
            raise fail(f"{type(e).__name__}: {detail} (run with --debug for the traceback)", 1) from None


_TERMINATED = threading.Event()
_RUNNING: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []  # what run() runs, while it runs


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, systemd, Kubernetes) stops a dump as Ctrl-C does, and it exits 143.

    While :func:`run` runs the dump, the handler cancels it, as asyncio does on Ctrl-C, so the statements in
    flight are cancelled and the partial epoch is kept for the next run; between epochs it raises
    KeyboardInterrupt, as Ctrl-C would. It does this itself rather than raise SIGINT in turn: a process that
    a script starts in the background (``pgprefetch dump ... &``, nohup, many schedulers) inherits SIGINT
    ignored, so a raised SIGINT did nothing and the dump ran to its end. SIGINT is left as it was found:
    ignored stays ignored. A second SIGTERM stops at once, as a second Ctrl-C does.
    """

    def on_term(signum: int, frame: object) -> None:
        first = not _TERMINATED.is_set()
        _TERMINATED.set()
        if first and _RUNNING:
            loop, task = _RUNNING[-1]
            if not task.done():
                task.cancel()
                loop.call_soon_threadsafe(lambda: None)  # wake a loop that waits in select() on a long timeout
                return
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, which SIGTERM cancels as Ctrl-C does (see :func:`stop_on_sigterm`).

    Cancelled by SIGTERM, it raises KeyboardInterrupt, as asyncio does after Ctrl-C, so that :class:`Group`
    reports both the same way (exit 143 for SIGTERM, 130 for Ctrl-C).
    """

    async def stoppable() -> T:
        task = asyncio.current_task()
        assert task is not None  # a coroutine asyncio.run runs is a task
        _RUNNING.append((asyncio.get_running_loop(), task))
        try:
            return await main
        finally:
            _RUNNING.pop()

    try:
        return asyncio.run(stoppable())
    except asyncio.CancelledError:
        if _TERMINATED.is_set():
            raise KeyboardInterrupt from None
        raise


def tune_for_dumping() -> None:
    """Settle the process for a dump: fewer garbage-collector walks, and no memory returned between batches.

    The modules' objects (numpy, zarr, asyncpg: about a hundred thousand) are frozen out of the cycle
    collector's sight: a dump allocates records by the batch, and each full collection walked them all.
    glibc hands blocks over 128 KiB out as fresh mappings and gives them back on free, so each batch's
    temporaries (a few MiB) were zeroed pages, faulted in again batch after batch: raising the mapping and
    trimming thresholds keeps them in the heap, to be reused (a third of the dump's system time on the
    ragged benchmark). Not glibc: the collector part only. The console script calls this, not the
    ``dump`` command itself, so that a process calling the CLI in-process keeps its own settings.
    """
    gc.freeze()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    # 32 MiB is the largest mapping threshold glibc documents for 64-bit; only if it took, the trimming one
    # (set alone, it would switch the automatic threshold off and keep the small default).
    if libc.mallopt(m_mmap_threshold, 32 << 20) == 1:
        libc.mallopt(m_trim_threshold, 128 << 20)


_JSON = threading.Event()  # the command was given --json: errors are JSON too


def json_option(help_text: str) -> Callable[[F], F]:
    """``--json``, which also turns a failure into one JSON object on stdout."""

    def note(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            _JSON.set()
        return value

    return click.option("--json", "as_json", is_flag=True, help=help_text, callback=note, is_eager=True)


class _JsonFailure(click.ClickException):
    """A failure reported as ``{"error": ..., "exit_code": ...}`` on stdout."""

    def show(self, file: Any = None) -> None:
        click.echo(json.dumps({"error": self.message, "exit_code": self.exit_code}))


def fail(message: str, code: int) -> click.ClickException:
    """The click exception that prints ``message`` (as a line, or as JSON after ``--json``) and exits ``code``."""
    e = _JsonFailure(message) if _JSON.is_set() else click.ClickException(message)
    e.exit_code = code  # type: ignore[misc]  # click types it a ClassVar; main() exits with the instance's
    return e


def log_to_stderr(quiet: bool, log_format: str = "text") -> None:
    """Retries, resumes and progress go to stderr as they happen; ``--quiet`` keeps only errors."""
    logger = logging.getLogger("pgprefetch")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    text = logging.Formatter("%(asctime)s pgprefetch %(levelname)s: %(message)s")
    handler.setFormatter(JsonFormatter() if log_format == "json" else text)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.ERROR if quiet else logging.INFO)
