"""Trials judged on the device: each trial's output files taken out of the dead worker's reach, then judged.

For tasks whose plan keeps the verdict on the GPU (``device_verdict``), a run worker leaves its
trials' outputs as bulk files. Once its whole process tree is gone (a killed process's DMA may
still be landing while the kernel tears it down), each file is moved into a folder of the
parent's (:func:`gpu_runner.protocol.take_bulk`) and the :class:`~gpu_runner.judge.Judge`
compares it with the reference it rebuilds from the trial's seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

from gpu_runner.compare import TrialCheck, parity_outputs, precision_rule
from gpu_runner.config import RunnerConfig
from gpu_runner.errors import EvaluatorFault
from gpu_runner.frames import JudgeOp
from gpu_runner.judge import Judge
from gpu_runner.pool import ReferenceData
from gpu_runner.protocol import FrameError, take_bulk
from gpu_runner.sandbox import Worker, wait_gone


def _shapes(metas: list[dict[str, Any]]) -> list[tuple[object, list[Any]]]:
    return [(m.get("dtype"), list(m.get("shape", []))) for m in metas]


async def judge_trials(
    judge: Judge,
    cfg: RunnerConfig,
    worker: Worker,
    tree: list[int],
    pending: list[tuple[int, dict[str, Any]]],
    ref: ReferenceData,
    reference_source: str,
    max_blob: int,
    verdict_root: Path,
    checks: list[TrialCheck],
    timed_seeds: dict[int, tuple[int, int]] | None = None,
    precision: str | None = None,
) -> None:
    """Add to ``checks`` those of the ``pending`` trials (trial, report header), once nothing of the
    candidate runs; trial numbers past the trials' are timed calls shipped under them
    (``timed_seeds``: their seeds; their inputs were drawn on the device). Raises
    :class:`~gpu_runner.protocol.FrameError` for a report whose files are not what it announced
    (``checks`` then holds the trials judged before it). ``precision``: the job's standard (None: the config's)."""
    timed = timed_seeds or {}
    await worker.proc.wait()
    await asyncio.to_thread(wait_gone, tree, 30.0)
    ref.files = verdict_root / worker.dir.name
    ref.files.mkdir(mode=0o700)
    dst = os.open(ref.files, os.O_RDONLY | os.O_DIRECTORY)
    try:
        async with judge.keeping_lease():
            for t, header in pending:
                outputs, fds = await _take_outputs(cfg, worker, t, header, ref, dst, max_blob)
                is_timed = t >= len(ref.seeds)
                job = JudgeOp(
                    reference_source=reference_source,
                    init_seed=ref.init_seed,
                    seed=timed[t][0] if is_timed else ref.seeds[t],
                    skip=timed[t][1] if is_timed else 0,
                    scale=1.0 if is_timed else ref.scales[t],
                    on_device=True if is_timed else ref.on_device,
                    init_on_device=ref.init_on_device,
                    input_sums=None if is_timed else ref.input_sums[t],
                    outputs=outputs,
                    parity=parity_outputs(ref.info),
                )
                tolerances, floors = dict(cfg.tolerances), dict(cfg.precision_floors)
                metas = list(header["tensors"])
                factor = precision_rule(cfg, ref.info, precision, job["scale"])
                checks.append(await judge.trial(job, metas, _metas(ref, t), tolerances, floors, factor, fds))
                worker.close_shared([k for k in worker.shared if k[0] == t])  # their memory goes once judged
                for out in outputs:  # each trial's files go as soon as they are judged
                    if "cand" in out:
                        with contextlib.suppress(OSError):
                            os.unlink(out["cand"])
    finally:
        os.close(dst)


def _metas(ref: ReferenceData, t: int) -> list[dict[str, Any]]:
    """The reference's output metadata of trial ``t`` (a timed call's: any trial's, the same)."""
    return ref.metas[t] if t < len(ref.metas) else ref.metas[0]


def _tolerances(cfg: RunnerConfig, dtype: str) -> dict[str, Any]:
    tol = cfg.tolerances.get(dtype)
    return {"dtype": dtype, "atol": tol[0] if tol else 0.0, "rtol": tol[1] if tol else 0.0, "exact": tol is None}


async def _take_outputs(
    cfg: RunnerConfig, worker: Worker, t: int, header: dict[str, Any], ref: ReferenceData, dst: int, max_blob: int
) -> tuple[list[dict[str, Any]], list[int]]:
    """What the judge needs of trial ``t``'s outputs (none if the shapes differ) and the descriptors
    of their shared buffers (none: they were files, moved into ``dst`` here)."""
    assert ref.files is not None
    ref_metas = _metas(ref, t)
    if _shapes(list(header["tensors"])) != _shapes(ref_metas):
        return [], []  # the judge's decision stops at the difference without reading anything
    if header.get("shared"):
        # The buffers are the ones the spare announced before its candidate existed (checked
        # against the reference's outputs then); the frame only says they were filled.
        shared = [worker.shared.get((t, i)) for i in range(len(ref_metas))]
        if any(out is None for out in shared):
            raise FrameError(f"trial {t} reports shared outputs its spare never made")
        found = [out for out in shared if out is not None]
        outputs = [{"shared": True, "size": out.size, **_tolerances(cfg, out.dtype)} for out in found]
        return outputs, [out.fd for out in found]
    if "bulk" not in header:
        raise EvaluatorFault(f"trial {t}'s outputs did not come as files")
    names = await asyncio.to_thread(take_bulk, worker.bulk_fd, header["bulk"], dst, f"c{t}_", max_blob)
    outputs = [
        {"cand": str(ref.files / name), **_tolerances(cfg, str(meta.get("dtype")))}
        for name, meta in zip(names, ref_metas, strict=True)
    ]
    return outputs, []
