"""The spellings of each covered op: functions, methods, modules and operators.

``resolve`` maps one FX node to a :class:`Spec`: the canonical op and the names (and defaults)
of its parameters, so ``torch.relu(x)``, ``F.relu(x)``, ``x.relu()`` and ``nn.ReLU()(x)`` all
become ``relu`` with an ``input``.
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from actors.experts.template.errors import UnsupportedGraph


class _Required:
    """Marks a parameter without a default."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Spec:
    """A canonical op and how a call of one spelling binds to it."""

    canon: str
    params: tuple[tuple[str, object], ...]
    module_attrs: tuple[tuple[str, str], ...] = ()
    """For modules: bound name -> module attribute read at trace time."""
    inplace: bool = False
    varargs: bool = False
    """``input`` then the remaining positional arguments as one tuple (``permute``)."""
    passthrough: bool = False
    """Only ``input`` matters (views: the traced output shape says the rest)."""
    renamed: tuple[tuple[str, str], ...] = ()
    """This spelling's own keyword -> the canonical parameter it binds (``swapaxes(axis0=...)``)."""


_IN = (("input", REQUIRED),)
_INPLACE = (("input", REQUIRED), ("inplace", False))

FUNCTIONS: dict[object, Spec] = {}
METHODS: dict[str, Spec] = {}
MODULES: dict[type[nn.Module], Spec] = {}


def _fn(targets: tuple[object, ...], spec: Spec) -> None:
    for target in targets:
        FUNCTIONS[target] = spec


def spell(spec: Spec, functions: tuple[object, ...] = (), methods: tuple[str, ...] = ()) -> Spec:
    """Make ``spec`` the spelling of the given functions and tensor methods (an op family's module
    calls this for the ops it brings; in-place methods ``name_`` come with the methods)."""
    _fn(functions, spec)
    _method(methods, spec)
    return spec


def _method(names: tuple[str, ...], spec: Spec) -> None:
    for name in names:
        METHODS[name] = spec
        if not spec.passthrough and spec.canon not in ("perm", "permute", "movedim", "getattr"):
            METHODS[name + "_"] = Spec(spec.canon, spec.params, inplace=True)


# Elementwise unary ops with no parameters.
for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "neg", "erf", "reciprocal", "square"):
    _spec = Spec(_name, _IN)
    _method((_name,), _spec)
    if hasattr(torch, _name):
        _fn((getattr(torch, _name),), _spec)
    # ``torch.relu_(x)``, ``F.relu_(x)``: in place, as the method ``x.relu_()``
    _fn(tuple(getattr(m, _name + "_") for m in (torch, F) if hasattr(m, _name + "_")), Spec(_name, _IN, inplace=True))
_fn((torch.negative, operator.neg), Spec("neg", _IN))
_fn((torch.special.expit,), Spec("sigmoid", _IN))
_fn((torch.special.erf,), Spec("erf", _IN))
_method(("negative",), Spec("neg", _IN))
for _name in ("relu", "relu6", "selu", "silu", "mish", "hardswish", "hardsigmoid"):
    _fn((getattr(F, _name),), Spec(_name, _INPLACE))
_fn((torch.selu,), Spec("selu", _IN))
for _name in ("sigmoid", "tanh", "softsign", "logsigmoid", "tanhshrink"):
    _fn((getattr(F, _name),), Spec(_name, _IN))
_fn((F.elu,), Spec("elu", (*_IN, ("alpha", 1.0), ("inplace", False))))
_fn((F.leaky_relu,), Spec("leaky_relu", (*_IN, ("negative_slope", 0.01), ("inplace", False))))
_fn((F.hardtanh,), Spec("hardtanh", (*_IN, ("min_val", -1.0), ("max_val", 1.0), ("inplace", False))))
_fn((F.softplus,), Spec("softplus", (*_IN, ("beta", 1.0), ("threshold", 20.0))))
_fn((F.gelu,), Spec("gelu", (*_IN, ("approximate", "none"))))
_CLAMP = Spec("clamp", (*_IN, ("min", None), ("max", None)))
_fn((torch.clamp, torch.clip), _CLAMP)
_method(("clamp", "clip"), _CLAMP)
_fn((torch.clamp_min,), Spec("clamp", (*_IN, ("min", REQUIRED))))
_fn((torch.clamp_max,), Spec("clamp", (*_IN, ("max", REQUIRED))))
_method(("clamp_min",), Spec("clamp", (*_IN, ("min", REQUIRED))))
_method(("clamp_max",), Spec("clamp", (*_IN, ("max", REQUIRED))))

# Binary ops.
_ALPHA = (*_IN, ("other", REQUIRED), ("alpha", 1))
_BIN = (*_IN, ("other", REQUIRED))
_fn((torch.add, operator.add), Spec("add", _ALPHA))
_fn((torch.sub, torch.subtract, operator.sub), Spec("sub", _ALPHA))
_fn((torch.mul, torch.multiply, operator.mul), Spec("mul", _BIN))
_fn((torch.div, torch.divide, torch.true_divide, operator.truediv), Spec("div", (*_BIN, ("rounding_mode", None))))
_fn((operator.iadd,), Spec("add", _ALPHA, inplace=True))
_fn((operator.isub,), Spec("sub", _ALPHA, inplace=True))
_fn((operator.imul,), Spec("mul", _BIN, inplace=True))
_fn((operator.itruediv,), Spec("div", (*_BIN, ("rounding_mode", None)), inplace=True))
_fn((torch.maximum,), Spec("maximum", _BIN))
_fn((torch.minimum,), Spec("minimum", _BIN))
_fn((torch.pow, operator.pow), Spec("pow", (*_IN, ("exponent", REQUIRED))))
_method(("add",), Spec("add", _ALPHA))
_method(("sub", "subtract"), Spec("sub", _ALPHA))
_method(("mul", "multiply"), Spec("mul", _BIN))
_method(("div", "divide", "true_divide"), Spec("div", (*_BIN, ("rounding_mode", None))))
_method(("maximum",), Spec("maximum", _BIN))
_method(("minimum",), Spec("minimum", _BIN))
_method(("pow",), Spec("pow", (*_IN, ("exponent", REQUIRED))))

# Comparisons (bool results) and the selections that read them.
for _name, _op in (("eq", operator.eq), ("ne", operator.ne), ("gt", operator.gt), ("ge", operator.ge),
                   ("lt", operator.lt), ("le", operator.le)):  # fmt: skip
    _fn((getattr(torch, _name), _op), Spec(_name, _BIN))
    METHODS[_name] = Spec(_name, _BIN)
_MASKED_FILL = Spec("masked_fill", (*_IN, ("mask", REQUIRED), ("value", REQUIRED)))
_fn((torch.masked_fill,), _MASKED_FILL)
_method(("masked_fill",), _MASKED_FILL)
_fn((torch.where,), Spec("where", (("condition", REQUIRED), *_BIN)))
_method(("where",), Spec("where", (*_IN, ("condition", REQUIRED), ("other", REQUIRED))))

# Reductions and normalisations.
_RED = (*_IN, ("dim", None), ("keepdim", False), ("dtype", None))
for _name in ("sum", "mean", "prod"):
    _fn((getattr(torch, _name),), Spec(_name, _RED))
    _method((_name,), Spec(_name, _RED))
for _name in ("amax", "amin"):
    _fn((getattr(torch, _name),), Spec(_name, (*_IN, ("dim", ()), ("keepdim", False))))
    _method((_name,), Spec(_name, (*_IN, ("dim", ()), ("keepdim", False))))
for _name in ("argmax", "argmin"):
    _fn((getattr(torch, _name),), Spec(_name, (*_IN, ("dim", None), ("keepdim", False))))
    _method((_name,), Spec(_name, (*_IN, ("dim", None), ("keepdim", False))))
for _name in ("max", "min"):
    _spec = Spec(_name, (*_IN, ("dim", None), ("keepdim", False), ("other", None)))
    _fn((getattr(torch, _name),), _spec)
    _method((_name,), _spec)
_fn((torch.logsumexp,), Spec("logsumexp", (*_IN, ("dim", REQUIRED), ("keepdim", False))))
_method(("logsumexp",), Spec("logsumexp", (*_IN, ("dim", REQUIRED), ("keepdim", False))))
for _name in ("softmax", "log_softmax"):
    _fn((getattr(F, _name),), Spec(_name, (*_IN, ("dim", None), ("_stacklevel", 3), ("dtype", None))))
    _fn((getattr(torch, _name),), Spec(_name, (*_IN, ("dim", REQUIRED), ("dtype", None))))
    _method((_name,), Spec(_name, (*_IN, ("dim", REQUIRED), ("dtype", None))))
_fn(
    (F.layer_norm,),
    Spec("layer_norm", (*_IN, ("normalized_shape", REQUIRED), ("weight", None), ("bias", None), ("eps", 1e-5))),
)
_fn(
    (F.group_norm,),
    Spec("group_norm", (*_IN, ("num_groups", REQUIRED), ("weight", None), ("bias", None), ("eps", 1e-5))),
)
if hasattr(F, "rms_norm"):
    _fn(
        (F.rms_norm,),
        Spec("rms_norm", (*_IN, ("normalized_shape", REQUIRED), ("weight", None), ("eps", None))),
    )

# Matrix products.
_fn((F.linear,), Spec("linear", (*_IN, ("weight", REQUIRED), ("bias", None))))
_fn((torch.matmul, torch.mm, torch.bmm, operator.matmul), Spec("matmul", _BIN))
_method(("matmul", "mm", "bmm"), Spec("matmul", _BIN))
_EINSUM = Spec("einsum", (("equation", REQUIRED), ("operands", REQUIRED)), varargs=True)  # its tensors as one tuple
_fn((torch.einsum, torch.functional.einsum), _EINSUM)
for _name in ("diag", "triu", "tril"):
    _fn((getattr(torch, _name),), Spec(_name, (*_IN, ("diagonal", 0))))
    _method((_name,), Spec(_name, (*_IN, ("diagonal", 0))))
_COSINE = (("x1", REQUIRED), ("x2", REQUIRED), ("dim", 1), ("eps", 1e-8))
_fn((F.cosine_similarity, torch.cosine_similarity), Spec("cosine_similarity", _COSINE))

# Convolutions (weight and bias of a module are read through its path).
_CONV = (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
_fn((F.conv1d, F.conv2d, F.conv3d), Spec("conv", (*_IN, ("weight", REQUIRED), ("bias", None), *_CONV)))
_CONV_T = (("stride", 1), ("padding", 0), ("output_padding", 0), ("groups", 1), ("dilation", 1))
_fn(
    (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d),
    Spec("conv_transpose", (*_IN, ("weight", REQUIRED), ("bias", None), *_CONV_T)),
)
_CONV_ATTRS = tuple((n, n) for n in ("stride", "padding", "dilation", "groups", "padding_mode"))
_CONVS: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONVS_T: tuple[type[nn.Module], ...] = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
for _conv in _CONVS:
    MODULES[_conv] = Spec("conv", _IN, module_attrs=_CONV_ATTRS)
for _conv in _CONVS_T:
    MODULES[_conv] = Spec(
        "conv_transpose",
        (*_IN, ("output_size", None)),
        module_attrs=(*_CONV_ATTRS, ("output_padding", "output_padding")),
    )

# Pooling (``nd``: the spatial rank of the spelling).
for _nd in (1, 2, 3):
    _max = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0), ("dilation", 1), ("ceil_mode", False))
    _avg: tuple[tuple[str, object], ...] = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0))
    _avg = (*_avg, ("ceil_mode", False), ("count_include_pad", True), ("divisor_override", None))
    _fn((getattr(F, f"max_pool{_nd}d"),), Spec("max_pool", (*_IN, *_max, ("return_indices", False), ("nd", _nd))))
    _fn((getattr(F, f"avg_pool{_nd}d"),), Spec("avg_pool", (*_IN, *_avg, ("nd", _nd))))
    _fn(
        (getattr(F, f"adaptive_avg_pool{_nd}d"),),
        Spec("adaptive_avg_pool", (*_IN, ("output_size", REQUIRED), ("nd", _nd))),
    )
    _fn(
        (getattr(F, f"adaptive_max_pool{_nd}d"),),
        Spec("adaptive_max_pool", (*_IN, ("output_size", REQUIRED), ("return_indices", False), ("nd", _nd))),
    )
    _attrs = tuple((n, n) for n, _ in _max)
    MODULES[getattr(nn, f"MaxPool{_nd}d")] = Spec(
        "max_pool", (*_IN, ("nd", _nd)), module_attrs=(*_attrs, ("return_indices", "return_indices"))
    )
    _attrs = tuple((n, n) for n, _ in _avg if _nd > 1 or n != "divisor_override")
    MODULES[getattr(nn, f"AvgPool{_nd}d")] = Spec("avg_pool", (*_IN, ("nd", _nd)), module_attrs=_attrs)
    MODULES[getattr(nn, f"AdaptiveAvgPool{_nd}d")] = Spec(
        "adaptive_avg_pool", (*_IN, ("nd", _nd)), module_attrs=(("output_size", "output_size"),)
    )
    MODULES[getattr(nn, f"AdaptiveMaxPool{_nd}d")] = Spec(
        "adaptive_max_pool",
        (*_IN, ("nd", _nd)),
        module_attrs=(("output_size", "output_size"), ("return_indices", "return_indices")),
    )

# Batch and instance norms, vector norms.
for _nd in (1, 2, 3):
    MODULES[getattr(nn, f"BatchNorm{_nd}d")] = Spec("batch_norm", _IN, module_attrs=(("eps", "eps"),))
    MODULES[getattr(nn, f"InstanceNorm{_nd}d")] = Spec("instance_norm", _IN, module_attrs=(("eps", "eps"),))
_BN_TAIL = (("training", False), ("momentum", 0.1), ("eps", 1e-5))
_IN_TAIL = (("use_input_stats", True), ("momentum", 0.1), ("eps", 1e-5))
_fn(
    (F.batch_norm,),
    Spec(
        "batch_norm",
        (*_IN, ("running_mean", REQUIRED), ("running_var", REQUIRED), ("weight", None), ("bias", None), *_BN_TAIL),
    ),
)
_fn(
    (F.instance_norm,),
    Spec(
        "instance_norm",
        (*_IN, ("running_mean", None), ("running_var", None), ("weight", None), ("bias", None), *_IN_TAIL),
    ),
)
_NORM = (*_IN, ("p", "fro"), ("dim", None), ("keepdim", False), ("out", None), ("dtype", None))
_fn((torch.norm,), Spec("norm", _NORM))
_method(("norm",), Spec("norm", (*_IN, ("p", "fro"), ("dim", None), ("keepdim", False), ("dtype", None))))
_fn((torch.linalg.vector_norm,), Spec("norm", (*_IN, ("ord", 2), ("dim", None), ("keepdim", False), ("dtype", None))))

# A number made a tensor in forward (``torch.tensor(0.5, device=x.device)``): a constant.
_fn(
    (torch.tensor,),
    Spec("tensor_const", (("data", REQUIRED), ("dtype", None), ("device", None), ("requires_grad", False))),
)

# Attention.
_QKV = (("query", REQUIRED), ("key", REQUIRED), ("value", REQUIRED))
_SDPA = (*_QKV, ("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False))
_fn((F.scaled_dot_product_attention,), Spec("sdpa", _SDPA))
_MHA_MASKS = (("key_padding_mask", None), ("need_weights", True), ("attn_mask", None))
_MHA_CALL = (*_MHA_MASKS, ("average_attn_weights", True), ("is_causal", False))
_MHA_ATTRS = ("embed_dim", "num_heads", "batch_first", "dropout", "training", "add_zero_attn", "_qkv_same_embed_dim")
MODULES[nn.MultiheadAttention] = Spec(
    "mha", (*_QKV, *_MHA_CALL), module_attrs=(*((n, n) for n in _MHA_ATTRS), ("bias_k", "bias_k"))
)

# Scans and the flips around them.
for _name in ("cumsum", "cumprod"):
    _fn((getattr(torch, _name),), Spec(_name, (*_IN, ("dim", REQUIRED), ("dtype", None))))
    METHODS[_name] = Spec(_name, (*_IN, ("dim", REQUIRED), ("dtype", None)))
_fn((torch.flip,), Spec("flip", (*_IN, ("dims", REQUIRED))))
METHODS["flip"] = Spec("flip", (*_IN, ("dims", REQUIRED)), varargs=True)

# Losses, in their functions' parameter order (the deprecated size_average / reduce and a
# weight are bound so that passing them declines).
_PAIR = (*_IN, ("target", REQUIRED))
_OLD = (("size_average", None), ("reduce", None), ("reduction", "mean"))
_fn((F.mse_loss,), Spec("mse_loss", (*_PAIR, *_OLD, ("weight", None))))
_fn((F.l1_loss,), Spec("l1_loss", (*_PAIR, *_OLD, ("weight", None))))
_fn((F.smooth_l1_loss,), Spec("smooth_l1_loss", (*_PAIR, *_OLD, ("beta", 1.0))))
_fn((F.huber_loss,), Spec("huber_loss", (*_PAIR, ("reduction", "mean"), ("delta", 1.0), ("weight", None))))
_fn((F.kl_div,), Spec("kl_div", (*_PAIR, *_OLD, ("log_target", False))))
_CE = (*_PAIR, ("weight", None), ("size_average", None), ("ignore_index", -100), ("reduce", None))
_fn((F.cross_entropy,), Spec("cross_entropy", (*_CE, ("reduction", "mean"), ("label_smoothing", 0.0))))
_fn((F.nll_loss,), Spec("nll_loss", (*_CE, ("reduction", "mean"))))
_CE_ATTRS = (("weight", "weight"), ("ignore_index", "ignore_index"), ("reduction", "reduction"))
MODULES[nn.CrossEntropyLoss] = Spec(
    "cross_entropy", _PAIR, module_attrs=(*_CE_ATTRS, ("label_smoothing", "label_smoothing"))
)
MODULES[nn.NLLLoss] = Spec("nll_loss", _PAIR, module_attrs=_CE_ATTRS)
_TRIPLET = (("anchor", REQUIRED), ("positive", REQUIRED), ("negative", REQUIRED))
_TRIPLET_OPTS = (("margin", 1.0), ("p", 2.0), ("eps", 1e-6), ("swap", False))
_fn((F.triplet_margin_loss,), Spec("triplet_margin_loss", (*_TRIPLET, *_TRIPLET_OPTS, *_OLD)))
MODULES[nn.MSELoss] = Spec("mse_loss", _PAIR, module_attrs=(("reduction", "reduction"),))
MODULES[nn.L1Loss] = Spec("l1_loss", _PAIR, module_attrs=(("reduction", "reduction"),))
MODULES[nn.SmoothL1Loss] = Spec("smooth_l1_loss", _PAIR, module_attrs=(("reduction", "reduction"), ("beta", "beta")))
MODULES[nn.HuberLoss] = Spec("huber_loss", _PAIR, module_attrs=(("reduction", "reduction"), ("delta", "delta")))
MODULES[nn.KLDivLoss] = Spec("kl_div", _PAIR, module_attrs=(("reduction", "reduction"), ("log_target", "log_target")))
MODULES[nn.TripletMarginLoss] = Spec(
    "triplet_margin_loss", _TRIPLET, module_attrs=(*((n, n) for n, _ in _TRIPLET_OPTS), ("reduction", "reduction"))
)

# Shapes, aliases, transposes, tuple access.
_VIEW = Spec("view", _IN, passthrough=True)
_ALIAS = Spec("alias", _IN, passthrough=True)
_fn((torch.reshape, torch.flatten, torch.squeeze, torch.unsqueeze, torch.unflatten, torch.ravel), _VIEW)
_method(("view", "reshape", "flatten", "squeeze", "unsqueeze", "unflatten", "ravel", "view_as", "reshape_as"), _VIEW)
_fn((torch.clone, torch.detach), _ALIAS)
_method(("contiguous", "clone", "detach", "float", "half", "bfloat16", "to", "type_as", "double"), _ALIAS)
_fn((F.dropout,), Spec("dropout", (*_IN, ("p", 0.5), ("training", True), ("inplace", False))))
_fn((torch.t,), Spec("perm", (*_IN, ("dim0", -2), ("dim1", -1))))
_method(("t",), Spec("perm", (*_IN, ("dim0", -2), ("dim1", -1))))
_fn((torch.transpose,), Spec("perm", (*_IN, ("dim0", REQUIRED), ("dim1", REQUIRED))))
_method(("transpose",), Spec("perm", (*_IN, ("dim0", REQUIRED), ("dim1", REQUIRED))))
_fn((torch.permute,), Spec("permute", (*_IN, ("dims", REQUIRED)), varargs=True))
_method(("permute",), Spec("permute", (*_IN, ("dims", REQUIRED)), varargs=True))
_fn((torch.swapdims,), Spec("perm", (*_IN, ("dim0", REQUIRED), ("dim1", REQUIRED))))
_method(("swapdims",), Spec("perm", (*_IN, ("dim0", REQUIRED), ("dim1", REQUIRED))))
_SWAPAXES = Spec("perm", (*_IN, ("dim0", REQUIRED), ("dim1", REQUIRED)), renamed=(("axis0", "dim0"), ("axis1", "dim1")))
_fn((torch.swapaxes,), _SWAPAXES)
_method(("swapaxes",), _SWAPAXES)
_MOVEDIM = Spec("movedim", (*_IN, ("source", REQUIRED), ("destination", REQUIRED)))
_fn((torch.movedim, torch.moveaxis), _MOVEDIM)
_method(("movedim", "moveaxis"), _MOVEDIM)
_fn((operator.getitem,), Spec("getitem", (*_IN, ("index", REQUIRED))))
_fn((F.pad,), Spec("pad", (*_IN, ("pad", REQUIRED), ("mode", "constant"), ("value", None))))  # families/pad.py
_fn((torch.constant_pad_nd,), Spec("pad", (*_IN, ("pad", REQUIRED), ("value", 0.0))))
_fn((builtins.getattr,), Spec("getattr", (*_IN, ("name", REQUIRED))))

# Modules.
_PLAIN: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.ReLU, "relu"),
    (nn.ReLU6, "relu6"),
    (nn.SELU, "selu"),
    (nn.SiLU, "silu"),
    (nn.Mish, "mish"),
    (nn.Hardswish, "hardswish"),
    (nn.Hardsigmoid, "hardsigmoid"),
)
for _cls, _canon in _PLAIN:
    MODULES[_cls] = Spec(_canon, _IN, module_attrs=(("inplace", "inplace"),))
_NO_ATTRS: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Sigmoid, "sigmoid"),
    (nn.Tanh, "tanh"),
    (nn.Softsign, "softsign"),
    (nn.LogSigmoid, "logsigmoid"),
    (nn.Tanhshrink, "tanhshrink"),
)
for _cls, _canon in _NO_ATTRS:
    MODULES[_cls] = Spec(_canon, _IN)
MODULES[nn.ELU] = Spec("elu", _IN, module_attrs=(("alpha", "alpha"), ("inplace", "inplace")))
MODULES[nn.LeakyReLU] = Spec(
    "leaky_relu", _IN, module_attrs=(("negative_slope", "negative_slope"), ("inplace", "inplace"))
)
MODULES[nn.Hardtanh] = Spec(
    "hardtanh", _IN, module_attrs=(("min_val", "min_val"), ("max_val", "max_val"), ("inplace", "inplace"))
)
MODULES[nn.Softplus] = Spec("softplus", _IN, module_attrs=(("beta", "beta"), ("threshold", "threshold")))
MODULES[nn.GELU] = Spec("gelu", _IN, module_attrs=(("approximate", "approximate"),))
MODULES[nn.Softmax] = Spec("softmax", _IN, module_attrs=(("dim", "dim"),))
MODULES[nn.CosineSimilarity] = Spec(
    "cosine_similarity", (("x1", REQUIRED), ("x2", REQUIRED)), module_attrs=(("dim", "dim"), ("eps", "eps"))
)
MODULES[nn.LogSoftmax] = Spec("log_softmax", _IN, module_attrs=(("dim", "dim"),))
MODULES[nn.Linear] = Spec("linear", _IN)
MODULES[nn.LayerNorm] = Spec("layer_norm", _IN, module_attrs=(("normalized_shape", "normalized_shape"), ("eps", "eps")))
MODULES[nn.GroupNorm] = Spec("group_norm", _IN, module_attrs=(("num_groups", "num_groups"), ("eps", "eps")))
if hasattr(nn, "RMSNorm"):
    MODULES[nn.RMSNorm] = Spec("rms_norm", _IN, module_attrs=(("normalized_shape", "normalized_shape"), ("eps", "eps")))
MODULES[nn.Dropout] = Spec("dropout", _IN, module_attrs=(("p", "p"), ("training", "training")))
MODULES[nn.Identity] = _ALIAS
MODULES[nn.Flatten] = _VIEW
MODULES[nn.Unflatten] = _VIEW


def resolve(fxn: fx.Node, module: nn.Module | None) -> Spec | None:
    """The spec of an FX call node, or ``None`` when the op is not covered."""
    if fxn.op == "call_module":
        assert module is not None
        return MODULES.get(type(module))
    if fxn.op == "call_method":
        return METHODS.get(str(fxn.target))
    if fxn.op == "call_function":
        try:
            return FUNCTIONS.get(fxn.target)
        except TypeError:  # an unhashable target
            return None
    return None


def bind(spec: Spec, args: list[Any], kwargs: dict[str, Any], module: torch.nn.Module | None) -> dict[str, Any]:
    """Bind call arguments to the canonical op's parameter names (module attributes first)."""
    if spec.passthrough:
        return {"input": args[0] if args else kwargs.get("input")}
    bound: dict[str, Any] = {}
    if module is not None:
        for name, attr in spec.module_attrs:
            bound[name] = getattr(module, attr)
    names = [p for p, _ in spec.params]
    if len(args) > len(names) and not spec.varargs:
        raise UnsupportedGraph(f"{spec.canon} called with {len(args)} positional arguments")
    if spec.varargs:
        bound[names[0]] = args[0]
        bound[names[1]] = tuple(args[1:]) if len(args) > 2 or not isinstance(args[1], tuple | list) else args[1]
    else:
        bound.update(zip(names, args, strict=False))
    renamed = dict(spec.renamed)
    for keyword, value in kwargs.items():
        key = renamed.get(keyword, keyword)
        if key not in names:
            raise UnsupportedGraph(f"{spec.canon} called with an unexpected keyword {key!r}")
        bound[key] = value
    for name, default in spec.params:
        if name not in bound:
            if default is REQUIRED:
                raise UnsupportedGraph(f"{spec.canon} called without {name!r}")
            bound[name] = default
    return bound
