"""Migration planning: ring and random topologies, stagnation-triggered migration, no resends,
lineage kept, and a migrant that enters the receiving island's archive."""

from __future__ import annotations

import pytest

from actors.evolution.brain import IslandBrain
from actors.evolution.credit import ExpertProfile
from actors.evolution.errors import PolicyConfigError
from actors.evolution.migration import MigrationPlanner, choose_migrants, ring_next
from schemas import Elite, EliteAnnouncement, IslandStatus, MigrationPolicy, MigrationReason, Role
from tests.evolution import factories as f

ISLANDS = ("i0", "i1", "i2")


def _elite(island: str, ms: float, parent_lineage: int = 0) -> Elite:
    parent = None
    for _ in range(parent_lineage):
        parent = f.candidate(island, parent=parent)
    cand = f.candidate(island, parent=parent)
    res = f.correct(cand, ms)
    assert res.fitness is not None
    assert res.timing is not None
    return Elite(
        candidate=cand, fitness=res.fitness, median_ms=res.timing.median_ms, cell=(0,), island=island, result=res
    )


def _announce(planner: MigrationPlanner, elite: Elite) -> None:
    planner.on_elite(EliteAnnouncement(run_id="run1", elite=elite, island_best=True))


def _status(island: str, stagnating: bool) -> IslandStatus:
    return IslandStatus(run_id="run1", island=island, evaluated=10, in_flight=0, archive_size=1, stagnating=stagnating)


def test_ring_sends_each_islands_best_to_the_next_after_the_interval() -> None:
    planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(interval_s=10, count=1), seed=0)
    best = {i: _elite(i, 0.1) for i in ISLANDS}
    for i in ISLANDS:
        _announce(planner, _elite(i, 0.5))
        _announce(planner, best[i])
    assert planner.due(100.0) == []  # starts the clock
    assert planner.due(105.0) == []
    out = planner.due(110.0)
    assert {(m.source_island, m.dest_island) for m in out} == {("i0", "i1"), ("i1", "i2"), ("i2", "i0")}
    assert all(m.reason is MigrationReason.RING for m in out)
    assert all(m.elites == (best[m.source_island],) for m in out)
    # next round: the best was sent already, so the second best follows; then nothing is left
    second = planner.due(120.0)
    assert all(m.elites[0].fitness < best[m.source_island].fitness for m in second)
    assert planner.due(130.0) == []


def test_random_topology_is_seeded_and_never_sends_to_itself() -> None:
    def dests(seed: int) -> list[str]:
        planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(topology=MigrationReason.RANDOM), seed=seed)
        return [str(planner.destination("i0")) for _ in range(30)]

    assert dests(1) == dests(1)
    assert dests(1) != dests(2)
    assert "i0" not in dests(1)
    assert set(dests(1)) == {"i1", "i2"}


def test_stagnating_island_gets_the_best_elite_of_the_others_once_per_episode() -> None:
    planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(count=1), seed=0)
    _announce(planner, _elite("i1", 0.3))
    top = _elite("i2", 0.1)
    _announce(planner, top)
    assert planner.on_status(_status("i0", False)) == []
    (m,) = planner.on_status(_status("i0", True))
    assert (m.source_island, m.dest_island, m.reason) == ("i2", "i0", MigrationReason.STAGNATION)
    assert m.elites == (top,)
    assert planner.on_status(_status("i0", True)) == []  # still the same episode
    planner.on_status(_status("i0", False))
    (again,) = planner.on_status(_status("i0", True))
    assert again.source_island == "i1"  # the top elite was already sent to i0


def test_stagnation_trigger_can_be_switched_off() -> None:
    planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(on_stagnation=False), seed=0)
    _announce(planner, _elite("i1", 0.3))
    assert planner.on_status(_status("i0", True)) == []


def test_migrants_keep_lineage_and_enter_the_receiving_archive() -> None:
    spec = f.spec(islands=2)
    planner = MigrationPlanner("run1", ("i0", "i1"), MigrationPolicy(interval_s=1, count=1), seed=0)
    elite = _elite("i0", 0.1, parent_lineage=3)
    _announce(planner, elite)
    planner.due(0.0)
    (m,) = planner.due(5.0)
    receiver = IslandBrain("i1", spec, [ExpertProfile(name="template", role=Role.TEMPLATE)], seed=0)
    assert receiver.on_migrants(m) == 1
    held = receiver.archive.elites()[0]
    assert held.candidate.lineage == elite.candidate.lineage
    assert len(held.candidate.lineage) == 3
    assert held.candidate.island == "i0"
    assert held.island == "i1"
    # the receiver's next request can start from the migrant: its child extends the lineage
    plan = receiver.next_request()
    assert plan.parent is not None
    assert plan.parent.candidate_id == elite.candidate.candidate_id
    child = plan.candidate(spec, elite.candidate.proposal)
    assert child.lineage == (*elite.candidate.lineage, elite.candidate.candidate_id)
    assert receiver.on_migrants(m) == 0  # redelivered: nothing new


def test_planner_survives_a_json_round_trip() -> None:
    planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(topology=MigrationReason.RANDOM, interval_s=1), seed=3)
    for i in ISLANDS:
        _announce(planner, _elite(i, 0.2))
        _announce(planner, _elite(i, 0.1))
    planner.due(0.0)
    planner.due(2.0)
    copy = MigrationPlanner.from_json(planner.to_json())
    a, b = copy.due(4.0), planner.due(4.0)
    assert [(m.source_island, m.dest_island, m.elites) for m in a] == [
        (m.source_island, m.dest_island, m.elites) for m in b
    ]


def test_helpers_and_bad_settings() -> None:
    assert ring_next(("b", "a", "c"), "c") == "a"
    elites = [_elite("i0", ms) for ms in (0.3, 0.1, 0.2)]
    picked = choose_migrants(elites, 2, exclude={elites[1].candidate.candidate_id})
    assert [e.median_ms for e in picked] == [0.2, 0.3]
    with pytest.raises(PolicyConfigError, match="islands"):
        MigrationPlanner("run1", ("i0", "i0"), MigrationPolicy(), seed=0)
    with pytest.raises(PolicyConfigError, match="topology"):
        MigrationPlanner("run1", ISLANDS, MigrationPolicy(topology=MigrationReason.STAGNATION), seed=0)


def test_migrants_go_only_to_islands_that_announced_themselves() -> None:
    planner = MigrationPlanner("run1", ISLANDS, MigrationPolicy(interval_s=10.0), seed=0)
    for island in ("i0", "i2"):
        _announce(planner, _elite(island, 0.1))
    planner.due(0.0)
    # i1 was never started: the ring closes over the islands that are there.
    out = planner.due(20.0, present={"i0", "i2"})
    assert {(m.source_island, m.dest_island) for m in out} == {("i0", "i2"), ("i2", "i0")}
    # Alone, an island sends nothing.
    assert planner.due(40.0, present={"i0"}) == []
    assert planner.destination("i0", present={"i0"}) is None
