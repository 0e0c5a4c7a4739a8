"""GPU-only messages produced for real (``-m gpu``): an out-of-bounds Triton store, a CUDA
out-of-memory, a Triton kernel that does not fit in shared memory. Each runs in its own process
(a CUDA error poisons the context) and its stderr goes through the log parser."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.diagnosis.logparse import classify_log
from schemas import DiagnosisCategory

pytestmark = pytest.mark.gpu

SCRIPTS = {
    "illegal_access": (
        DiagnosisCategory.RUNTIME_ILLEGAL_ACCESS,
        """
        import torch, triton, triton.language as tl

        @triton.jit
        def oob(out_ptr, far, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK) + far  # far is a 64-bit argument: no compile-time range check
            tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32))

        out = torch.empty(1024, device="cuda")
        oob[(1,)](out, 1 << 34, BLOCK=128)
        torch.cuda.synchronize()
        """,
    ),
    "oom": (
        DiagnosisCategory.RUNTIME_OOM,
        """
        import torch
        x = torch.empty(1 << 46, dtype=torch.float32, device="cuda")
        """,
    ),
    "shared_memory": (
        DiagnosisCategory.COMPILE_RESOURCES,
        """
        import torch, triton, triton.language as tl

        @triton.jit
        def big_dot(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
            rm = tl.arange(0, BM)
            rn = tl.arange(0, BN)
            rk = tl.arange(0, BK)
            a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
            tl.store(c_ptr + rm[:, None] * BN + rn[None, :], tl.dot(a, b))

        a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        c = torch.empty(256, 256, device="cuda")
        big_dot[(1,)](a, a, c, BM=256, BN=256, BK=256, num_stages=4)
        torch.cuda.synchronize()
        """,
    ),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_gpu_failure_message_is_classified_by_its_cause(name: str, tmp_path: Path) -> None:
    expected, body = SCRIPTS[name]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / f"{name}.py"  # Triton reads a @jit function's source from its file
    script.write_text(textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    assert proc.returncode != 0, f"{name} did not fail:\n{proc.stdout}\n{proc.stderr}"
    finding = classify_log(proc.stderr)
    assert finding is not None, proc.stderr[-2000:]
    assert finding.category is expected, proc.stderr[-2000:]
