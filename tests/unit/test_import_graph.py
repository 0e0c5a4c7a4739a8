"""The modules of each package import one another without loops: the import graph, read from the
source with ``ast`` (imports inside functions and imports only for type checkers count), has no
cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports anywhere in its body."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        package_of = name if path.name == "__init__.py" else name.rpartition(".")[0]
        stack: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
        while stack:
            node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    edges |= {a.name for a in child.names if a.name in modules}
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = package_of.split(".")[: len(package_of.split(".")) - child.level + 1]
                        base = ".".join([*anchor, *([base] if base else [])])
                    subs = {f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in modules}
                    edges |= subs
                    if base in modules and len(subs) < len(child.names):  # a name from the package itself
                        edges.add(base)
                stack.append(child)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


@pytest.mark.parametrize(
    "package",
    ["actors", "actors.runtime", "actors.kinds", "actors.commands", "schemas", "gpu_runner", "experience"],
)
def test_modules_of_a_package_import_each_other_without_a_loop(package: str) -> None:
    graph = import_graph(package)
    assert len(graph) > 3
    assert cycles(graph) == set()


def test_a_loop_through_an_import_inside_a_function_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_the_command_line_modules_sit_above_the_controller_and_the_launcher() -> None:
    graph = import_graph("actors")
    below = {"actors.commands.controller", "actors.commands.launch", "actors.runtime.options", "actors.runtime.process"}
    for module in below:
        assert not graph[module] & {"actors.commands.cli", "actors.commands.run", "actors.commands.actor"}, module


def test_the_runtime_imports_no_actor_kind_and_no_command_and_kinds_import_no_command() -> None:
    graph = import_graph("actors")
    for module, imported in graph.items():
        if module.startswith("actors.runtime"):
            assert not {m for m in imported if m.startswith(("actors.kinds", "actors.commands"))}, module
        if module.startswith("actors.kinds"):
            assert not {m for m in imported if m.startswith("actors.commands")}, module


def test_an_island_process_never_loads_the_openai_sdk() -> None:
    code = (
        "import sys, actors.kinds.island, actors.evolution.metaprompt\n"
        "loaded = sorted(m for m in sys.modules if m == 'openai' or m.startswith(('actors.llm', 'actors.experts')))\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, actors.llm.client; print('openai' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    assert loaded.stdout.strip() == "True"  # the check above can see the SDK when it is loaded
