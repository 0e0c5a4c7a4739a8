"""The recurrent family: ``nn.RNN`` (tanh, relu), ``nn.LSTM`` and ``nn.GRU`` modules lowered.

A call ``self.rnn(x, hx)`` becomes, per layer: for each direction, the input projection of every
time step as one matrix product (``x`` viewed as ``(T*B, I)`` times ``W_ih^T``, ``b_ih`` added in
its epilogue), then one ``REC`` node whose kernel (``_recurrent_kernel.py``) walks the time steps in
order (from the end for the backward direction), adds ``h_{t-1} @ W_hh^T + b_hh`` and applies the
cell's equations. ``b_hh`` is added inside the step, as PyTorch groups it (``linear_hh(h) +
linear_ih(x)``): GRU needs ``b_hn`` there anyway (``n = tanh(x_n + r * (W_hn h + b_hn))``).

A ``REC`` node's value is one flat buffer: the layer's output sequence in the layout of ``x``
(``(B, T, D*H)`` with ``batch_first``, else ``(T, B, D*H)``; the backward direction in the second
half of the features), then the final hidden state as ``(D, B, H)`` and, for an LSTM, the final
cell state as ``(D, B, H)``. The next layer, the module's output and its ``h_n`` / ``c_n`` read it
through PyTorch views (data movement only, admitted under every run policy); ``h_n`` and ``c_n``
of several layers are joined by ``torch.cat``'s lowering (``concat.py``), of one layer copied
(``clone``) so that no two returned tensors share memory. The module's result is the tuple it
returns: ``(output, h_n)``, or ``(output, (h_n, c_n))`` for an LSTM.

Covered: any number of layers, ``batch_first`` either way, bidirectional, with or without biases,
dropout between layers in eval mode (or 0), initial states given (``hx``) or absent (zeros).
Declined, with the reason: ``proj_size``, packed sequences, unbatched (2-D) input, dropout in
training mode, states of other shapes, float16/bfloat16 tensors.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families._recurrent_kernel import RecSpec, RecurrentWriter
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.ir import NodeKind, NodeRef, Plan, TupleRef
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.lowering import LowerContext, lower_fn, lowering
from actors.experts.template.params import TemplateParams
from actors.experts.template.products import product
from actors.experts.template.spellings import MODULES, REQUIRED, Spec

for _cls, _canon in ((nn.RNN, "rnn"), (nn.LSTM, "lstm"), (nn.GRU, "gru")):
    MODULES[_cls] = Spec(_canon, (("input", REQUIRED), ("hx", None)))


def _refuse(module: nn.RNNBase) -> str | None:
    """Why this module is not covered (``None``: it is)."""
    name = type(module).__name__
    if getattr(module, "proj_size", 0):
        return f"{name} with proj_size={module.proj_size} (projected hidden states) is not covered"
    if module.dropout and module.training and module.num_layers > 1:
        return f"{name} with dropout={module.dropout} between layers in training mode is random; not covered"
    if str(module.mode).lower() not in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        return f"{name} of mode {module.mode!r} is not covered"
    return None


def _layout(lw: LowerContext, src: NodeRef, shape: tuple[int, ...], expr: str) -> NodeRef:
    """A PyTorch data-movement op of ``src`` (``{0}`` in ``expr``), made contiguous."""
    return lw.add(NodeKind.TORCH, shape, dtype="float32", args=(src.id,), path=expr)


def _states(lw: LowerContext, hx: object, mode: str, shape: tuple[int, ...]) -> tuple[NodeRef | None, NodeRef | None]:
    """``(h0, c0)`` from the module's ``hx`` argument, each checked to be ``shape``."""
    if hx is None:
        return None, None
    if mode == "lstm":
        items = hx.items if isinstance(hx, TupleRef) else hx
        if not isinstance(items, tuple | list) or len(items) != 2:
            raise UnsupportedGraph("LSTM's hx must be a tuple (h0, c0) of tensors")
        h0, c0 = (lw.tensor(s, "an initial state of LSTM") for s in items)
    else:
        h0, c0 = lw.tensor(hx, "the initial state of a recurrent module"), None
    for state in (h0, c0):
        if state is not None and lw.shape(state) != shape:
            raise UnsupportedGraph(f"an initial state of shape {lw.shape(state)} is not covered (expected {shape})")
    return h0, c0


@lowering("rnn", "lstm", "gru")
def _recurrent(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> TupleRef:
    return lower_recurrent(lw, b, traced)


def lower_recurrent(lw: LowerContext, b: dict[str, Any], traced: Any = None) -> TupleRef:
    """The nodes of one ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` call; the tuple the module returns."""
    path = str(b["__path__"])
    module = lw.traced.root.get_submodule(path)
    if not isinstance(module, nn.RNNBase):
        raise UnsupportedGraph(f"module {path} is not a recurrent module")
    name = type(module).__name__
    why = _refuse(module)
    if why is not None:
        raise UnsupportedGraph(why, op=name)
    x = b["input"]
    if not isinstance(x, NodeRef):
        raise UnsupportedGraph(f"{name} of a {type(x).__name__}: packed sequences are not covered", op=name)
    x = lw.tensor(x, f"the input of {name}")
    shape = lw.shape(x)
    if len(shape) != 3:
        raise UnsupportedGraph(f"{name} of an unbatched {len(shape)}-D input is not covered (batched 3-D is)", op=name)
    first = bool(module.batch_first)
    batch, steps = (shape[0], shape[1]) if first else (shape[1], shape[0])
    hidden, layers, dirs = int(module.hidden_size), int(module.num_layers), 2 if module.bidirectional else 1
    if shape[2] != module.input_size or steps == 0 or batch == 0:
        raise UnsupportedGraph(f"{name} of input shape {shape} is not covered", op=name)
    mode = str(module.mode).lower()
    h0, c0 = _states(lw, b.get("hx"), mode, (layers * dirs, batch, hidden))
    rows = steps * batch
    src = lw.view(x, (rows, shape[2]))
    recs: list[NodeRef] = []
    for layer in range(layers):
        given = (h0 is not None, c0 is not None)
        spec = RecSpec(mode, steps, batch, hidden, dirs, first, layer, bool(module.bias), *given)
        suffixes = ("", "_reverse")[:dirs]
        projections = []
        for sfx in suffixes:
            proj = product(lw, src, lw.perm(lw.param(f"{path}.weight_ih_l{layer}{sfx}")))
            if spec.bias:
                proj = lw.ew("add", proj, lw.param(f"{path}.bias_ih_l{layer}{sfx}"))
            projections.append(proj)
        weights = [lw.param(f"{path}.weight_hh_l{layer}{sfx}") for sfx in suffixes]
        biases = [lw.param(f"{path}.bias_hh_l{layer}{sfx}") for sfx in suffixes] if spec.bias else []
        states = [s for s in (h0, c0) if s is not None]
        args = tuple(r.id for r in (*projections, *weights, *biases, *states))
        rec = lw.add(NodeKind.REC, (spec.numel,), op=mode, args=args, attrs=spec.attrs())
        recs.append(rec)
        src = _layout(lw, rec, (rows, dirs * hidden), f"{{0}}[:{spec.seq}].view({rows}, {dirs * hidden})")
    last = RecSpec.of(lw.node(recs[-1]))
    out_shape = (batch, steps, dirs * hidden) if first else (steps, batch, dirs * hidden)
    output = _layout(lw, recs[-1], out_shape, f"{{0}}[:{last.seq}].view{out_shape!r}")
    h_n = _final(lw, recs, last, 0)
    result = TupleRef((output, TupleRef((h_n, _final(lw, recs, last, 1))) if mode == "lstm" else h_n))
    _check_traced(result, traced, name, lw)
    return result


def _final(lw: LowerContext, recs: list[NodeRef], spec: RecSpec, which: int) -> NodeRef:
    """``h_n`` (``which`` 0) or ``c_n`` (1) of every layer, ``(L*D, B, H)``."""
    start = spec.seq + which * spec.states
    part = (spec.directions, spec.batch, spec.hidden)
    expr = f"{{0}}[{start}:{start + spec.states}].view{part!r}"
    if len(recs) == 1:
        return _layout(lw, recs[0], part, expr + ".clone()")  # no two returned tensors share memory
    parts = [_layout(lw, rec, part, expr) for rec in recs]
    cat = lower_fn("cat")
    if cat is None:
        raise UnsupportedGraph("joining the states of several layers needs torch.cat's lowering")
    joined = cat(lw, "cat", {"tensors": parts, "dim": 0}, None)
    if not isinstance(joined, NodeRef):
        raise UnsupportedGraph("the states of several layers did not join into one tensor")
    return joined


def _check_traced(result: TupleRef, traced: Any, name: str, lw: LowerContext) -> None:
    """The shapes lowered must be those the module returned on meta tensors (else decline)."""
    want = [tuple(t.shape) for t in _flat_traced(traced)]
    got = [lw.shape(r) for r in _flat(result)]
    if want and want != got:
        raise UnsupportedGraph(f"{name} lowered to shapes {got}, but it returned {want}", op=name)


def _flat_traced(value: Any) -> list[Any]:
    """The tensors of a traced (nested) tuple, in order."""
    if isinstance(value, tuple | list):
        return [t for v in value for t in _flat_traced(v)]
    return [value] if hasattr(value, "shape") else []


def _flat(ref: TupleRef) -> list[NodeRef]:
    """The tensors of a lowered (nested) tuple, in order."""
    found: list[NodeRef] = []
    for item in ref.items:
        if isinstance(item, TupleRef):
            found.extend(_flat(item))
        elif isinstance(item, NodeRef):
            found.append(item)
    return found


def _rec_defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    """First sizes: the matrix-product kind's defaults serve (the batch and hidden chunks clamp)."""
    return {}


def _rec_relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    """The matrix-product parameters the kernel reads; a block clamped to 16 whatever its value is left out."""
    sp = RecSpec.of(plan.nodes[kernel.mm])
    names = ["mm_warps", "mm_precision"]
    if sp.batch > 16:
        names.append("mm_block_m")
    if sp.hidden > 16:
        names += ["mm_block_n", "mm_block_k"]
    return names


register(
    KernelTemplate(
        kind=KernelKind.REC,
        writer=RecurrentWriter,
        defaults=_rec_defaults,
        relevant=_rec_relevant,
        compute=("mm_block_n", "mm_block_k", "mm_warps", "mm_precision"),
        latency=("mm_warps",),  # mm_block_m here would steer the products' latency mutations too
        tiles=("mm_block_m", "mm_block_n", "mm_block_k"),
        precision=("mm_precision",),
    )
)
