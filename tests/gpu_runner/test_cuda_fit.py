"""Fitting the confinement of CUDA workers: the full plan tried in a throw-away worker, layers given
up one at a time only where the trial fails, each named with its error."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_runner import cuda_fit
from gpu_runner.confine import landlock
from gpu_runner.cuda_fit import check, failure, fit_cuda
from gpu_runner.sandbox import Isolation, probe_isolation

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def probed() -> Isolation:
    iso = probe_isolation(network=True, pids=True, user=None, python=sys.executable)
    assert iso.layers is not None
    if not iso.layers.namespaces:
        pytest.skip(f"no namespaces here: {iso.layers.notes['user_namespace']}")
    return iso


@pytest.fixture(autouse=True)
def _fresh_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_fit, "_FITTED", {})
    monkeypatch.delenv(cuda_fit.ENV_SWITCH, raising=False)


def _breaks_under(*layers: str) -> Any:
    """A trial that fails while any of ``layers`` holds (as CUDA did under Landlock before the
    thread-name grant), and records what it was given."""
    seen: list[Isolation] = []

    def trial(iso: Isolation) -> dict[str, Any]:
        seen.append(iso)
        assert iso.layers is not None
        holding = {
            "landlock": iso.layers.landlock,
            "mount_view": iso.layers.namespaces and iso.wanted.get("mount", True),
            "private /tmp": not iso.layers.keep_tmp and iso.wanted.get("mount", True),
            "user_namespace": iso.layers.userns,
        }
        broken = [name for name in layers if holding[name]]
        return {"spawn": "ok", "cuda": f"RuntimeError: error 304 under {broken}" if broken else "ok"}

    trial.seen = seen  # type: ignore[attr-defined]
    return trial


def test_cuda_keeps_every_layer_when_the_full_plan_works(probed: Isolation) -> None:
    trial = _breaks_under()
    assert fit_cuda(probed, sys.executable, trial) == probed
    assert len(trial.seen) == 1


@pytest.mark.skipif(landlock.abi() < 1, reason="Landlock is not enabled in this kernel")
def test_only_the_layer_that_breaks_cuda_is_dropped_and_named_with_its_error(probed: Isolation) -> None:
    fitted = fit_cuda(probed, sys.executable, _breaks_under("landlock"))
    assert fitted.layers is not None
    assert not fitted.layers.landlock
    assert fitted.layers.notes["landlock"].startswith("skipped: CUDA did not work under it")
    assert "error 304" in fitted.layers.notes["landlock"]
    # The private /tmp was given up first, then found innocent and restored.
    assert not fitted.layers.keep_tmp
    assert fitted.wanted.get("mount", True)
    assert fitted.layers.namespaces


def test_a_private_tmp_that_breaks_cuda_keeps_the_rest_of_the_view(probed: Isolation) -> None:
    fitted = fit_cuda(probed, sys.executable, _breaks_under("private /tmp"))
    assert fitted.layers is not None
    assert fitted.layers.keep_tmp
    assert fitted.wanted.get("mount", True)
    assert "/tmp kept visible read-only" in fitted.layers.notes["mount_view"]
    assert fitted.layers.landlock == probed.layers.landlock  # type: ignore[union-attr]


def test_when_nothing_lighter_works_the_compatible_fallback_names_why(probed: Isolation) -> None:
    def trial(iso: Isolation) -> dict[str, Any]:
        return {"spawn": "ok", "cuda": "RuntimeError: no device"}

    fitted = fit_cuda(probed, sys.executable, trial)
    assert fitted.layers is not None
    assert not fitted.layers.landlock
    assert not fitted.layers.userns
    assert "fallback plan" in fitted.layers.notes["landlock"]
    assert "no device" in fitted.layers.notes["landlock"]


@pytest.mark.parametrize("breaks", [(), ("landlock",), ("private /tmp",), ("landlock", "mount_view", "user_namespace")])
def test_a_remembered_fit_is_used_by_the_next_evaluator_without_a_trial(
    probed: Isolation, tmp_path: Path, breaks: tuple[str, ...]
) -> None:
    memo = tmp_path / "cuda_fit"
    trial = _breaks_under(*breaks)
    first = fit_cuda(probed, sys.executable, trial, memo)
    assert trial.seen
    cuda_fit._FITTED.clear()  # another evaluator process

    def no_trial(iso: Isolation) -> dict[str, Any]:
        raise AssertionError("the remembered fit should have been used")

    assert fit_cuda(probed, sys.executable, no_trial, memo) == first


def test_a_remembered_fallback_is_recalled_with_its_reason(probed: Isolation, tmp_path: Path) -> None:
    def broken(iso: Isolation) -> dict[str, Any]:
        return {"spawn": "ok", "cuda": "RuntimeError: no device"}

    first = fit_cuda(probed, sys.executable, broken, tmp_path)
    cuda_fit._FITTED.clear()
    again = fit_cuda(probed, sys.executable, _breaks_under(), tmp_path)
    assert again == first
    assert "no device" in again.layers.notes["landlock"]  # type: ignore[union-attr]


def test_a_changed_machine_or_the_retry_switch_tries_again(
    probed: Isolation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit_cuda(probed, sys.executable, _breaks_under("landlock"), tmp_path)
    cuda_fit._FITTED.clear()
    facts = cuda_fit._machine()
    monkeypatch.setattr(cuda_fit, "_machine", lambda: {**facts, "driver": "another driver"})
    trial = _breaks_under()
    fitted = fit_cuda(probed, sys.executable, trial, tmp_path)
    assert trial.seen
    assert fitted.layers.landlock == probed.layers.landlock  # type: ignore[union-attr]
    cuda_fit._FITTED.clear()
    monkeypatch.setenv(cuda_fit.ENV_SWITCH, "retry")
    retried = _breaks_under("landlock")
    assert not fit_cuda(probed, sys.executable, retried, tmp_path).layers.landlock  # type: ignore[union-attr]
    assert retried.seen


def test_the_switch_skips_the_trial(probed: Isolation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cuda_fit.ENV_SWITCH, "compatible")

    def trial(iso: Isolation) -> dict[str, Any]:
        raise AssertionError("no trial expected")

    fitted = fit_cuda(probed, sys.executable, trial)
    assert "KFOUNDRY_CUDA_CONFINE=compatible" in fitted.layers.notes["mount_view"]  # type: ignore[union-attr]


@pytest.mark.timeout(180)
def test_the_trial_enters_the_full_worker_plan_and_reports_each_step(probed: Isolation) -> None:
    """On a machine without CUDA, the plan is entered (spawn ok) and CUDA is the step that fails."""
    found = check(probed, sys.executable)
    assert found["spawn"] == "ok", found
    if os.path.exists("/dev/nvidiactl"):
        assert failure(found) is None, found
    else:
        assert found["cuda"] != "ok"
        assert found["triton"] == "not tried"


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_cuda_workers_keep_landlock_the_mount_view_and_a_private_tmp() -> None:
    """On the GPU machine: with the thread-name grant, every layer the CPU has holds for CUDA too."""
    iso = probe_isolation(network=True, pids=True, user=None, python=sys.executable, cuda=True)
    found = check(iso, sys.executable)
    assert failure(found) is None, found
    fitted = fit_cuda(iso, sys.executable)
    assert fitted.layers is not None
    missing = {k: v for k, v in fitted.layers.notes.items() if v.startswith("skipped")}
    assert not missing, missing
    assert not fitted.layers.keep_tmp
