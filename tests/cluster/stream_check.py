"""What a run left in its JetStream stream, read back through any server of the cluster.

Used by the cluster tests in-process, and as ``python -m tests.cluster.stream_check`` from inside
a network namespace the test process cannot reach (it prints one JSON object):

    python -m tests.cluster.stream_check wait-run URL RUN TIMEOUT_S   exit 0 once RUN is registered
    python -m tests.cluster.stream_check wait-results URL RUN N TIMEOUT_S  exit 0 once N results are in
    python -m tests.cluster.stream_check audit URL RUN                counts per candidate id
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import nats
import nats.errors
import nats.js.errors

from schemas import Candidate, EvalResult, Feedback, RunEnd, decode_any, subjects


@dataclass
class Audit:
    """Per-candidate counts of what the run's stream holds."""

    candidates: dict[str, int] = field(default_factory=dict)
    results: dict[str, int] = field(default_factory=dict)
    feedback: dict[str, int] = field(default_factory=dict)
    run_ends: int = 0
    dead_letters: int = 0
    undecodable: int = 0

    @property
    def lost(self) -> list[str]:
        """Candidates with no result."""
        return sorted(set(self.candidates) - set(self.results))

    @property
    def doubled(self) -> list[str]:
        """Candidates published, evaluated or fed back more than once."""
        many = [c for table in (self.candidates, self.results, self.feedback) for c, n in table.items() if n > 1]
        return sorted(set(many))


async def _read_all(js: nats.js.JetStreamContext, stream: str, subject: str) -> list[bytes]:
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return []
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    out: list[bytes] = []
    try:
        remaining = int(info.state.messages)
        last = int(info.state.last_seq)
        while remaining > 0:
            msg = await sub.next_msg(timeout=10.0)
            out.append(msg.data)
            if int(msg.metadata.sequence.stream) >= last:
                break
    finally:
        await sub.unsubscribe()
    return out


async def audit(url: str, run_id: str) -> Audit:
    """Read the run stream (and the run's dead letters) from the start."""
    nc = await nats.connect(servers=url.split(","), connect_timeout=5)
    try:
        js = nc.jetstream()
        result = Audit()
        cands: Counter[str] = Counter()
        results: Counter[str] = Counter()
        fed: Counter[str] = Counter()
        for data in await _read_all(js, subjects.run_stream(run_id), subjects.run_all(run_id)):
            try:
                msg = decode_any(data)
            except ValueError:
                result.undecodable += 1
                continue
            if isinstance(msg, Candidate):
                cands[msg.candidate_id] += 1
            elif isinstance(msg, EvalResult):
                results[msg.candidate_id] += 1
            elif isinstance(msg, Feedback):
                fed[msg.candidate_id] += 1
            elif isinstance(msg, RunEnd):
                result.run_ends += 1
        result.dead_letters = len(await _read_all(js, subjects.DLQ_STREAM, subjects.dead_letters(run_id)))
        result.candidates, result.results, result.feedback = dict(cands), dict(results), dict(fed)
        return result
    finally:
        await nc.close()


async def wait_run(url: str, run_id: str, timeout_s: float) -> bool:
    """Whether ``run_id`` got registered (its spec in the runs bucket) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    nc = await nats.connect(servers=url.split(","), connect_timeout=5)
    try:
        js = nc.jetstream()
        while time.monotonic() < deadline:
            try:
                kv = await js.key_value(subjects.RUNS_BUCKET)
                await kv.get(run_id)
                return True
            except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
                await asyncio.sleep(0.2)
        return False
    finally:
        await nc.close()


async def wait_results(url: str, run_id: str, want: int, timeout_s: float) -> int:
    """The number of results in the run stream once it reaches ``want`` (or at ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    nc = await nats.connect(servers=url.split(","), connect_timeout=5)
    try:
        js = nc.jetstream()
        stream, subject = subjects.run_stream(run_id), subjects.results(run_id)
        have = 0
        while time.monotonic() < deadline:
            try:
                info = await js.stream_info(stream, subjects_filter=subject)
            except (nats.errors.TimeoutError, nats.js.errors.Error):
                # A server of the cluster has just gone: the stream elects a new leader.
                await asyncio.sleep(0.2)
                continue
            have = sum((info.state.subjects or {}).values())
            if have >= want:
                break
            await asyncio.sleep(0.1)
        return have
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["wait-run"] and len(argv) == 4:
        return 0 if asyncio.run(wait_run(argv[1], argv[2], float(argv[3]))) else 1
    if argv[:1] == ["wait-results"] and len(argv) == 5:
        have = asyncio.run(wait_results(argv[1], argv[2], int(argv[3]), float(argv[4])))
        sys.stdout.write(json.dumps({"results": have}) + "\n")
        return 0 if have >= int(argv[3]) else 1
    if argv[:1] == ["audit"] and len(argv) == 3:
        sys.stdout.write(json.dumps(asdict(asyncio.run(audit(argv[1], argv[2])))) + "\n")
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
