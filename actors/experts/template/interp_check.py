"""Check rendered candidates against their references, in a child process, on the CPU.

``python -m actors.experts.template.interp_check`` reads a JSON list of jobs on stdin
(``reference``, ``candidate`` sources, ``seeds``, ``atol``, ``rtol``) and writes one JSON list of
verdicts on stdout. It must run with ``TRITON_INTERPRET=1`` in its environment (it refuses
otherwise), and it executes both sources, so it is only ever started as its own process:
:func:`check_in_subprocess` does that. Per seed it builds ``Model`` and ``ModelNew`` under the
same seed, requires identical parameters, runs both on the reference's ``get_inputs()``, and
compares outputs (nested as the reference's, a tuple where it has a tuple, a list where it has a
list; exactly for integer outputs) plus each one's error against a float64 run of the reference.
The tests and ``bench/template_bench.py --device cpu`` use it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from actors.runtime.childenv import child_pythonpath

_ENV_KEY = "TRITON_INTERPRET"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one job."""

    ok: bool
    detail: str
    max_abs_err: float | None = None
    err_vs_fp64: float | None = None
    ref_err_vs_fp64: float | None = None


def _module(source: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


def _rel_l2(a: Any, b: Any) -> float:
    import torch

    diff = torch.linalg.vector_norm((a.double() - b.double()).flatten())
    ref = torch.linalg.vector_norm(b.double().flatten())
    return float(diff / ref) if float(ref) > 0 else float(diff)


def _check(job: dict[str, Any]) -> Verdict:
    import copy

    import torch

    ref_ns = _module(job["reference"], "kf_check_reference")
    cand_ns = _module(job["candidate"], "kf_check_candidate")
    worst: Verdict | None = None
    for seed in job["seeds"]:
        torch.manual_seed(seed)
        init = list(ref_ns["get_init_inputs"]())
        torch.manual_seed(seed)
        ref = ref_ns["Model"](*init)
        torch.manual_seed(seed)
        new = cand_ns["ModelNew"](*init)
        ref_state, new_state = ref.state_dict(), new.state_dict()
        if list(ref_state) != list(new_state):
            return Verdict(False, f"parameter names differ: {list(ref_state)} vs {list(new_state)}")
        for key, value in ref_state.items():
            if not torch.equal(value, new_state[key]):
                return Verdict(False, f"parameter {key} differs under seed {seed}")
        torch.manual_seed(seed + 1)
        inputs = list(ref_ns["get_inputs"]())
        before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():  # each side on its own copy (a reference may write its inputs)
            expected = ref(*[x.clone() if isinstance(x, torch.Tensor) else x for x in before])
            actual = new(*inputs)
            ref64 = copy.deepcopy(ref).double()
            exact = ref64(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in before])
        for x, y in zip(inputs, before, strict=True):
            if isinstance(x, torch.Tensor) and not torch.equal(x, y):
                return Verdict(False, "the candidate changed an input")
        if _nesting(actual) != _nesting(expected):
            return Verdict(False, f"output structure {_nesting(actual)}, the reference's {_nesting(expected)}")
        expected_all, actual_all, exact_all = _listed(expected), _listed(actual), _listed(exact)
        if len(actual_all) != len(expected_all):
            return Verdict(False, f"{len(actual_all)} outputs, the reference returns {len(expected_all)}")
        for actual, expected, exact in zip(actual_all, expected_all, exact_all, strict=True):
            bad = not isinstance(actual, torch.Tensor)
            if bad or actual.shape != expected.shape or actual.dtype != expected.dtype:
                got = (getattr(actual, "shape", None), getattr(actual, "dtype", None))
                return Verdict(False, f"output {got} vs expected {(expected.shape, expected.dtype)}")
            if not expected.is_floating_point():
                if not torch.equal(actual, expected):
                    return Verdict(False, f"integer output differs at {int((actual != expected).sum())} places")
                continue
            max_abs = float((actual - expected).abs().max()) if actual.numel() else 0.0
            err, ref_err = _rel_l2(actual, exact), _rel_l2(expected, exact)
            if not torch.allclose(actual, expected, atol=job["atol"], rtol=job["rtol"]):
                return Verdict(False, f"mismatch under seed {seed}: max abs err {max_abs:.3g}", max_abs, err, ref_err)
            if worst is None or (worst.err_vs_fp64 or 0.0) < err:
                worst = Verdict(True, "ok", max_abs, err, ref_err)
    return worst or Verdict(True, "ok")


def _listed(value: Any) -> list[Any]:
    """A forward's outputs as a list, in order (one tensor, or tuples or lists of them, nested or not)."""
    return [x for v in value for x in _listed(v)] if isinstance(value, tuple | list) else [value]


def _nesting(value: Any) -> Any:
    """How a forward's outputs nest: ``("tuple", "tensor", ("list", ...))``, the kind of each
    tuple and list kept (the template returns the reference's own)."""
    if isinstance(value, tuple | list):
        return ("list" if isinstance(value, list) else "tuple", *map(_nesting, value))
    return type(value).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process: ``interp_check JOBS.json`` (or the jobs on stdin)."""
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get(_ENV_KEY) != "1":
        sys.stderr.write(f"interp_check runs only with {_ENV_KEY}=1 in its environment\n")
        return 2
    if args:
        with open(args[0], encoding="utf-8") as fh:
            jobs = json.load(fh)
    else:
        jobs = json.loads(sys.stdin.read())
    verdicts = []
    for job in jobs:
        try:
            verdict = _check(job)
        except Exception as exc:  # noqa: BLE001 - a candidate's failure is this job's verdict
            verdict = Verdict(False, f"{type(exc).__name__}: {exc}")
        verdicts.append(asdict(verdict))
    sys.stdout.write(json.dumps(verdicts))
    return 0


_ROOT = Path(__file__).resolve().parents[3]


def start_check(jobs: list[dict[str, Any]], workdir: Path) -> subprocess.Popen[str]:
    """Start a child process checking ``jobs`` (written under ``workdir``); see ``finish_check``."""
    # A unique name: two calls in a row may pass lists that share an id() (the first freed).
    fd, name = tempfile.mkstemp(prefix="jobs-", suffix=".json", dir=workdir)
    path = Path(name)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(jobs, fh)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env.update({_ENV_KEY: "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": child_pythonpath(_ROOT)})
    return subprocess.Popen(
        [sys.executable, "-m", "actors.experts.template.interp_check", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(workdir),
    )


def finish_check(proc: subprocess.Popen[str], timeout: float) -> list[Verdict]:
    """Wait for a child started by ``start_check`` and parse its verdicts."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"interp_check exited {proc.returncode}: {err[-2000:]}")
    return [Verdict(**v) for v in json.loads(out)]


def check_in_subprocess(jobs: list[dict[str, Any]], workdir: Path, timeout: float = 600.0) -> list[Verdict]:
    """Run ``jobs`` in one interpreter child process and return their verdicts in order."""
    return finish_check(start_check(jobs, workdir), timeout)


if __name__ == "__main__":
    raise SystemExit(main())
