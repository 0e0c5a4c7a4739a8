"""Every command the README gives works as written: ``kfoundry`` commands parse with the real
argparse parser and their ``--help`` reaches the subcommand they name; the pytest and pip
commands name markers and extras that exist; each benchmark starts as written, and one that needs
a GPU says so in one line (no traceback) on a machine without one."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from gpu_runner.cli import _parser as eval_parser

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PROGRAMS = ("kfoundry", "python", "pytest", "pip")


def readme_commands() -> list[str]:
    """Commands of the README's code blocks, and inline code spans that start with a program."""
    found: list[str] = []
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", README, flags=re.S | re.M)
    for block in blocks:
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found.append(line)
    prose = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        text = " ".join(span.split())
        if text.split(" ", 1)[0] in PROGRAMS and " " in text:
            found.append(text)
    return found


def expand(command: str) -> list[list[str]]:
    """argv lists for one README command: environment assignments dropped, ``a|b`` choices and
    ``[--x | --y]`` optional alternatives expanded, ``...`` (more of the same) dropped and ``…``
    (a value to fill in) given one."""
    optional = re.search(r"\[(-[^\]]+)\]", command)
    if optional:
        before, after = command[: optional.start()], command[optional.end() :]
        options = ["", *(o.strip() for o in optional.group(1).split("|"))]
        return [argv for o in options for argv in expand(f"{before}{o}{after}")]
    tokens = [t for t in shlex.split(command) if t != "..."]
    while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):
        tokens.pop(0)
    tokens = ["VALUE" if t == "…" else t for t in tokens]
    choices = [t.split("|") if "|" in t and not t.startswith("-") else [t] for t in tokens]
    return [list(argv) for argv in itertools.product(*choices)]


COMMANDS = [argv for command in readme_commands() for argv in expand(command)]
# ``kfoundry run`` alone, in prose, names the command; it is checked as a name, not run.
NAMES = [argv for argv in COMMANDS if argv[0] == "kfoundry" and len(argv) == 2 and argv[1] in {"run", "eval"}]
KFOUNDRY = [argv for argv in COMMANDS if argv[0] == "kfoundry" and argv not in NAMES]
BENCHES = [argv for argv in COMMANDS if argv[0] == "python" and argv[1].startswith("bench/")]


def _ids(argvs: list[list[str]]) -> list[str]:
    return [" ".join(a)[:60] for a in argvs]


def test_readme_has_the_commands_this_test_checks() -> None:
    subcommands = {argv[1] for argv in KFOUNDRY}
    assert {"run", "actor", "eval", "tap", "status", "drain", "expert", "server"} <= subcommands, subcommands
    assert {Path(argv[1]).name for argv in BENCHES} >= {
        "fabric_bench.py",
        "gpu_runner_bench.py",
        "gpu_interference.py",
        "template_bench.py",
        "experience_bench.py",
    }
    assert not [c for c in COMMANDS if c[0] not in PROGRAMS], "a README command runs a program this test ignores"


def test_commands_the_readme_names_exist() -> None:
    choices = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert NAMES
    assert all(argv[1] in choices for argv in NAMES)


def _subcommand_path(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The subcommand names ``argv`` walks through (``["expert", "set"]``)."""
    path: list[str] = []
    for token in argv:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or token not in actions[0].choices:
            break
        path.append(token)
        parser = actions[0].choices[token]
    return path


@pytest.mark.parametrize("argv", KFOUNDRY, ids=_ids(KFOUNDRY))
def test_kfoundry_command_parses_and_its_help_is_the_subcommands(argv: list[str]) -> None:
    args = argv[1:]
    if args[0] == "eval":  # ``kfoundry eval`` hands its arguments to gpu_runner's parser
        parser, path, prog = eval_parser(), [], eval_parser().prog
        parser.parse_args(args[1:])
        help_argv = [*args[1:], "--help"]
    else:
        parser = build_parser()
        parsed = parser.parse_args(args)
        assert callable(parsed.func)
        path = _subcommand_path(parser, args)
        prog = " ".join(["kfoundry", *path])
        help_argv = [*args, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        parser.parse_args(help_argv)
    assert exited.value.code == 0
    assert out.getvalue().startswith(f"usage: {prog} "), out.getvalue()[:200]


def test_pytest_and_pip_commands_name_markers_and_extras_that_exist() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = {m.split(":")[0] for m in project["tool"]["pytest"]["ini_options"]["markers"]}
    extras = set(project["project"]["optional-dependencies"])
    checked = 0
    for argv in COMMANDS:
        if argv[0] == "pytest" and "-m" in argv:
            assert set(re.findall(r"\w+", argv[argv.index("-m") + 1])) - {"not", "and", "or"} <= markers, argv
            checked += 1
        if argv[:2] == ["pip", "install"]:
            for spec in (a for a in argv if "[" in a):
                assert set(spec[spec.index("[") + 1 : spec.index("]")].split(",")) <= extras, argv
                checked += 1
    assert checked >= 3


def _no_gpu_env() -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    return env


def _start_all(argvs: list[list[str]]) -> list[tuple[list[str], subprocess.Popen[str]]]:
    """Start every command at once (each imports torch: seconds apiece on a small machine)."""
    return [
        (argv, subprocess.Popen(
            [sys.executable, *argv[1:]], cwd=ROOT, env=_no_gpu_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
        for argv in argvs
    ]  # fmt: skip


GPU_BENCHES = {
    "gpu_runner_bench.py": 1,
    "template_bench.py": 1,
    "gpu_interference.py": 1,
    "multigpu_bench.py": 0,
    "scale_bench.py": 2,
    "trust_bench.py": 0,
    "crosscheck_probe.py": 0,
}
"""Benchmarks that need a GPU, and their exit status without one: ``multigpu_bench.py`` measures
what it can with fewer GPUs, and with none says so and ends without an error."""
NO_GPU_LINE = re.compile(r"no (CUDA )?GPU|needs a CUDA GPU")


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
def test_each_benchmark_starts_as_written_and_without_a_gpu_says_so_in_one_line() -> None:
    """From the repository root, as the README writes them: a benchmark that can run here shows
    its ``--help`` (its imports, ``bench`` included, work); one that needs a GPU exits with one
    line naming the missing GPU, no traceback."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU benchmarks would run")
    needs_gpu = [a for a in BENCHES if Path(a[1]).name in GPU_BENCHES]
    runs_here = [["python", s, "--help"] for s in sorted({a[1] for a in BENCHES if Path(a[1]).name not in GPU_BENCHES})]
    assert len(needs_gpu) >= 4
    assert len(runs_here) >= 2
    for argv, proc in _start_all(needs_gpu + runs_here):
        out, err = proc.communicate(timeout=100)
        if argv[-1] == "--help":
            assert proc.returncode == 0, f"{argv}: {err[-2000:]}"
            assert out.startswith("usage: "), f"{argv}: {out[:200]}"
            continue
        lines = [line for line in (out + err).splitlines() if line.strip()]
        assert proc.returncode == GPU_BENCHES[Path(argv[1]).name], f"{argv}: exit {proc.returncode}: {err[-2000:]}"
        assert len(lines) == 1, f"{argv}: {lines[-10:]}"
        assert NO_GPU_LINE.search(lines[0]), lines[0]
        assert "Traceback" not in err


STARTED_S = 45.0
"""How long a benchmark that runs here gets, as written, to show that it started: it has either
ended or is still measuring (no traceback) by then."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_benchmark_that_runs_here_runs_as_written_or_says_in_one_line_why_not(tmp_path: Path) -> None:
    """The README's CPU benchmarks exactly as written (no ``--help``), all at once: each one that
    ends within ``STARTED_S`` ends cleanly (status 0, or one line saying why it cannot), and each
    one still measuring then has printed no traceback; those are stopped with SIGINT, then their
    process group is killed."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmarks would run for real")
    written = sorted({tuple(a) for a in BENCHES if Path(a[1]).name not in GPU_BENCHES})
    assert len(written) >= 4
    started: list[tuple[tuple[str, ...], subprocess.Popen[bytes], Path]] = []
    for n, argv in enumerate(written):
        out = tmp_path / f"bench{n}.out"
        with open(out, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, *argv[1:]], cwd=ROOT, env=_no_gpu_env(),
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        started.append((argv, proc, out))
    deadline = time.monotonic() + STARTED_S
    try:
        while time.monotonic() < deadline and any(p.poll() is None for _, p, _ in started):
            time.sleep(0.5)
        for argv, proc, out in started:
            text = out.read_text(errors="replace")
            assert "Traceback" not in text, f"{argv}: {text[-3000:]}"
            if proc.poll() is None:
                continue  # still measuring: it started as written
            lines = [line for line in text.splitlines() if line.strip()]
            assert proc.returncode == 0 or len(lines) == 1, f"{argv}: exit {proc.returncode}: {lines[-10:]}"
    finally:
        for _, proc, _ in started:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (a benchmark cleans up its servers and actors), then SIGKILL to its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
