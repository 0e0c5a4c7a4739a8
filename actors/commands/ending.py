"""When each step of a run's end must be over, so that ``kfoundry run`` exits on its budget.

A user who runs ``kfoundry run TASK --seconds S`` times the command: the process must be gone,
its results written, within a second or two of S, and within 5 s of a first SIGINT/SIGTERM. So:

- the wall budget counts from the process's start (``RunSpec.created_at``, set by ``kfoundry run``);
- the run ends :func:`wind_down_s` before its deadline (``Progress.ends_at``): the time its end
  takes, from ``RunEnd`` to the process's exit;
- every wait of the end is bounded by :func:`stop_by`, past which the local actors still stopping
  are stopped at once (:func:`stop_actors`); the results are written while they stop.

Reads and writes nothing on the bus: the controller (``actors.commands.controller``) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from actors.runtime.base import Actor
from actors.runtime.logs import get_logger
from schemas import ActorKind, ActorState, DeviceChoice, RunSpec, StopReason

log = get_logger(__name__)

ACTOR_STOP_S = 20.0
"""Longest the local actors may drain after a run ended on a budget other than time (its
candidates, tokens, speed-of-light) before they are stopped at once."""
ACTOR_ABORT_S = 2.0
"""Longest a stop at once may take before the run goes on without the actors (their unfinished
work is named; the evaluator's janitor sweeps its processes once this one has exited)."""

WIND_DOWN_S = {DeviceChoice.CPU: 1.5, DeviceChoice.CUDA: 3.0, DeviceChoice.AUTO: 3.0}
"""How long before its wall deadline a run ends: the time its end takes, from ``RunEnd`` to the
process's exit (the islands' and the evaluators' stop, the results written beside them, the
embedded server released). CPU: measured on a 2-core host (bench/results/budget_cpu.md). GPU: an
estimate from an H200 run's log, whose evaluator took 3.2-3.6 s to stop (its fork servers' own
exits, 0.7-0.8 s each on the CPU host, are gone since). Measured since on an H200 (``kfoundry
bench``, 40 s runs, 2026-12-03, 19 runs): every process exited 0.1-2 s before its budget."""
STOP_PAST_DEADLINE_S = 0.5
"""How long past the wall deadline the local actors may still be stopping before they are stopped
at once (the process then exits within about a second, results written)."""

INTERRUPT_WAIT_S = 1.0
"""After a first SIGINT/SIGTERM (or ``kfoundry runs stop``), how long the candidates in flight may
finish, and the last feedback arrive, before what is in flight is cancelled (with 2 s, a CPU run's
evaluator, closing under load, was still stopping at 3.5 s and was stopped at once)."""
INTERRUPT_END_S = 3.5
"""After a first SIGINT/SIGTERM, by when the local actors must have stopped (else at once): the
process ends within 5 s of the signal with its results written (a CPU run took 13 s, with a 6 s
wait for what was in flight and the actors' stop after it)."""


def wind_down_s(spec: RunSpec) -> float:
    """How long before its wall deadline ``spec``'s run ends (:data:`WIND_DOWN_S` for its device, at
    most a quarter of the budget)."""
    reserve = WIND_DOWN_S.get(spec.device, WIND_DOWN_S[DeviceChoice.AUTO])
    wall = spec.budget.wall_s
    return reserve if wall is None else min(reserve, wall / 4)


def stop_by(reason: StopReason, *, now: float, deadline: float | None, interrupted_at: float | None) -> float:
    """When (wall clock) the local actors must have stopped once the run ended at ``now`` for
    ``reason``, else they are stopped at once: a little past the wall deadline, a few seconds after
    an interrupt, or :data:`ACTOR_STOP_S` from now, whichever comes first."""
    bounds = [now + ACTOR_STOP_S]
    if deadline is not None:
        bounds.append(max(now, deadline) + STOP_PAST_DEADLINE_S)
    if reason is StopReason.INTERRUPTED:
        bounds.append((interrupted_at or now) + INTERRUPT_END_S)
    return min(bounds)


def in_flight_wait_s(
    reason: StopReason, *, now: float, ends_at: float | None, interrupted_at: float | None, eval_timeout_s: float
) -> float:
    """How long the run may wait, once it ended for ``reason``, for what is in flight (an interrupt:
    :data:`INTERRUPT_WAIT_S` from the signal) or for the last results' feedback (the other budgets
    but time: up to 5 s), never past ``ends_at``, when the wall budget's wind-down begins."""
    if reason is StopReason.WALL_TIME:
        return 0.0
    left = 5.0 if ends_at is None else min(5.0, ends_at - now)
    if reason is StopReason.INTERRUPTED:
        left = min(left, (interrupted_at or now) + INTERRUPT_WAIT_S - now, eval_timeout_s)
    return max(0.0, left)


async def stop_all_but_evaluators(
    actors: Sequence[Actor], reason: StopReason, until: float, stop_all: asyncio.Event
) -> None:
    """After ``RunEnd`` (which every actor of the run, remote islands included, leaves on): the
    local islands are told to stop and why, and waited for; then every other local actor, through
    ``stop_all`` (the experts and the curator serve the islands to the end); the run's own actors
    but the evaluators (diagnosers, migrators) are waited for too; all until ``until``. They stop
    within a second, and what the report reads is then complete: the islands' saved archives, the
    diagnoses and feedback of the last results, the migrations (the islands' unread feedback stays
    in their durable consumers). The evaluators, closing their worker processes (seconds on a GPU
    host), and the actors that serve no one run (experts, curator: nothing of theirs is in the
    report) stop while the results are written (:func:`stop_actors`)."""
    why = f"run ended ({reason})"
    islands = [a for a in actors if a.kind is ActorKind.ISLAND]
    for actor in islands:
        actor.request_stop(why)
    others = [a for a in actors if a.run_id is not None and a.kind not in (ActorKind.ISLAND, ActorKind.EVALUATOR)]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, min(10.0, until - time.time()))):
            for actor in islands:
                await actor.wait_stopped()
    stop_all.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, min(10.0, until - time.time()))):
            for actor in others:
                await actor.wait_stopped()


async def stop_actors(
    task: asyncio.Task[None],
    actors: Sequence[Actor],
    until: float,
    *,
    ended_at: float | None,
    say: Callable[[str], None],
) -> None:
    """Wait for the local actors (``task`` runs them) to drain until ``until`` (wall clock); then
    stop the rest at once, and go on without them after :data:`ACTOR_ABORT_S`.

    Their results are in the run's stream already (the report is built from it), so an actor
    whose drain hangs (seen on an H100: an evaluator whose cancelled evaluations never returned
    held the run 400 s past its budget) or is slow (an evaluator closing its worker processes:
    3.2-3.6 s on an H200 host) costs nothing but its unfinished work, which is named. An actor's
    failure is raised."""
    given = time.time()
    done, _ = await asyncio.wait([task], timeout=max(0.0, until - given))
    if not done:
        took = time.time() - (ended_at or given)
        still = [f"{a.actor_id} ({a.state.value})" for a in actors if a.state is not ActorState.STOPPED]
        log.warning("actors did not stop in time: cancelled", seconds=round(took, 2), actors=still)
        say(f"{len(still)} actor(s) still stopping {took:.1f} s after the run ended, cancelled: " + ", ".join(still))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=ACTOR_ABORT_S)
        if not done:
            log.warning("actors did not stop when cancelled either; going on without them", seconds=ACTOR_ABORT_S)
    if done and not task.cancelled() and (exc := task.exception()) is not None:
        raise exc
