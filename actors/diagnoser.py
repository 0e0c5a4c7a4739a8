"""Diagnoser actor: turns each ``EvalResult`` into a typed ``Diagnosis`` and feeds it back.

Reads:  ``kf.<run>.result.*`` (``EvalResult``) through the run's shared durable pull consumer
        ``diagnosers``; the candidate itself is fetched by id from the run stream (its own
        subject ``kf.<run>.cand.<island>.<candidate>``).
Writes: ``kf.<run>.feedback.<island>`` (``Feedback``: candidate, result, diagnosis) into the run
        stream with dedup id ``feedback-<candidate>``, before the result is acked.

Diagnosers are hot-swappable: start a new version beside the old one, then drain the old one
(``kfoundry drain ID``); they share the durable consumer, so nothing is lost or doubled.
"""

from __future__ import annotations

from typing import Protocol

import nats.errors
import nats.js.errors

from actors.base import Actor
from actors.bus import ConsumerSpec, Delivery
from actors.errors import Retry
from actors.logs import bound
from schemas import ActorKind, Candidate, Diagnosis, EvalResult, Feedback, subjects


class Diagnose(Protocol):
    """The diagnosis seam: rule-based, possibly refined by an LLM."""

    version: str

    async def __call__(self, result: EvalResult, candidate: Candidate) -> Diagnosis:
        """The diagnosis of one evaluation."""
        ...


class Refiner(Protocol):
    """Refines a rule-based diagnosis (``actors.diagnosis.llm_diagnoser.LLMDiagnoser``)."""

    async def diagnose(self, result: EvalResult, candidate: Candidate | None, baseline: Diagnosis) -> Diagnosis:
        """A refined diagnosis; the baseline itself when the refiner cannot help."""
        ...


class RuleDiagnose:
    """The rule-based diagnoser, optionally refined by an LLM diagnoser."""

    def __init__(self, llm: Refiner | None = None) -> None:
        from actors.diagnosis.rules import RuleDiagnoser

        self.rules = RuleDiagnoser()
        self.llm = llm
        self.version = f"rules-{self.rules.version}" + ("+llm" if llm is not None else "")

    async def __call__(self, result: EvalResult, candidate: Candidate) -> Diagnosis:
        diagnosis = self.rules.diagnose(result, candidate)
        if self.llm is not None:
            diagnosis = await self.llm.diagnose(result, candidate, diagnosis)
        return diagnosis


class DiagnoserActor(Actor):
    """Diagnoses the results of one run (see the module docstring)."""

    kind = ActorKind.DIAGNOSER
    description = "Turns EvalResults into typed Diagnoses and Feedback for islands"

    def __init__(
        self,
        *,
        nats_url: str,
        run_id: str,
        diagnose: Diagnose,
        concurrency: int = 16,
        actor_id: str | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__(nats_url=nats_url, run_id=run_id, actor_id=actor_id, version=version)
        self.diagnose = diagnose
        self.concurrency = concurrency
        self.diagnosed = 0
        self._direct = True
        """Whether the run stream answers direct gets (see :meth:`candidate`)."""

    async def setup(self) -> None:
        consumer = ConsumerSpec(
            stream=subjects.run_stream(self.rid),
            durable=subjects.DIAGNOSERS,
            filter_subject=subjects.results(self.rid),
            ack_wait_s=30.0,
            max_deliver=5,
            batch=64,
        )
        await self.bus.consume(consumer, EvalResult, self.handle, concurrency=self.concurrency)

    async def candidate(self, result: EvalResult) -> Candidate:
        """Fetch the candidate of a result from the run stream: a direct get by subject, or the
        stream API's get where the stream does not allow direct gets (made by an older version)."""
        subject = subjects.candidates(self.rid, result.island, result.candidate_id)
        stream = subjects.run_stream(self.rid)
        try:
            try:
                raw = await self.bus.js.get_last_msg(stream, subject, direct=self._direct)
            except nats.errors.NoRespondersError:
                self._direct = False
                self.log.info("run stream has no direct gets: reading candidates through the stream API")
                raw = await self.bus.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError as exc:
            raise Retry(f"candidate {result.candidate_id} not found in the run stream yet", 1.0) from exc
        if raw.data is None:
            raise Retry(f"candidate {result.candidate_id} read back empty from the run stream", 1.0)
        return Candidate.model_validate_json(raw.data)

    async def handle(self, result: EvalResult, delivery: Delivery) -> None:
        """Diagnose one result and feed it back to its island."""
        with bound(island=result.island, candidate=result.candidate_id):
            candidate = await self.candidate(result)
            diagnosis = await self.diagnose(result, candidate)
            diagnosis = diagnosis.model_copy(update={"diagnoser": f"{self.actor_id}/{self.diagnose.version}"})
            feedback = Feedback(
                run_id=self.rid, island=result.island, candidate=candidate, result=result, diagnosis=diagnosis
            )
            await self.bus.publish_durable(
                subjects.feedback(self.rid, result.island), feedback, msg_id=f"feedback-{result.candidate_id}"
            )
            self.diagnosed += 1
            self.log.info("diagnosed", category=str(diagnosis.category), status=str(result.status))

    def extra_stats(self) -> dict[str, float | int | str | None]:
        return {"diagnosed": self.diagnosed, "diagnoser": self.diagnose.version}
