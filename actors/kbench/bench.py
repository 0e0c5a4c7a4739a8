"""``kfoundry bench KERNELBENCH_DIR --level N --problems SPEC``: the command.

Runs each selected problem with ``kfoundry run`` (``runner``), one after another, and after each
one rewrites ``<out>/bench.json`` (``results.BenchFile``) and ``<out>/bench.md`` (the table with
its totals). Problems already in an existing ``bench.json`` of the same level are skipped, so a
bench stopped by SIGINT/SIGTERM (the running problem is stopped and not kept) or by a crash
resumes where it was. One line per problem start and end goes to stderr, with elapsed time.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from pydantic import ValidationError

from actors.kbench.errors import BenchError, Interrupted, ResultsFileError
from actors.kbench.problems import Problem, select
from actors.kbench.results import BenchFile, ProblemResult, markdown, totals
from actors.kbench.slots import Slot, plan_slots

if TYPE_CHECKING:  # the runner (and the report it reads) load only when a bench runs: every
    # kfoundry command builds this parser
    from actors.kbench.runner import RunOptions

EXIT_INTERRUPTED = 130
EXIT_UNFINISHED = 75
"""Exit status when ``--start-until`` left problems unstarted (EX_TEMPFAIL: run again to resume)."""


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="run `kfoundry run` on problems of a KernelBench checkout and tabulate the results",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("kernelbench_dir", type=Path, help="a KernelBench checkout (its KernelBench/ folder, or the repo)")
    p.add_argument("--level", type=int, required=True, help="KernelBench level (1, 2, 3, ...)")
    p.add_argument(
        "--problems",
        default="dev",
        help="problems: numbers and ranges (1,2,5-9), 'dev' (the development subset) or 'all'",
    )
    p.add_argument("--seconds", type=float, default=None, help="wall-clock budget per problem (kfoundry run --seconds)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--eval-timeout", type=float, default=180.0, help="kfoundry run --eval-timeout")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder (bench.json, bench.md, runs/)")
    p.add_argument(
        "--run-args",
        default="",
        help="more `kfoundry run` arguments as one string, e.g. --run-args='--islands 1 --experts template'",
    )
    p.add_argument("--grace", type=float, default=30.0, help="seconds a run gets to stop after SIGINT")
    p.add_argument(
        "--start-until",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no problem after this many seconds of the bench; those running finish and are kept "
        "(run again to resume; exit status 75): a bench cut into time slots loses no run half done",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="problems run at once (default 1). On GPUs each run gets GPUs of its own (the visible GPUs "
        "split evenly; at most one run per GPU) and a share of the cores; on the CPU, a share of the cores; and "
        "each plans with its share of the host's memory (--host-memory-share)",
    )
    p.set_defaults(func=cmd_bench)


def load_existing(path: Path, level: int) -> BenchFile | None:
    """The ``bench.json`` at ``path`` if there is one; it must be of the same level."""
    if not path.exists():
        return None
    try:
        existing = BenchFile.model_validate_json(path.read_text())
    except (ValidationError, ValueError, OSError) as exc:
        raise ResultsFileError(f"{path}: cannot resume from it ({str(exc).splitlines()[0]}); move it away") from exc
    if existing.level != level:
        raise ResultsFileError(f"{path} holds level {existing.level}, not level {level}: use another --out")
    return existing


def write(bench: BenchFile, out: Path) -> None:
    """Write ``bench.json`` and ``bench.md`` atomically (a reader never sees half a file)."""
    final = bench.model_copy(update={"totals": totals(bench.results)})
    for name, text in (("bench.json", final.model_dump_json(indent=2)), ("bench.md", markdown(final))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


class Bench:
    """The bench's loop over its problems (see the module docstring): one run at a time, or one
    per slot at a time, each slot's runs started from a thread of its own."""

    def __init__(
        self,
        problems: list[Problem],
        bench: BenchFile,
        out: Path,
        opts: RunOptions,
        progress: TextIO,
        slots: Sequence[Slot] | None = None,
        start_until_s: float | None = None,
    ) -> None:
        self.problems = problems
        self.bench = bench
        self.out = out
        self.opts = opts
        self.progress = progress
        self.slots = list(slots) if slots else [Slot()]
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._queue: deque[tuple[int, Problem]] = deque()
        self._todo = 0
        self._failure: BaseException | None = None
        self.start_until_s = start_until_s
        """No problem is started after this many seconds (``--start-until``)."""
        self._held = 0
        """Problems not started because of :attr:`start_until_s`."""

    def _say(self, text: str) -> None:
        with self._lock:
            self.progress.write(f"[{time.monotonic() - self._started:7.0f}s] {text}\n")
            self.progress.flush()

    def run(self) -> int:
        self._started = time.monotonic()
        done = {(r.level, r.number) for r in self.bench.results}
        todo = [p for p in self.problems if (p.level, p.number) not in done]
        skipped = len(self.problems) - len(todo)
        self._todo = len(todo)
        self._queue.extend(enumerate(todo, 1))
        self._say(f"{len(todo)} problem(s) to run, {skipped} already in {self.out / 'bench.json'}")
        if len(self.slots) == 1:
            self._work(self.slots[0])
        else:
            self._say(f"{len(self.slots)} at a time: " + "; ".join(s.describe() for s in self.slots))
            threads = [
                threading.Thread(target=self._work, args=(slot,), name=f"bench-slot-{slot.index}", daemon=True)
                for slot in self.slots
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # joined in steps, so the main thread still takes SIGINT/SIGTERM
                    t.join(timeout=0.5)
        write(self.bench, self.out)
        if self._failure is not None:
            raise self._failure
        if self.stop.is_set():
            self._say(f"stopped; finished results kept in {self.out / 'bench.json'} (run again to resume)")
            return EXIT_INTERRUPTED
        if self._held:
            self._say(
                f"--start-until {self.start_until_s:g} s reached: {self._held} problem(s) not started; "
                f"finished results in {self.out / 'bench.json'} (run again to resume)"
            )
            return EXIT_UNFINISHED
        self._say(f"done: {self.out / 'bench.json'}, {self.out / 'bench.md'}")
        return 0

    def _work(self, slot: Slot) -> None:
        """Run problems from the queue on ``slot`` until it is empty or the bench is stopped."""
        from actors.kbench.runner import describe, run_problem

        try:
            if slot.cores:
                os.sched_setaffinity(0, slot.cores)  # this thread's; the runs it starts inherit it
            where = f" on {slot.label()}" if len(self.slots) > 1 else ""
            while not self.stop.is_set():
                with self._lock:
                    if not self._queue:
                        return
                    if self.start_until_s is not None and time.monotonic() - self._started > self.start_until_s:
                        self._held = len(self._queue)
                        return
                    i, problem = self._queue.popleft()
                self._say(f"({i}/{self._todo}) {problem.name}: start{where}")
                try:
                    result = run_problem(problem, self.out, self.opts, self.stop, slot=slot)
                except Interrupted:
                    self._say(f"({i}/{self._todo}) {problem.name}: interrupted, not kept")
                    return
                self._keep(result)
                budget = f" of its {self.opts.seconds:g} s budget" if self.opts.seconds is not None else ""
                self._say(f"({i}/{self._todo}) {problem.name}: {describe(result)} (wall {result.wall_s:.1f} s{budget})")
        except BaseException as exc:  # a slot's thread: the failure ends the bench, raised by run()
            with self._lock:
                self._failure = self._failure or exc
            self.stop.set()
            if threading.current_thread() is threading.main_thread():
                raise

    def _keep(self, result: ProblemResult) -> None:
        with self._lock:
            rows = [r for r in self.bench.results if (r.level, r.number) != (result.level, result.number)]
            rows.append(result)
            rows.sort(key=lambda r: (r.level, r.number))
            self.bench = self.bench.model_copy(update={"results": tuple(rows)})
            write(self.bench, self.out)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.seconds is not None and args.seconds <= 0:
        raise BenchError(f"--seconds {args.seconds:g}: must be positive")
    if args.start_until is not None and args.start_until < 0:
        raise BenchError(f"--start-until {args.start_until:g}: must be 0 or more seconds")
    if args.eval_timeout <= 0 or args.grace <= 0:
        raise BenchError("--eval-timeout and --grace must be positive")
    problems = select(args.kernelbench_dir, args.level, args.problems)
    try:
        run_args = tuple(shlex.split(args.run_args))
    except ValueError as exc:
        raise BenchError(f"--run-args {args.run_args!r}: {exc}") from exc
    owned = {"--run-dir", "--device", "--seconds", "--eval-timeout", "--host-memory-share"}
    clash = sorted(owned & {a.split("=", 1)[0] for a in run_args})
    if clash:
        raise BenchError(f"--run-args: {', '.join(clash)} is set by the bench itself")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    bench = load_existing(out / "bench.json", args.level) or BenchFile(
        kernelbench_dir=str(args.kernelbench_dir.resolve()), level=args.level, problems_spec=args.problems
    )
    from actors.kbench.runner import RunOptions
    from actors.runtime.gpus import list_gpus

    slots = plan_slots(
        args.parallel,
        args.device,
        list_gpus() if args.parallel > 1 and args.device != "cpu" else [],
        sorted(os.sched_getaffinity(0)),
    )
    bench = bench.model_copy(
        update={
            "problems_spec": args.problems,
            "run_args": run_args,
            "device": args.device,
            "seconds": args.seconds,
            "parallel": args.parallel,
        }
    )

    opts = RunOptions(
        device=args.device,
        seconds=args.seconds,
        run_args=run_args,
        eval_timeout_s=args.eval_timeout,
        grace_s=args.grace,
        # runs side by side each plan with their share of the host's memory: each measured the
        # same available memory, and two 6 GB elementwise tasks could together plan past it
        host_memory_share=1.0 / len(slots) if len(slots) > 1 else None,
    )
    runner = Bench(problems, bench, out, opts, sys.stderr, slots, args.start_until)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping the running problem (finished ones are kept)\n")
        runner.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
