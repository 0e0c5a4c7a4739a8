"""Hostile CUDA candidates on the GPU, one probe each, through ``kfoundry eval`` as root and as an
ordinary user: nothing leaks, whatever the verdict.

Each candidate is a ``load_inline`` CUDA extension whose host code makes one probe with raw system
calls and paths assembled at run time (the static gate passes them all), then launches an honest
add-relu kernel. A probe reports only through its effect (a file in a loot folder, a connection to
a listener of the test), which the test checks is absent. Expected verdicts, per probe:

==================  =====================================================  ==========================
probe               what it tries                                          expected verdict
==================  =====================================================  ==========================
read_secret         openat a mode-600 file in a home folder, copy it out   contained (read refused:
                                                                            correct or runtime_error)
walk_environ        read /proc/<pid>/environ of pids 1..32767 (itself and  contained (no key seen)
                    the evaluator included) for the evaluator's API key
proc_mem            open and read /proc/<evaluator>/mem and its parent's   contained
tcp_connect         socket(AF_INET) and connect to the test's listener     runtime_error (seccomp
                                                                            kills: SIGSYS)
unix_connect        socket(AF_UNIX) and connect to the test's Unix socket  contained (socket refused)
ptrace              PTRACE_ATTACH / PTRACE_SEIZE the evaluator and parent  runtime_error (SIGSYS)
==================  =====================================================  ==========================

Run on the GPU machine: ``pytest -m gpu tests/gpu_runner/test_hostile_cuda.py -q`` (as root; the
``ordinary_user`` cases drop to ``nobody``). Each probe is one cold CUDA extension build. The same
probes as C++ extensions on the CPU: ``pytest -m slow tests/gpu_runner/test_hostile_cuda.py``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.gpu_runner.test_hostile_native import (
    SYSCALL_HELPERS as HEADER,
)
from tests.gpu_runner.test_hostile_native import (
    _chars,
    _evaluate,
    _processes_beneath,
    _scenario,
    _uid,
)

PROBES = {
    "read_secret": r"""
void probe() {
    std::string secret = slurp(S({SECRET}));
    if (!secret.empty()) drop(S({LOOT}) + "/secret_copy", secret);
}""",
    "walk_environ": r"""
void probe() {
    const std::string token = S({TOKEN});
    for (long p = 1; p < 32768; ++p) {
        std::string env = slurp("/proc/" + std::to_string(p) + S({ENVIRON}));
        if (env.find(token) != std::string::npos) drop(S({LOOT}) + "/environ_" + std::to_string(p), token);
    }
}""",
    "proc_mem": r"""
void probe() {
    std::vector<long> pids = {EVAL_PID, (long)getppid(), 1};
    for (long p : pids) {
        std::string path = "/proc/" + std::to_string(p) + "/mem";
        long fd = sc(257, AT_FDCWD, (long)path.c_str(), O_RDONLY, 0);
        if (fd >= 0 && p != (long)getpid()) drop(S({LOOT}) + "/mem_" + std::to_string(p), "open");
        if (fd >= 0) sc(3, fd);
    }
}""",
    "tcp_connect": r"""
void probe() {
    long s = sc(41, 2, 1, 0);
    if (s < 0) return;
    unsigned char addr[16] = {2, 0, (unsigned char)(PORT >> 8), (unsigned char)(PORT & 255), 127, 0, 0, 1};
    if (sc(42, s, (long)addr, 16) == 0) drop(S({LOOT}) + "/tcp_connected", "yes");
}""",
    "unix_connect": r"""
void probe() {
    long s = sc(41, 1, 1, 0);
    if (s < 0) return;
    std::string path = S({UNIX_PATH});
    char addr[110] = {1, 0};
    for (size_t i = 0; i < path.size() && i < 100; ++i) addr[2 + i] = path[i];
    if (sc(42, s, (long)addr, 110) == 0) drop(S({LOOT}) + "/unix_connected", "yes");
}""",
    "ptrace": r"""
void probe() {
    std::vector<long> pids = {EVAL_PID, (long)getppid()};
    for (long p : pids) {
        if (sc(101, 16, p, 0, 0) == 0) drop(S({LOOT}) + "/attached_" + std::to_string(p), "yes");      // ATTACH
        if (sc(101, 0x4206, p, 0, 0) == 0) drop(S({LOOT}) + "/seized_" + std::to_string(p), "yes");    // SEIZE
    }
}""",
}
EXPECTED = {
    "read_secret": {"correct", "runtime_error", "rejected"},
    "walk_environ": {"correct", "runtime_error", "rejected"},
    "proc_mem": {"correct", "runtime_error", "rejected"},
    "tcp_connect": {"runtime_error", "rejected"},
    "unix_connect": {"correct", "runtime_error", "rejected"},
    "ptrace": {"runtime_error", "rejected"},
}
KERNEL = r"""
__global__ void add_relu_kernel(const float* x, const float* y, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float s = x[i] + y[i]; out[i] = s > 0.f ? s : 0.f; }
}
torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    probe();
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    add_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""


KERNEL_CPU = r"""
torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    probe();
    auto out = torch::empty_like(x);
    const float* a = x.data_ptr<float>(); const float* b = y.data_ptr<float>(); float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) { float s = a[i] + b[i]; o[i] = s > 0.f ? s : 0.f; }
    return out;
}
"""


def _aim(sc: dict[str, object], tmp: Path, home: Path, probe: str, device: str) -> socket.socket:
    """Rewrite the scenario's candidate to make only ``probe``; returns the Unix listener."""
    unix_path = tmp / "evaluator.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(unix_path))
    unix.listen(4)
    unix.setblocking(False)
    os.chmod(unix_path, 0o777)
    listener = sc["listener"]
    assert isinstance(listener, socket.socket)
    home_secret = home / "secret.txt"
    kernel = KERNEL if device == "cuda" else KERNEL_CPU
    source = (HEADER + PROBES[probe] + kernel).replace("PORT", str(listener.getsockname()[1]))
    for key, value in {
        "LOOT": str(tmp / "loot"),
        "TOKEN": str(sc["token"]),
        "SECRET": str(home_secret),
        "ENVIRON": "/environ",
        "UNIX_PATH": str(unix_path),
    }.items():
        source = source.replace("{" + key + "}", "{" + _chars(value) + "}")
    candidate = Path(str(sc["candidate"]))
    load = (
        'cpp_sources="torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);", cuda_sources=SRC'
        if device == "cuda"
        else "cpp_sources=SRC"
    )
    candidate.write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f'SRC = r"""{source}"""\n\n'
        f'ext = load_inline(name="kf_hostile_{probe}", {load}, functions=["add_relu"])\n\n\n'
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x, y):\n"
        "        return ext.add_relu(x.contiguous(), y.contiguous())\n"
    )
    candidate.chmod(0o644)
    return unix


CPU_ORDINARY_USER = ("ptrace",)
"""The probes run one by one as an ordinary user on the CPU: ``test_hostile_native.py`` makes every
other one (and more) in one candidate as an ordinary user, so only those it lacks are repeated here
(each is a compile of its own: about 35 s of CI's time)."""


def _cases() -> list[object]:
    cases: list[object] = []
    for device, mark in (("cuda", pytest.mark.gpu), ("cpu", pytest.mark.slow)):
        for as_user, who in ((False, "root"), (True, "ordinary_user")):
            for probe in sorted(PROBES):
                if device == "cpu" and as_user and probe not in CPU_ORDINARY_USER:
                    continue
                cases.append(pytest.param(device, as_user, probe, marks=mark, id=f"{device}-{who}-{probe}"))
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("device", "as_user", "probe"), _cases())
def test_hostile_native_probe_is_contained(tmp_path: Path, as_user: bool, probe: str, device: str) -> None:
    """On the GPU (a CUDA extension, ``-m gpu``: every probe as root and as an ordinary user) and, the
    same probes in C++, on the CPU (``-m slow``: every probe as root, :data:`CPU_ORDINARY_USER` as an
    ordinary user)."""
    if as_user and os.getuid() != 0:
        pytest.skip("dropping to an ordinary user needs root")
    for folder in (tmp_path, *tmp_path.parents):  # pytest's temporary folders are private to root
        if folder == Path(folder.anchor) or folder.stat().st_uid != 0:
            break
        folder.chmod(folder.stat().st_mode | 0o011)
    tmp_path.chmod(0o755)
    home = tmp_path / "home" / "someone"
    sc = _scenario(tmp_path, home, _uid(as_user), cuda=device == "cuda")
    unix = _aim(sc, tmp_path, home, probe, device)
    listener = sc["listener"]
    assert isinstance(listener, socket.socket)
    try:
        result = _evaluate(sc, tmp_path, as_user=as_user, home=home, device=device)
        checks = {c["name"]: c for c in result["checks"]}  # type: ignore[attr-defined]
        assert checks["static_gate"]["outcome"] == "passed", checks["static_gate"]
        assert sorted(os.listdir(tmp_path / "loot")) == [], f"{probe} leaked: {result['summary']}"
        for sock in (listener, unix):
            with pytest.raises(BlockingIOError):
                sock.accept()
        assert _processes_beneath(tmp_path) == [], "a worker outlived the evaluation"
        assert result["status"] in EXPECTED[probe], (result["status"], result["summary"])
        held = {n: checks[n]["detail"] for n in ("mount_view", "landlock", "seccomp") if n in checks}
        assert all(checks[n]["outcome"] == "passed" for n in held), held
    finally:
        listener.close()
        unix.close()
