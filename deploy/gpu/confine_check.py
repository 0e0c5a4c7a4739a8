"""Which confinement layers let CUDA work in the evaluator's workers on this GPU machine.

    python3 deploy/gpu/confine_check.py

Evaluates one honest Triton candidate with every layer on, then with each layer switched off
alone, and prints one line per configuration (the verdict, or the evaluator's error).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.errors import RunnerError
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, KernelLanguage

ROOT = Path(__file__).resolve().parents[2] / "tests" / "gpu_runner"


async def one(name: str, **off: bool) -> str:
    ref = (ROOT / "references" / "add_relu.py").read_text()
    cand = (ROOT / "candidates" / "honest_add_relu.py").read_text()
    cfg = RunnerConfig(device=DeviceChoice.CUDA, spares=1, compile_workers=2, timing_budget_s=1.0, **off)
    t0 = time.perf_counter()
    try:
        async with EvaluationService(cfg) as service:
            await service.prepare(ref)
            job = EvalJob(
                reference_source=ref,
                candidate_source=cand,
                language=KernelLanguage.TRITON,
                timeout_s=120,
                task_id=service.task_id(ref),
                candidate_id=name,
            )
            result = await asyncio.wait_for(service.evaluate(job), 200)
            layers = [f"{c.name}={c.outcome.value}" for c in result.checks if c.name in LAYERS]
            return f"{name}: {result.status.value} ({time.perf_counter() - t0:.0f} s) {result.summary[:100]} {layers}"
    except (RunnerError, TimeoutError) as exc:
        return f"{name}: evaluator error ({time.perf_counter() - t0:.0f} s): {str(exc)[-1200:]}"


LAYERS = ("user_namespace", "network_isolation", "pid_namespace", "ipc_namespace", "mount_view", "landlock", "seccomp")


def main() -> int:
    configs: list[tuple[str, dict[str, bool]]] = [
        ("all layers", {}),
        ("no mount view, no landlock", {"mount_isolation": False, "landlock": False}),
        ("no mount, landlock, ipc", {"mount_isolation": False, "landlock": False, "ipc_isolation": False}),
        (
            "seccomp only",
            {
                "mount_isolation": False,
                "landlock": False,
                "ipc_isolation": False,
                "network_isolation": False,
                "pid_isolation": False,
            },
        ),
    ]
    for name, off in configs:
        print(asyncio.run(one(name, **off)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
