"""bench.compile_bench: a small model of repeated layers compiled for sm_90 on this CPU in both
forms, shared kernels writing fewer cubins than a function per kernel, and the table of the two."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compile_bench import Row, measure, table
from tests.experts.test_template_share import REPEATED


@pytest.mark.slow  # ~13 s on a 2-core host: two compiles of a model for sm_90
@pytest.mark.timeout(600)
def test_shared_kernels_compile_fewer_cubins_than_a_function_per_kernel(tmp_path: Path) -> None:
    problem = tmp_path / "1_Repeated.py"
    problem.write_text(REPEATED, encoding="utf-8")
    rows = measure(problem, "NVIDIA H100 80GB HBM3", 1, 90, tmp_path)
    alone, shared = rows
    assert (alone.form, shared.form) == ("one function per kernel", "shared")
    assert not alone.error, alone
    assert not shared.error, shared
    assert alone.sites == shared.sites
    # every function launched at the task's shape or at the held-out batch is compiled once
    assert 0 < shared.cubins < alone.cubins, rows
    assert shared.functions < alone.functions, rows
    text = table(rows, 1, 90, "NVIDIA H100 80GB HBM3")
    assert "| 1_Repeated | shared |" in text
    assert text.count("\n| 1_Repeated") == 2


def test_the_table_says_what_failed() -> None:
    rows = [Row("7_X", "one function per kernel", 3, 3, 3, 1.0), Row("7_X", "shared", 3, 2, 2, 0.5)]
    assert "| 7_X | shared | 3 | 2 | 2 | 0.5 | 2.00x |" in table(rows, 2, 90, "H100")
    rows[1].error = "RuntimeError: boom"
    assert "| 7_X | shared | 3 | 2 | 2 | 0.5 | RuntimeError: boom |" in table(rows, 2, 90, "H100")
