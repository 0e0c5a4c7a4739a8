"""What of the reference's source a ``ModelNew`` carries over so it builds the same parameters.

``ModelNew.__init__`` is ``Model.__init__`` as text: KernelBench seeds the generator before it
builds each model, so the same construction code in the same order gives the same weights. What
that code calls comes along: ``Model``'s own helper methods (``_make_layer``), the module-level
classes it instantiates (``BasicBlock``, ``InceptionModule``) with their class constants, their
``__init__`` and the methods their ``__init__`` calls, module-level functions it calls, module
constants (with what a computed one reads: ``to_2tuple = _ntuple(2)``), and the imports they use
that the evaluator's gate lets a candidate make (its own tables). A carried class loses its
``forward`` and every other method its construction does not reach: ``ModelNew.forward`` runs
kernels, never a submodule's own forward, and the evaluator's gate would take a torch op in a
carried ``forward`` for a fallback.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass, field

from actors.experts.template.errors import TraceFailed, UnsupportedGraph
from gpu_runner.gate_tables import ALLOWED_IMPORT_ROOTS, IMPORT_RULES
from schemas.task import parse_module

_PROVIDED = frozenset({"torch", "nn", "F", "math", "triton", "tl"})
_MODULE_BASES = frozenset({"nn.Module", "torch.nn.Module", "Module"})
_SKIPPED = frozenset({"forward", "__call__", "extra_repr"})


class _SuperRewriter(ast.NodeTransformer):
    """``super(Model, self).__init__()`` -> ``super().__init__()`` and ``Model.X`` -> ``ModelNew.X``
    (the class is ``ModelNew``)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id="ModelNew", ctx=node.ctx) if node.id == "Model" else node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "super"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in ("Model", "ModelNew")
        ):
            return ast.Call(func=node.func, args=[], keywords=[])
        return node


def _free_names(func: ast.FunctionDef) -> set[str]:
    """Names ``func`` reads that it does not bind itself and that are not builtins."""
    bound = {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}
    if func.args.vararg:
        bound.add(func.args.vararg.arg)
    if func.args.kwarg:
        bound.add(func.args.kwarg.arg)
    loads: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            else:
                loads.add(node.id)
        elif isinstance(node, ast.comprehension | ast.Lambda | ast.FunctionDef) and node is not func:
            if isinstance(node, ast.FunctionDef):
                bound.add(node.name)  # a helper defined inside __init__
            for inner in ast.walk(node):
                if isinstance(inner, ast.arg):
                    bound.add(inner.arg)
    return {n for n in loads - bound if not hasattr(builtins, n)}


def _self_reads(func: ast.FunctionDef) -> set[str]:
    """Attributes ``func`` reads from ``self`` (``self._make_layer``, ``self.expansion``)."""
    return {
        node.attr
        for node in ast.walk(func)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Load)
    }


def _importable(module: str) -> bool:
    """Whether the evaluator's gate lets a candidate import ``module`` (its own tables)."""
    if module.split(".")[0] not in ALLOWED_IMPORT_ROOTS or module.startswith("torch._"):
        return False
    return not any(module == prefix or module.startswith(prefix + ".") for prefix in IMPORT_RULES)


def _names_read(node: ast.AST) -> set[str]:
    """Names an expression or statement reads, less builtins (a lambda's own arguments too)."""
    bound = {
        a.arg
        for sub in ast.walk(node)
        if isinstance(sub, ast.Lambda)
        for a in ast.walk(sub.args)
        if isinstance(a, ast.arg)
    }
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {n for n in loads - bound if not hasattr(builtins, n)}


def _is_literal(value: ast.expr) -> bool:
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


@dataclass
class _Members:
    """A class's body sorted: methods by name, class-level assignments by the names they bind."""

    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)
    assigns: dict[str, ast.stmt] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, node: ast.ClassDef) -> _Members:
        members = cls()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                members.methods[item.name] = item
            elif isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            members.assigns[sub.id] = item
            elif not (isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant)):  # not a docstring
                members.other.append(type(item).__name__)
        return members

    def reached_from_init(self, owner: str) -> tuple[list[ast.FunctionDef], list[ast.stmt]]:
        """The methods ``__init__`` reaches through ``self`` (itself first) and the class-level
        assignments any of them reads, in the class's own order."""
        todo = ["__init__"] if "__init__" in self.methods else []
        methods: list[str] = []
        reads: set[str] = set()
        while todo:
            name = todo.pop()
            if name in methods:
                continue
            method = self.methods[name]
            if method.decorator_list and not all(
                isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in method.decorator_list
            ):
                raise UnsupportedGraph(f"{owner}.{name} is decorated, which the template does not carry over")
            methods.append(name)
            for attr in _self_reads(method):
                if attr in self.methods and attr not in _SKIPPED:
                    todo.append(attr)
                reads.add(attr)
        order = list(self.methods)
        kept = [self.methods[n] for n in sorted(methods, key=order.index)]
        # Literal constants all stay (``block.expansion`` reads one through a class passed in);
        # any other assignment only where the kept methods read it through ``self``.
        assigns = list(
            dict.fromkeys(
                a
                for n, a in self.assigns.items()
                if n in reads or (a.value is not None and _is_literal(a.value))  # type: ignore[attr-defined]
            )
        )
        return kept, assigns


class _Carrier:
    """Collects, in dependency order, the module-level definitions the construction code needs."""

    def __init__(self, tree: ast.Module) -> None:
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.constants: dict[str, ast.Assign] = {}
        self.prelude: list[str] = []
        self.provided = set(_PROVIDED)
        self.refused: dict[str, str] = {}
        """Names bound by imports a candidate may not make, with the import."""
        self.done: set[str] = set()
        for stmt in tree.body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                module = stmt.module if isinstance(stmt, ast.ImportFrom) and not stmt.level else None
                mods = [module] if module else [a.name for a in stmt.names]
                names = [(a.asname or a.name).split(".")[0] for a in stmt.names]
                if module is None and isinstance(stmt, ast.ImportFrom):
                    self.refused.update(dict.fromkeys(names, "a relative import"))
                elif all(_importable(m) for m in mods):
                    self.prelude.append(ast.unparse(stmt))
                    self.provided.update(names)
                else:
                    self.refused.update(dict.fromkeys(names, ast.unparse(stmt)))
            elif isinstance(stmt, ast.ClassDef) and stmt.name != "Model":
                self.classes[stmt.name] = stmt
            elif isinstance(stmt, ast.FunctionDef) and stmt.name not in ("get_inputs", "get_init_inputs"):
                self.functions[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.constants[stmt.targets[0].id] = stmt

    def need(self, names: set[str], user: str) -> None:
        for name in sorted(names - self.provided):
            if name in self.done:  # carried already (also while carrying an earlier name)
                continue
            if name == "ModelNew":
                raise UnsupportedGraph(f"{user} uses a class named ModelNew, the name of the generated model")
            self.done.add(name)  # before its own needs: a class naming itself in super(...)
            if name in self.classes:
                self._carry_class(self.classes[name])
            elif name in self.functions:
                function = self.functions[name]
                if function.decorator_list:
                    raise UnsupportedGraph(f"{user} uses the decorated function {name!r}, which is not carried over")
                self.need(_free_names(function), f"function {name}")
                self.prelude.append(ast.unparse(function))
            elif name in self.constants:
                assign = self.constants[name]
                if not _is_literal(assign.value):  # ``to_2tuple = _ntuple(2)``: what it reads comes too
                    self.need(_names_read(assign.value), f"the module-level {name}")
                self.prelude.append(ast.unparse(assign))
            elif name in self.refused:
                raise UnsupportedGraph(
                    f"{user} uses {name!r} from `{self.refused[name]}`, which a candidate may not import"
                )
            else:
                raise UnsupportedGraph(f"{user} uses {name!r}, which the template cannot carry over")

    def _carry_class(self, node: ast.ClassDef) -> None:
        if node.decorator_list or node.keywords:
            raise UnsupportedGraph(f"class {node.name} is decorated or has keywords: not carried over")
        for base in node.bases:
            text = ast.unparse(base)
            if text in _MODULE_BASES:
                continue
            if isinstance(base, ast.Name) and base.id in self.classes:
                self.need({base.id}, f"class {node.name}")
                continue
            raise UnsupportedGraph(f"class {node.name} derives from {text}, which the template cannot carry over")
        members = _Members.of(node)
        if members.other:
            raise UnsupportedGraph(f"class {node.name} holds a {members.other[0]} in its body: not carried over")
        methods, assigns = members.reached_from_init(node.name)
        needs: set[str] = set()
        for method in methods:
            needs |= _free_names(method)
        for assign in assigns:
            needs |= _names_read(assign)
        self.need(needs - {node.name}, f"class {node.name}")
        body: list[ast.stmt] = [*assigns, *methods] or [ast.Pass()]
        carried = copy.copy(node)
        carried.body = body
        self.prelude.append(ast.unparse(ast.fix_missing_locations(carried)))


def init_source(source: str) -> tuple[str, str]:
    """``Model.__init__`` (and the helper methods it calls) as method text for ``ModelNew``, and the
    module-level code they need (imports, constants, helper classes and functions), in an order
    that defines each thing before it is used."""
    tree = parse_module(source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        raise TraceFailed("load", "no class Model in the reference")
    carrier = _Carrier(tree)
    for base in model.bases:
        if ast.unparse(base) not in _MODULE_BASES:
            raise UnsupportedGraph("Model must derive from nn.Module directly to be carried over")
    members = _Members.of(model)
    if "__init__" not in members.methods:  # nn.Module's own: no init inputs and no parameters
        return "def __init__(self):\n    super().__init__()", "\n".join(carrier.prelude)
    if members.methods["__init__"].decorator_list:
        raise UnsupportedGraph("a decorated Model.__init__ is not covered")
    methods, assigns = members.reached_from_init("Model")
    for assign in assigns:
        value = assign.value if isinstance(assign, ast.Assign | ast.AnnAssign) else None
        if value is None or not _is_literal(value):
            names = ", ".join(n for n, a in members.assigns.items() if a is assign)
            raise UnsupportedGraph(f"Model.__init__ uses its own member {names!r}, which is not carried over")
    needs: set[str] = set()
    for method in methods:
        needs |= _free_names(method)
    carrier.need(needs - {"Model"}, "Model.__init__")
    rewritten = [_SuperRewriter().visit(parse_module(ast.unparse(m))).body[0] for m in methods]
    parts = [ast.unparse(a) for a in assigns]
    init_text = "\n".join([*parts, ""] if parts else []) + "\n\n".join(ast.unparse(m) for m in rewritten)
    return init_text, "\n\n".join(carrier.prelude)
