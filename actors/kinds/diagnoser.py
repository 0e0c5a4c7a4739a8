"""Diagnoser actor: turns each ``EvalResult`` into a typed ``Diagnosis`` and feeds it back.

Reads:  ``kf.<run>.result.*`` (``EvalResult``) through the run's shared durable pull consumer
        ``diagnosers``; when its diagnosis reads the candidate itself (an LLM refiner), the
        candidate is read by id from the run stream (its own subject
        ``kf.<run>.cand.<island>.<candidate>``).
Writes: ``kf.<run>.feedback.<island>`` (``Feedback``: result and diagnosis; the island has the
        candidate) into the run stream with dedup id ``feedback-<candidate>``, before the result
        is acked.

Diagnosers are hot-swappable: start a new version beside the old one, then drain the old one
(``kfoundry drain ID``); they share the durable consumer, so nothing is lost or doubled.
"""

from __future__ import annotations

from typing import Protocol

from actors.runtime.base import Actor
from actors.runtime.bus import ConsumerSpec, Delivery
from actors.runtime.candidates import CandidateReader
from actors.runtime.logs import bound
from schemas import ActorKind, Candidate, Diagnosis, EvalResult, Feedback, subjects


class Diagnose(Protocol):
    """The diagnosis seam: rule-based, possibly refined by an LLM."""

    version: str
    needs_candidate: bool
    """Whether it reads the candidate (its source); the rules alone read only the result."""

    async def __call__(self, result: EvalResult, candidate: Candidate | None) -> Diagnosis:
        """The diagnosis of one evaluation (``candidate`` is given when ``needs_candidate``)."""
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
        self.needs_candidate = llm is not None

    async def __call__(self, result: EvalResult, candidate: Candidate | None) -> Diagnosis:
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
        self._reader: CandidateReader | None = None

    async def setup(self) -> None:
        self._reader = CandidateReader(self.bus, self.rid)
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
        """The candidate of a result, read from the run stream."""
        assert self._reader is not None  # set up before the consumer starts
        return await self._reader.read(result.island, result.candidate_id)

    async def handle(self, result: EvalResult, delivery: Delivery) -> None:
        """Diagnose one result and feed it back to its island."""
        with bound(island=result.island, candidate=result.candidate_id):
            candidate = await self.candidate(result) if self.diagnose.needs_candidate else None
            diagnosis = await self.diagnose(result, candidate)
            diagnosis = diagnosis.model_copy(update={"diagnoser": f"{self.actor_id}/{self.diagnose.version}"})
            feedback = Feedback(run_id=self.rid, island=result.island, result=result, diagnosis=diagnosis)
            await self.bus.publish_durable(
                subjects.feedback(self.rid, result.island), feedback, msg_id=f"feedback-{result.candidate_id}"
            )
            self.diagnosed += 1
            self.log.info("diagnosed", category=str(diagnosis.category), status=str(result.status))

    def extra_stats(self) -> dict[str, float | int | str | None]:
        return {"diagnosed": self.diagnosed, "diagnoser": self.diagnose.version}
