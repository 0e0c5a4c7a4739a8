"""Reading a candidate back from its run's stream, by id.

Every candidate has a subject of its own (``kf.<run>.cand.<island>.<candidate>``), so any actor
can read it with a direct get of the last message on that subject, or, where the stream was made
without direct gets (by an older version), through the stream API's get.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

from actors.runtime.bus import Bus
from actors.runtime.errors import Retry
from actors.runtime.logs import get_logger
from schemas import Candidate, subjects

log = get_logger(__name__)


class CandidateReader:
    """Reads candidates of one run by id (remembers whether its stream answers direct gets)."""

    def __init__(self, bus: Bus, run_id: str) -> None:
        self.bus = bus
        self.run_id = run_id
        self.direct = True
        """Whether the run stream answers direct gets (``False`` once it said it does not)."""
        self.reads = 0
        """Candidates read so far."""

    async def read(self, island: str, candidate_id: str) -> Candidate:
        """The candidate; :class:`Retry` (after a second) when the stream does not hold it yet."""
        subject = subjects.candidates(self.run_id, island, candidate_id)
        stream = subjects.run_stream(self.run_id)
        try:
            try:
                raw = await self.bus.js.get_last_msg(stream, subject, direct=self.direct)
            except nats.errors.NoRespondersError:
                self.direct = False
                log.info("run stream has no direct gets: reading candidates through the stream API", run=self.run_id)
                raw = await self.bus.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError as exc:
            raise Retry(f"candidate {candidate_id} not found in the run stream yet", 1.0) from exc
        if raw.data is None:
            raise Retry(f"candidate {candidate_id} read back empty from the run stream", 1.0)
        self.reads += 1
        return Candidate.model_validate_json(raw.data)
