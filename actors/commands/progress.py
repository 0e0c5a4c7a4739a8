"""The run's progress, counted from its JetStream stream: what the controller decides on.

``RunWatcher`` reads the run stream ``KF_RUN_<run>`` (every ``kf.<run>.>`` subject) through the
controller's durable pull consumer ``controller``: a NATS outage or a controller reconnect loses
nothing and counts nothing twice (the consumer resumes where its acknowledgements stopped, and
``Progress`` keys every count by candidate id). It reads:

- ``kf.<run>.cand.<island>.<candidate>``: candidates issued (the id is in the subject; not decoded);
- ``kf.<run>.result.<island>`` (``EvalResult``): evaluated, verdicts, the best;
- ``kf.<run>.feedback.<island>``: feedback delivered (the id is in the ``Nats-Msg-Id``);
- ``kf.<run>.status.<island>`` (``IslandStatus``): in flight, tokens, islands that stopped;
- ``kf.<run>.stop`` (``RunStop``): an operator asked the run to stop (``kfoundry runs stop``).

``Progress.stop_reason`` is the run's budget: candidates evaluated, the deadline
(``RunSpec.deadline``, less the time the run's end takes: ``Progress.ends_at``), tokens,
speed-of-light, or every island stopped with nothing left in flight; or an operator's stop
request (the run ends as on an interrupt).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import nats.errors
import nats.js.errors
import pydantic
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from actors.runtime.bus import MSG_ID_HEADER, Bus, settled
from actors.runtime.gpu_usage import gpu_usage, progress_part
from actors.runtime.logs import get_logger
from schemas import DeadLetter, EvalResult, IslandStatus, RunSpec, RunStop, StopReason, subjects

log = get_logger(__name__)

CONTROLLER_CONSUMER = "controller"


class Progress:
    """Counts what the run produced, by candidate id, and renders a progress line."""

    def __init__(self, spec: RunSpec, *, wind_down_s: float = 0.0) -> None:
        self.spec = spec
        self.wind_down_s = wind_down_s
        """How long before the wall deadline the run ends, so that its end is over by then."""
        self.issued: set[str] = set()
        self.results: dict[str, EvalResult] = {}
        self.dead_lettered: set[str] = set()
        """Candidates an actor dead-lettered while the run was watched (``kf.dlq.<run>``)."""
        self.feedback: set[str] = set()
        self.statuses: Counter[str] = Counter()
        self.best: EvalResult | None = None
        self.islands: dict[str, IslandStatus] = {}
        self.stop_request: RunStop | None = None
        """The first operator's request that the run stop, once one is read."""

    @property
    def evaluated(self) -> int:
        return len(self.results)

    @property
    def reference_nonfinite_share(self) -> float | None:
        """Where the reference's outputs hold NaN/Inf, their share (from any verdict that says so)."""
        for result in self.results.values():
            share = result.correctness.reference_nonfinite_share if result.correctness else None
            if share:
                return share
        return None

    @property
    def in_flight(self) -> set[str]:
        """Candidates issued whose result has not arrived, and that no actor gave up on (a
        dead-lettered candidate is never judged: counted apart, not as in flight for ever)."""
        return self.issued - self.results.keys() - self.dead_lettered

    @property
    def deadline(self) -> float | None:
        """When the wall budget ends (``RunSpec.deadline``)."""
        return self.spec.deadline

    @property
    def ends_at(self) -> float | None:
        """When the run ends for its wall budget: its deadline less the time its end takes."""
        deadline = self.spec.deadline
        return None if deadline is None else deadline - self.wind_down_s

    @property
    def elapsed(self) -> float:
        return time.time() - self.spec.created_at

    def on_candidate(self, candidate_id: str) -> None:
        self.issued.add(candidate_id)

    def on_dead_letter(self, candidate_id: str) -> None:
        if candidate_id not in self.results:
            self.dead_lettered.add(candidate_id)

    def on_result(self, result: EvalResult) -> None:
        if result.candidate_id in self.results:
            return
        self.issued.add(result.candidate_id)
        self.results[result.candidate_id] = result
        self.statuses[result.status.value] += 1
        fitness = result.fitness
        if fitness is not None and (self.best is None or fitness > (self.best.fitness or 0.0)):
            self.best = result

    def on_feedback(self, candidate_id: str) -> None:
        self.feedback.add(candidate_id)

    def on_status(self, status: IslandStatus) -> None:
        old = self.islands.get(status.island)
        if old is None or status.at >= old.at:
            self.islands[status.island] = status

    def on_stop(self, request: RunStop) -> None:
        if self.stop_request is None:
            self.stop_request = request

    def line(self) -> str:
        budget = self.spec.budget
        total = f"/{budget.candidates}" if budget.candidates else ""
        best = f"{self.best.fitness:.3g}x ({self.best.island})" if self.best and self.best.fitness else "-"
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.statuses.items()))
        if self.dead_lettered:
            counts += f" dead-lettered={len(self.dead_lettered)}"
        gpus = progress_part(gpu_usage(self.results.values()))
        return (
            f"[{self.elapsed:6.0f}s] evaluated {self.evaluated}{total}  best {best}  "
            f"in flight {len(self.in_flight)}  {counts}" + (f"  {gpus}" if gpus else "")
        )

    def missing_islands(self) -> list[str]:
        """Islands the run expects (``i0`` … ``i<N-1>``) that have not announced themselves."""
        return [i for i in self.spec.island_names() if i not in self.islands]

    def stop_reason(self, now: float | None = None) -> StopReason | None:
        budget = self.spec.budget
        if budget.candidates is not None and self.evaluated >= budget.candidates:
            return StopReason.CANDIDATES
        if self.stop_request is not None:
            return StopReason.INTERRUPTED
        ends_at = self.ends_at
        if ends_at is not None and (now or time.time()) >= ends_at:
            return StopReason.WALL_TIME
        tokens = sum(s.tokens_used for s in self.islands.values())
        if budget.tokens is not None and tokens >= budget.tokens:
            return StopReason.TOKENS
        fraction = self.best.sol.fraction if self.best is not None and self.best.sol is not None else None
        if fraction is not None and fraction >= self.spec.target_sol_fraction:
            return StopReason.SPEED_OF_LIGHT
        stopped = [s.stopped for s in self.islands.values() if s.stopped is not None]
        if len(self.islands) >= self.spec.islands and len(stopped) == len(self.islands) and not self.in_flight:
            return stopped[0]
        return None


class RunWatcher:
    """Feeds a ``Progress`` from the run stream's durable ``controller`` consumer."""

    def __init__(self, bus: Bus, progress: Progress, *, batch: int = 512) -> None:
        self.bus = bus
        self.progress = progress
        self.batch = batch
        self.changed = asyncio.Event()
        """Set whenever a message moved the counts (cleared by the reader)."""
        self._task: asyncio.Task[None] | None = None
        self._psub: object | None = None
        self._dlq: Subscription | None = None
        self._stopping = False
        self.handled_seq = 0
        """The stream sequence of the last message counted."""
        run = progress.spec.run_id
        self._prefix = {
            "cand": subjects.candidates(run).rsplit(".", 2)[0] + ".",
            "result": subjects.results(run).rsplit(".", 1)[0] + ".",
            "feedback": subjects.feedback(run).rsplit(".", 1)[0] + ".",
            "status": subjects.island_status(run).rsplit(".", 1)[0] + ".",
        }
        self._stop_subject = subjects.run_stop(run)

    async def start(self) -> None:
        run = self.progress.spec.run_id
        config = ConsumerConfig(
            durable_name=CONTROLLER_CONSUMER,
            ack_policy=AckPolicy.ALL,
            ack_wait=30.0,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=subjects.run_all(run),
            max_ack_pending=100_000,
        )
        self._psub = await settled(
            "creating the controller's consumer of the run stream",
            lambda: self.bus.js.pull_subscribe(
                subjects.run_all(run), durable=CONTROLLER_CONSUMER, stream=subjects.run_stream(run), config=config
            ),
        )
        self._task = asyncio.create_task(self._loop(), name="run-watcher")
        self._dlq = await self.bus.nc.subscribe(subjects.dead_letters(run), cb=self._on_dead_letter)

    async def _on_dead_letter(self, msg: Msg) -> None:
        """A candidate of the run that an actor gave up on leaves the in-flight count."""
        try:
            letter = DeadLetter.model_validate_json(msg.data)
        except pydantic.ValidationError:
            return
        if letter.subject.startswith(self._prefix["cand"]):
            self.progress.on_dead_letter(letter.subject.rsplit(".", 1)[1])
            self.changed.set()

    def handle(self, msg: Msg) -> None:
        """Count one message of the run stream."""
        subject = msg.subject
        p = self._prefix
        with contextlib.suppress(ValueError, AttributeError):  # a message without JetStream metadata
            self.handled_seq = max(self.handled_seq, msg.metadata.sequence.stream)
        try:
            if subject.startswith(p["cand"]):
                self.progress.on_candidate(subject.rsplit(".", 1)[1])
            elif subject.startswith(p["result"]):
                self.progress.on_result(EvalResult.model_validate_json(msg.data))
            elif subject.startswith(p["feedback"]):
                msg_id = (msg.headers or {}).get(MSG_ID_HEADER, "")
                if msg_id.startswith("feedback-"):
                    self.progress.on_feedback(msg_id.removeprefix("feedback-"))
            elif subject.startswith(p["status"]):
                self.progress.on_status(IslandStatus.model_validate_json(msg.data))
            elif subject == self._stop_subject:
                self.progress.on_stop(RunStop.model_validate_json(msg.data))
        except pydantic.ValidationError as exc:
            # Actors dead-letter what they cannot read; the count just skips it.
            log.warning("run stream message not counted", subject=subject, error=str(exc).splitlines()[0])

    async def _loop(self) -> None:
        psub = self._psub
        assert psub is not None
        while not self._stopping:
            try:
                msgs = await psub.fetch(self.batch, timeout=0.25)  # type: ignore[attr-defined]
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                # An outage: the durable consumer keeps our place; try again.
                log.warning("run stream read failed, retrying", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            for msg in msgs:
                self.handle(msg)
            self.changed.set()
            with contextlib.suppress(nats.errors.Error):
                await msgs[-1].ack()

    async def catch_up(self, timeout: float = 1.0) -> bool:
        """Wait, at most ``timeout`` s, until every message already in the run stream is counted.

        The run's end decides on what is in flight; a candidate published just before an interrupt
        may not have reached this reader yet (seen in CI: a RunEnd whose ``cancelled`` missed the
        one candidate in flight). False when it did not catch up in time, or the server did not say.
        """
        run = self.progress.spec.run_id
        stream = subjects.run_stream(run)
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = await self.bus.js.consumer_info(stream, CONTROLLER_CONSUMER, timeout=max(0.1, timeout))
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                log.warning("run stream position not read", error=f"{type(exc).__name__}: {exc}")
                return False
            delivered = (info.delivered.stream_seq if info.delivered is not None else 0) or 0
            if not info.num_pending and self.handled_seq >= delivered:
                return True
            if time.monotonic() >= deadline or self._task is None or self._task.done():
                log.warning("run stream not caught up", pending=info.num_pending, behind=delivered - self.handled_seq)
                return False
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Stop reading (bounded: a fetch in progress ends within its timeout)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            await asyncio.wait([task], timeout=2.0)
            if not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=1.0)
        dlq, self._dlq = self._dlq, None
        if dlq is not None:
            with contextlib.suppress(nats.errors.Error):
                await dlq.unsubscribe()
        psub, self._psub = self._psub, None
        if psub is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(2.0):
                    await psub.unsubscribe()  # type: ignore[attr-defined]
