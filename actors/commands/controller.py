"""The run controller: sets a run up, watches it, ends it, and writes its results.

Reads:  the run stream through its durable ``controller`` consumer (``actors.commands.progress``: counts,
        budget and summary survive an outage) and, at the end, the whole run stream (ordered
        consumer) for the report.
Writes: the ``RunSpec`` (``kf_runs`` KV; create-only: an id the server already knows is refused,
        ``actors.commands.run_registry``), expert configs it needs (``kf_experts`` KV), seed
        candidates, ``RunEnd`` on ``kf.<run>.end``.

Ending a run: on the candidate budget, every candidate issued has been evaluated (the islands'
shared quota, ``actors.runtime.quota``, issues exactly N); the controller waits briefly for the last
feedback, then ``RunEnd`` tells every actor of the run, islands included, to leave. On any other end
(the deadline, the token budget, speed-of-light) it does not wait: ``RunEnd`` lists the candidates
still in flight as cancelled, and evaluators stop them at once. A first interrupt waits briefly for
what is in flight (saying so); a second one stops at once and is recorded the same way. An
operator's ``RunStop`` in the run's stream (``kfoundry runs stop``) ends the run as a first
interrupt does.

Budgets kept (``actors.commands.ending``): the wall budget counts from the command's start, the run
ends early enough for its end to be over on the budget, the results are written while the actors
stop, and every step of the end is bounded; a first interrupt ends the process within 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import nats.errors
import nats.js.errors

from actors.commands.ending import (
    ACTOR_ABORT_S,
    ACTOR_STOP_S,
    in_flight_wait_s,
    stop_actors,
    stop_all_but_evaluators,
    stop_by,
    wind_down_s,
)
from actors.commands.launch import run_actors, run_local_actors
from actors.commands.outcome import RunOutcome
from actors.commands.progress import Progress, RunWatcher
from actors.commands.run_registry import refuse_used_run_id, register_new_run
from actors.commands.run_stream import publish_seeds, write_results
from actors.evolution.amdahl import breakdown_lines
from actors.kinds.registry import default_expert_config
from actors.report.model import checking_sentence, declines_sentence, unanswered_sentence
from actors.runtime.base import Actor
from actors.runtime.bus import Bus
from actors.runtime.errors import BusError, ConfigError, TaskInvalid
from actors.runtime.kv import get_expert_config, list_expert_configs, put_expert_config
from actors.runtime.logs import get_logger
from actors.runtime.options import RunOptions
from schemas import (
    ExpertConfig,
    ExpertKind,
    ExpertRef,
    RunEnd,
    RunSpec,
    StopReason,
    TorchOpsPolicy,
    subjects,
)

if TYPE_CHECKING:
    from actors.commands.signature import SignatureRun
    from actors.runtime.gpu_claim import GpuClaim

log = get_logger(__name__)
MISSING_GRACE_S = 30.0
"""How long a run waits for its islands to announce themselves before it names the missing ones
(it names them earlier, at its first result)."""


class RunController:
    """Runs one run end to end (see the module docstring)."""

    def __init__(
        self,
        *,
        spec: RunSpec,
        url: str,
        run_dir: Path,
        options: RunOptions,
        seeds: list[str] | None = None,
        progress: TextIO | None = None,
        gpu_claims: Sequence[GpuClaim] = (),
    ) -> None:
        self.spec = spec
        self.gpu_claims = tuple(gpu_claims)
        """GPUs claimed for this run's local evaluators, one evaluator each (none: ``--evaluators`` unpinned)."""
        self.url = url
        self.run_dir = run_dir
        self.options = options
        self.seeds = seeds or []
        self.out = progress
        self.progress = Progress(spec, wind_down_s=wind_down_s(spec))
        self.actors: list[Actor] = []
        self.evaluators: list[Actor] | None = None
        """This process's evaluators while prestarted and not yet running with the other actors
        (:meth:`prestart_evaluators`); ``None``: not built yet."""
        self.llm_diagnoser: ExpertConfig | None = None
        self.watcher: RunWatcher | None = None
        self.cancelled: tuple[str, ...] = ()
        self.dead_lettered: set[str] = set()
        """Candidates of the run an actor dead-lettered (read at the run's end)."""
        self.connect_timeout: float | None = options.connect_timeout_s
        self.interrupted_at: float | None = None
        """When the first SIGINT/SIGTERM arrived (wall clock), or an operator's stop was read."""
        self.ended_at: float | None = None
        """When the run's end was decided (wall clock)."""
        self.signature_run: SignatureRun | None = None
        """The task's description in this process (its forward run once), from the set-up on."""

    async def _setup(self, bus: Bus) -> None:
        from actors.commands.signature import SignatureRun, signature_within

        await refuse_used_run_id(bus, self.spec)  # at once, before the task's signature takes seconds
        self.signature_run = SignatureRun()
        task = await signature_within(self.spec.task, run=self.signature_run)
        self.spec = self.spec.model_copy(update={"task": task})
        if self.options.all_llm_experts:
            await self._add_llm_experts(bus)
        self.progress.spec = self.spec
        await bus.ensure_shared_streams()
        await register_new_run(bus, self.spec)  # the run's stream, and its spec if its id is still free

    async def _add_llm_experts(self, bus: Bus) -> None:
        """``--experts`` with no value: every configured LLM expert joins the template expert."""
        names = {e.name for e in self.spec.experts}
        llms = [c.name for c in await list_expert_configs(bus) if c.kind is ExpertKind.LLM and c.name not in names]
        experts = (*self.spec.experts, *(ExpertRef(name=n) for n in llms))
        self.spec = self.spec.model_copy(update={"experts": experts})
        log.info("experts of the run", experts=[e.name for e in experts])
        if not llms:
            self._say(
                "--experts: no LLM expert is configured (`kfoundry expert set NAME --kind llm ...`); template only"
            )

    async def _expert_configs(self, bus: Bus) -> list[ExpertConfig]:
        configs = []
        for ref in self.spec.experts:
            config = await get_expert_config(bus, ref.name)
            if config is None:
                config = default_expert_config(ref.name)
                await put_expert_config(bus, config)
            configs.append(config)
        return configs

    def _show(self, final: bool = False) -> None:
        if self.out is None:
            return
        if self.out.isatty():
            self.out.write("\r" + self.progress.line() + ("\n" if final else ""))
        else:
            self.out.write(self.progress.line() + "\n")
        self.out.flush()

    def _say(self, text: str) -> None:
        if self.out is not None:
            self.out.write(("\n" if self.out.isatty() else "") + text + "\n")
            self.out.flush()

    async def _wait(self, until: Any, *, timeout: float | None, stop: asyncio.Event | None = None) -> bool:
        """Wait until ``until()`` holds (re-checked whenever the stream moved), ``timeout`` passed
        or ``stop`` was set; returns whether ``until()`` held. Shows progress meanwhile."""
        watcher = self.watcher
        assert watcher is not None
        end = None if timeout is None else time.monotonic() + timeout
        last_line = time.monotonic()
        interval = 1.0 if self.out is not None and self.out.isatty() else 10.0
        while not until():
            if stop is not None and stop.is_set():
                return False
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            if now - last_line >= interval:
                self._show()
                last_line = now
            watcher.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await watcher.changed.wait()
        return True

    def _warn_missing_islands(self) -> bool:
        """Say once which expected islands nobody started (they get no migrants, and the run
        ends on its other budgets without them). Returns whether it has said it."""
        missing = self.progress.missing_islands()
        if not missing:
            return False
        started = sorted(self.progress.islands)
        hint = " ".join(
            f"`kfoundry actor island --island {i} --run {self.spec.run_id} --nats {self.url}`" for i in missing
        )
        text = (
            f"run {self.spec.run_id}: island(s) {', '.join(missing)} of the {self.spec.islands} it expects have not "
            f"started (running: {', '.join(started) or 'none'}); start them: {hint}"
        )
        log.warning("islands missing", missing=missing, running=started)
        if self.out is not None:
            self.out.write(text + "\n")
            self.out.flush()
        return True

    async def _wait_for_end(self, stop: asyncio.Event, actors_done: asyncio.Future[Any] | None) -> StopReason:
        reason: StopReason | None = None

        warned_missing = False

        def ended() -> bool:
            nonlocal reason, warned_missing
            if not warned_missing and (self.progress.evaluated or self.progress.elapsed >= MISSING_GRACE_S):
                warned_missing = self._warn_missing_islands()
            if stop.is_set() or (actors_done is not None and actors_done.done()):
                reason = StopReason.INTERRUPTED
            else:
                reason = self.progress.stop_reason()
            if reason is StopReason.INTERRUPTED and self.interrupted_at is None:  # an operator's stop
                self.interrupted_at = time.time()
            return reason is not None

        await self._wait(ended, timeout=None, stop=None)
        assert reason is not None
        return reason

    async def _finish_in_flight(self, reason: StopReason) -> None:
        """Before the islands are drained: let what is in flight end as the reason asks, bounded
        (``actors.commands.ending.in_flight_wait_s``)."""
        progress = self.progress
        if progress.stop_request is not None:  # `kfoundry runs stop`: ends the run as an interrupt does
            self._say(f"run {self.spec.run_id}: {progress.stop_request.sentence()}")
        wait = in_flight_wait_s(
            reason,
            now=time.time(),
            ends_at=progress.ends_at,
            interrupted_at=self.interrupted_at,
            eval_timeout_s=self.spec.eval_timeout_s,
        )
        if reason is StopReason.INTERRUPTED:
            if progress.in_flight and wait > 0:
                self._say(
                    f"interrupted: waiting up to {wait:.0f} s for {len(progress.in_flight)} candidate(s) in flight, "
                    "then cancelling them and writing the results (Ctrl-C again to stop at once)"
                )
            # What is in flight, and the last results' feedback (the islands' archives learn from it).
            await self._wait(
                lambda: not progress.in_flight and progress.results.keys() <= progress.feedback, timeout=wait
            )
        elif wait > 0:  # the last results' feedback
            await self._wait(lambda: progress.results.keys() <= progress.feedback, timeout=wait)

    async def _dead_lettered(self, bus: Bus) -> set[str]:
        """The ids of the run's candidates an actor gave up on (its dead letters on candidate subjects)."""
        from actors.runtime.observe import dead_letters

        prefix = subjects.candidates(self.spec.run_id).removesuffix("*.*")  # kf.<run>.cand.
        try:
            letters = await dead_letters(bus.nc, run_id=self.spec.run_id, timeout=2.0)
        except (nats.errors.Error, nats.js.errors.Error, BusError) as exc:
            log.warning("dead letters not read", error=str(exc))
            return set()
        return {d.subject.rsplit(".", 1)[1] for d in letters if d.subject.startswith(prefix)}

    def _run_end(self, reason: StopReason, cancelled: tuple[str, ...] = ()) -> RunEnd:
        best = self.progress.best
        return RunEnd(
            run_id=self.spec.run_id,
            reason=reason,
            best_candidate_id=best.candidate_id if best else None,
            best_fitness=best.fitness if best else None,
            evaluated=self.progress.evaluated,
            cancelled=cancelled,
        )

    async def _abort(self, bus: Bus) -> None:
        """A second interrupt: record the run's end (what was in flight is cancelled) at once."""
        if self.watcher is not None:  # bounded: it stops at once
            await self.watcher.catch_up(0.5)
        cancelled = tuple(sorted(self.progress.in_flight))
        self.cancelled = cancelled
        with contextlib.suppress(BusError, TimeoutError, nats.errors.Error):
            async with asyncio.timeout(2.0):
                await bus.publish_durable(
                    subjects.run_end(self.spec.run_id),
                    self._run_end(StopReason.INTERRUPTED, cancelled),
                    msg_id=f"end-{self.spec.run_id}",
                    attempts=1,
                )
        log.warning("run stopped at once", cancelled=len(cancelled), evaluated=self.progress.evaluated)
        self._say(
            f"run {self.spec.run_id} stopped at once after {self.progress.evaluated} evaluated: "
            f"{len(cancelled)} evaluation(s) in flight cancelled (recorded in its RunEnd); no report written"
        )

    def prestart_evaluators(self) -> None:
        """Build this process's evaluators and start their runners now, before anything else of the
        run (called inside the event loop): their fork servers' and sandbox probe's imports of torch
        (5-7 s on an H200 host) then overlap this process's own start-up, which waited for them."""
        if not self.options.local_actors or self.evaluators is not None:
            return
        from actors.commands.launch import local_evaluators
        from actors.kinds.evaluator import EvaluatorActor

        self.evaluators = local_evaluators(self.spec, self.options, self.url, self.gpu_claims)
        for actor in self.evaluators:
            if isinstance(actor, EvaluatorActor):
                actor.prestart()

    async def close_prestarted(self) -> None:
        """Close the prestarted evaluators' runners where the actors never ran (the run ended first)."""
        from actors.kinds.evaluator import EvaluatorActor

        evaluators, self.evaluators = self.evaluators or [], []
        closing = [a for a in evaluators if isinstance(a, EvaluatorActor)]
        outcomes = await asyncio.gather(*(a.runner.aclose() for a in closing), return_exceptions=True)
        for actor, outcome in zip(closing, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # the run's own error goes on; this one is logged
                log.error("prestarted evaluator not closed cleanly", actor=actor.actor_id, error=repr(outcome))

    def prefetch_analysis(self) -> None:
        """Start the template expert's analysis of the task now, beside the evaluators' start (called
        inside the event loop): the expert of this process takes its answer at its first request
        (:mod:`actors.experts.analysis_child`). Its actors came up about 5 s after the process started
        on an H100 host, and only then did the expert start the child whose trace its first proposals
        waited for."""
        if not self.options.local_actors or not any(e.name == "template" for e in self.spec.experts):
            return
        from actors.experts import analysis_child
        from actors.runtime import task_confine

        keep = "all" if self.spec.torch_ops is TorchOpsPolicy.REFERENCE else "layout"  # as the expert asks
        analysis_child.prefetch(self.spec.task.source, keep, task_confine.wanted())
        log.info("template analysis started ahead", keep_torch=keep)

    async def run(self, stop: asyncio.Event) -> RunOutcome:
        """Set up, run until a stop condition, end the run and write its results."""
        from actors.experts import analysis_child

        self.prestart_evaluators()
        self.prefetch_analysis()
        try:
            bus = await Bus.connect(
                self.url,
                name="kfoundry-run",
                actor_id=f"controller-{self.spec.run_id}",
                connect_timeout=self.connect_timeout,
            )
            return await self._run(bus, stop)
        finally:
            await analysis_child.cancel_prefetches()  # not taken: the run ended first, or no expert asked
            if self.evaluators:  # built, never run (the run ended while setting up)
                await self.close_prestarted()

    async def _run(self, bus: Bus, stop: asyncio.Event) -> RunOutcome:
        actors_task: asyncio.Task[None] | None = None
        actors_stop = asyncio.Event()
        aborted = False
        stopping_actors = False
        # The first SIGINT/SIGTERM's time: the run ends within seconds of it, whatever it is doing then.
        interrupt = asyncio.ensure_future(stop.wait())
        interrupt.add_done_callback(self._interrupted)
        try:
            await self._setup(bus)
            self.watcher = RunWatcher(bus, self.progress)
            await self.watcher.start()
            if self.out is not None:
                self.out.write(f"run {self.spec.run_id}: task {self.spec.task.name} on {self.spec.device}, ")
                self.out.write(f"{self.spec.islands} islands, NATS {self.url}, results in {self.run_dir}\n")
                self.out.write(f"watch it: kfoundry tap --run {self.spec.run_id} --nats {self.url}\n")
                if self.gpu_claims and self.options.local_actors:
                    gpus = ", ".join(f"{c.gpu.index} ({c.gpu.name})" for c in self.gpu_claims)
                    self.out.write(f"evaluators: one per GPU on GPU {gpus}\n")
            if self.options.local_actors and not stop.is_set():  # interrupted while setting up: none started
                configs = await self._expert_configs(bus)
                wanted = self.options.actors.llm_diagnoser
                if wanted:
                    self.llm_diagnoser = await get_expert_config(bus, wanted)
                    if self.llm_diagnoser is None:
                        raise ConfigError(f"--llm-diagnoser {wanted}: no such expert configuration")
                self.actors = run_local_actors(
                    self.spec, self.options, self.url, configs, self.llm_diagnoser, self.gpu_claims, self.evaluators
                )
                self.evaluators = []  # handed over: they stop with the other actors
                if self.options.metrics_port is not None:  # its server was bound by `kfoundry run`
                    from actors.runtime.metrics import collect_actors

                    collect_actors(self.actors)
                actors_task = asyncio.create_task(run_actors(self.actors, actors_stop))
                # its failure is raised where it is awaited; a run that refused its task before
                # awaiting it (it ended on the refusal) logged "Task exception was never retrieved"
                actors_task.add_done_callback(_retrieve)
                # Actors that start slowly do not hold the run past its deadline (less its wind-down).
                deadline = self.progress.ends_at
                ready: asyncio.Future[Any] = asyncio.ensure_future(
                    asyncio.gather(*(a.wait_ready() for a in self.actors))
                )
                # An interrupt during start-up ends the wait too.
                stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
                await asyncio.wait(
                    [ready, stopped],
                    timeout=None if deadline is None else max(0.0, deadline - time.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for waiter in (ready, stopped):
                    if not waiter.done():
                        waiter.cancel()
                    # an actor stopped while setting up ends the gather with its CancelledError:
                    # taken here, not logged as "never retrieved" when the future is collected
                    waiter.add_done_callback(_retrieve)
                refused = next((r for a in self.actors if (r := getattr(a, "refused", None)) is not None), None)
                if refused is not None:  # the task cannot be evaluated here: stop everything at once
                    aborted = True
                    raise refused
            await publish_seeds(bus, self.spec, self.seeds)
            try:
                reason = await self._wait_for_end(stop, actors_task)
                self.ended_at = time.time()
                if self.signature_run is not None:
                    self.signature_run.stop()  # a forward still spinning would hold the GIL against the end
                await self.watcher.catch_up(1.0)  # what is in flight: every candidate already issued
                log.info(
                    "run ending", reason=str(reason), evaluated=self.progress.evaluated, deadline=self.progress.deadline
                )
                await self._finish_in_flight(reason)
                until = stop_by(
                    reason, now=time.time(), deadline=self.progress.deadline, interrupted_at=self.interrupted_at
                )
                # Whatever is still in flight now is not waited for: the deadline passed, the goal
                # was reached, or the interrupt's grace ended. Evaluators stop it at once.
                # A candidate an evaluator gave up on (dead-lettered) is not in flight: it is said apart.
                self.dead_lettered = await self._dead_lettered(bus)
                self.cancelled = tuple(sorted(self.progress.in_flight - self.dead_lettered))
                # RunEnd first: every actor of the run, islands included, leaves on it at once, side
                # by side. Islands drained before it waited for feedback that the evaluators, told
                # only afterwards, were about to cancel: 2.15 s of the 9 s that 40 s runs on an H200
                # overran their budget (run logs of KernelBench L1-63); on the CPU a 20 s run's end
                # went from 3.8 s to 1.6 s past its deadline with RunEnd first.
                end = self._run_end(reason, self.cancelled)
                await bus.publish_durable(subjects.run_end(self.spec.run_id), end, msg_id=f"end-{self.spec.run_id}")
                await stop_all_but_evaluators(self.actors, reason, until, actors_stop)
            except asyncio.CancelledError:
                aborted = True
                await self._abort(bus)
                raise
            if self.cancelled:
                self._say(f"{len(self.cancelled)} evaluation(s) in flight cancelled at the end of the run")
            if self.dead_lettered:
                self._say(
                    f"{len(self.dead_lettered)} candidate(s) dead-lettered: an evaluator gave up on them "
                    f"(kfoundry dlq --run {self.spec.run_id} says why)"
                )
            # The results are written while the evaluators (closing their worker processes) stop: the
            # report is built from the run's stream and the islands' saved archives, complete now.
            stopping: asyncio.Task[None] | None = None
            if actors_task is not None:
                stopping_actors = True
                # If the event loop itself is blocked (no timeout can fire), say where: every
                # thread's stack goes to stderr once the actors should long have stopped.
                faulthandler.dump_traceback_later(max(0.0, until - time.time()) + ACTOR_ABORT_S + 15.0, exit=False)
                stopping = asyncio.create_task(self._stop_actors(actors_task, until))
            try:
                await self.watcher.stop()
                self._show(final=True)
                log.info("run ended, writing results", reason=str(reason), evaluated=self.progress.evaluated)
                report = await write_results(bus, self.spec, self.progress.best, self.run_dir)
            except asyncio.CancelledError:  # a second interrupt while the results were being written
                aborted = True
                if actors_task is not None:
                    actors_task.cancel()
                raise
            finally:
                if stopping is not None:
                    try:
                        await stopping  # an actor's failure is raised here, once the results are written
                    finally:
                        faulthandler.cancel_dump_traceback_later()
            if (hang := self._hang()) is not None:
                raise hang
            best = self.progress.best
            return RunOutcome(
                run_id=self.spec.run_id,
                reason=reason,
                evaluated=self.progress.evaluated,
                statuses=dict(self.progress.statuses),
                best_fitness=best.fitness if best else None,
                best_candidate_id=best.candidate_id if best else None,
                run_dir=self.run_dir,
                device=self.spec.device,
                cancelled=len(self.cancelled),
                # the report's: derived from the run's compiled/eager ratio where the best was
                # timed before the torch.compile baseline was ready
                best_vs_compiled=report.best.speedup_vs_compiled if report.best else None,
                best_compiled_derived=report.best is not None and report.best.compiled_derived is not None,
                declined=declines_sentence(report.islands, self.spec.torch_ops)
                or self._checking()
                or unanswered_sentence(report.experts),
                dead_lettered=len(self.dead_lettered),
                reference_nonfinite_share=self.progress.reference_nonfinite_share,
                held_out=report.best.held_out if report.best else (),
                first_verdict=report.first_verdict.sentence() if report.first_verdict else None,
                time_split=tuple(breakdown_lines(report.best.time_breakdown, limit=4))
                if report.best is not None and report.best.time_breakdown is not None
                else (),
            )
        finally:
            interrupt.cancel()
            actors_stop.set()
            if actors_task is not None and not actors_task.done() and not stopping_actors:
                if aborted:
                    actors_task.cancel()  # every local actor stops at once too
                await self._stop_actors(actors_task, time.time() + ACTOR_STOP_S)
            if self.watcher is not None:
                await self.watcher.stop()
            await bus.close()

    def _checking(self) -> str | None:
        """Where a local evaluator was still checking the task at the end (a reference whose first
        run had not returned, a 20 s run's budget before its 30 s bound): what the end line says."""
        from gpu_runner.config import RunnerConfig

        since = [s for a in self.actors if (s := getattr(a, "checking_since", None)) is not None]
        return checking_sentence(time.time() - min(since), RunnerConfig.reference_first_run_s) if since else None

    def _hang(self) -> TaskInvalid | None:
        """Where the run ended while a local evaluator still checked the task and the task's
        description here (its forward, run once on the meta device or the CPU) had not returned
        past the time it was given: a forward that does not return (a 20 s run of one ended before
        the evaluator's 30 s bound, status 1). The run is refused as a task that does not work (2)."""
        from actors.commands.signature import SIGNATURE_WAIT_S
        from gpu_runner.config import RunnerConfig

        stuck = self.signature_run.unreturned_s() if self.signature_run is not None else None
        # a local evaluator still starting counts as one that has not checked the task: with the
        # forward spinning in this process's thread (holding the GIL), its set-up can start past a
        # 20 s budget on a loaded host (the run then ended as "no expert answered", status 1)
        unchecked = any(getattr(a, "task_checked", True) is False for a in self.actors)
        if stuck is None or stuck <= SIGNATURE_WAIT_S or not unchecked:
            return None
        return TaskInvalid(
            f"the task does not work: its forward had not returned after {stuck:.0f} s when the run ended "
            f"(run once here to describe the task, given {SIGNATURE_WAIT_S:g} s; the evaluator, still checking "
            f"it, refuses one that never returns after {RunnerConfig.reference_first_run_s:g} s and names the "
            "line it is stuck on: give the run more --seconds to see it)"
        )

    async def _stop_actors(self, task: asyncio.Task[None], until: float) -> None:
        await stop_actors(task, self.actors, until, ended_at=self.ended_at, say=self._say)

    def _interrupted(self, waiter: asyncio.Future[Any]) -> None:
        if not waiter.cancelled() and self.interrupted_at is None:
            self.interrupted_at = time.time()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Take a finished future's outcome (a start-up wait given up on ends however its awaitables do)."""
    if not future.cancelled():
        future.exception()
