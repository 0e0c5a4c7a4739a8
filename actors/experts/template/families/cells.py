"""Recurrent cells called step by step: ``nn.RNNCell`` (tanh, relu), ``nn.LSTMCell``, ``nn.GRUCell``.

A model that walks the time steps itself (``for t in range(T): h, c = self.cell(x[:, t], (h, c))``)
is traced with the loop unrolled, so each call is one step: the two products ``x @ W_ih^T`` and
``h @ W_hh^T`` with their biases, then the cell's equations in PyTorch's gate order as elementwise
ops, which fuse into the products' epilogues and into one another as anywhere else:

- RNN: ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``;
- LSTM, gates ``i, f, g, o``: ``c' = σ(f) c + σ(i) tanh(g)``, ``h' = σ(o) tanh(c')``; the call
  returns ``(h', c')``;
- GRU, gates ``r, z, n``: ``n = tanh(x_n + b_in + r (h W_hn^T + b_hn))``,
  ``h' = (1 - z) n + z h``.

A missing state is zeros (a ``fill`` node), as PyTorch starts. Declined, with the reason: unbatched
(1-D) inputs and states of other shapes.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.slicing import part
from actors.experts.template.ir import NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.products import product
from actors.experts.template.spellings import MODULES, REQUIRED, Spec

for _cls, _canon in ((nn.RNNCell, "rnn_cell"), (nn.LSTMCell, "lstm_cell"), (nn.GRUCell, "gru_cell")):
    MODULES[_cls] = Spec(_canon, (("input", REQUIRED), ("hx", None)))


def _linear(lw: LowerContext, x: NodeRef, path: str, which: str, bias: bool) -> NodeRef:
    """``x @ W_{which}^T + b_{which}`` of the cell at ``path``."""
    out = product(lw, x, lw.perm(lw.param(f"{path}.weight_{which}")))
    return lw.ew("add", out, lw.param(f"{path}.bias_{which}")) if bias else out


def _gates(lw: LowerContext, x: NodeRef, count: int) -> list[NodeRef]:
    """``x``'s last dim cut into ``count`` equal gates (slices that the elementwise ops read in place)."""
    size = lw.shape(x)[-1] // count
    return [part(lw, x, 1, i * size, size) for i in range(count)]


def _state(lw: LowerContext, value: object, shape: tuple[int, int], what: str) -> NodeRef:
    """A state given (checked against ``shape``), or zeros where it is absent."""
    if value is None:
        return lw.add(NodeKind.EW, shape, op="fill", args=(), attrs=(0.0,), dtype="float32")
    state = lw.tensor(value, what)
    if lw.shape(state) != shape:
        raise UnsupportedGraph(f"{what} of shape {lw.shape(state)} is not covered (expected {shape})")
    return state


@lowering("rnn_cell", "lstm_cell", "gru_cell")
def _cell(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef | TupleRef:
    path = str(b["__path__"])
    cell = lw.traced.root.get_submodule(path)
    assert isinstance(cell, nn.RNNCellBase)
    x = lw.tensor(b["input"], f"the input of {type(cell).__name__}")
    if len(lw.shape(x)) != 2:
        raise UnsupportedGraph(f"{type(cell).__name__} of an unbatched input is not covered (batch, features)")
    shape = (lw.shape(x)[0], cell.hidden_size)
    hx = b.get("hx")
    if canon == "lstm_cell":
        if hx is not None and (not isinstance(hx, tuple | list | TupleRef) or len(_items(hx)) != 2):
            raise UnsupportedGraph("LSTMCell state other than a pair (h, c) is not covered")
        h, c = (
            _state(lw, s, shape, f"LSTMCell state {n}") for s, n in zip(_items(hx) or (None, None), "hc", strict=True)
        )
    else:
        h = _state(lw, hx, shape, f"{type(cell).__name__} state")
    gi = _linear(lw, x, path, "ih", cell.bias)
    gh = _linear(lw, h, path, "hh", cell.bias)
    if canon == "rnn_cell":
        act = "tanh" if getattr(cell, "nonlinearity", "tanh") == "tanh" else "relu"
        return lw.ew(act, lw.ew("add", gi, gh))
    if canon == "lstm_cell":
        i, f, g, o = _gates(lw, lw.ew("add", gi, gh), 4)
        c_next = lw.ew("add", lw.ew("mul", lw.ew("sigmoid", f), c), lw.ew("mul", lw.ew("sigmoid", i), lw.ew("tanh", g)))
        return TupleRef((lw.ew("mul", lw.ew("sigmoid", o), lw.ew("tanh", c_next)), c_next))
    xr, xz, xn = _gates(lw, gi, 3)
    hr, hz, hn = _gates(lw, gh, 3)
    r = lw.ew("sigmoid", lw.ew("add", xr, hr))
    z = lw.ew("sigmoid", lw.ew("add", xz, hz))
    n = lw.ew("tanh", lw.ew("add", xn, lw.ew("mul", r, hn)))
    return lw.ew("add", lw.ew("mul", lw.ew("sub", 1.0, z), n), lw.ew("mul", z, h))


def _items(hx: object) -> tuple[object, ...]:
    if hx is None:
        return ()
    if isinstance(hx, TupleRef):
        return tuple(hx.items)
    assert isinstance(hx, tuple | list)
    return tuple(hx)
