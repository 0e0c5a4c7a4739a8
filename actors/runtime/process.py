"""Process plumbing shared by every command: which NATS server, the NATS options, signals to a stop.

``nats_url`` picks the server (``--nats``, else ``NATS_URL``, else the embedded one);
``add_nats_options`` adds ``--nats`` and ``--connect-timeout`` to a command; ``run_async`` runs a
command's coroutine with SIGINT/SIGTERM turned into a graceful stop and a second signal into a
stop at once. This module sits below the commands (``actors.commands``: ``cli``, ``run``, ``actor``) and
imports none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TextIO

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
    finally:
        # The command is ending: connections it left open end with it and do not keep a server
        # it started itself running (one it found running counts every client, this one's too).
        server.release(ignore_own=server.started_here)


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


def _exit_now(code: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_async(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main`` with the first SIGINT/SIGTERM turned into a graceful stop event and a second
    one into a stop at once (``main`` is cancelled). Interrupted by SIGINT, the exit status is 130."""

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
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        final = 130 if signal.SIGINT in received else code
        # The command's work is done (a run's results are written): the event loop's own teardown
        # (tasks still being cancelled, threads of the default executor) must not hold the process.
        timer = threading.Timer(EXIT_GRACE_S, _exit_now, args=(final,))
        timer.daemon = True
        timer.start()
        return final

    return asyncio.run(wrapper())
