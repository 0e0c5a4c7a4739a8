"""Parsing Python source from several threads at once (``schemas.task.parse_module``)."""

from __future__ import annotations

import ast
import gc
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.task import parse_expression, parse_module

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("actors", "gpu_runner", "schemas", "experience")
BIG = "\n".join(f"def f{i}(a, b):\n    return [(a + b) * {i} for _ in range(3)]" for i in range(300))


def _collide(parse: Callable[[str], object]) -> list[BaseException]:
    """Thread A parses a large module; at the first garbage collection during it (the tree's
    objects are being built then), A waits up to 0.5 s for thread B, which parses a small module
    from a deeper stack. Returns what A's parse raised."""
    b_may_start = threading.Event()
    b_done = threading.Event()
    raised: list[BaseException] = []

    def a() -> None:
        try:
            parse(BIG)
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever A raised
            raised.append(exc)

    def b() -> None:
        def deep(n: int) -> object:
            return deep(n - 1) if n else parse("x = [1, 2, 3]\ny = {'a': (1, 2)}\n")

        b_may_start.wait(5.0)
        deep(30)
        b_done.set()

    thread_a = threading.Thread(target=a)
    thread_b = threading.Thread(target=b)

    def during_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.current_thread() is thread_a and not b_may_start.is_set():
            b_may_start.set()
            b_done.wait(0.5)

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    gc.callbacks.append(during_collection)
    try:
        thread_b.start()
        thread_a.start()
        thread_a.join(10.0)
        thread_b.join(10.0)
    finally:
        gc.callbacks.remove(during_collection)
        gc.set_threshold(*threshold)
    assert b_may_start.is_set(), "no garbage collection ran during thread A's parse"
    assert not thread_a.is_alive()
    assert not thread_b.is_alive()
    return raised


@pytest.mark.timeout(30)
def test_a_parse_interleaved_with_another_threads_parse_builds_its_tree() -> None:
    if sys.version_info < (3, 12):
        # The setting reproduces CPython 3.11's failure with its own ast.parse ...
        unguarded = _collide(ast.parse)
        assert [type(e) for e in unguarded] == [SystemError], unguarded
        assert "recursion depth mismatch" in str(unguarded[0])
    # ... which parse_module does not show.
    assert _collide(parse_module) == []


def test_parse_expression_and_module_return_the_trees() -> None:
    assert ast.literal_eval(parse_expression("(1, 'a', [2.5])")) == (1, "a", [2.5])
    assert [type(n) for n in parse_module("import torch\nx = 1\n", "t.py").body] == [ast.Import, ast.Assign]
    with pytest.raises(SyntaxError) as info:
        parse_module("def (", "bad.py")
    assert info.value.filename == "bad.py"


def test_library_code_parses_only_through_the_locked_parser() -> None:
    offenders = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "schemas" / "task.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "ast":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} from ast import ...")
                if not isinstance(node, ast.Call):
                    continue
                name = ast.unparse(node.func)
                if name == "ast.parse":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert offenders == []
