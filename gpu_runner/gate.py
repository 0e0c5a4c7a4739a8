"""The static gate: an AST pass over a candidate before anything of it runs.

It resolves import aliases (``F.relu`` is ``torch.nn.functional.relu``), works out which
functions lie on the forward path (everything reachable from a ``forward``/``__call__`` method,
Triton kernels and ``__init__`` excluded), and reports every rule it finds broken as a
:class:`schemas.Finding` with the rule id, line and column. C++/CUDA strings handed to
``load_inline`` are scanned too. The policy itself lives in :mod:`gpu_runner.gate_tables`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gpu_runner import gate_tables as T
from schemas import CheatRule, Finding, Severity, TorchOpsPolicy
from schemas.task import parse_module

R = CheatRule
REFERENCE_NAMES = ("Model", "get_inputs", "get_init_inputs")


@dataclass(frozen=True)
class GateReport:
    """What the gate found, and what it learned about the candidate's kernels."""

    findings: tuple[Finding, ...]
    triton_kernels: tuple[str, ...] = ()
    cuda_kernels: tuple[str, ...] = ()
    uses_load_inline: bool = False
    syntax_error: str | None = None
    torch_ops_kept: tuple[str, ...] = ()
    """Torch operations the candidate leaves to PyTorch that the run's ``reference`` policy admitted."""
    admitted_aten_ops: frozenset[str] = frozenset()
    """Aten compute ops its forward may dispatch (the reference's own, under ``reference``)."""
    op_namespaces: tuple[str, ...] = ()
    """Custom-op namespaces its own native sources register (``TORCH_LIBRARY(ns, m)``): calls of
    ``torch.ops.<ns>.*`` run its compiled kernels. Any other custom op a forward dispatches was
    registered from Python, and its implementation is PyTorch compute."""

    @property
    def rejected(self) -> bool:
        """Whether any finding rejects the candidate."""
        return any(f.severity is Severity.REJECT for f in self.findings)


def reference_globals(reference_source: str) -> dict[str, str]:
    """The reference's inputs and sizes: its ``Model``/``get_inputs``/``get_init_inputs`` and
    module-level assignments, each with a dump of its definition. (Its helpers and kernels are
    not inputs: a candidate may reuse their names.)"""
    tree = parse_module(reference_source)
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in REFERENCE_NAMES:
            out[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out[name.id] = ast.dump(node.value) if node.value is not None else ""
    return out


def check_candidate(
    source: str, reference_source: str, torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID
) -> GateReport:
    """Run every static rule over ``source``; ``reference_source`` tells which names it may not
    redefine and, under the ``reference`` policy, which torch operations it may leave to PyTorch."""
    try:
        tree = parse_module(source)
    except SyntaxError as exc:
        return GateReport(findings=(), syntax_error=f"line {exc.lineno}: {exc.msg}")
    gate = _Gate(tree, reference_globals(reference_source))
    gate.run()
    findings, kept, admitted = tuple(gate.findings), tuple[str, ...](), frozenset[str]()
    if torch_ops is TorchOpsPolicy.REFERENCE:
        from gpu_runner.gate_policy import admit_reference_ops

        allowed = forward_torch_ops(reference_source)
        findings, kept, admitted = admit_reference_ops(findings, gate.compute_keys, reference_source, allowed)
    return GateReport(
        findings=findings,
        triton_kernels=tuple(sorted(gate.triton_kernels)),
        cuda_kernels=tuple(sorted(gate.cuda_kernels)),
        uses_load_inline=gate.uses_load_inline,
        torch_ops_kept=kept,
        admitted_aten_ops=admitted,
        op_namespaces=tuple(sorted(gate.op_namespaces)),
    )


def forward_torch_ops(source: str) -> frozenset[str]:
    """The torch compute operations a module's forward path calls, by the gate's names
    (``torch.matmul``, ``.sum``, ``@``, ``torch.nn.Conv2d`` for a call of such a submodule)."""
    gate = _Gate(parse_module(source), {})
    gate.collect()
    gate.mark_forward_path()
    for node in ast.walk(gate.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and id(node) in gate.forward_nodes:
            gate.check_forward(node)
    return frozenset(gate.compute_keys.values())


def _rule_for_module(module: str) -> CheatRule | None:
    best: tuple[int, CheatRule] | None = None
    for prefix, rule in T.IMPORT_RULES.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), rule)
    if best is not None:
        return best[1]
    root = module.split(".", 1)[0]
    if root not in T.ALLOWED_IMPORT_ROOTS:
        return R.INTROSPECTION
    if module.startswith("torch._"):
        return R.INTROSPECTION
    return None


class _Gate:
    def __init__(self, tree: ast.Module, ref_globals: dict[str, str]) -> None:
        self.tree = tree
        self.ref_globals = ref_globals
        self.findings: list[Finding] = []
        self.seen: set[tuple[CheatRule, int, int]] = set()
        self.aliases: dict[str, str] = {}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.module_attrs: dict[str, str] = {}
        self.compute_keys: dict[int, str] = {}
        """Index in ``findings`` of a torch-compute finding -> the operation's name."""
        self.triton_kernels: set[str] = set()
        self.cuda_kernels: set[str] = set()
        self.op_namespaces: set[str] = set()
        self.uses_load_inline = False
        self.forward_nodes: set[int] = set()

    def add(self, rule: CheatRule, node: ast.AST, message: str, severity: Severity = Severity.REJECT) -> None:
        line, col = getattr(node, "lineno", None), getattr(node, "col_offset", None)
        key = (rule, line or 0, col or 0)
        if key in self.seen:
            return
        self.seen.add(key)
        self.findings.append(Finding(rule=rule, severity=severity, message=message, line=line, col=col))

    def add_compute(self, node: ast.AST, op: str, message: str) -> None:
        before = len(self.findings)
        self.add(R.TORCH_COMPUTE, node, message)
        if len(self.findings) > before:
            self.compute_keys[before] = op

    # ---- name resolution -------------------------------------------------------------------------
    def qual(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = self.qual(node.args[0])
            return f"{base}.{node.args[1].value}" if base is not None else None
        return None

    # ---- passes ----------------------------------------------------------------------------------
    def run(self) -> None:
        self.collect()
        self.mark_forward_path()
        if "ModelNew" not in self.classes:
            self.add(R.MISSING_MODEL, self.tree, "the candidate defines no class ModelNew")
        self.check_redefinitions()
        for node in ast.walk(self.tree):
            self.visit(node)

    def collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".", 1)[0]
                    self.aliases[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(node.name, []).append(node)
                if self.is_triton(node):
                    self.triton_kernels.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self.functions.setdefault(item.name, []).append(item)
                        if item.name == "__init__":
                            self.collect_module_attrs(item)

    def is_triton(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        for dec in fn.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if (self.qual(target) or "") in T.TRITON_DECORATORS:
                return True
        return False

    def collect_module_attrs(self, init: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                name = self.qual(node.value.func) or ""
                if name.startswith("torch.nn.") and not name.startswith(("torch.nn.Parameter", "torch.nn.init")):
                    for target in node.targets:
                        if isinstance(target, ast.Attribute):
                            self.module_attrs[target.attr] = name

    def mark_forward_path(self) -> None:
        roots = [f for name in ("forward", "__call__") for f in self.functions.get(name, [])]
        todo = list(roots)
        while todo:
            fn = todo.pop()
            if id(fn) in self.forward_nodes or self.is_triton(fn):
                continue
            self.forward_nodes.add(id(fn))
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                called = node.func
                if isinstance(called, ast.Name):
                    todo.extend(self.functions.get(called.id, []))
                    if called.id in self.classes:
                        todo.extend(self.functions_of(self.classes[called.id]))
                elif isinstance(called, ast.Attribute) and called.attr != "__init__":
                    todo.extend(self.functions.get(called.attr, []))

    @staticmethod
    def functions_of(cls: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        return [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]

    def check_redefinitions(self) -> None:
        for node in self.tree.body:
            names: list[tuple[str, str]] = []
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in REFERENCE_NAMES:
                names.append((node.name, ast.dump(node)))
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name) and sub.id in self.ref_globals:
                            names.append((sub.id, ast.dump(node.value)))
            for name, dump in names:
                if self.ref_globals.get(name) == dump:
                    self.add(
                        R.REDEFINED_INPUTS,
                        node,
                        f"{name} copies the reference's definition "
                        "(ignored: inputs and sizes always come from the reference)",
                        Severity.INFO,
                    )
                else:
                    self.add(R.REDEFINED_INPUTS, node, f"{name} redefines the reference's {name}")

    # ---- rules -----------------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self.check_import(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                self.add(R.INTROSPECTION, node, "relative imports are not allowed")
            for alias in node.names:
                self.check_import(f"{node.module}.{alias.name}" if node.module else alias.name, node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, ast.Attribute):
            if node.attr in T.DUNDER_ATTRS:
                self.add(R.INTROSPECTION, node, f"accesses {node.attr} (interpreter internals)")
            qual = self.qual(node) or ""
            if qual == "os.environ" or qual.startswith(("os.environ.", "os.getenv", "os.putenv")):
                self.add(R.ENVIRONMENT, node, "reads or writes the environment")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            self.add(R.INTROSPECTION, node, "accesses __builtins__")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                self.check_store(target, node)
        elif isinstance(node, ast.ClassDef):
            self.check_class(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in ("__torch_function__", "__torch_dispatch__"):
                self.add(R.TENSOR_SUBCLASS, node, f"defines {node.name} (intercepts torch calls)")
            if id(node) in self.forward_nodes:
                self.check_forward(node)
        elif isinstance(node, ast.Try):
            self.check_try(node)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            self.add(R.MONKEYPATCH, node, "rebinds module state from inside a function", Severity.INFO)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.check_native_source(node)

    def check_import(self, module: str, node: ast.AST) -> None:
        rule = _rule_for_module(module)
        if rule is not None:
            self.add(rule, node, f"imports {module}")

    def check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in T.BUILTIN_RULES and func.id not in self.aliases:
            self.add(T.BUILTIN_RULES[func.id], node, f"calls {func.id}()")
        computed = len(node.args) >= 2 and not (
            isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
        )
        if isinstance(func, ast.Name) and func.id == "getattr" and computed:
            self.add(R.DYNAMIC_CODE, node, "getattr with a computed name hides what is called")
        if isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3:
            self.add(R.DYNAMIC_CODE, node, "creates a class at run time with type()")
        qual = self.qual(func) or ""
        for prefix, rule in T.CALL_PREFIX_RULES:
            if qual == prefix or qual.startswith(prefix + "."):
                self.add(rule, node, f"calls {qual}")
        if qual.startswith(("os.", "shutil.", "pathlib.")):
            self.add(R.FILE_ACCESS, node, f"calls {qual}")
        if qual == "torch.utils.cpp_extension.load_inline":
            self.uses_load_inline = True
            for kw in node.keywords:
                if kw.arg in ("build_directory", "extra_include_paths"):
                    self.add(R.FILE_ACCESS, kw.value, f"load_inline({kw.arg}=...) picks paths on disk")
        if isinstance(func, ast.Attribute) and func.attr in ("as_subclass", "_make_subclass"):
            self.add(R.TENSOR_SUBCLASS, node, f"calls .{func.attr}() (tensor subclass)")
        if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
            self.add(R.MONKEYPATCH, node, f"calls {func.attr} directly")

    def check_store(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.check_store(elt, node)
            return
        if isinstance(target, ast.Subscript):
            container = self.qual(target.value) or ""
            if container.startswith(("os.environ", "sys.modules")):
                rule = R.ENVIRONMENT if "environ" in container else R.INTROSPECTION
                self.add(rule, node, f"writes {container}[...]")
            return
        if not isinstance(target, ast.Attribute):
            return
        qual = self.qual(target)
        if target.attr == "__class__":
            self.add(R.TENSOR_SUBCLASS, node, "assigns __class__")
        if qual is None:
            return
        low = qual.lower()
        if "allow_tf32" in low or "backends" in low or "precision" in low or "reduced_precision" in low:
            self.add(R.PRECISION_FLAGS, node, f"sets {qual}")
        elif any(w in low for w in ("time", "perf_counter", "event", "elapsed", "synchronize", "do_bench")):
            self.add(R.TIMER_TAMPERING, node, f"replaces {qual}")
        else:
            self.add(R.MONKEYPATCH, node, f"replaces {qual} (monkeypatching a library)")

    def check_class(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            qual = self.qual(base) or (base.id if isinstance(base, ast.Name) else "")
            if qual in ("torch.Tensor", "Tensor", "torch._C.TensorBase", "torch.nn.Parameter"):
                self.add(R.TENSOR_SUBCLASS, node, f"class {node.name} subclasses {qual}")
            if "Mode" in qual and qual.startswith("torch"):
                self.add(R.TENSOR_SUBCLASS, node, f"class {node.name} subclasses {qual}")

    def check_forward(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.MatMult):
                self.add_compute(node, "@", f"uses @ (a torch matmul) in {fn.name}")
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            qual = self.qual(func) or ""
            if qual.startswith("torch.") and qual not in T.ALLOWED_TORCH_CALLS:
                if not qual.startswith(("torch.cuda.", "torch.ops.")) and not qual.endswith(".apply"):
                    self.add_compute(node, qual, f"calls {qual} in {fn.name} (a torch op, not a kernel)")
            elif isinstance(func, ast.Attribute) and not qual:
                owner = func.value
                if (
                    isinstance(owner, ast.Attribute)
                    and isinstance(owner.value, ast.Name)
                    and owner.value.id == "self"
                    and owner.attr in self.module_attrs
                    and func.attr in ("forward", "__call__")
                ) or (isinstance(owner, ast.Name) and owner.id == "self" and func.attr in self.module_attrs):
                    attr = owner.attr if isinstance(owner, ast.Attribute) else func.attr
                    self.add_compute(node, self.module_attrs[attr], f"calls the torch module self.{attr} in {fn.name}")
                elif func.attr in T.COMPUTE_METHODS:
                    self.add_compute(
                        node, f".{func.attr}", f"calls .{func.attr}() in {fn.name} (a torch op, not a kernel)"
                    )

    def check_try(self, node: ast.Try) -> None:
        in_forward = any(
            id(fn) in self.forward_nodes
            for fn in ast.walk(self.tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and node in ast.walk(fn)
        )
        torch_in_handler = any(
            isinstance(sub, ast.Call)
            and (
                (self.qual(sub.func) or "").startswith("torch.")
                or (isinstance(sub.func, ast.Attribute) and sub.func.attr in T.COMPUTE_METHODS)
            )
            for handler in [*node.handlers, ast.Module(body=node.orelse + node.finalbody, type_ignores=[])]
            for sub in ast.walk(handler)
        )
        if in_forward or torch_in_handler:
            where = "in the forward path" if in_forward else "with torch in its handler"
            self.add(R.TORCH_FALLBACK, node, f"try/except {where} (a fallback can hide a failing kernel)")
        else:
            self.add(R.TORCH_FALLBACK, node, "try/except outside the forward path", Severity.INFO)

    def check_native_source(self, node: ast.Constant) -> None:
        text = node.value
        if not isinstance(text, str) or len(text) < 16:
            return
        for match in T.CUDA_KERNEL_RE.finditer(text):
            self.cuda_kernels.add(match.group(1))
        for match in T.TORCH_LIBRARY_RE.finditer(text):
            self.op_namespaces.add(match.group(1))
        looks_native = any(tok in text for tok in ("#include", "__global__", "torch::", "at::", "PYBIND11"))
        if not looks_native:
            return
        for pattern, rule, review, what in T.CPP_PATTERNS:
            for match in pattern.finditer(text):
                line = node.lineno + text.count("\n", 0, match.start())
                finding_node = ast.Constant(value=None, lineno=line, col_offset=0)
                severity = Severity.REVIEW if review else Severity.REJECT
                self.add(rule, finding_node, f"native source {what}: {match.group(0).strip()!r}", severity)
