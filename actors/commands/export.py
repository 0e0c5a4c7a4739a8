"""``kfoundry export RUN_DIR``: a run's best kernels as a module a user imports beside their model.

Reads the run directory ``kfoundry run`` wrote (``report.json``, ``best_model.py``) and writes one
Python file: the best candidate's ``ModelNew`` and its Triton kernels, which import only torch and
triton (never Kernel Foundry: a file that does is refused), under a header that says where it was
verified (the GPUs, the task, its input shapes and dtypes when ``--task`` names the task file, the
precision it was judged at, its speed there), that its kernels are specialised to those shapes,
and how to verify it again (``kfoundry eval``). Nothing is written over an existing file unless
``--force``. A run with no correct candidate has nothing to export: one line, exit 2.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import re
from pathlib import Path
from typing import Any

from actors.runtime.errors import ConfigError
from schemas.task import parse_module

OWN_PACKAGES = ("actors", "gpu_runner", "schemas", "experience", "kfoundry")
"""Top-level packages of Kernel Foundry: an exported module imports none of them."""


def add_export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kfoundry export RUN_DIR [--out FILE] [--task TASK.py] [--force]``."""
    p = sub.add_parser("export", help="write a run's best kernels as a module to import beside your model")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the folder kfoundry run wrote (its --run-dir)")
    p.add_argument("--out", type=Path, help="the module to write (default: <task name>_kernels.py here)")
    p.add_argument(
        "--task", type=Path, help="the run's task file: the header lists its input shapes (checked to be the run's)"
    )
    p.add_argument("--force", action="store_true", help="write over --out if it exists")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    report, source = read_run(args.run_dir)
    out: Path = args.out or Path(f"{_identifier(str(report.get('task_name') or 'task'))}_kernels.py")
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists; give --force to write over it")
    shapes = task_inputs(args.task, str(report.get("task_id") or "")) if args.task is not None else None
    out.write_text(header(report, args.run_dir, out, args.task, shapes) + source, encoding="utf-8")
    best = report["best"]
    print(  # noqa: T201 - the command's own output
        f"wrote {out}: ModelNew of run {report.get('run_id')} ({best.get('speedup_vs_eager') or 0:.3f}x eager); "
        f"verify it again with: kfoundry eval {args.task or 'TASK.py'} {out}"
    )
    return 0


def read_run(run_dir: Path) -> tuple[dict[str, Any], str]:
    """A run directory's report and best model, or :class:`ConfigError` naming what is missing."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory (give the folder kfoundry run wrote, its --run-dir)")
    report_path, model_path = run_dir / "report.json", run_dir / "best_model.py"
    if not report_path.is_file():
        raise ConfigError(f"{run_dir} has no report.json: not a finished run's folder")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{report_path} cannot be read: {exc}") from exc
    if not isinstance(report, dict) or not isinstance(report.get("best"), dict):
        raise ConfigError(f"run {run_dir} found no correct candidate: there is nothing to export")
    if not model_path.is_file():
        raise ConfigError(f"{run_dir} has no best_model.py")
    source = model_path.read_text(encoding="utf-8")
    check_standalone(source, model_path)
    return report, source


def check_standalone(source: str, where: Path) -> None:
    """Refuse a model that does not define ``ModelNew`` or imports Kernel Foundry."""
    try:
        tree = parse_module(source)
    except SyntaxError as exc:
        raise ConfigError(f"{where} is not valid Python: {exc.msg} (line {exc.lineno})") from exc
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise ConfigError(f"{where} defines no class ModelNew")
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in OWN_PACKAGES:
                raise ConfigError(f"{where} imports {name}: not a module that stands alone")


def task_inputs(task: Path, task_id: str) -> list[str]:
    """``name: (shape) dtype`` of each input the task's ``get_inputs()`` gives, drawn on the meta
    device (no data); the task file must be the run's (its fingerprint is the run's task id)."""
    import torch

    from actors.experts.template.trace import load_namespace
    from schemas import source_fingerprint

    try:
        source = task.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the task file {task}: {exc.strerror or exc}") from exc
    if task_id and source_fingerprint(source) != task_id:
        given = source_fingerprint(source)
        raise ConfigError(f"{task} is not this run's task (its id is {given}, the run's {task_id})")
    namespace = load_namespace(source)  # the user's own task file, loaded as the template expert loads it
    try:
        with torch.device("meta"):
            inputs = list(namespace["get_inputs"]())
    except Exception as exc:  # the task's own failure, named
        raise ConfigError(f"the task's get_inputs() failed: {type(exc).__name__}: {exc}") from exc
    names = _forward_names(namespace)
    found = []
    for i, value in enumerate(inputs):
        name = names[i] if i < len(names) else f"input {i}"
        if isinstance(value, torch.Tensor):
            found.append(f"{name}: {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}")
        else:
            found.append(f"{name}: {type(value).__name__} {value!r}")
    return found


def _forward_names(namespace: dict[str, Any]) -> list[str]:
    import inspect

    model = namespace.get("Model")
    try:
        return [n for n in inspect.signature(model.forward).parameters if n != "self"]  # type: ignore[union-attr]
    except (TypeError, ValueError, AttributeError):
        return []


def header(report: dict[str, Any], run_dir: Path, out: Path, task: Path | None, shapes: list[str] | None) -> str:
    """The comment block that opens the exported module."""
    best = report["best"]
    gpus = sorted({str(g.get("name")) for g in report.get("gpus") or [] if g.get("name")})
    where = ", ".join(gpus) or "the machine of the run"
    task_file = str(task) if task is not None else "TASK.py"
    lines = [
        f"Exported by `kfoundry export` on {datetime.date.today().isoformat()} from run {report.get('run_id')} "
        f"({run_dir}), task {report.get('task_name')} (id {report.get('task_id')}).",
        f"Verified by Kernel Foundry's evaluator on {where}: correct on every trial, on inputs drawn from the "
        "task's get_inputs() with seeds the candidate could not know.",
    ]
    if shapes is not None:
        lines.append("Verified at these inputs (a template candidate's kernels are specialised to them):")
        lines += [f"  {s}" for s in shapes]
    else:
        lines.append(
            "Verified at the input shapes of the task's get_inputs() (a template candidate is specialised to them; "
            "its forward refuses others); give --task to list them here."
        )
    for shape in best.get("held_out") or []:
        outcome = "correct" if shape.get("outcome") == "correct" else f"raised: {shape.get('detail')}"
        cand_ms, eager_ms = shape.get("candidate_ms"), shape.get("eager_ms")
        if outcome == "correct" and cand_ms and eager_ms:
            outcome += f", {eager_ms / cand_ms:.3g}x eager there ({cand_ms:.4g} ms against {eager_ms:.4g} ms)"
        lines.append(f"Held-out shape (drawn by the evaluator) {shape.get('shape')}: {outcome}")
    if not best.get("held_out") and best.get("held_out_note"):
        lines.append(f"Held-out shapes: {best['held_out_note']}")
    precision = best.get("precision")
    err, ref = best.get("err_vs_fp64"), best.get("ref_err_vs_fp64")
    if precision is not None and err is not None:
        judged = "exact (IEEE float32 reference)" if precision == "exact" else "the reference's own precision"
        lines.append(
            f"Precision: judged at {judged}; relative error {err:.2e} against float64"
            + (f" (the reference's: {ref:.2e})." if ref is not None else ".")
        )
    speed = f"{best.get('speedup_vs_eager') or 0:.3f}x eager PyTorch"
    if best.get("speedup_vs_compiled") is not None:
        speed += f", {best['speedup_vs_compiled']:.3f}x torch.compile"
    if best.get("median_ms") is not None:
        speed += f", median {best['median_ms']:.4f} ms"
    lines += [
        f"Speed there: {speed}.",
        f"Verify it again (on your GPU, your versions): kfoundry eval {task_file} {out} --device cuda",
        f"Use: from {_identifier(out.stem)} import ModelNew; build it with your Model's constructor arguments and "
        "load your Model's state_dict into it (the template expert's candidates keep its parameters' names).",
    ]
    return "".join(f"# {line}\n" for line in lines) + "\n"


def _identifier(text: str) -> str:
    """``text`` as a Python module name (letters, digits, underscores; not starting with a digit)."""
    name = re.sub(r"\W", "_", text) or "task"
    return f"_{name}" if name[0].isdigit() else name
