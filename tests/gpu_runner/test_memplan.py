"""The memory plan: what fits is kept as configured, what is large is cut or judged on the device,
and what cannot fit one evaluation is refused with what it needs."""

from __future__ import annotations

import pytest

from gpu_runner.errors import TaskTooLarge
from gpu_runner.memplan import DEVICE_VERDICT_TRIALS, Footprint, plan

GIB = 1 << 30
H200_FREE = 148 * 10**9
H100_FREE = 80 * 10**9
HOST = 125 * 10**9


def _fp(inputs: float, outputs: float, params: float = 0.0) -> Footprint:
    i, o = int(inputs * GIB), int(outputs * GIB)
    return Footprint(i, o, int(params * GIB), max(i, o))


def test_small_task_keeps_the_configured_trials_and_spares() -> None:
    made = plan(
        _fp(0.0625, 0.0625), device="cuda", max_trials=5, max_spares=2, host_available=HOST, device_free=H200_FREE
    )
    assert (made.trials, made.spares, made.device_verdict) == (5, 2, False)
    assert made.notes == []


def test_six_gigabyte_elementwise_task_is_judged_on_the_device_on_an_h200() -> None:
    made = plan(_fp(6, 6), device="cuda", max_trials=5, max_spares=2, host_available=HOST, device_free=H200_FREE)
    assert made.device_verdict
    assert 2 <= made.trials <= DEVICE_VERDICT_TRIALS
    assert made.device_per_eval <= 0.85 * H200_FREE
    # the candidate's output files alone: its trials' and the timed call shipped for judgment
    assert made.host_per_spare == (made.trials + made.timed_slots) * 6 * GIB
    assert made.timed_slots == 1


def test_task_that_cannot_fit_one_evaluation_is_refused_with_what_it_needs() -> None:
    with pytest.raises(TaskTooLarge) as caught:
        plan(_fp(30, 30), device="cuda", max_trials=5, max_spares=2, host_available=HOST, device_free=H100_FREE)
    message = str(caught.value)
    assert "task needs ~" in message
    assert "of device memory for one evaluation; this GPU has 74.5 GiB free" in message


def test_host_memory_limits_a_cpu_task() -> None:
    with pytest.raises(TaskTooLarge, match="of host memory for one evaluation"):
        plan(
            _fp(1, 0.2), device="cpu", max_trials=5, max_spares=2, host_available=1 * GIB, device_verdict_bytes=1 << 40
        )


def test_a_cpu_task_counts_its_tensors_against_host_memory() -> None:
    """On the CPU the inputs every trial keeps are host memory: 1 GiB of inputs per trial on a
    host with 20 GiB available cannot keep five trials in two workers and the referee (a spare and
    a running candidate once held ~23 GiB and the workers were killed for memory on a 24 GiB machine)."""
    made = plan(_fp(1, 1e-8), device="cpu", max_trials=5, max_spares=1, host_available=20 * GIB)
    assert made.host_per_spare >= made.trials * 1 * GIB
    assert made.spares == 0 or made.trials < 5
    small = plan(_fp(0.01, 0.01), device="cpu", max_trials=5, max_spares=1, host_available=14 * GIB)
    assert (small.trials, small.spares) == (5, 1)
    with pytest.raises(TaskTooLarge, match=r"of host memory for one evaluation; this host has 14\.0 GiB available"):
        plan(_fp(20, 1e-8), device="cpu", max_trials=5, max_spares=1, host_available=14 * GIB)


def test_spares_shrink_before_trials_when_device_memory_is_short() -> None:
    made = plan(_fp(8, 0.001), device="cuda", max_trials=5, max_spares=2, host_available=HOST, device_free=H200_FREE)
    assert made.spares >= 1
    assert made.spares < 2
    assert any("spares cut" in n for n in made.notes)


def test_shared_output_buffers_are_planned_only_where_they_fit_beside_everything_else() -> None:
    kw = {"device": "cuda", "max_trials": 5, "max_spares": 2, "host_available": HOST}
    # 6 GB outputs on an H200: room for the buffers of the trials and of the shipped timed call on the
    # device; no trial or baseline given up, but the spare is (the buffers save more time than a
    # spare's preparation hides: 11 of 21 s per evaluation at 4 GiB on an H100).
    files = plan(_fp(6, 6), device_free=H200_FREE, **kw)  # type: ignore[arg-type]
    shared = plan(_fp(6, 6), device_free=H200_FREE, shared_outputs=True, **kw)  # type: ignore[arg-type]
    assert shared.shared_outputs
    assert not files.shared_outputs
    assert (shared.trials, shared.compiled_baseline) == (files.trials, files.compiled_baseline)
    assert shared.spares < files.spares
    assert shared.device_per_spare == files.device_per_spare + (shared.trials + shared.timed_slots) * 6 * GIB
    # On an H100 they do not fit beside the referee's baseline: host files, and the plan says why.
    tight = plan(_fp(6, 6), device_free=H100_FREE, shared_outputs=True, **kw)  # type: ignore[arg-type]
    assert not tight.shared_outputs
    assert any("shared device buffers do not fit" in n for n in tight.notes)
    # Small outputs are compared on the host: there is nothing to share.
    small = plan(_fp(0.0625, 0.0625), device_free=H200_FREE, shared_outputs=True, **kw)  # type: ignore[arg-type]
    assert not small.shared_outputs
    assert small.notes == []


def test_a_task_past_the_aside_size_builds_its_compiled_baseline_aside_where_the_plan_keeps_everything() -> None:
    """KernelBench L2-4's footprint (1 GiB in, 2 GiB out) on an H100: the baseline's process
    (:func:`aside_bytes`) is held back from the budget and the plan is otherwise the same, so the
    referee no longer builds it before the first verdict. Where holding it back would cut the
    plan, the device has too little free for the share, or the share is 0, it stays in the referee."""
    from gpu_runner.config import RunnerConfig
    from gpu_runner.memplan import aside_bytes
    from gpu_runner.pool import plan_with_aside

    fp = _fp(1, 2)
    args = {"device": "cuda", "max_trials": 5, "max_spares": 2, "host_available": HOST}
    alone = plan(fp, device_free=H100_FREE, **args)  # type: ignore[arg-type]
    aside = plan_with_aside(fp, RunnerConfig(), device_free=H100_FREE, **args)
    assert not alone.compile_aside
    assert aside.compile_aside
    assert (aside.trials, aside.spares, aside.poison_bytes) == (alone.trials, alone.spares, alone.poison_bytes)
    assert aside.device_budget is not None
    assert alone.device_budget is not None
    assert aside.device_budget == alone.device_budget - aside_bytes(fp)
    assert "torch.compile baseline built aside" in aside.summary()
    # the share of the device it may take
    assert not plan_with_aside(fp, RunnerConfig(compile_aside_share=0.0), device_free=H100_FREE, **args).compile_aside
    small_gpu = int(aside_bytes(fp) / 0.15) - 1
    assert not plan_with_aside(fp, RunnerConfig(), device_free=small_gpu, **args).compile_aside
    # a plan that would lose a spare or a trial keeps the baseline in the referee
    big = _fp(6, 6)
    tight = plan(big, device_free=H100_FREE, **args)  # type: ignore[arg-type]
    with pytest.raises(TaskTooLarge):  # 6 GB in and out: held back, not one evaluation fits
        plan(big, device_free=H100_FREE, reserved=aside_bytes(big), **args)  # type: ignore[arg-type]
    got = plan_with_aside(big, RunnerConfig(compile_aside_share=0.5), device_free=H100_FREE, **args)
    assert not got.compile_aside
    assert (got.trials, got.spares, got.poison_bytes) == (tight.trials, tight.spares, tight.poison_bytes)
    mid = _fp(1, 2)  # on a GPU with room for all but the spares once the bytes are held back
    free = 40 * 10**9
    alone_mid = plan(mid, device_free=free, **args)  # type: ignore[arg-type]
    held_mid = plan(mid, device_free=free, reserved=aside_bytes(mid), **args)  # type: ignore[arg-type]
    assert held_mid.spares < alone_mid.spares
    got = plan_with_aside(mid, RunnerConfig(compile_aside_share=0.5), device_free=free, **args)
    assert not got.compile_aside
    assert got.spares == alone_mid.spares
    # small tasks go aside by size, with nothing held back (as before); the CPU never
    tiny = _fp(0.0625, 0.0625)
    assert not plan_with_aside(tiny, RunnerConfig(), device_free=H100_FREE, **args).compile_aside
    assert not plan_with_aside(fp, RunnerConfig(), **{**args, "device": "cpu"}).compile_aside
