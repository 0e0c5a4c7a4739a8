"""The compile stage (parent side): a content-hash cache in front of sandboxed compile workers.

The key covers the candidate, the reference (Triton specialises on its shapes), the target and
the software versions, so an identical source never compiles twice, failures included (a
timeout is not cached). Artifacts move from the worker's private directory into the cache only
through the parent, which the run process then copies from: nothing a candidate's process
wrote is shared with another candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import structlog

from gpu_runner.config import RunnerConfig, compile_processes, usable_cores
from gpu_runner.errors import WorkerStartError
from gpu_runner.forkserver import ForkServer
from gpu_runner.frames import CompileOp, Op, Report, op_frame
from gpu_runner.gate import GateReport
from gpu_runner.isolation import sandbox_settings
from gpu_runner.lease import UNRANKED, Turn
from gpu_runner.protocol import FrameError
from gpu_runner.sandbox import Isolation, Worker, await_ready, chown_tree, spawn_worker
from gpu_runner.triton_cache import copy_tree

logger = structlog.get_logger(__name__)
_names = count()


def _seed_cache(seed: Path, tree: Path) -> None:
    """Start a worker's Triton cache ``tree`` from an earlier compile's (where it still exists)."""
    if seed.is_dir():
        copy_tree(seed, tree)


@dataclass(frozen=True)
class CompileOutcome:
    """What the compile stage produced for one candidate."""

    ok: bool
    needed: bool
    cache_hit: bool = False
    seconds: float = 0.0
    log: str = ""
    aot: str = ""
    error: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    entry: Path | None = None
    ext_manifest: dict[str, str] = field(default_factory=dict)

    @property
    def triton_dir(self) -> Path | None:
        """Triton cache tree to give the run process, if the stage made one."""
        if self.entry is None:
            return None
        path = self.entry / "triton"
        return path if path.exists() else None


def compile_env(
    cfg: RunnerConfig, base: Path, device: str, target: dict[str, Any] | None, private_name: str
) -> dict[str, str]:
    """The environment of a compile worker (or of their fork server) whose private folder is
    ``base / private_name``, compiling for ``target`` (``arch``) on a CUDA machine."""
    private = base / private_name
    env = {
        "TRITON_CACHE_DIR": str(private / "triton"),
        "TORCH_EXTENSIONS_DIR": str(private / "ext"),
        "MAX_JOBS": str(max(1, usable_cores() // cfg.compile_workers)),
    }
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ""
        if target is not None:
            arch = int(target["arch"])
            env["TORCH_CUDA_ARCH_LIST"] = f"{arch // 10}.{arch % 10}"
    else:
        env["TRITON_INTERPRET"] = "1"
    return env


GATE_PATIENCE_S = 5.0
"""How long a compile lets better-ranked candidates still in the static gate go first
(:meth:`CoreBudget.take`): about two whole-model candidates' gates (KernelBench L3-15's took 2 s on a
2-core host)."""


class CoreBudget:
    """The host's cores, shared by the compiles in the order of their turns (the candidates'
    ranks, then their arrival: :data:`gpu_runner.lease.Turn`), lowest first.

    Each compile had taken ``cores // running`` processes for its kernels whatever the others
    took: a run's first eight candidates of a whole model (KernelBench L3-15, 838 kernels each)
    compiled side by side in about 40 processes on 16 cores, and none was ready in 90 s. Now a
    compile that can use every core waits for them and has them alone: the first candidate is
    compiled in an eighth of the time, the eighth no later than before. By turn, as the compile
    line orders the verdicts: a better-ranked candidate that reaches the compiler a moment later
    is not left behind a variant's minute of compiling.

    Candidates still in the static gate are in that order too (:meth:`arriving`, for
    ``patience_s`` at most): at a run's start two islands' candidates reach the evaluator a moment
    apart, and the first to leave the gate had taken every core. On an H100 host (KernelBench
    L3-22, two islands of four) a better-ranked candidate of the first island arrived 0.3 s after
    the second island's first, waited for that one's 9.4 s compile, and that one, compiled, waited
    10 s more for it (the compile line's patience, :class:`gpu_runner.lease.CompileLine`): the
    first verdict came 37 s into the run."""

    def __init__(self, cores: int, patience_s: float = GATE_PATIENCE_S) -> None:
        self.cores = max(1, cores)
        self.free = self.cores
        self.patience_s = patience_s
        self._line: set[Turn] = set()
        self._gating: dict[Turn, float] = {}
        """Evaluations in the static gate: until when each is waited for (``patience_s`` from its arrival)."""
        self._holding: dict[Turn, float] = {}
        """Compiles holding cores now: since when."""
        self._ended: dict[Turn, float] = {}
        """When each evaluation's last compile gave its cores back (until :meth:`forget`)."""
        self._arrivals = count()
        self._changed = asyncio.Condition()

    def arriving(self, turn: Turn) -> None:
        """An evaluation arrived and is in the static gate: worse-ranked compiles wait for it, for
        ``patience_s`` from now at most."""
        self._gating[turn] = time.monotonic() + self.patience_s

    async def arrived(self, turn: Turn) -> None:
        """It left the gate (to compile now, or not at all); idempotent."""
        if self._gating.pop(turn, None) is not None:
            async with self._changed:
                self._changed.notify_all()

    def beside(self, turn: Turn) -> Callable[[Turn], bool]:
        """Which better-ranked evaluations a compiled candidate waits for in the compile line
        (:meth:`gpu_runner.lease.CompileLine.wait_turn`): those in the gate, and those whose
        compile ran beside its own (started before its own gave the cores back). Not those that
        compile after it: they waited for its cores (a whole model's compile takes them all), so
        they are a whole compile away, and the GPU would wait with it: on an H100 host a compiled
        KernelBench L3-22 candidate waited 6.8 s so, of the first verdict's 40 s."""
        own_end = self._ended.get(turn)
        until = time.monotonic() if own_end is None else own_end

        def soon(other: Turn) -> bool:
            since = self._holding.get(other)
            return other in self._gating or (since is not None and since < until)

        return soon

    async def forget(self, turn: Turn) -> None:
        """The evaluation ended: nothing of it is kept (out of the gate too, if it never left it)."""
        self._ended.pop(turn, None)
        await self.arrived(turn)

    async def take(self, want: int, turn: Turn | None = None) -> int:
        """Wait for ``want`` cores (at most all of them) behind the lower turns, those still in
        the gate included (for ``patience_s`` from their arrival; none given: after every ranked
        one, in arrival order); how many."""
        want = max(1, min(want, self.cores))
        me: Turn = turn if turn is not None else (UNRANKED, next(self._arrivals))
        self._gating.pop(me, None)
        async with self._changed:
            self._line.add(me)
            try:
                while True:
                    now = time.monotonic()
                    ahead = [until for other, until in self._gating.items() if other < me and until > now]
                    if not ahead and min(self._line) == me and self.free >= want:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(ahead) - now if ahead else None):
                            await self._changed.wait()
                self.free -= want
                if turn is not None:
                    self._holding[turn] = time.monotonic()
            finally:
                self._line.discard(me)
                self._changed.notify_all()
        return want

    async def give(self, cores: int, turn: Turn | None = None) -> None:
        if turn is not None and self._holding.pop(turn, None) is not None:
            self._ended[turn] = time.monotonic()
        async with self._changed:
            self.free += cores
            self._changed.notify_all()


class Compiler:
    """Compiles candidates in single-use CPU-only workers, behind a content-hash cache."""

    def __init__(self, cfg: RunnerConfig, iso: Isolation, device: str, base: Path, versions: str) -> None:
        self.cfg = cfg
        self.iso = iso
        self.device = device
        self.base = base
        self.cache = cfg.resolved_cache_dir() / "compile"
        self.versions = versions
        self.sem = asyncio.Semaphore(cfg.compile_workers)
        self.cores = CoreBudget(usable_cores())
        """The cores the compiles share (each takes what its kernels can use: ``jobs``)."""
        self.inflight: dict[str, asyncio.Future[CompileOutcome]] = {}
        self.idle: list[Worker] = []
        self.starting = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.reaping: set[asyncio.Task[None]] = set()
        self.target: dict[str, Any] | None = None
        self.forks: ForkServer | None = None
        """Where workers are forked from (None: fresh interpreters)."""
        self.closed = False

    @contextlib.asynccontextmanager
    async def _cores(self, kernels: int, turn: Turn | None) -> AsyncIterator[int]:
        """The cores for a compile of ``kernels`` Triton kernels, for as long as it runs."""
        jobs = await self.cores.take(compile_processes(self.cores.cores, kernels), turn)
        try:
            yield jobs
        finally:
            await asyncio.shield(self.cores.give(jobs, turn))

    def warm_count(self) -> int:
        return self.cfg.compile_workers if self.device == "cuda" else 0

    def env(self, private_name: str) -> dict[str, str]:
        return compile_env(self.cfg, self.base, self.device, self.target, private_name)

    async def _new_worker(self) -> Worker:
        name = f"compile-{next(_names)}"
        worker = await spawn_worker(
            "compile", self.device, self.iso, self.cfg.python, self.base, name, self.env(name), forks=self.forks
        )
        try:
            await await_ready(worker, self.cfg.worker_start_timeout_s)
        except BaseException:
            await worker.kill(sweep=False)
            raise
        return worker

    def refill(self) -> None:
        """Keep compile workers warm (CUDA only: on the CPU they are rarely needed)."""
        while not self.closed and self.target is not None and len(self.idle) + self.starting < self.warm_count():
            self.starting += 1
            task = asyncio.create_task(self._start())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _start(self) -> None:
        try:
            worker = await self._new_worker()
            if self.closed:
                await worker.kill(sweep=False)
            else:
                self.idle.append(worker)
        except WorkerStartError as exc:
            logger.warning("compile_worker_failed", error=str(exc)[:500])
        finally:
            self.starting -= 1

    def key(self, candidate: str, reference: str, variants: Sequence[Mapping[str, int]] = ()) -> str:
        parts = [candidate, reference, json.dumps(self.target, sort_keys=True), self.versions, self.device]
        if variants:  # compiled at the held-out shapes too: another entry
            parts.append(json.dumps(list(variants), sort_keys=True))
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]

    def needed(self, gate: GateReport) -> bool:
        return self.device == "cuda" or gate.uses_load_inline

    async def compile(
        self,
        candidate: str,
        reference: str,
        gate: GateReport,
        timeout_s: float,
        variants: Sequence[Mapping[str, int]] = (),
        seed: Path | None = None,
        turn: Turn | None = None,
    ) -> CompileOutcome:
        """Compile (or fetch from the cache) one candidate; at the task's held-out shapes
        (``variants``, module-level sizes) too, where they are known. ``seed``: the Triton cache of
        an earlier compile of the same candidate (at the reference's shapes alone), which the
        worker starts from: only the kernels the shapes add are compiled. ``turn``: its place in
        line for the cores (:class:`CoreBudget`)."""
        if not self.needed(gate):
            return CompileOutcome(ok=True, needed=False, aot="not needed: Triton runs under the interpreter here")
        key = self.key(candidate, reference, variants)
        entry = self.cache / key
        cached = self._load(entry)
        if cached is not None:
            return cached
        if key in self.inflight:
            return await asyncio.shield(self.inflight[key])
        future: asyncio.Future[CompileOutcome] = asyncio.get_running_loop().create_future()
        self.inflight[key] = future
        try:
            outcome = await self._compile(candidate, reference, gate, timeout_s, entry, variants, seed, turn)
            future.set_result(outcome)
            return outcome
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it
            raise
        finally:
            del self.inflight[key]

    def _load(self, entry: Path) -> CompileOutcome | None:
        meta_path = entry / "meta.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        manifest = {k: str(entry / v) for k, v in meta["ext"].items()}
        return CompileOutcome(
            ok=meta["ok"],
            needed=True,
            cache_hit=True,
            seconds=0.0,
            log=meta["log"],
            aot=str(meta["aot"]),
            error=meta["error"],
            entry=entry,
            ext_manifest=manifest,
        )

    async def _compile(
        self,
        candidate: str,
        reference: str,
        gate: GateReport,
        timeout_s: float,
        entry: Path,
        variants: Sequence[Mapping[str, int]] = (),
        seed: Path | None = None,
        turn: Turn | None = None,
    ) -> CompileOutcome:
        queued = time.perf_counter()
        async with self.sem, self._cores(len(gate.triton_kernels), turn) as jobs:
            started = time.perf_counter()
            warm = bool(self.idle)
            worker = self.idle.pop() if self.idle else await self._new_worker()
            got_worker = time.perf_counter()
            self.refill()
            try:
                header = await self._run(worker, candidate, reference, gate, timeout_s, variants, seed, jobs)
            except TimeoutError:
                return CompileOutcome(
                    ok=False,
                    needed=True,
                    seconds=time.perf_counter() - started,
                    timed_out=True,
                    log=worker.log_text(),
                    error={
                        "etype": "TimeoutError",
                        "stage": "compile",
                        "message": f"compilation exceeded {timeout_s:.0f} s",
                    },
                )
            except (asyncio.IncompleteReadError, FrameError) as exc:
                await asyncio.sleep(0.05)  # let a crashed process's exit status arrive
                rc = worker.proc.returncode
                return CompileOutcome(
                    ok=False,
                    needed=True,
                    seconds=time.perf_counter() - started,
                    log=worker.log_text(),
                    error={
                        "etype": type(exc).__name__,
                        "stage": "compile",
                        "message": f"the compile process died (exit status {rc})",
                    },
                )
            finally:
                tree = worker.terminate()
                self._reap(worker.reap(tree, sweep=self.iso.pids.startswith("skipped")))
            ran = time.perf_counter()
            seconds = ran - started
            outcome = await asyncio.to_thread(self._store, worker, header, entry, seconds)
            # Where a compile's time goes (for throughput work): the queue for a worker slot, a
            # worker's start when none was warm, the worker's own run, and storing the result.
            logger.debug(
                "compile phases",
                queued_s=round(started - queued, 3),
                worker_start_s=round(got_worker - started, 3),
                warm=warm,
                in_worker_s=round(float(header.get("elapsed_s", 0.0)), 3),
                worker_phases={k: round(float(v), 3) for k, v in (header.get("phases") or {}).items()},
                run_s=round(ran - got_worker, 3),
                store_s=round(time.perf_counter() - ran, 3),
                total_s=round(time.perf_counter() - queued, 3),
            )
            return outcome

    async def _run(
        self,
        worker: Worker,
        candidate: str,
        reference: str,
        gate: GateReport,
        timeout_s: float,
        variants: Sequence[Mapping[str, int]] = (),
        seed: Path | None = None,
        jobs: int = 1,
    ) -> dict[str, Any]:
        path = worker.dir / "candidate.py"
        path.write_text(candidate)
        (worker.dir / "ext").mkdir(exist_ok=True)
        if seed is not None:
            await asyncio.to_thread(_seed_cache, seed, worker.dir / "triton")
        chown_tree(worker.dir, self.iso.uid, self.iso.gid)
        sandbox = sandbox_settings(self.cfg, self.iso, worker.dir, worker.bulk, "compile", True)
        await worker.send(
            op_frame(
                Op.COMPILE,
                CompileOp(
                    candidate_path=str(path),
                    reference_source=reference,
                    build_root=str(worker.dir / "ext"),
                    target=self.target if self.device == "cuda" else None,
                    triton_kernels=list(gate.triton_kernels),
                    sandbox=sandbox,
                    jobs=jobs,
                    variants=[dict(v) for v in variants],
                ),
            )
        )
        async with asyncio.timeout(timeout_s):
            while True:
                header, _ = await worker.recv(1 << 20)
                if header["kind"] is Report.COMPILED:
                    return header

    def _store(self, worker: Worker, header: dict[str, Any], entry: Path, seconds: float) -> CompileOutcome:
        tmp = entry.parent / f".tmp-{secrets.token_hex(6)}"
        tmp.mkdir(parents=True)
        triton_src = worker.dir / "triton"
        if triton_src.exists():
            # Its group files still name this worker's folder: the run worker's copy is relocated
            # where it lands (gpu_runner.triton_cache).
            shutil.copytree(triton_src, tmp / "triton", symlinks=False, ignore_dangling_symlinks=True)
        ext: dict[str, str] = {}
        for item in header.get("built", []):
            so = Path(str(item["so"]))
            if so.is_file() and so.resolve().is_relative_to(worker.dir.resolve()):
                rel = Path("ext") / str(item["key"]) / so.name
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(so, tmp / rel)
                ext[str(item["key"])] = str(rel)
        ok = bool(header.get("ok"))
        error = {k: str(header.get(k, "")) for k in ("etype", "message", "traceback", "stage")} if not ok else {}
        log = worker.log_text()
        meta = {
            "ok": ok,
            "log": log[-200_000:],
            "aot": str(header.get("aot", "")),
            "error": error,
            "ext": ext,
            "seconds": seconds,
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(entry)
        except OSError:  # another evaluator stored the same key first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
        manifest = {k: str(entry / v) for k, v in ext.items()}
        return CompileOutcome(
            ok=ok,
            needed=True,
            seconds=seconds,
            log=log,
            aot=str(meta["aot"]),
            error=error,
            entry=entry,
            ext_manifest=manifest,
        )

    def _reap(self, reap: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(reap)
        self.reaping.add(task)
        task.add_done_callback(self.reaping.discard)

    async def close(self) -> None:
        self.closed = True
        if self.reaping:
            await asyncio.gather(*self.reaping, return_exceptions=True)
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for worker in self.idle:
            await worker.kill(sweep=False)
        self.idle.clear()
