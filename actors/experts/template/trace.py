"""Loading and tracing a KernelBench-format reference.

The reference is the user's own code: it is executed here (``Model``, ``get_inputs`` and
``get_init_inputs`` are called under ``torch.device("meta")`` so no real memory is allocated and
no random state is consumed) and its ``forward`` is traced with ``torch.fx``. Callers run this in
a worker thread, never on the event loop. ``__init__`` is taken from the source as text (:mod:`.carry`) so
the rendered ``ModelNew`` builds exactly the same parameters in the same order.
"""

from __future__ import annotations

import builtins
import importlib.util
import operator
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import fx
from torch.fx.experimental.meta_tracer import MetaDeviceAttribute, MetaProxy, MetaTracer, proxys_to_metas
from torch.nn.utils import parametrize

from actors.experts.template.errors import TraceFailed, UnsupportedGraph
from gpu_runner.errors import missing_hint

if importlib.util.find_spec("einops") is not None:  # its calls on traced tensors record tensor ops
    from actors.experts.template import einops_trace  # noqa: F401


@dataclass
class Traced:
    """A traced reference: its graph, the traced value of every node, and the module."""

    graph_module: fx.GraphModule
    values: dict[fx.Node, Any]
    root: torch.nn.Module
    arg_names: tuple[str, ...]
    source: str | None = None
    """The reference's source (the explicit attention pattern reads how a mask buffer is built)."""
    float_args: frozenset[int] = frozenset()
    """Positions of ``forward``'s arguments that ``get_inputs()`` gives as Python floats (traced as
    0-dim float32 tensors; the rendered ``ModelNew`` makes one from the number it is given)."""
    rebound: frozenset[str] = frozenset()
    """Paths of the plain tensor attributes (not parameters or buffers) ``forward`` assigns
    (``self.hidden = ...``); tracing puts them back as they were (:func:`_kept_attributes`)."""


_NORMS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.InstanceNorm1d,
    torch.nn.InstanceNorm2d,
    torch.nn.InstanceNorm3d,
)


def _kept_shape(module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The meta value of a batch or instance norm module's output (its input's shape and dtype),
    or of a transformer module's (:func:`_transformer_shape`), or None where the module is another
    type (a subclass may change ``forward``) or its call is not the plain one on a meta tensor of
    its channels. PyTorch computes these on meta tensors
    through its decomposition, about 4 ms a call: most of DenseNet-121's analysis."""
    if type(module) in _TRANSFORMERS:
        return _transformer_shape(module, args, kwargs)
    if type(module) not in _NORMS or kwargs or len(args) != 1:
        return None
    x = args[0]
    features = getattr(module, "num_features", None)
    if not isinstance(x, torch.Tensor) or x.device.type != "meta" or x.dim() < 2 or x.shape[1] != features:
        return None
    return torch.empty_like(x)


_TRANSFORMERS = (
    torch.nn.Transformer,
    torch.nn.TransformerEncoder,
    torch.nn.TransformerDecoder,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerDecoderLayer,
)


def _transformer_shape(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> torch.Tensor | None:
    """The meta value of a transformer module's output: its source's (an encoder's) or target's
    (a decoder's) shape and dtype. PyTorch's own forward cannot run on meta tensors once a mask is
    given (``_detect_is_causal_mask`` compares the mask's values)."""
    if type(module) is torch.nn.Transformer:
        x = args[1] if len(args) > 1 else kwargs.get("tgt")
    else:
        x = args[0] if args else kwargs.get("src", kwargs.get("tgt"))
    if not isinstance(x, torch.Tensor) or x.device.type != "meta":
        return None
    return torch.empty_like(x)


class _Recorder(fx.Interpreter):
    """Runs the graph on meta tensors and keeps every node's value (shapes and dtypes)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kept = _kept_shape(self.fetch_attr(target), args, kwargs)
        return kept if kept is not None else super().call_module(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n] = result
        return result


def load_namespace(source: str) -> dict[str, Any]:
    """Execute the reference source in a fresh namespace and return it."""
    namespace: dict[str, Any] = {"__name__": "kf_reference", "__builtins__": builtins}
    try:
        code = compile(source, "<reference>", "exec")
        exec(code, namespace)
    except Exception as exc:  # any failure of user code is reported, typed
        raise TraceFailed("load", f"{type(exc).__name__}: {exc}{missing_hint(exc)}") from exc
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in namespace:
            raise TraceFailed("load", f"the reference defines no {name}")
    return namespace


def _trace_with_sizes(model: torch.nn.Module, inputs: list[Any], rebound: set[str]) -> fx.GraphModule:
    """Trace ``forward`` with every proxy carrying its meta value, so ``x.size()``, ``x.shape``
    and ``math.sqrt(k.size(-1))`` are plain numbers and buffers (``self.bias[:, :, :T, :T]``) are
    graph nodes, not constants baked from meta tensors."""
    import inspect
    import warnings

    params = inspect.signature(model.forward).parameters
    names = list(params)
    # Arguments get_inputs() leaves out take their defaults (``forward(self, x, mask=None)``).
    defaults = {n: params[n].default for n in names[len(inputs) :]}
    if len(names) < len(inputs) or any(d is inspect.Parameter.empty for d in defaults.values()):
        raise UnsupportedGraph(f"forward takes {len(names)} arguments but get_inputs() gives {len(inputs)}")
    tracer = _augmenting(MetaTracer)()
    tracer.proxy_buffer_attributes = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a value it could not compute: fall back to the plain tracer
        warnings.filterwarnings("ignore", message=".*_assert_is_none")  # a default of None checked
        # a default of another value is checked by ``torch._assert(arg == value)``, on no tensor
        checks = "(<built-in function eq>|<function _assert )"
        warnings.filterwarnings("ignore", message=f"Could not compute metadata for call_function target {checks}")
        meta_args = dict(zip(names, inputs, strict=False))
        with _kept_attributes(model, rebound), _attribute_reads(tracer, model):
            graph = tracer.trace(model, meta_args=meta_args, concrete_args=defaults or None)
    defaulted = [n for n in graph.nodes if n.op == "placeholder"][len(inputs) :]
    for node in list(graph.nodes):  # fx's checks that a defaulted argument got its default: nothing to compute
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            graph.erase_node(node)
        elif node.op == "call_function" and node.target is torch._assert and _checks_a_default(node, defaulted):
            check = node.args[0]
            graph.erase_node(node)
            if isinstance(check, fx.Node) and not check.users:
                graph.erase_node(check)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[len(inputs) :]:  # the defaulted arguments, once nothing reads them
        if not node.users:
            graph.erase_node(node)
    return fx.GraphModule(tracer.root, graph)


def _checks_a_default(node: fx.Node, defaulted: list[fx.Node]) -> bool:
    """Whether ``node`` is fx's ``torch._assert(arg == value)`` on an argument left to its default."""
    check = node.args[0] if node.args else None
    return (
        isinstance(check, fx.Node)
        and check.op == "call_function"
        and check.target is operator.eq
        and bool(check.args)
        and check.args[0] in defaulted
    )


_AUGMENTED = {
    "__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
    "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv, "__imod__": operator.imod,
    "__ipow__": operator.ipow, "__imatmul__": operator.imatmul, "__iand__": operator.iand,
    "__ior__": operator.ior, "__ixor__": operator.ixor, "__ilshift__": operator.ilshift,
    "__irshift__": operator.irshift,
}  # fmt: skip
"""``y += x`` on a tensor writes ``y`` (every other name of it sees the change); ``fx.Proxy`` has
no ``__iadd__``, so Python records ``y + x`` and a later read of ``y`` through another name (``z =
y`` before) would see the old value. The tracers here record ``operator.iadd`` and its kin, which
the lowerer treats as in-place writes."""


def _augment(proxy: fx.Proxy) -> fx.Proxy:
    cls = type(proxy)
    if not hasattr(cls, "_kf_augmented"):
        cls = _PROXIES.get(cls) or _PROXIES.setdefault(cls, _augmented_class(cls))
        proxy.__class__ = cls
    return proxy


def _augmented_class(base: type[fx.Proxy]) -> type[fx.Proxy]:
    def method(op: Any) -> Any:
        def apply(self: fx.Proxy, other: Any) -> fx.Proxy:
            return self.tracer.create_proxy("call_function", op, (self, other), {})

        return apply

    members: dict[str, Any] = {"_kf_augmented": True, **{n: method(op) for n, op in _AUGMENTED.items()}}
    if issubclass(base, MetaProxy):
        members["device"] = property(lambda self: _Device(self, "device"))
        members["size"] = _meta_size
    return type(base.__name__, (base,), members)


def _meta_size(self: Any, dim: int | None = None) -> Any:
    """``x.size(dim)`` of a proxy with its meta value: a number, ``x.size(0)`` included (the meta
    tracer's own ``size`` tests ``if dim``, so dimension 0 gave the whole ``torch.Size``)."""
    meta = getattr(self, "_tensor_meta", None)
    if meta is not None:
        return meta.size() if dim is None else meta.size(dim)
    return MetaProxy.size(self, dim)


class _Device(MetaDeviceAttribute):
    """``x.device`` while tracing with sizes: compared with another tensor's device it is equal
    (every tensor of the model and its inputs sits on the one device the evaluator runs it on), so
    a reference's guard (``if x.device != self.clusters.device: raise``) traces as the branch it
    takes; any other use stays a traced value, as the meta tracer makes it."""

    def __eq__(self, other: object) -> Any:
        return True if isinstance(other, MetaDeviceAttribute) else super().__eq__(other)

    def __ne__(self, other: object) -> Any:
        return False if isinstance(other, MetaDeviceAttribute) else super().__ne__(other)

    __hash__ = MetaDeviceAttribute.__hash__


_PROXIES: dict[type, type[fx.Proxy]] = {}


_T = TypeVar("_T", bound=fx.Tracer)

_PY_DTYPES: dict[type, torch.dtype] = {bool: torch.bool, int: torch.int64, float: torch.float64}
"""The Python types PyTorch takes as a ``dtype`` argument, and the dtypes it reads them as."""


_PARAMETRIZATION_MODULES = frozenset({"torch.nn.utils.parametrize", "torch.nn.utils.parametrizations"})
"""Modules of these are traced through (the list of a parametrized tensor, ``_WeightNorm``)."""


def _augmenting(tracer: type[_T]) -> type[_T]:
    """``tracer`` whose proxies record augmented assignments (:data:`_AUGMENTED`)."""

    def proxy(self: fx.Tracer, node: fx.Node) -> fx.Proxy:
        return _augment(tracer.proxy(self, node))

    def create_arg(self: fx.Tracer, a: Any) -> Any:  # ``dtype=bool``: fx records no Python type
        return tracer.create_arg(self, _PY_DTYPES.get(a, a) if isinstance(a, type) else a)

    def is_leaf_module(self: fx.Tracer, m: torch.nn.Module, qualname: str) -> bool:
        # A parametrized module (``weight_norm``) is traced through: its weight is computed in
        # forward from the parametrization's parameters (``torch._weight_norm(v, g, dim)``).
        through = parametrize.is_parametrized(m) or type(m).__module__ in _PARAMETRIZATION_MODULES
        return False if through else tracer.is_leaf_module(self, m, qualname)

    members: dict[str, Any] = {"proxy": proxy, "create_arg": create_arg, "is_leaf_module": is_leaf_module}
    if issubclass(tracer, MetaTracer):
        members.update(call_module=_meta_call_module, create_proxy=_meta_create_proxy)
    return type(tracer.__name__, (tracer,), members)


def _meta_call_module(self: Any, m: torch.nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
    """A module called while the meta tracer computes a leaf module's output on meta tensors
    (``nn.TransformerEncoder`` calling its layers) runs as plain code: recorded, it would put meta
    tensors in the graph as constants (``_tensor_constant0``) and overwrite the outer leaf's
    ``orig_forward``."""
    if getattr(self, "_kf_meta_depth", 0):
        return forward(*args, **kwargs)
    return MetaTracer.call_module(self, m, forward, args, kwargs)


def _meta_create_proxy(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
    if kind != "call_module":
        return MetaTracer.create_proxy(self, kind, *args, **kwargs)
    if len(args) >= 3 and not kwargs:
        target, call_args, call_kwargs = args[:3]
        metas = fx.node.map_aggregate(call_args, proxys_to_metas)
        kept = _kept_shape(self.root.get_submodule(target), metas, call_kwargs)
        if kept is not None:
            proxy = fx.Tracer.create_proxy(self, kind, *args)
            proxy.install_tensor_meta(kept)
            return proxy
    self._kf_meta_depth = getattr(self, "_kf_meta_depth", 0) + 1
    try:
        return MetaTracer.create_proxy(self, kind, *args, **kwargs)
    finally:
        self._kf_meta_depth -= 1


@contextmanager
def _kept_attributes(model: torch.nn.Module, rebound: set[str]) -> Iterator[None]:
    """Put back every tensor attribute ``forward`` assigned while it was traced, adding its path to
    ``rebound``: the assignment left a proxy on the module, which the graph module built after
    would copy and the recorder then run as if it were the attribute. An attribute ``forward``
    adds with a traced value is removed; a tensor constant the tracer adds (``_tensor_constant0``)
    stays, the graph reads it."""
    saved = {name: dict(vars(module)) for name, module in model.named_modules()}
    try:
        yield
    finally:
        for name, module in model.named_modules():
            before = saved.get(name, {})
            state = vars(module)
            for key, value in list(state.items()):
                old = before.get(key, _ABSENT)
                if value is old or not isinstance(value, fx.Proxy | torch.Tensor) or key.startswith("_tensor_constant"):
                    continue
                if isinstance(old, torch.Tensor) or isinstance(value, fx.Proxy):
                    rebound.add(f"{name}.{key}" if name else key)
                    if old is _ABSENT:
                        del state[key]
                    else:
                        state[key] = old


_ABSENT = object()


@contextmanager
def _attribute_reads(tracer: fx.Tracer, model: torch.nn.Module) -> Iterator[None]:
    """While ``tracer`` traces ``model``, every read of a plain tensor attribute that still holds
    its tensor is a ``get_attr`` node of its own: fx reads such an attribute as the tensor itself,
    so an op on it alone (``self.h + 1.0``) would run once, there, and leave its result in the
    graph as a constant. Each module holding one is, meanwhile, of a subclass with a property per
    attribute (a read while the tracer computes a value on meta tensors gets the tensor)."""
    swapped: list[tuple[torch.nn.Module, type]] = []
    for name, module in model.named_modules():
        held = {
            key: value
            for key, value in vars(module).items()
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
        }
        if not held:
            continue
        cls = type(module)
        members: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        for key, tensor in held.items():
            members[key] = _attribute_property(tracer, f"{name}.{key}" if name else key, key, tensor)
        module.__class__ = type(cls.__name__, (cls,), members)
        swapped.append((module, cls))
    try:
        yield
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def _attribute_property(tracer: fx.Tracer, path: str, key: str, tensor: torch.Tensor) -> property:
    def read(module: torch.nn.Module) -> Any:
        value = vars(module).get(key, tensor)
        if value is not tensor or getattr(tracer, "_disable_module_getattr", False):
            return value
        if getattr(tracer, "_kf_meta_depth", 0):
            return value
        return tracer.create_proxy("get_attr", path, (), {})

    def write(module: torch.nn.Module, value: Any) -> None:
        vars(module)[key] = value

    return property(read, write)


CPU_BUILD_LIMIT = 4 << 30
"""Most bytes of parameters and buffers a model built on the CPU may hold (see :func:`_construct`)."""


def _construct(namespace: dict[str, Any], init_inputs: list[Any]) -> Any:
    """``Model(*init_inputs)`` on the meta device; where its construction reads a value (``.item()``
    of a ``torch.linspace``, as Swin's stochastic depth rates), built on the CPU instead and then
    moved to the meta device. The CPU build draws from this process's random state, which the
    analysis never uses for anything else, and is refused past :data:`CPU_BUILD_LIMIT`."""
    try:
        with torch.device("meta"):
            return namespace["Model"](*init_inputs)
    except Exception as exc:  # noqa: BLE001 - user code; the CPU build decides
        first = exc
    try:
        with torch.no_grad():
            model = namespace["Model"](*namespace["get_init_inputs"]())  # on the CPU this time
    except Exception as exc:  # user code
        detail = f"{type(first).__name__}: {first} (on the meta device; on the CPU: {type(exc).__name__}: {exc})"
        raise TraceFailed("construct", detail) from exc
    if not isinstance(model, torch.nn.Module):
        return model  # refused by the caller
    size: int = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > CPU_BUILD_LIMIT:
        raise TraceFailed(
            "construct",
            f"{type(first).__name__}: {first} (on the meta device; on the CPU it holds {size / 2**30:.1f} GiB)",
        )
    return model.to("meta")


def trace_reference(source: str, sizes: Mapping[str, int] | None = None) -> Traced:
    """Build the reference on the meta device, trace ``forward`` and record every value;
    ``sizes``: module-level integers of the reference set to other values first (``any_batch.py``
    traces it at a second batch size)."""
    namespace = load_namespace(source)
    namespace.update(sizes or {})
    try:
        with torch.device("meta"):
            init_inputs = list(namespace["get_init_inputs"]())
            inputs = list(namespace["get_inputs"]())
    except Exception as exc:  # user code
        raise TraceFailed("construct", f"{type(exc).__name__}: {exc}") from exc
    model = _construct(namespace, init_inputs)
    if not isinstance(model, torch.nn.Module):
        raise TraceFailed("construct", "Model(...) is not an nn.Module")
    float_args: set[int] = set()
    for i, value in enumerate(inputs):
        if isinstance(value, float | int) and not isinstance(value, bool):  # a scalar operand (a matrix-scalar product)
            inputs[i] = torch.tensor(value, dtype=torch.float32, device="meta")
            float_args.add(i)
        elif not isinstance(value, torch.Tensor):
            raise UnsupportedGraph(f"input {i} of get_inputs() is a {type(value).__name__}, not a tensor")
    rebound: set[str] = set()
    try:
        gm = _trace_with_sizes(model, inputs, rebound)
    except Exception:  # noqa: BLE001 - the shape-aware tracer is stricter: the plain one decides
        rebound.clear()
        try:
            plain = _augmenting(fx.Tracer)()
            with _kept_attributes(model, rebound), _attribute_reads(plain, model):
                graph = plain.trace(model)
            gm = fx.GraphModule(plain.root, graph)
        except Exception as exc:  # data-dependent control flow
            raise UnsupportedGraph(f"torch.fx could not trace forward: {type(exc).__name__}: {exc}") from exc
    recorder = _Recorder(gm)
    try:
        recorder.run(*inputs)
    except Exception as exc:  # user code on meta tensors
        raise UnsupportedGraph(f"forward failed on meta tensors: {type(exc).__name__}: {exc}") from exc
    names = tuple(str(n.target) for n in gm.graph.nodes if n.op == "placeholder")
    if len(names) != len(inputs):
        raise UnsupportedGraph(f"forward takes {len(names)} arguments but get_inputs() gives {len(inputs)}")
    if any(n.startswith("*") for n in names):
        raise UnsupportedGraph("forward with *args is not covered")
    return Traced(
        graph_module=gm,
        values=recorder.values,
        root=model,
        arg_names=names,
        source=source,
        float_args=frozenset(float_args),
        rebound=frozenset(rebound),
    )
