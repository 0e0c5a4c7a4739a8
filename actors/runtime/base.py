"""The ``Actor`` base: lifecycle, discovery, control, logs and statistics.

An actor connects its own :class:`~actors.runtime.bus.Bus`, registers a ``nats.micro`` service (so
``$SRV.PING/INFO/STATS`` find it, with its statistics in the stats' ``data``), serves its control
endpoint ``kf.ctl.<actor-id>`` (``Control`` → ``ActorInfo``), then calls :meth:`Actor.setup`
where a subclass subscribes, consumes and serves. It runs until :meth:`Actor.request_stop` (a
``drain`` control message, SIGTERM through the launcher, or the subclass itself), then calls
:meth:`Actor.on_drain` and closes the bus in the order that loses nothing.

A subclass overrides ``setup`` and, where it has them, ``on_drain``, ``on_pause``/``on_resume``
and ``extra_stats``; every hook has a documented no-op default.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import os
import socket
import time
import uuid
from typing import Any, ClassVar

import structlog
from nats.micro.service import Service

from actors.runtime.bus import Bus
from actors.runtime.errors import BusError, ConfigError
from actors.runtime.kv import wait_for_run
from actors.runtime.logs import get_logger
from actors.runtime.stats import StatsRecorder
from schemas import ActorInfo, ActorKind, ActorState, ActorStats, Control, ControlAction, RunEnd, subjects


def new_actor_id(kind: ActorKind | str) -> str:
    """A readable unique actor id, e.g. ``evaluator-3f2a9c1d``."""
    return f"{kind}-{uuid.uuid4().hex[:8]}"


_unfreeze_at_exit = False


def _freeze_what_set_up_left() -> None:
    """What set-up left (imports: torch alone is some 200,000 objects) lives as long as the
    process: out of the collector's sight, so a full collection, which runs every few seconds
    under load, walks only what the actor makes while it serves. At exit it is handed back, so
    the interpreter's last collection frees it as before (left frozen, extension modules such as
    Triton's report every object of theirs still alive as a leak)."""
    global _unfreeze_at_exit
    gc.freeze()
    if not _unfreeze_at_exit:
        _unfreeze_at_exit = True
        atexit.register(gc.unfreeze)


class Actor:
    """Base of every actor kind (see the module docstring)."""

    kind: ClassVar[ActorKind]
    version: ClassVar[str] = "0.1.0"
    description: ClassVar[str] = ""

    def __init__(
        self,
        *,
        nats_url: str,
        run_id: str | None,
        actor_id: str | None = None,
        island: str | None = None,
        service_name: str | None = None,
        version: str | None = None,
        wait_for_run_s: float = 600.0,
    ) -> None:
        self.nats_url = nats_url
        self.wait_for_run_s = wait_for_run_s
        """How long to wait for the run to be registered (an actor started before its run)."""
        self.run_id = run_id
        self.actor_id = actor_id or new_actor_id(self.kind)
        subjects.control(self.actor_id)  # validates the id
        self.island = island
        self.service_name = service_name or f"kf-{self.kind}"
        if version is not None:
            self.version = version  # type: ignore[misc]
        self.stats = StatsRecorder()
        self.state = ActorState.STARTING
        self.started_at = time.time()
        self.stopped_at: float | None = None
        """When the actor had stopped (wall clock)."""
        self.host = socket.gethostname()
        self._bus: Bus | None = None
        self._service: Service | None = None
        self._stop = asyncio.Event()
        self._stopped = asyncio.Event()
        self._ready = asyncio.Event()
        self.stop_reason = ""
        self.run_ended = False
        """Set when the run's ``RunEnd`` arrived: the other actors of the run are leaving."""
        self.log = get_logger(f"kf.{self.kind}").bind(actor=self.actor_id, run=self.run_id, island=island)

    # -- hooks ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Subscribe, consume and serve. Called once connected and registered. No-op default."""

    async def on_drain(self) -> None:
        """Called after a stop is requested, before the bus drains. No-op default."""

    async def teardown(self) -> None:
        """Called after the bus has closed: release what the actor owns. No-op default."""

    async def on_pause(self) -> None:
        """Stop taking new work (in-hand work continues). Default: pause the bus's consumers."""
        self.bus.pause()

    async def on_resume(self) -> None:
        """Take work again. Default: resume the bus's consumers."""
        self.bus.resume()

    def extra_stats(self) -> dict[str, float | int | str | None]:
        """Actor-specific counters for the statistics snapshot. Default: none."""
        return {}

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def bus(self) -> Bus:
        """The actor's bus (connected in :meth:`run`)."""
        if self._bus is None:
            raise RuntimeError(f"{self.actor_id}: bus used before run() connected it")
        return self._bus

    @property
    def service(self) -> Service:
        """The actor's ``nats.micro`` service (registered in :meth:`run`)."""
        if self._service is None:
            raise RuntimeError(f"{self.actor_id}: service used before run() registered it")
        return self._service

    @property
    def rid(self) -> str:
        """The run id of an actor that serves one run."""
        if self.run_id is None:
            raise RuntimeError(f"{self.actor_id} serves no run")
        return self.run_id

    @property
    def dlq_run(self) -> str:
        return self.run_id or subjects.NO_RUN

    async def run(self) -> None:
        """Connect (retrying until stopped), wait for the run, register, set up, serve until asked
        to stop, then drain and close."""
        try:
            self._bus = await Bus.connect(
                self.nats_url,
                name=self.actor_id,
                actor_id=self.actor_id,
                dlq_run=self.dlq_run,
                stats=self.stats,
                connect_timeout=None,
                stop=self._stop,
                kind=str(self.kind),
            )
        except BusError:
            if not self._stop.is_set():
                raise
            self._stopped_early()
            return
        try:
            if self.run_id is not None:
                try:
                    await wait_for_run(self.bus, self.run_id, wait_s=self.wait_for_run_s, stop=self._stop)
                except ConfigError:
                    if not self._stop.is_set():
                        raise
                    return
            if self._stop.is_set():
                return
            with structlog.contextvars.bound_contextvars(actor=self.actor_id, run=self.run_id):
                service = self._service = await self.bus.add_service(
                    name=self.service_name,
                    version=self.version,
                    description=self.description or f"Kernel Foundry {self.kind}",
                    metadata=self._metadata(),
                    stats_handler=self._stats_data,
                )
                await self.bus.serve(
                    service,
                    name="control",
                    subject=subjects.control(self.actor_id),
                    request_type=Control,
                    handler=self._on_control,
                    queue_group=self.actor_id,
                    concurrency=4,
                    record_stats=False,
                )
                if self.run_id is not None:
                    await self.bus.subscribe(subjects.run_end(self.run_id), RunEnd, self._on_run_end, concurrency=1)
                if not await self._set_up_unless_stopped():
                    self.log.info("actor stopped while setting up", reason=self.stop_reason)
                    return
                self.state = ActorState.RUNNING
                self._ready.set()
                _freeze_what_set_up_left()
                self.log.info("actor running", kind=str(self.kind), version=self.version)
                await self._stop.wait()
                self.state = ActorState.DRAINING
                self.log.info(
                    "actor draining: finishing the messages in hand (a second Ctrl-C stops at once)",
                    reason=self.stop_reason,
                    in_hand=self.bus.in_hand,
                )
                try:
                    async with asyncio.timeout(self.drain_timeout()):
                        await self.on_drain()
                except TimeoutError:
                    # A drain must end: an actor that never stops would hold its whole process.
                    self.log.warning("drain timed out", seconds=self.drain_timeout())
        except asyncio.CancelledError:
            # Stopped at once (a second interrupt): cancel what is in hand, it stays in its
            # stream unacknowledged and is redelivered to whoever serves the run next.
            n = await self.bus.abort()
            self.log.warning("actor stopped at once", cancelled=n)
            raise
        finally:
            try:
                async with asyncio.timeout(60.0):
                    await self.bus.close()
            except TimeoutError:
                # A handler that never returns must not keep the actor (and its process) alive;
                # what it held unacknowledged is redelivered by JetStream.
                self.log.warning("bus close timed out after 60 s; closing the connection")
                with contextlib.suppress(Exception):
                    await self.bus.nc.close()
            finally:
                try:
                    # Its own counters as they are now, before the teardown closes what they count
                    # (``extra`` is otherwise refreshed only by a stats request: a swapped-in expert's
                    # last word said it had answered none).
                    final = self.snapshot()
                finally:
                    await self.teardown()
            self.state = ActorState.STOPPED
            self.stopped_at = time.time()
            self._ready.set()
            self._stopped.set()
            self.log.info("actor stopped", reason=self.stop_reason, **final.model_dump())

    async def _set_up_unless_stopped(self) -> bool:
        """:meth:`setup`, cancelled when a stop is requested first (a run that ends while its
        evaluator is still starting must not wait for the start); whether it completed."""
        setup = asyncio.create_task(self.setup())
        stopped = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({setup, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not setup.done():
                setup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await setup
        if setup.cancelled():
            return False
        setup.result()  # a failed setup raises here, as an awaited one did
        return True

    def _stopped_early(self) -> None:
        self.state = ActorState.STOPPED
        self.stopped_at = time.time()
        self._ready.set()
        self._stopped.set()
        self.log.info("actor stopped before it started", reason=self.stop_reason)

    def drain_timeout(self) -> float:
        """The longest :meth:`on_drain` may take before the actor stops anyway."""
        return 600.0

    def request_stop(self, reason: str) -> None:
        """Ask the actor to drain and stop (idempotent; safe from signal handlers)."""
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    async def wait_ready(self) -> None:
        """Wait until :meth:`setup` has finished (or the actor stopped)."""
        await self._ready.wait()

    async def wait_stopped(self) -> None:
        """Wait until the actor has fully stopped."""
        await self._stopped.wait()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- discovery and control -----------------------------------------------------------

    def _metadata(self) -> dict[str, str]:
        meta = {
            "actor_id": self.actor_id,
            "kind": str(self.kind),
            "host": self.host,
            "pid": str(os.getpid()),
            "run_id": self.run_id or "",
        }
        if self.island:
            meta["island"] = self.island
        return meta

    def snapshot(self) -> ActorStats:
        """The statistics snapshot with the actor's own counters."""
        self.stats.extra = dict(self.extra_stats())
        return self.stats.snapshot()

    def info(self) -> ActorInfo:
        """Who this actor is and how it is doing."""
        return ActorInfo(
            actor_id=self.actor_id,
            kind=self.kind,
            name=self.service_name,
            version=self.version,
            host=self.host,
            pid=os.getpid(),
            run_id=self.run_id,
            island=self.island,
            state=self.state,
            started_at=self.started_at,
            stats=self.snapshot(),
        )

    async def _on_run_end(self, end: RunEnd, _delivery: Any) -> None:
        self.run_ended = True
        self.request_stop(f"run ended ({end.reason})")

    def _stats_data(self, _endpoint_stats: Any) -> dict[str, Any]:
        return dict(self.snapshot().model_dump(mode="json"))

    async def _on_control(self, control: Control) -> ActorInfo:
        self.log.info("control", action=str(control.action), reason=control.reason)
        if control.action is ControlAction.DRAIN:
            self.request_stop(control.reason or "drain requested")
            self.state = ActorState.DRAINING
        elif control.action is ControlAction.PAUSE and self.state is ActorState.RUNNING:
            await self.on_pause()
            self.state = ActorState.PAUSED
        elif control.action is ControlAction.RESUME and self.state is ActorState.PAUSED:
            await self.on_resume()
            self.state = ActorState.RUNNING
        return self.info()
