"""bench.compile_bench: small models of repeated layers compiled for sm_90 on this CPU in each form
(shared kernels write fewer cubins than a function per kernel; share_sizes fewer functions where
layers differ in width), and the table of the forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compile_bench import Row, measure, table
from tests.experts.test_template_share import REPEATED
from tests.experts.test_template_share_sizes import WIDENING


@pytest.mark.slow  # ~13 s on a 2-core host: two compiles of a model for sm_90
@pytest.mark.timeout(600)
def test_shared_kernels_compile_fewer_cubins_than_a_function_per_kernel(tmp_path: Path) -> None:
    problem = tmp_path / "1_Repeated.py"
    problem.write_text(REPEATED, encoding="utf-8")
    rows = measure(problem, "NVIDIA H100 80GB HBM3", 1, 90, tmp_path)
    alone, shared, sizes = rows
    assert (alone.form, shared.form, sizes.form) == ("one function per kernel", "shared", "shared sizes")
    assert not alone.error, alone
    assert not shared.error, shared
    assert not sizes.error, sizes
    assert alone.sites == shared.sites == sizes.sites
    # every function launched at the task's shape or at the held-out batch is compiled once
    assert 0 < shared.cubins < alone.cubins, rows
    assert shared.functions < alone.functions, rows
    # its layers are all of one width: nothing more to share by moving constants
    assert sizes.functions <= shared.functions, rows
    text = table(rows, 1, 90, "NVIDIA H100 80GB HBM3")
    assert "| 1_Repeated | shared |" in text
    assert "| 1_Repeated | shared sizes |" in text
    assert text.count("\n| 1_Repeated") == 3


def test_the_table_says_what_failed() -> None:
    rows = [Row("7_X", "one function per kernel", 3, 3, 3, 1.0), Row("7_X", "shared", 3, 2, 2, 0.5)]
    assert "| 7_X | shared | 3 | 2 | 2 | 0.5 | 2.00x |" in table(rows, 2, 90, "H100")
    rows[1].error = "RuntimeError: boom"
    assert "| 7_X | shared | 3 | 2 | 2 | 0.5 | RuntimeError: boom |" in table(rows, 2, 90, "H100")


@pytest.mark.slow  # two compiles of a small model for sm_90
@pytest.mark.timeout(600)
def test_layers_of_other_widths_compile_as_fewer_functions_with_share_sizes(tmp_path: Path) -> None:
    # Triton takes every constant share_sizes moved as an argument (none it needs when compiling)
    problem = tmp_path / "2_Widening.py"
    problem.write_text(WIDENING, encoding="utf-8")
    shared, sizes = measure(problem, "NVIDIA H100 80GB HBM3", 1, 90, tmp_path, forms=("shared", "sizes"))
    assert not shared.error, shared
    assert not sizes.error, sizes
    assert sizes.functions < shared.functions, (shared, sizes)
    assert 0 < sizes.cubins <= shared.cubins, (shared, sizes)
