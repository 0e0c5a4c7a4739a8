"""What the run controller writes into and reads back from the run's stream, beyond progress: the
seed candidates at the start, and at the end the whole stream replayed into ``best_model.py``
and the report.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from actors.commands.outcome import held_out_note, model_header_note, precision_note, verdict_of
from actors.runtime.bus import Bus
from actors.runtime.logs import get_logger
from actors.runtime.quota import CandidateQuota
from schemas import Candidate, DeviceChoice, EvalResult, Message, Proposal, RunSpec, decode_any, subjects

if TYPE_CHECKING:
    from actors.report.model import RunReport

log = get_logger(__name__)


async def publish_seeds(bus: Bus, spec: RunSpec, seeds: list[str]) -> None:
    """The user's seed candidates (``--seed-candidate``), dealt to the islands in turn, within the
    run's candidate quota."""
    quota = CandidateQuota(bus, spec.run_id, spec.budget.candidates)
    for i, source in enumerate(seeds):
        if not await quota.take():
            log.warning("seed candidates beyond the candidate budget not published", seeds=len(seeds) - i)
            break
        island = spec.island_names()[i % spec.islands]
        cand = Candidate(
            run_id=spec.run_id,
            island=island,
            task_id=spec.task.task_id,
            expert="user",
            proposal=Proposal(source=source, language=spec.language, strategy="seed", description="seed"),
        )
        await bus.publish_durable(
            subjects.candidates(spec.run_id, island, cand.candidate_id), cand, msg_id=cand.candidate_id
        )


async def replay(bus: Bus, run_id: str) -> list[Message]:
    """Every message of the run stream, in order."""
    stream = subjects.run_stream(run_id)
    info = await bus.js.stream_info(stream)
    last = int(info.state.last_seq)
    out: list[Message] = []
    if last == 0:
        return out
    sub = await bus.js.subscribe(subjects.run_all(run_id), stream=stream, ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=10.0)
            with contextlib.suppress(ValueError):
                out.append(decode_any(msg.data))
            if int(msg.metadata.sequence.stream) >= last:
                break
    finally:
        await sub.unsubscribe()
    return out


async def write_results(
    bus: Bus, spec: RunSpec, best: EvalResult | None, run_dir: Path, messages: list[Message] | None = None
) -> RunReport:
    """``best_model.py`` (the best candidate, standalone, with a header saying what it is worth)
    and the report with its plots, in ``run_dir``; the report. ``messages``: the run stream when
    the caller has replayed it already."""
    from actors.report import build_report, write_report
    from actors.runtime.kv import load_text

    if messages is None:
        messages = await replay(bus, spec.run_id)
    states = {}
    for island in spec.island_names():
        text = await load_text(bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(spec.run_id, island))
        if text is not None:
            states[island] = text
    report = await asyncio.to_thread(build_report, spec, messages, states)
    if best is not None:
        subject = subjects.candidates(spec.run_id, best.island, best.candidate_id)
        raw = await bus.js.get_last_msg(subjects.run_stream(spec.run_id), subject)
        cand = Candidate.model_validate_json(raw.data or b"")
        device = best.device.name if best.device else "?"
        median = f"{best.timing.median_ms:.4f} ms" if best.timing else "?"
        # the report's: derived from the run's compiled/eager ratio where the best was timed
        # before the torch.compile baseline was ready
        top = report.best if report.best is not None and report.best.candidate_id == best.candidate_id else None
        speedup_c = top.speedup_vs_compiled if top is not None else best.speedup_vs_compiled
        how = " (derived from the run's compiled/eager ratio)" if top is not None and top.compiled_derived else ""
        vs_compiled = f", {speedup_c:.3f}x over torch.compile{how}" if speedup_c else ""
        header = (
            f"# Kernel Foundry run {spec.run_id}: best candidate {cand.candidate_id}\n"
            f"# {best.speedup_vs_eager:.3f}x over eager PyTorch{vs_compiled} on {device} (median {median})\n"
            f"# expert {cand.expert}, strategy {cand.proposal.strategy or '-'}, generation {cand.generation}\n"
        )
        if spec.device is DeviceChoice.CPU:
            header += "# timed on the CPU (Triton interpreter): a correctness check, not a speedup\n"
        verdict = verdict_of(best.speedup_vs_eager, spec.device)
        header += model_header_note(verdict, best.speedup_vs_eager, speedup_c)
        header += precision_note(best.correctness)
        header += held_out_note(best.correctness)
        if best.torch_ops:
            header += (
                f"# left to PyTorch (the reference's own ops, --torch-ops reference): {', '.join(best.torch_ops)}\n"
            )
        (run_dir / "best_model.py").write_text(header + cand.proposal.source)
    await asyncio.to_thread(write_report, report, run_dir)
    log.info("results written", run_dir=str(run_dir), messages=len(messages))
    return report
