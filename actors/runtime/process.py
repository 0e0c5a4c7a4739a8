"""Process plumbing shared by every command: which NATS server, the NATS options, signals to a stop.

``nats_url`` picks the server (``--nats``, else ``NATS_URL``, else the embedded one);
``add_nats_options`` adds ``--nats`` and ``--connect-timeout`` to a command; ``run_async`` runs a
command's coroutine with SIGINT/SIGTERM turned into a graceful stop and a second signal into a
stop at once; ``process_started_at`` is when the command's process started (a run's wall budget
counts from it) and ``exit_promptly`` ends a process whose work is done without the interpreter's
own teardown. This module sits below the commands (``actors.commands``: ``cli``, ``run``,
``actor``) and imports none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import NoReturn, TextIO

_IMPORTED_AT = time.time()
"""When this module was first imported: the process's start where ``/proc`` cannot say (it is
imported with the command line's parser, before torch or any actor)."""

ABORT_GRACE_S = 3.0
"""Longest a second signal waits for the command to record what it can before the process exits."""
EXIT_GRACE_S = 15.0
"""Longest the event loop's teardown may take once a command has its exit status."""


def say(text: str, stream: TextIO | None = None) -> None:
    """One line to ``stream`` (stdout by default), flushed: what a command shows its user."""
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()


@contextlib.contextmanager
def nats_url(arg: str | None) -> Iterator[str]:
    """The server to use: ``--nats``, else ``NATS_URL``, else the embedded server."""
    url = arg or os.environ.get("NATS_URL")
    if url:
        yield url
        return
    from actors.runtime.nats_server import EmbeddedServer

    server = EmbeddedServer()
    url = server.acquire()
    try:
        yield url
    except BaseException:
        # A command ending on an error (a task refused) exits at once after its line: the server
        # it started is gone before it does (its store holds little; a prompt exit left it running).
        server.release(ignore_own=server.started_here, wait=True)
        raise
    # The command is ending: connections it left open end with it and do not keep a server it
    # started itself running (one it found running counts every client, this one's too). Nor does
    # the server's own shutdown hold the exit (the next command to start one waits).
    server.release(ignore_own=server.started_here, wait=False)


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def add_nats_options(p: argparse.ArgumentParser, *, connect_timeout: float | None = 5.0) -> None:
    """``--nats`` and ``--connect-timeout`` (one-shot commands give up after a few seconds; a
    long-running actor, ``connect_timeout=None``, keeps trying until stopped)."""
    p.add_argument("--nats", help="NATS server URL(s), comma-separated (default: $NATS_URL, else embedded)")
    default = "keep trying, one log line per attempt" if connect_timeout is None else f"{connect_timeout:g}"
    p.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=connect_timeout,
        metavar="SECONDS",
        help=f"give up on an unreachable or lost NATS server after this long (default: {default})",
    )


def process_started_at() -> float:
    """When this process started (seconds since the epoch): what a user who timed the command
    counts from, the interpreter's start-up and every import included (1-8 s of a ``kfoundry run``
    on a 2-core host before anything of the run exists).

    Read from the kernel: ``/proc/self/stat``'s start time (clock ticks since boot) against
    ``CLOCK_BOOTTIME``, to a tick (10 ms). Where that cannot be read, or gives a time after this
    module's import or more than an hour before it (a clock the kernel keeps apart, in a time
    namespace say), the import's time stands in."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT
    started = time.time() - age
    return started if _IMPORTED_AT - 3600.0 < started <= _IMPORTED_AT else _IMPORTED_AT


def exit_promptly(code: int) -> NoReturn:
    """End a process whose work is done (results written, output said) with ``code``, now.

    The ``atexit`` hooks run and the standard streams are flushed, as at a normal exit; what is
    skipped is the interpreter's own teardown: collecting every module's objects and the C++
    destructors of the libraries loaded (torch, Triton, FAISS, the MiniLM model), 1.6 s of a CPU
    run's exit on a 2-core host, after its results were written and inside its wall budget.
    Threads still running (none of the command's own) end with the process."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    _exit_now(code)


def _exit_later(code: int) -> None:
    """Exit with ``code`` in :data:`EXIT_GRACE_S` unless the process has ended by then."""
    timer = threading.Timer(EXIT_GRACE_S, _exit_now, args=(code,))
    timer.daemon = True
    timer.start()


def _exit_now(code: int) -> NoReturn:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_async(
    main: Callable[[asyncio.Event], Awaitable[int]], on_error: Callable[[BaseException], int | None] | None = None
) -> int:
    """Run ``main`` with the first SIGINT/SIGTERM turned into a graceful stop event and a second
    one into a stop at once (``main`` is cancelled). Interrupted by SIGINT, the exit status is 130.

    ``on_error``: called with what ``main`` raised (a cancellation aside), inside the event loop;
    where it returns an exit status it has told the user (the error's one line), and the event
    loop's teardown that follows may not hold the process past :data:`EXIT_GRACE_S`, as after a
    normal end. The error is raised on as before."""

    async def wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        received: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            received.append(sig)
            if len(received) == 1:
                stop.set()
            elif len(received) == 2 and task is not None:
                say(f"kfoundry: second {sig.name}: stopping at once", sys.stderr)
                task.cancel()  # the command records what it can (a run: its end) within a moment
                # Work in threads (a compile, a trace) cannot be cancelled: do not wait for it.
                timer = threading.Timer(ABORT_GRACE_S, _exit_now, args=(130 if signal.SIGINT in received else 143,))
                timer.daemon = True
                timer.start()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            code = await main(stop)
        except asyncio.CancelledError:
            if len(received) < 2:
                raise
            code = 1
        except Exception as exc:
            said = on_error(exc) if on_error is not None else None
            if said is not None:
                _exit_later(130 if signal.SIGINT in received else said)
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        final = 130 if signal.SIGINT in received else code
        # The command's work is done (a run's results are written): the event loop's own teardown
        # (tasks still being cancelled, threads of the default executor) must not hold the process.
        _exit_later(final)
        return final

    return asyncio.run(wrapper())
