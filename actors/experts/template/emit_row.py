"""The row template: reductions and normalisations over a ``(outer, R, inner)`` view.

Two layouts. When the reduced dims are innermost (``inner == 1``) a program takes ``BLOCK_M``
whole rows and the tile is ``[BLOCK_M, BLOCK_R]``; otherwise a program takes one ``outer`` index
and ``BLOCK_I`` consecutive inner positions, and the tile is ``[BLOCK_R, BLOCK_I]`` (coalesced
along ``inner``). One-pass kernels hold the whole row in registers and read it once; multi-pass
kernels loop over ``R`` once per dependent reduction, recomputing the elementwise prologue from
memory each pass; a softmax's max and sum of exponentials share one (online: the running sum is
rescaled when the running maximum grows), so do a norm's sum and squared deviations (merged per
tile), then the output takes another. Reductions accumulate in fp32 tiles.
"""

from __future__ import annotations

import math

from actors.experts.template.any_batch import Sym
from actors.experts.template.emit import IndexSpace, Launch, Scope, Writer
from actors.experts.template.fuse import Kernel, Schedule
from actors.experts.template.ir import NodeKind
from actors.experts.template.params import ONE_PASS_MAX_TILE, TemplateParams

SYM_ROW_TILE = 4096
"""Largest tile (elements) of a loop over a row whose length moves with the batch."""


def next_pow2(n: int) -> int:
    """Smallest power of two >= n."""
    return 1 << max(0, (n - 1).bit_length())


MOST_ROWS = 32
"""Most rows one program of a row kernel takes (the largest ``row_block_m`` of the space)."""

FEW_PROGRAMS = 256
"""Programs below which a row kernel does not take more rows per program (two per SM of a GPU
of up to 128 SMs) unless its first kernel already launches fewer."""


PER_THREAD = 8
"""Fewest elements of its tile a thread of a later row kernel holds (:func:`row_shape`)."""


def row_shape(sched: Schedule, kernel: Kernel, block_m: int, warps: int) -> tuple[int, int]:
    """Rows per program and warps of ``kernel`` (rows innermost). The parameters' ``row_block_m``
    and ``row_warps`` were chosen for the schedule's first such kernel (``tuning.default_params``
    and the GPU model read the first kernel of each kind). A kernel whose rows are shorter takes
    as many rows as keep that kernel's tile, within :data:`MOST_ROWS`, its own rows and enough
    programs to spread over the GPU (:data:`FEW_PROGRAMS`), and no more warps than give every
    thread :data:`PER_THREAD` elements of its tile; longer rows take fewer rows.
    Without this a whole model's later layers inherit the first layer's shape: MobileNetV1's
    196-wide batch-norm rows ran one to a program of 16 warps under the 12544-wide first
    layer's choice (94 us a kernel on an H100, where cuDNN takes 5 us)."""
    if isinstance(kernel.reduced, Sym):
        return block_m, warps
    first = next(
        (k for k in sched.kernels if k.kind is kernel.kind and k.inner == 1 and not isinstance(k.reduced, Sym)),
        kernel,
    )
    own, chosen = next_pow2(kernel.reduced), next_pow2(first.reduced)
    if own == chosen:
        return block_m, warps
    rows = max(1, min(MOST_ROWS, chosen * block_m // own))
    if not isinstance(kernel.outer, Sym) and not isinstance(first.outer, Sym):
        # where the rows move with the batch (the any-batch copies) the shape may not depend on
        # how many there are: the copy's text is the same at every batch (any_sizes.check_texts)
        spread = min(math.ceil(first.outer / block_m), FEW_PROGRAMS)
        rows = min(rows, next_pow2(kernel.outer), kernel.outer // spread)
    rows = max(1, rows)
    rows = 1 << (rows.bit_length() - 1)
    tile = own * rows
    return rows, max(1, min(warps, tile // (32 * PER_THREAD)))


class RowWriter(Writer):
    """Emits one row kernel."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        self.r = kernel.reduced
        self.last = kernel.inner == 1
        rtile = next_pow2(self.r)
        self.bm, self.warps = (
            row_shape(sched, kernel, params.row_block_m, params.row_warps) if self.last else (1, params.row_warps)
        )
        self.bi = 1 if self.last else params.row_block_i
        width = self.bm if self.last else self.bi
        if isinstance(self.r, Sym):
            # a row whose length moves with the batch (batch norm's statistics, a mean over the
            # samples) has no bound: loop over it in blocks that do not depend on its length
            self.one_pass = False
            self.block_r = max(16, min(params.row_block_r, SYM_ROW_TILE // width))
        else:
            self.one_pass = params.row_one_pass and rtile * width <= ONE_PASS_MAX_TILE
            self.block_r = rtile if self.one_pass else min(params.row_block_r, rtile)
        self.axis = 1 if self.last else 0
        self.tile = "[BLOCK_M, BLOCK_R]" if self.last else "[BLOCK_R, BLOCK_I]"
        self.ridx = "cols[None, :]" if self.last else "rr[:, None]"
        self.nib = math.ceil(kernel.inner / self.bi)
        self.reds = [n for n in kernel.nodes if self.plan.nodes[n].kind is NodeKind.RED]
        self.eviction: str | None = None
        """The L2 hint of the loop being written (see ``write``)."""

    def space(self, row: bool) -> IndexSpace:
        d0, d1 = self.kernel.dims
        rank = len(self.kernel.domain)
        if row:
            return IndexSpace(lin="rows" if self.last else "rlin", mask="rmask" if self.last else "imask")
        if self.last:
            fast = {(d0, d1): "cols[None, :]"}
            if d0 > 0:
                fast[(0, d0)] = "rows[:, None]"
        else:
            fast = {(d0, d1): "rr[:, None]", (d1, rank): "ci[None, :]"}
        return IndexSpace(lin="lin", mask="m", shape=self.kernel.domain, fast=fast)

    def broadcast_row(self, var: str) -> str:
        return f"{var}[:, None]" if self.last else f"{var}[None, :]"

    # -- structure -----------------------------------------------------------------------
    def _prologue(self, s: Scope) -> None:
        k = self.kernel
        if self.last:
            self.emit(s, f"rows = {self.pid()} * BLOCK_M + tl.arange(0, BLOCK_M)")
            self.emit(s, f"rmask = rows < {k.outer}")
        else:
            self.emit(s, f"pid = {self.pid()}")
            self.emit(s, f"o = pid // {self.nib}")
            self.emit(s, f"ci = (pid % {self.nib}) * BLOCK_I + tl.arange(0, BLOCK_I)")
            self.emit(s, f"imask = ci < {k.inner}")
            self.emit(s, f"rlin = o * {k.inner} + ci")

    def _tile(self, s: Scope, start: str) -> None:
        r, inner = self.r, self.kernel.inner
        if self.last:
            self.emit(s, f"cols = {start}tl.arange(0, BLOCK_R)")
            self.emit(s, f"m = rmask[:, None] & (cols < {r})[None, :]")
            self.emit(s, f"lin = rows[:, None] * {r} + cols[None, :]")
        else:
            self.emit(s, f"rr = {start}tl.arange(0, BLOCK_R)")
            self.emit(s, f"m = (rr < {r})[:, None] & imask[None, :]")
            self.emit(s, f"lin = (o * {r} + rr[:, None]) * {inner} + ci[None, :]")

    def _phases(self) -> dict[int, int]:
        phase: dict[int, int] = {}

        def depth(nid: int) -> int:
            if not self.inside(nid):
                return 0
            node = self.plan.nodes[nid]
            if node.kind is NodeKind.RED:
                return phase[nid]
            return max((depth(a) for a in node.tensor_args()), default=0)

        for red in self.reds:
            phase[red] = 1 + depth(self.plan.nodes[red].tensor_args()[0])
        return phase

    def _row_deps(self, top: Scope, nid: int, seen: set[int]) -> None:
        """Compute, in the top scope, every row-level value the element value ``nid`` reads."""
        if nid in seen or not self.inside(nid):
            return
        seen.add(nid)
        if self.row_level(nid):
            self.value(top, nid)
            return
        for arg in self.plan.nodes[nid].tensor_args():
            self._row_deps(top, arg, seen)

    # -- reductions ----------------------------------------------------------------------
    def _source(self, s: Scope, red: int) -> str:
        src = self.plan.nodes[red].tensor_args()[0]
        return self.operand(s, src, self.plan.nodes[src].shape, row=False)

    def _reduce_once(self, s: Scope, red: int) -> None:
        node = self.plan.nodes[red]
        src = self._source(s, red)
        ax, var = self.axis, f"v{red}"
        if node.op == "sum":
            self.emit(s, f"{var} = tl.sum(tl.where(m, {src}, 0.0), axis={ax})")
        elif node.op == "prod":
            self.used.add("_kf_mul")
            self.emit(s, f"{var} = tl.reduce(tl.where(m, {src}, 1.0), {ax}, _kf_mul)")
        elif node.op in ("amax", "amin"):
            fn, pad = ("max", "float('-inf')") if node.op == "amax" else ("min", "float('inf')")
            self.emit(s, f"{var} = tl.{fn}(tl.where(m, {src}, {pad}), axis={ax})")
        else:
            fn, pad = ("max", "float('-inf')") if node.op == "argmax" else ("min", "float('inf')")
            t, best = self.fresh("t"), self.fresh("best")
            self.emit(s, f"{t} = tl.where(m, {src}, {pad})")
            self.emit(s, f"{best} = tl.{fn}({t}, axis={ax})")
            cond = f"{t} == {self.broadcast_row(best)}"
            self.emit(s, f"{var} = tl.min(tl.where({cond}, {self.ridx}, 2147483647), axis={ax})")
        s.memo[("v", red)] = var

    def _acc_init(self, s: Scope, red: int) -> None:
        op = self.plan.nodes[red].op
        if op in ("sum", "prod"):
            fill = "tl.zeros" if op == "sum" else "tl.full"
            value = "" if op == "sum" else ", 1.0"
            self.emit(s, f"a{red} = {fill}({self.tile}{value}, dtype=tl.float32)")
            return
        pad = "float('-inf')" if op in ("amax", "argmax") else "float('inf')"
        self.emit(s, f"a{red} = tl.full({self.tile}, {pad}, tl.float32)")
        if op.startswith("arg"):
            self.emit(s, f"i{red} = tl.zeros({self.tile}, dtype=tl.int32)")

    def _acc_step(self, s: Scope, red: int) -> None:
        node = self.plan.nodes[red]
        src = self._source(s, red)
        acc = f"a{red}"
        if node.op == "sum":
            self.emit(s, f"{acc} += tl.where(m, {src}, 0.0)")
        elif node.op == "prod":
            self.emit(s, f"{acc} = {acc} * tl.where(m, {src}, 1.0)")
        elif node.op in ("amax", "amin"):
            fn, pad = ("maximum", "float('-inf')") if node.op == "amax" else ("minimum", "float('inf')")
            self.emit(s, f"{acc} = tl.{fn}({acc}, tl.where(m, {src}, {pad}))")
        else:
            cmp, pad = (">", "float('-inf')") if node.op == "argmax" else ("<", "float('inf')")
            t, u = self.fresh("t"), self.fresh("u")
            self.emit(s, f"{t} = tl.where(m, {src}, {pad})")
            self.emit(s, f"{u} = {t} {cmp} {acc}")
            self.emit(s, f"i{red} = tl.where({u}, ({self.ridx}).to(tl.int32), i{red})")
            self.emit(s, f"{acc} = tl.where({u}, {t}, {acc})")

    def _acc_final(self, s: Scope, red: int) -> None:
        op, ax, var = self.plan.nodes[red].op, self.axis, f"v{red}"
        if op == "sum":
            self.emit(s, f"{var} = tl.sum(a{red}, axis={ax})")
        elif op == "prod":
            self.used.add("_kf_mul")
            self.emit(s, f"{var} = tl.reduce(a{red}, {ax}, _kf_mul)")
        elif op in ("amax", "amin"):
            self.emit(s, f"{var} = tl.{op[1:]}(a{red}, axis={ax})")
        else:
            best = self.fresh("best")
            self.emit(s, f"{best} = tl.{'max' if op == 'argmax' else 'min'}(a{red}, axis={ax})")
            cond = f"a{red} == {self.broadcast_row(best)}"
            self.emit(s, f"{var} = tl.min(tl.where({cond}, i{red}, 2147483647), axis={ax})")
        s.memo[("v", red)] = var

    def _by_phase(self, phase: dict[int, int]) -> dict[int, list[int]]:
        """The kernel's reductions grouped by phase."""
        by_phase: dict[int, list[int]] = {}
        for red in self.reds:
            by_phase.setdefault(phase[red], []).append(red)
        return by_phase

    def _online_pairs(self, phase: dict[int, int]) -> dict[int, tuple[int, int]]:
        """Phase -> (``amax`` M, ``sum`` T) of a softmax's statistics, taken in one loop.

        The pattern: M = max(S) alone in its phase, then T = sum(exp(S - M)) alone in the next,
        with S the same value. A multi-pass kernel read the row once for M and once more for T
        (then once for the output); the online form keeps a running maximum and rescales the
        running sum whenever it grows, so both come from one read (log_softmax over rows of 393216:
        three reads and a write, two reads and a write now).
        """
        nodes = self.plan.nodes
        by_phase = self._by_phase(phase)
        pairs: dict[int, tuple[int, int]] = {}
        for p, batch in by_phase.items():
            after = by_phase.get(p + 1, [])
            if len(batch) != 1 or len(after) != 1:
                continue
            m_id, t_id = batch[0], after[0]
            if nodes[m_id].op != "amax" or nodes[t_id].op != "sum":
                continue
            src = nodes[m_id].tensor_args()[0]
            e = nodes[nodes[t_id].tensor_args()[0]]
            if not (self.inside(e.id) and e.kind is NodeKind.EW and e.op == "exp" and len(e.args) == 1):
                continue
            d = nodes[e.tensor_args()[0]]
            if self.inside(d.id) and d.kind is NodeKind.EW and d.op == "sub" and d.args == (src, m_id):
                pairs[p] = (m_id, t_id)
        return pairs

    def _online(self, top: Scope, m_id: int, t_id: int) -> None:
        """M = max(S) and T = sum(exp(S - M)) in one loop over the row (see ``_online_pairs``)."""
        self._row_deps(top, self.plan.nodes[m_id].tensor_args()[0], set())
        ax, mv, sv = self.axis, f"v{m_id}", f"v{t_id}"
        vec = "[BLOCK_M]" if self.last else "[BLOCK_I]"
        self.emit(top, f"{mv} = tl.full({vec}, float('-inf'), tl.float32)")
        self.emit(top, f"{sv} = tl.zeros({vec}, dtype=tl.float32)")
        loop = self._loop(top)
        t, new, safe = self.fresh("t"), self.fresh("mx"), self.fresh("ms")
        self.emit(loop, f"{t} = tl.where(m, {self._source(loop, m_id)}, float('-inf'))")
        self.emit(loop, f"{new} = tl.maximum({mv}, tl.max({t}, axis={ax}))")
        # A row with no finite maximum yet (masked, or all -inf so far) rescales by 0, not NaN.
        self.emit(loop, f"{safe} = tl.where({new} == float('-inf'), 0.0, {new})")
        grown = f"tl.exp({mv} - {safe})"
        step = f"tl.sum(tl.where(m, tl.exp({t} - {self.broadcast_row(safe)}), 0.0), axis={ax})"
        self.emit(loop, f"{sv} = {sv} * {grown} + {step}")
        self.emit(loop, f"{mv} = {new}")
        top.memo[("v", m_id)] = mv
        top.memo[("v", t_id)] = sv

    def _welford_pairs(self, phase: dict[int, int]) -> dict[int, tuple[int, int]]:
        """Phase -> (``sum`` S, ``sum`` Q) of a row's mean and squared deviations, taken in one loop.

        The pattern: S = sum(X) alone in its phase, then Q = sum(D * D) alone in the next, with
        D = X - S / R (R the row's length, X the same value). A multi-pass kernel read the row once
        for S and once more for Q; Welford's running mean and squared deviations take both from
        one read, with no difference of large sums (a norm's statistics over rows of 262144: two
        reads, one now).
        """
        nodes = self.plan.nodes
        by_phase = self._by_phase(phase)
        pairs: dict[int, tuple[int, int]] = {}
        for p, batch in sorted(by_phase.items()):
            after = by_phase.get(p + 1, [])
            if len(batch) != 1 or len(after) != 1 or p - 1 in pairs:
                continue
            s_id, q_id = batch[0], after[0]
            if nodes[s_id].op != "sum" or nodes[q_id].op != "sum":
                continue
            sq = nodes[nodes[q_id].tensor_args()[0]]
            if not (self.inside(sq.id) and sq.kind is NodeKind.EW and sq.op == "mul" and len(set(sq.args)) == 1):
                continue
            d = nodes[sq.tensor_args()[0]]
            if not (self.inside(d.id) and d.kind is NodeKind.EW and d.op == "sub" and len(d.args) == 2):
                continue
            x, mu = d.args
            if x != nodes[s_id].tensor_args()[0] or not isinstance(mu, int) or not self.inside(mu):
                continue
            mean = nodes[mu]
            if mean.kind is NodeKind.EW and mean.op == "div" and mean.args == (s_id, float(self.r)):
                pairs[p] = (s_id, q_id)
        return pairs

    def _welford(self, top: Scope, s_id: int, q_id: int) -> None:
        """S = sum(X) and Q = sum((X - S / R)^2) in one loop over the row (see ``_welford_pairs``).

        Each lane of the tile keeps its own sum, mean and squared deviations (Welford's update: no
        reduction across lanes inside the loop); the lanes are merged once after it. A lane that
        takes part in a pass has taken part in every pass before it (the masks cut only the last
        pass's tail and rows outside the grid), so the count at the k-th pass is k for every lane
        it updates (one reciprocal per pass, not one division per element), and a lane's count
        after the loop follows from its position alone.
        """
        self._row_deps(top, self.plan.nodes[s_id].tensor_args()[0], set())
        ax, sv, qv, r = self.axis, f"v{s_id}", f"v{q_id}", self.r
        total, mean, q = self.fresh("ws"), self.fresh("wmean"), self.fresh("wq")
        for var in (total, mean, q):
            self.emit(top, f"{var} = tl.zeros({self.tile}, dtype=tl.float32)")
        loop = self._loop(top)
        t, delta, inv = self.fresh("t"), self.fresh("dl"), self.fresh("inv")
        self.emit(loop, f"{t} = tl.where(m, {self._source(loop, s_id)}, 0.0)")
        self.emit(loop, f"{inv} = 1.0 / (r0 // BLOCK_R + 1)")
        self.emit(loop, f"{delta} = {t} - {mean}")
        self.emit(loop, f"{mean} = tl.where(m, {mean} + {delta} * {inv}, {mean})")
        self.emit(loop, f"{q} = tl.where(m, {q} + {delta} * ({t} - {mean}), {q})")
        self.emit(loop, f"{total} = {total} + {t}")
        n, mu = self.fresh("wn"), self.fresh("wmu")
        passes = f"({r} - tl.arange(0, BLOCK_R) + BLOCK_R - 1) // BLOCK_R"  # passes that lane took part in
        lanes, rows = ("[None, :]", "rmask[:, None]") if self.last else ("[:, None]", "imask[None, :]")
        self.emit(top, f"{n} = tl.where({rows}, ({passes}){lanes}, 0).to(tl.float32)")
        self.emit(top, f"{sv} = tl.sum({total}, axis={ax})")
        self.emit(top, f"{mu} = {sv} / {f'({r} * 1.0)' if isinstance(r, Sym) else float(r)}")
        spread = f"{n} * ({mean} - {self.broadcast_row(mu)}) * ({mean} - {self.broadcast_row(mu)})"
        self.emit(top, f"{qv} = tl.sum({q}, axis={ax}) + tl.sum({spread}, axis={ax})")
        top.memo[("v", s_id)] = sv
        top.memo[("v", q_id)] = qv

    # -- the kernel ----------------------------------------------------------------------
    def write(self) -> Launch:
        top = Scope(indent="    ")
        start = len(self.lines)
        self._prologue(top)
        exports = self.kernel.exports
        elem_exports = [e for e in exports if not self.row_level(e)]
        if self.one_pass:
            self._tile(top, "")
            for red in self.reds:
                self._reduce_once(top, red)
            for nid in exports:
                self.store(top, nid, row=self.row_level(nid))
        else:
            phase = self._phases()
            online = self._online_pairs(phase)
            welford = {
                p: pair for p, pair in self._welford_pairs(phase).items() if p not in online and p - 1 not in online
            }
            runs = [
                p for p in range(1, max(phase.values(), default=0) + 1) if p - 1 not in online and p - 1 not in welford
            ]
            # Loops before the last keep the row in L2 for the next (rows of 256 KB, as in L2 norm
            # over 65535 columns, can be read again from it); the last read lets it go.
            self.eviction = "evict_last" if len(runs) + bool(elem_exports) > 1 else None
            for p in runs:
                if p == runs[-1] and not elem_exports:
                    self.eviction = "evict_first" if self.eviction else None
                if p in online:
                    self._online(top, *online[p])
                    continue
                if p in welford:
                    self._welford(top, *welford[p])
                    continue
                batch = [r for r in self.reds if phase[r] == p]
                seen: set[int] = set()
                for red in batch:
                    self._row_deps(top, self.plan.nodes[red].tensor_args()[0], seen)
                    self._acc_init(top, red)
                loop = self._loop(top)
                for red in batch:
                    self._acc_step(loop, red)
                for red in batch:
                    self._acc_final(top, red)
            if elem_exports:
                seen = set()
                for nid in elem_exports:
                    self._row_deps(top, nid, seen)
                if self.eviction:
                    self.eviction = "evict_first"
                loop = self._loop(top)
                for nid in elem_exports:
                    self.store(loop, nid, row=False)
            for nid in exports:
                if self.row_level(nid):
                    self.store(top, nid, row=True)
        body = self.lines[start:]
        consts = ["BLOCK_M", "BLOCK_R"] if self.last else ["BLOCK_R", "BLOCK_I"]
        values = (
            {"BLOCK_M": self.bm, "BLOCK_R": self.block_r}
            if self.last
            else {"BLOCK_R": self.block_r, "BLOCK_I": self.bi}
        )
        grid = math.ceil(self.kernel.outer / self.bm) if self.last else self.kernel.outer * self.nib
        return Launch(
            source="\n".join(["@triton.jit", self.signature(consts), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(grid,),
            constexprs=values,
            num_warps=self.warps,
            num_stages=self.params.row_stages,
        )

    def _loop(self, top: Scope) -> Scope:
        self.emit(top, f"for r0 in range(0, {self.r}, BLOCK_R):")
        loop = Scope(indent=top.indent + "    ", parent=top, eviction=self.eviction)
        self._tile(loop, "r0 + ")
        return loop
