"""Capture genuine compiler and runtime messages into ``tests/diagnosis/data/`` (run by hand).

``python -m tests.diagnosis.capture_fixtures`` compiles broken CUDA sources with the local
``nvcc``, compiles broken Triton kernels ahead of time for ``sm_90`` (the same front end a GPU
runs at first launch), runs broken Triton kernels under ``TRITON_INTERPRET=1``, runs broken
PyTorch code and a broken ``load_inline`` C++ extension, and writes each message verbatim with a
manifest (``manifest.json``) that says how it was made and which category the cause belongs to.
Messages that only a GPU produces are not captured here; their fixtures are listed in the
manifest with the public issue they were seen in, and ``test_logparse_gpu.py`` produces them for
real on a GPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

DATA = Path(__file__).with_name("data")


@dataclass(frozen=True)
class Fixture:
    """One captured message: its file, the category of the cause, and how it was produced."""

    file: str
    expected: str
    origin: str


CUDA_SOURCES: dict[str, tuple[str, str, str]] = {
    # name: (arch, expected category, source)
    "nvcc_undefined_identifier": (
        "sm_90",
        "compile.type",
        """
        __global__ void add_kernel(const float* x, const float* y, float* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = x[i] + yy[i];
        }
        """,
    ),
    "nvcc_missing_semicolon": (
        "sm_90",
        "compile.syntax",
        """
        __global__ void scale_kernel(float* x, float s, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x
            if (i < n) x[i] *= s;
        }
        """,
    ),
    "nvcc_cub_max_removed": (
        "sm_90",
        "compile.type",
        """
        #include <cub/cub.cuh>
        __global__ void rowmax_kernel(const float* x, float* out, int cols) {
            typedef cub::BlockReduce<float, 256> BlockReduce;
            __shared__ typename BlockReduce::TempStorage tmp;
            float v = x[blockIdx.x * cols + threadIdx.x];
            float m = BlockReduce(tmp).Reduce(v, cub::Max());
            if (threadIdx.x == 0) out[blockIdx.x] = m;
        }
        """,
    ),
    "nvcc_missing_include": (
        "sm_90",
        "compile.import",
        """
        #include "my_helpers.cuh"
        __global__ void k(float* x) { x[threadIdx.x] = 0.f; }
        """,
    ),
    "nvcc_bad_conversion": (
        "sm_90",
        "compile.type",
        """
        #include <cuda_fp16.h>
        __global__ void k(const float* x, __half* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            float* p = out;
            if (i < n) p[i] = x[i];
        }
        """,
    ),
    "nvcc_no_overload": (
        "sm_90",
        "compile.type",
        """
        __global__ void k(const float* x, int* acc, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) atomicAdd(acc, x[i], 3);
        }
        """,
    ),
    "ptxas_too_much_shared": (
        "sm_90",
        "compile.resources",
        """
        __global__ void big_smem_kernel(const float* x, float* out, int n) {
            __shared__ float tile[64 * 1024];
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            tile[threadIdx.x] = x[i];
            __syncthreads();
            if (i < n) out[i] = tile[(threadIdx.x + 1) % blockDim.x];
        }
        """,
    ),
    "ptxas_unsupported_instruction": (
        "sm_80",
        "compile.unsupported",
        """
        __global__ void k(float* x) {
            asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
            x[threadIdx.x] = 1.f;
        }
        """,
    ),
}

TRITON_KERNELS = """
import torch
import triton
import triton.language as tl


@triton.jit
def name_error_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(x_ptr + offs, mask=offs < n) * scale
    tl.store(out_ptr + offs, y, mask=offs < n)


@triton.jit
def arange_kernel(x_ptr, out_ptr, n):
    offs = tl.arange(0, 100)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def broadcast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    a = tl.load(x_ptr + tl.arange(0, BLOCK))
    b = tl.load(x_ptr + tl.arange(0, BLOCK * 2))
    tl.store(out_ptr + tl.arange(0, BLOCK), a + b)


@triton.jit
def dot_rank_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.load(b_ptr + r)
    tl.store(c_ptr + r, tl.dot(a, b))


@triton.jit
def huge_block_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def big_dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], tl.dot(a, b))


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
"""

# name: (expected, script body run after the kernels above, compiled ahead of time for sm_90)
TRITON_AOT: dict[str, tuple[str, str]] = {
    "triton_compile_name_error": (
        "compile.type",
        'aot(name_error_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},'
        ' {"BLOCK": 128})',
    ),
    "triton_compile_arange_np2": (
        "compile.unsupported",
        'aot(arange_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, {})',
    ),
    "triton_compile_broadcast": (
        "compile.type",
        'aot(broadcast_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},'
        ' {"BLOCK": 64})',
    ),
    "triton_compile_numel_too_large": (
        "compile.resources",
        'aot(huge_block_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},'
        ' {"BLOCK": 2 ** 21})',
    ),
    "triton_out_of_resources_shared": (
        "compile.resources",
        # Compiles a real 256x256x256 fp16 dot for sm_90 and raises Triton's own OutOfResources
        # with the shared memory the compiler reported and the H100/H200 opt-in limit (232448 B),
        # as Triton's loader does when it sees a kernel that does not fit.
        'k = aot(big_dot_kernel, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BM": "constexpr",'
        ' "BN": "constexpr", "BK": "constexpr"}, {"BM": 256, "BN": 256, "BK": 256}, num_stages=4)\n'
        "from triton.runtime.errors import OutOfResources\n"
        'raise OutOfResources(k.metadata.shared, 232448, "shared memory")',
    ),
}

AOT_PRELUDE = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def aot(fn, signature, constexprs, **options):
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
"""

TRITON_INTERP: dict[str, tuple[str, str]] = {
    "triton_interp_name_error": (
        "compile.type",
        "x = torch.randn(1000); out = torch.empty(1000)\nname_error_kernel[(1,)](x, out, 1000, BLOCK=64)",
    ),
    "triton_interp_arange_np2": (
        "compile.unsupported",
        "x = torch.randn(1000); out = torch.empty(1000)\narange_kernel[(1,)](x, out, 1000)",
    ),
    "triton_interp_broadcast": (
        "compile.type",
        "x = torch.randn(1000); out = torch.empty(1000)\nbroadcast_kernel[(1,)](x, out, 1000, BLOCK=64)",
    ),
    "triton_interp_dot_rank": (
        "compile.type",
        "a = torch.randn(32, 32); x = torch.randn(32); c = torch.empty(32)\ndot_rank_kernel[(1,)](a, x, c, BLOCK=32)",
    ),
    "triton_interp_int_as_pointer": (
        "compile.type",
        "out = torch.empty(1000)\nscale_kernel[(1,)](3, out, 1000, BLOCK=256)",
    ),
}

PYTHON_SNIPPETS: dict[str, tuple[str, str]] = {
    "python_syntax_error": (
        "compile.syntax",
        "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module)\n    def forward(self, x):\n        return x\n",
    ),
    "python_module_not_found": (
        "compile.import",
        "import torch\nimport my_fused_ops\nclass ModelNew(torch.nn.Module):\n    pass\n",
    ),
    "torch_size_mismatch": (
        "runtime.shape",
        "import torch\na = torch.randn(8, 64)\nb = torch.randn(8, 32)\nout = a + b\n",
    ),
    "torch_view_invalid": (
        "runtime.shape",
        "import torch\nx = torch.randn(4, 4)\ny = x.view(3, 5)\n",
    ),
    "torch_mm_shapes": (
        "runtime.shape",
        "import torch\nw = torch.randn(128, 64)\nx = torch.randn(16, 128)\ny = torch.nn.functional.linear(x, w)\n",
    ),
    "torch_dtype_mismatch": (
        "runtime.dtype",
        "import torch\na = torch.randn(4, 4)\nb = torch.randn(4, 4, dtype=torch.float64)\nc = a @ b\n",
    ),
    "torch_cpu_oom": (
        "runtime.oom",
        "import torch\nx = torch.empty(1 << 46, dtype=torch.float32)\n",
    ),
    "python_memory_error_rlimit": (
        "runtime.oom",
        "import resource\nresource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))\n"
        "blocks = [bytearray(1 << 28) for _ in range(16)]\n",
    ),
    "python_attribute_error": (
        "runtime.exception",
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        return self.kernel(x)\nModelNew()(torch.randn(2))\n",
    ),
    "python_segfault_faulthandler": (
        "runtime.crash",
        "import ctypes, faulthandler\nfaulthandler.enable()\nctypes.string_at(0)\n",
    ),
}

LOAD_INLINE = '''
import torch
from torch.utils.cpp_extension import load_inline

cpp = """
#include <torch/extension.h>
torch::Tensor scale(torch::Tensor x) {
    auto out = torch::empty_like(x);
    auto* p = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = xs[i] * 2.0f;
    return out;
}
"""
load_inline(name="kf_broken_scale", cpp_sources=[cpp], functions=["scale"], verbose=False,
            build_directory=BUILD)
'''


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False)
    return (proc.stdout + proc.stderr).strip() + "\n"


def _python_env(interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def _write(name: str, text: str, expected: str, origin: str, out: list[Fixture]) -> None:
    (DATA / f"{name}.txt").write_text(text)
    out.append(Fixture(file=f"{name}.txt", expected=expected, origin=origin))


def capture(work: Path) -> list[Fixture]:
    """Produce every local fixture; returns their manifest entries."""
    fixtures: list[Fixture] = []
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found on PATH")
    version = _run([nvcc, "--version"]).strip().splitlines()[-1]
    for name, (arch, expected, source) in CUDA_SOURCES.items():
        path = work / f"{name}.cu"
        path.write_text(textwrap.dedent(source).lstrip())
        text = _run([nvcc, f"-arch={arch}", "-c", path.name, "-o", f"{name}.o"], cwd=work)
        _write(name, text, expected, f"nvcc -arch={arch} -c {name}.cu ({version})", fixtures)
    py = sys.executable
    for name, (expected, body) in TRITON_AOT.items():
        script = work / f"{name}.py"
        script.write_text(TRITON_KERNELS + AOT_PRELUDE + "\n" + body + "\n")
        text = _run([py, script.name], env=_python_env(False), cwd=work)
        _write(name, text, expected, "triton.compile(..., GPUTarget('cuda', 90, 32)) on the CPU", fixtures)
    for name, (expected, body) in TRITON_INTERP.items():
        script = work / f"{name}.py"
        script.write_text(TRITON_KERNELS + "\n" + body + "\n")
        text = _run([py, script.name], env=_python_env(True), cwd=work)
        _write(name, text, expected, "TRITON_INTERPRET=1 python (Triton interpreter)", fixtures)
    for name, (expected, body) in PYTHON_SNIPPETS.items():
        script = work / f"{name}.py"
        script.write_text(body)
        text = _run([py, "-X", "faulthandler", script.name], env=_python_env(False), cwd=work)
        _write(name, text, expected, "python (torch CPU) running a broken snippet", fixtures)
    build = work / "ext_build"
    build.mkdir()
    script = work / "load_inline_broken.py"
    script.write_text(f"BUILD = {str(build)!r}\n" + LOAD_INLINE)
    text = _run([py, script.name], env=_python_env(False), cwd=work)
    _write(
        "load_inline_cpp_undeclared",
        text,
        "compile.type",
        "torch.utils.cpp_extension.load_inline (ninja + g++) on a broken C++ source",
        fixtures,
    )
    return fixtures


def main() -> int:
    DATA.mkdir(exist_ok=True)
    manifest = DATA / "manifest.json"
    previous: list[dict[str, str]] = json.loads(manifest.read_text()) if manifest.exists() else []
    public = [entry for entry in previous if entry["origin"].startswith("public issue")]
    with tempfile.TemporaryDirectory(prefix="kf-capture-") as tmp:
        fixtures = capture(Path(tmp))
    entries = [asdict(f) for f in fixtures] + public
    manifest.write_text(json.dumps(entries, indent=2) + "\n")
    sys.stdout.write(f"wrote {len(fixtures)} captured fixtures ({len(public)} public kept)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
