"""Stagnation: triggers after a window without real improvement, resets on improvement."""

from __future__ import annotations

from actors.evolution.stagnation import StagnationDetector


def test_triggers_after_window_without_improvement_and_resets_on_improvement() -> None:
    s = StagnationDetector(window=3, eps=0.01)
    flags = [s.observe(best, at=float(t)) for t, best in enumerate([1.0, 1.0, 1.0, 1.0])]
    assert flags == [False, False, False, True]
    assert s.observe(1.5, at=4.0) is False
    assert s.is_stagnating() is False


def test_gains_below_eps_do_not_reset_but_add_up() -> None:
    s = StagnationDetector(window=4, eps=0.05)
    s.observe(1.0, at=0.0)
    assert [s.observe(b, at=float(k)) for k, b in enumerate([1.02, 1.04, 1.04], start=1)] == [False] * 3
    assert s.since == 3
    assert s.reference == 1.0
    assert s.observe(1.06, at=4.0) is False  # ... but together they pass 5 % of the reference
    assert s.since == 0
    assert s.reference == 1.06
    assert [s.observe(1.07, at=10.0 + k) for k in range(4)] == [False, False, False, True]


def test_an_island_with_only_failures_stagnates() -> None:
    s = StagnationDetector(window=2)
    assert [s.observe(None, at=float(t)) for t in range(3)] == [False, True, True]


def test_seconds_window_triggers_on_time_alone() -> None:
    s = StagnationDetector(window=1000, seconds=30.0)
    s.observe(2.0, at=100.0)
    assert s.observe(2.0, at=120.0) is False
    assert s.observe(2.0, at=131.0) is True
    assert s.is_stagnating(at=125.0) is False


def test_reset_starts_a_new_window() -> None:
    s = StagnationDetector(window=2)
    for t in range(3):
        s.observe(1.0, at=float(t))
    assert s.is_stagnating()
    s.reset(at=10.0)
    assert not s.is_stagnating()
    assert StagnationDetector.model_validate_json(s.model_dump_json()) == s
