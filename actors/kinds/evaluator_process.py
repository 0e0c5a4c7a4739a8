"""An evaluator of ``kfoundry run`` started as its own process, so that it holds no secrets.

``kfoundry run`` hosts its experts in its own process, and they need API keys. Where the
environment holds any (:func:`holds_secrets`), the run's evaluators do not live beside them:
each is a ``kfoundry actor evaluator`` child (the same actor a remote machine runs) started with
the environment less every secret-like variable (API keys, tokens, passwords, NATS credentials
other than the URL it connects with). Its fork servers, janitor and workers inherit that
environment, so nothing in the evaluator's process tree (what candidates run under) holds a key.

The child is an actor of this process for the run: ready when it logs ``actor running``, refused
(its one-line message) when it ends before that (the task cannot be evaluated here), asked to drain
with SIGTERM, stopped at once with SIGKILL, and killed with this process (``PR_SET_PDEATHSIG``).
Its JSON log lines go to this process's log (``run.log``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping

from actors.runtime.base import Actor
from actors.runtime.childenv import child_pythonpath
from actors.runtime.errors import TaskRefused
from actors.runtime.options import ActorOptions
from schemas import ActorKind, ActorState

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|CREDS|AUTH|COOKIE|SESSION|NKEY", re.IGNORECASE)
"""Variables no evaluator gets (also any ``NATS_*`` but the URL)."""
SECRET_VALUE_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|CREDS|NKEY)$", re.IGNORECASE)
"""Variables whose presence moves evaluators out of the run's process."""
_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 60.0


def holds_secrets(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` holds a key, token, password or NATS credential (with a value)."""
    return any(
        v and (SECRET_VALUE_NAME.search(k) or (k.startswith("NATS_") and k != "NATS_URL")) for k, v in environ.items()
    )


def scrubbed(environ: Mapping[str, str], url: str) -> dict[str, str]:
    """``environ`` without secrets and NATS credentials; the URL the child connects to instead."""
    env = {k: v for k, v in environ.items() if not SECRET_NAME.search(k) and not k.startswith("NATS_")}
    env["NATS_URL"] = url  # in the environment, not the command line: others may read a command line
    env["PYTHONPATH"] = child_pythonpath()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class EvaluatorProcess(Actor):
    """A ``kfoundry actor evaluator`` child standing for an in-process evaluator."""

    kind = ActorKind.EVALUATOR

    def __init__(self, *, nats_url: str, run_id: str, argv: list[str], actor_id: str | None = None) -> None:
        super().__init__(nats_url=nats_url, run_id=run_id, actor_id=actor_id)
        self.argv = argv
        """The child's options after ``actor evaluator`` (run, device, isolation, ...)."""
        self.refused: TaskRefused | None = None
        self.pid: int | None = None
        self._lines = logging.getLogger("kf.evaluator.process")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "actors.cli", "actor", "evaluator", "--id", self.actor_id, *self.argv]

    async def _read(self, stream: asyncio.StreamReader, last: list[str]) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if not text:
                continue
            last[:] = [*last[-19:], text]
            self._lines.info(text)
            if text.startswith("{"):
                with contextlib.suppress(ValueError):
                    if json.loads(text).get("event") == "actor running":
                        self.state = ActorState.RUNNING
                        self._ready.set()

    async def run(self) -> None:
        env = scrubbed(os.environ, self.nats_url)
        proc = await asyncio.create_subprocess_exec(
            *self.command(),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.pid = proc.pid
        self.log.info("evaluator started as its own process (no secrets in its environment)", pid=proc.pid)
        last: list[str] = []
        reader = asyncio.ensure_future(self._read(proc.stdout, last) if proc.stdout else asyncio.sleep(0))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            waiter = asyncio.ensure_future(proc.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)  # drain: what is in hand is finished
                try:
                    async with asyncio.timeout(STOP_GRACE_S):
                        await waiter
                except TimeoutError:
                    proc.kill()
                    await waiter
            await reader
            code = proc.returncode
            if code and not self._ready.is_set() and not self._stop.is_set():
                # It could not start (a refused task, strict isolation, a bad option): its one line
                # ends the run as an in-process evaluator's refusal would.
                said = [ln.removeprefix("kfoundry: ") for ln in last if ln.startswith("kfoundry: ")]
                self.refused = TaskRefused(said[-1] if said else f"the evaluator process ended with status {code}")
                raise self.refused
            if code not in (0, None) and not self._stop.is_set():
                self.log.warning("evaluator process ended", exit_code=code, last=last[-5:])
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # stopped at once: what it held is redelivered
            raise
        finally:
            stopper.cancel()
            reader.cancel()
            self.state = ActorState.STOPPED
            self._ready.set()
            self._stopped.set()


def child_argv(options: ActorOptions, run_id: str, isolation: str) -> list[str]:
    """The ``kfoundry actor evaluator`` options that reproduce this run's evaluator."""
    argv = ["--run", run_id, "--device", str(options.device), "--runner", str(options.runner)]
    argv += ["--noop-delay", str(options.noop_delay_s), "--ack-wait", str(options.ack_wait_s)]
    argv += ["--isolation", str(isolation), "--log-level", options.log_level]
    if options.spares is not None:  # else the evaluator sizes itself, as the run did (same machine)
        argv += ["--spares", str(options.spares)]
    if options.host_memory_share is not None:
        argv += ["--host-memory-share", repr(options.host_memory_share)]
    concurrency = options.eval_concurrency or options.concurrency
    if concurrency:
        argv += ["--eval-concurrency", str(concurrency)]
    return argv
