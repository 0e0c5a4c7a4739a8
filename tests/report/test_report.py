"""The run report: built from a two-island run's messages and brains, written as JSON and PNGs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from actors.commands.outcome import RunVerdict
from actors.evolution.brain import IslandBrain
from actors.evolution.credit import ExpertProfile
from actors.evolution.migration import MigrationPlanner
from actors.report import RunReport, build_report, write_report
from schemas import (
    Candidate,
    Decline,
    DeclineReason,
    DeviceChoice,
    DeviceKind,
    DiagnosisCategory,
    EliteAnnouncement,
    ExperienceOutcome,
    Feedback,
    IslandStatus,
    Message,
    Migration,
    MigrationPolicy,
    MigrationReason,
    Role,
    RunEnd,
    StopReason,
)
from tests.evolution import factories as f
from tests.evolution.landscape import Landscape

EXPERTS = (
    ExpertProfile(name="template", role=Role.TEMPLATE),
    ExpertProfile(name="mem", role=Role.MEMORY),
    ExpertProfile(name="fix", role=Role.REPAIR),
)
PNG = b"\x89PNG\r\n\x1a\n"


def _run(steps: int = 24) -> tuple[list[Message], dict[str, IslandBrain]]:
    """Two islands on the landscape, ring migration every 5 s of landscape time."""
    spec = f.spec(islands=2)
    brains = {i: IslandBrain(i, spec, EXPERTS, seed=3) for i in ("i0", "i1")}
    envs = {"i0": Landscape(1), "i1": Landscape(2)}
    planner = MigrationPlanner("run1", tuple(brains), MigrationPolicy(interval_s=5.0, count=1), seed=0)
    messages: list[Message] = []
    for step in range(steps):
        for island, brain in brains.items():
            plan = brain.next_request()
            fb = envs[island].evaluate(brain, plan)
            if step % 4 == 0:  # pretend the curator showed an experience to this expert
                cand = fb.judged().model_copy(update={"experience_ids": ("exp-a",)})
                fb = fb.model_copy(update={"candidate": cand})
            # As the run stream holds them: the candidate, and feedback that names it.
            messages += [fb.judged(), fb.model_copy(update={"candidate": None})]
            out = brain.on_feedback(fb)
            if out.elite is not None:
                ann = EliteAnnouncement(run_id="run1", elite=out.elite, island_best=out.improved_best)
                planner.on_elite(ann)
                messages.append(ann)
            messages.append(brain.status(at=envs[island].at))
        for m in planner.due(float(2000 + step)):
            messages.append(m)
            brains[m.dest_island].on_migrants(m)
    first = next(m for m in messages if isinstance(m, Candidate) and m.experience_ids)
    messages.append(
        ExperienceOutcome(experience_ids=("exp-a",), candidate_id=first.candidate_id, improved=True, delta=0.5)
    )
    messages.append(RunEnd(run_id="run1", reason=StopReason.CANDIDATES, evaluated=2 * steps, at=3000.0))
    return messages, brains


@pytest.fixture(scope="module")
def run() -> tuple[list[Message], dict[str, IslandBrain]]:
    return _run()


def test_report_names_the_best_kernel_and_its_lineage(run: tuple[list[Message], dict[str, IslandBrain]]) -> None:
    messages, brains = run
    report = build_report(f.spec(islands=2), messages, brains)
    feedback = [m for m in messages if isinstance(m, Feedback)]
    fittest = max((fb for fb in feedback if fb.result.fitness is not None), key=lambda fb: fb.result.fitness or 0.0)
    best = next(m for m in messages if isinstance(m, Candidate) and m.candidate_id == fittest.candidate_id)
    assert report.best is not None
    assert report.best.fitness == fittest.result.fitness
    steps = report.best.lineage
    assert [s.candidate_id for s in steps] == [*best.lineage, best.candidate_id]
    assert all(s.expert for s in steps)
    assert steps[-1].answered == (best.diagnosis.category if best.diagnosis else None)
    assert report.best.source == best.proposal.source


def test_report_counts_statuses_categories_routing_and_migrations(
    run: tuple[list[Message], dict[str, IslandBrain]],
) -> None:
    messages, brains = run
    report = build_report(f.spec(islands=2), messages, brains)
    feedback = [m for m in messages if isinstance(m, Feedback)]
    assert report.evaluated == len(feedback)
    assert report.status_counts == dict(Counter(fb.result.status.value for fb in feedback))
    assert sum(report.category_counts.values()) == len(feedback)
    assert sum(r.candidates for r in report.routing) == len(feedback)
    assert {r.answered for r in report.routing} >= {"start"}
    migrations = [m for m in messages if isinstance(m, Migration)]
    assert migrations, "the run is long enough for ring migrations"
    assert len(report.migrations) == len(migrations)
    assert {e.reason for e in report.migrations} == {MigrationReason.RING}
    assert report.end_reason is StopReason.CANDIDATES
    assert {c.island for c in report.credit} == {"i0", "i1"}
    assert sum(c.pulls for c in report.credit if c.island == "i0") >= brains["i0"].evaluated


def test_report_follows_each_island_and_its_archive(run: tuple[list[Message], dict[str, IslandBrain]]) -> None:
    messages, brains = run
    report = build_report(f.spec(islands=2), messages, brains)
    by_island = {i.island: i for i in report.islands}
    for island, brain in brains.items():
        part = by_island[island]
        assert len(part.fitness) == len(brain.fitness_history)
        assert part.best_fitness == (brain.archive.best().fitness if brain.archive.best() else None)  # type: ignore[union-attr]
        assert part.archive is not None
        assert part.archive.elites == len(brain.archive)
        assert len(part.archive.grid[0]) == len(part.archive.x_labels)
    assert any(s.migrant for i in report.islands for s in i.fitness), "an accepted migrant shows in the history"


def test_report_lists_experiences_with_their_outcomes(run: tuple[list[Message], dict[str, IslandBrain]]) -> None:
    messages, brains = run
    report = build_report(None, messages, brains)
    (use,) = report.experiences
    used_by = [m.candidate_id for m in messages if isinstance(m, Candidate) and m.experience_ids]
    assert use.experience_id == "exp-a"
    assert list(use.candidates) == used_by
    assert use.improved + use.not_improved == len(used_by)
    assert use.improved >= 1  # the outcome message says the first one improved


def test_write_report_puts_json_and_three_png_plots_in_the_run_directory(
    run: tuple[list[Message], dict[str, IslandBrain]], tmp_path: Path
) -> None:
    messages, brains = run
    report = build_report(f.spec(islands=2), messages, brains)
    paths = write_report(report, tmp_path / "run1")
    names = {p.name for p in paths}
    assert names == {"report.json", "fitness.png", "archive.png", "credit.png"}
    for p in paths:
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data.startswith(PNG)
            assert len(data) > 5000
    back = RunReport.model_validate_json((tmp_path / "run1" / "report.json").read_text())
    assert back.plots == {"fitness": "fitness.png", "archive": "archive.png", "credit": "credit.png"}
    assert back.model_copy(update={"plots": {}}) == report
    assert json.loads((tmp_path / "run1" / "report.json").read_text())["best"]["fitness"] == report.best.fitness  # type: ignore[union-attr]


def test_report_from_messages_alone_still_has_fitness_and_counts(
    run: tuple[list[Message], dict[str, IslandBrain]], tmp_path: Path
) -> None:
    messages, _ = run
    report = build_report(None, messages)
    assert report.evaluated > 0
    assert report.credit == ()
    assert all(i.archive is None for i in report.islands)
    series = {i.island: [s.best for s in i.fitness if s.best is not None] for i in report.islands}
    assert all(v == sorted(v) and v for v in series.values())
    paths = write_report(report, tmp_path)
    assert {p.name for p in paths} == {"report.json", "fitness.png"}


def test_report_says_when_the_first_correct_candidate_came(run: tuple[list[Message], dict[str, IslandBrain]]) -> None:
    messages, brains = run
    spec = f.spec(islands=2)
    report = build_report(spec, messages, brains)
    correct = [m.result for m in messages if isinstance(m, Feedback) and m.result.status.value == "correct"]
    assert correct, "the landscape must produce correct candidates"
    assert report.first_correct_s == pytest.approx(min(r.created_at for r in correct) - spec.created_at)
    assert report.best is not None
    assert report.best.speedup_vs_eager == report.best.fitness


def test_report_carries_each_islands_declines_and_the_last_reason() -> None:
    spec = f.spec(islands=1)
    decline = Decline(reason=DeclineReason.UNSUPPORTED, detail="no template for aten.conv2d")
    status = IslandStatus(
        run_id=spec.run_id, island="i0", evaluated=0, in_flight=0, archive_size=0, declines=8,
        last_decline=decline, stopped=StopReason.NO_PROGRESS,
    )  # fmt: skip
    report = build_report(spec, [status])
    (island,) = report.islands
    assert (island.declines, island.last_decline, island.stopped) == (8, decline, StopReason.NO_PROGRESS)
    assert report.first_correct_s is None
    assert report.evaluated == 0


def test_report_and_summary_name_the_sandbox_layers_that_did_not_hold(tmp_path: Path) -> None:
    from actors.report import isolation_warning
    from schemas import Check, CheckOutcome

    spec = f.spec(islands=1)
    cand = f.candidate()
    checks = (
        Check(name="landlock", outcome=CheckOutcome.SKIPPED, detail="skipped: Landlock is not available (ABI 0)"),
        Check(name="seccomp", outcome=CheckOutcome.SKIPPED, detail="skipped: disabled by config"),
        Check(name="pid_namespace", outcome=CheckOutcome.PASSED, detail="own PID namespace"),
    )
    result = f.correct(cand, 0.5).model_copy(update={"checks": checks})
    report = build_report(spec, [cand, result])
    assert report.isolation_gaps == {"landlock": "Landlock is not available (ABI 0)"}
    write_report(report, tmp_path)
    warning = isolation_warning(tmp_path / "report.json")
    assert warning is not None
    assert warning.startswith("warning: candidates ran without these sandbox layers")
    assert "landlock: Landlock is not available" in warning
    assert "seccomp" not in warning
    held = build_report(spec, [cand, f.correct(cand, 0.5)])
    assert held.isolation_gaps == {}
    write_report(held, tmp_path)
    assert isolation_warning(tmp_path / "report.json") is None


@pytest.mark.parametrize(
    ("eager_ms", "median_ms", "kind", "verdict", "beats_eager"),
    [
        (1.0, 1.25, DeviceKind.CUDA, RunVerdict.NOT_FASTER_THAN_EAGER, False),
        (1.0, 0.5, DeviceKind.CUDA, RunVerdict.FASTER_THAN_EAGER, True),
        (1.0, 50.0, DeviceKind.CPU, RunVerdict.NOT_TIMED_ON_GPU, False),
    ],
)
def test_report_says_whether_the_best_beat_eager_and_torch_compile(
    eager_ms: float, median_ms: float, kind: DeviceKind, verdict: RunVerdict, beats_eager: bool
) -> None:
    cand = f.candidate()
    result = f.correct(cand, median_ms, eager_ms=eager_ms, kind=kind)  # compiled is 0.8x of that
    fb = f.feedback(cand, result, f.diagnosis(cand, DiagnosisCategory.SLOW_MEMORY_BOUND))
    device = DeviceChoice.CPU if kind is DeviceKind.CPU else DeviceChoice.CUDA
    report = build_report(f.spec(islands=1, device=device), [fb])
    assert report.verdict is verdict
    assert report.beats_eager is beats_eager
    assert report.beats_compiled is (0.8 * eager_ms / median_ms > 1.0)
    assert RunReport.model_validate_json(report.model_dump_json()).verdict is verdict


def test_report_without_a_correct_candidate_has_no_verdict_on_speed() -> None:
    report = build_report(f.spec(islands=1), [])
    assert report.verdict is RunVerdict.NO_CORRECT_CANDIDATE
    assert (report.beats_eager, report.beats_compiled) == (None, None)


def test_report_shows_each_experts_requests_declines_candidates_and_best() -> None:
    experts = (ExpertProfile(name="template", role=Role.TEMPLATE), ExpertProfile(name="gpt", role=Role.GENERAL))
    spec = f.spec(islands=1, experts=[{"name": "template"}, {"name": "gpt"}, {"name": "idle"}])
    brain = IslandBrain("i0", spec, experts, seed=2)
    env = Landscape(4, fail=0.3)
    messages: list[Message] = []
    declined = False
    for _ in range(16):
        plan = brain.next_request()
        if plan.expert == "gpt" and not declined:
            declined = True
            brain.on_reply(plan, 0, decline="refused")
            continue
        fb = env.evaluate(brain, plan)
        brain.on_feedback(fb)
        messages.append(fb)
    assert declined
    report = build_report(spec, messages, {"i0": brain})
    rows = {r.expert: r for r in report.experts}
    assert set(rows) == {"template", "gpt", "idle"}
    for name in ("template", "gpt"):
        mine = [m for m in messages if isinstance(m, Feedback) and m.judged().expert == name]
        row = rows[name]
        assert row.candidates == len(mine) > 0
        assert row.correct == sum(m.result.status.value == "correct" for m in mine)
        fits = [m.result.fitness for m in mine if m.result.fitness is not None]
        assert row.best_fitness == (max(fits) if fits else None)
        assert row.requests == row.candidates + row.declines
        assert row.islands == ("i0",)
    assert (rows["gpt"].declines, rows["gpt"].declined_by) == (1, {"refused": 1})
    assert (rows["template"].declines, rows["idle"].requests, rows["idle"].candidates) == (0, 0, 0)


def test_an_experts_counts_add_up_from_proposals_to_verdicts() -> None:
    """Proposals skipped as duplicates, candidates published, evaluated and left without a verdict
    (cancelled at the run's end, dead-lettered): ``published == candidates + unjudged``."""
    experts = (ExpertProfile(name="template", role=Role.TEMPLATE),)
    spec = f.spec(islands=1, experts=[{"name": "template"}])
    brain = IslandBrain("i0", spec, experts, seed=2)
    brain.credit.usage_of("template").duplicates = 4  # as the island counts them
    cands = [f.candidate(params={"BLOCK_SIZE": 256 * (k + 1)}) for k in range(3)]
    messages: list[Message] = [*cands, f.correct(cands[0], 0.5), f.correct(cands[1], 0.4)]
    row = build_report(spec, messages, {"i0": brain}).experts[0]
    assert (row.duplicates, row.published, row.candidates, row.unjudged) == (4, 3, 2, 1)
    restored = IslandBrain.from_json(brain.to_json(), spec)  # the archive bucket keeps the count
    assert restored.credit.usage_of("template").duplicates == 4


def _family_candidate(strategy: str, expert: str = "template") -> Candidate:
    cand = f.candidate(expert=expert)
    return cand.model_copy(update={"proposal": cand.proposal.model_copy(update={"strategy": strategy})})


def test_report_gives_each_family_its_first_and_best_fraction_of_speed_of_light() -> None:
    spec = f.spec(islands=1)  # created at t = 1000
    steps = [  # (strategy, expert, median ms, at); the bound is 0.1 ms, eager 1 ms
        ("template:softmax/default", "template", 0.5, 1010.0),  # first correct: 20% of SOL, 2x
        ("template:softmax/mutate.slow.memory_bound", "template", 0.125, 1020.0),  # best: 80%, 8x
        ("template:softmax/mutate.random", "template", 0.25, 1030.0),
        ("template:gemm/default", "template", 0.2, 1015.0),
        ("fusion/idea", "gpt", 1.0, 1040.0),
    ]
    messages: list[Message] = []
    for strategy, expert, median, at in steps:
        cand = _family_candidate(strategy, expert)
        result = f.correct(cand, median, at=at)
        messages.append(f.feedback(cand, result, f.diagnosis(cand, DiagnosisCategory.SLOW_MEMORY_BOUND)))
    broken = _family_candidate("template:softmax/mutate.random")
    messages.append(f.feedback(broken, f.failed(broken), f.diagnosis(broken, DiagnosisCategory.COMPILE_TYPE)))
    report = build_report(spec, messages)
    families = {r.family: r for r in report.families}
    assert set(families) == {"template:softmax", "template:gemm", "gpt"}
    soft = families["template:softmax"]
    assert (soft.candidates, soft.correct) == (4, 3)
    assert soft.first_sol_fraction == pytest.approx(0.2)
    assert soft.first_speedup_vs_eager == pytest.approx(2.0)
    assert soft.best_sol_fraction == pytest.approx(0.8)
    assert soft.best_speedup_vs_eager == pytest.approx(8.0)
    assert families["template:gemm"].first_sol_fraction == families["template:gemm"].best_sol_fraction
    # Final best 8x at t = 20 s: nothing earlier reached 90% of it.
    assert report.to_90pct_best_s == pytest.approx(20.0)


def test_a_best_timed_before_the_compiled_baseline_was_ready_gets_the_run_s_ratio(
    run: tuple[list[Message], dict[str, IslandBrain]],
) -> None:
    """torch.compile is built beside the referee, so the first verdicts are timed beside eager
    alone: where the best is one of them, its speedup over torch.compile is derived from the
    compiled/eager ratio of the verdicts timed beside both (their median), and said to be."""
    messages, brains = run
    feedback = [m for m in messages if isinstance(m, Feedback)]
    fittest = max((fb for fb in feedback if fb.result.fitness is not None), key=lambda fb: fb.result.fitness or 0.0)
    pending = "not ready yet: torch.compile of the reference was being built beside the referee (12 s)"
    changed: list[Message] = []
    for m in messages:
        if isinstance(m, Feedback) and m.result.baselines is not None and m.result.baselines.eager is not None:
            eager = m.result.baselines.eager
            if m.candidate_id == fittest.candidate_id:
                baselines = m.result.baselines.model_copy(update={"compiled": None, "compiled_error": pending})
                result = m.result.model_copy(update={"baselines": baselines, "speedup_vs_compiled": None})
            else:  # torch.compile 2.5x faster than eager, 3x on one verdict (the median is 2.5)
                ratio = 3.0 if m is feedback[0] else 2.5
                compiled = f.timing(eager.median_ms / ratio)
                result = m.result.model_copy(
                    update={"baselines": m.result.baselines.model_copy(update={"compiled": compiled})}
                )
            m = m.model_copy(update={"result": result})
        changed.append(m)
    best = build_report(f.spec(islands=2), changed, brains).best
    assert best is not None
    assert best.candidate_id == fittest.candidate_id
    assert best.speedup_vs_eager is not None
    assert best.speedup_vs_compiled == pytest.approx(best.speedup_vs_eager / 2.5)
    assert best.compiled_derived is not None
    assert pending in best.compiled_derived
    # nothing timed beside torch.compile: nothing derived
    alone = build_report(f.spec(islands=2), messages, brains).best
    assert alone is not None
    assert alone.compiled_derived is None


def test_report_says_where_the_first_seconds_went() -> None:
    """The first verdict of any status, from the run's start: when the experts first proposed,
    when its candidate was published, and its evaluator stages (what their total leaves is the
    wait for a spare or the GPU); on the run's end line too."""
    from actors.commands.outcome import RunOutcome
    from schemas import StageTimes

    spec = f.spec(islands=1)  # created at t = 1000 s
    early = f.candidate().model_copy(update={"created_at": 1004.0})
    judged = f.candidate().model_copy(update={"created_at": 1006.0})
    stages = StageTimes(gate_s=0.5, compile_s=8.0, line_s=1.0, run_s=4.0, total_s=15.5)
    first = f.correct(judged, 0.5, at=1022.0).model_copy(update={"stages": stages})
    later = f.correct(early, 0.4, at=1030.0)
    report = build_report(spec, [early, judged, later, first])
    fv = report.first_verdict
    assert fv is not None
    assert fv.candidate_id == judged.candidate_id
    assert fv.status == "correct"
    assert (fv.first_proposal_s, fv.proposed_s, fv.verdict_s) == (4.0, 6.0, 22.0)
    assert fv.queued_s == pytest.approx(0.5)  # received at 1006.5 (the verdict's time less its total)
    assert fv.waiting_s == pytest.approx(2.0)  # 15.5 - 0.5 - 8 - 1 - 4
    line = fv.sentence()
    assert line.startswith("first verdict (correct) at 22.0 s: proposed at 6.0 s (the first proposal at 4.0 s)")
    for part in ("gate 0.5 s", "compile 8.0 s", "compile line 1.0 s", "waiting for a spare or the GPU 2.0 s"):
        assert part in line
    assert RunReport.model_validate_json(report.model_dump_json()).first_verdict == fv
    outcome = RunOutcome(
        run_id="run1",
        reason=StopReason.WALL_TIME,
        evaluated=2,
        statuses={"correct": 2},
        best_fitness=2.0,
        best_candidate_id=early.candidate_id,
        run_dir=Path("/tmp/run"),
        first_verdict=line,
    )
    assert line in outcome.summary(30.0).splitlines()
    assert build_report(spec, [early]).first_verdict is None
