"""Debug helper: evaluate one candidate on the GPU under several isolation settings."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, KernelLanguage

REF = Path(f"tests/gpu_runner/references/{sys.argv[1] if len(sys.argv) > 1 else 'add_relu'}.py").read_text()
CAND = Path(f"tests/gpu_runner/candidates/{sys.argv[2] if len(sys.argv) > 2 else 'honest_add_relu'}.py").read_text()


async def one(label: str, **kw: object) -> None:
    import time

    cfg = RunnerConfig(device=DeviceChoice.CUDA, spares=2, **kw)  # type: ignore[arg-type]
    async with EvaluationService(cfg) as svc:
        await svc.prepare(REF)
        await svc.wait_spares(2, timeout_s=200)
        for i in range(3):
            t = time.perf_counter()
            res = await svc.evaluate(EvalJob(REF, CAND, KernelLanguage.TRITON, timeout_s=120, candidate_id=f"c{i}"))
            print(f"--- eval {i}: {time.perf_counter() - t:.2f} s wall, stages {res.stages}")
            await svc.wait_spares(2, timeout_s=200)
        print(f"=== {label}: {res.status} {res.summary}")
        for c in res.checks:
            print("   check", c.name, c.outcome, (c.detail or "")[:200])
        print("   runtime_log:", (res.runtime_log or "")[-3000:])
        print("   compile_log:", (res.compile_log or "")[-1500:])


async def main() -> None:
    await one("default")


asyncio.run(main())
