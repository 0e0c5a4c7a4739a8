"""``bench.template_coverage``'s shrinking of a problem's sizes for CPU checks."""

from __future__ import annotations

from bench.template_coverage import shrink_sizes

SOURCE = """
batch_size = 8192 * 2
input_shape = (8192 * 2,)
dim = 1
features = 2 ** 12
odd = (64, 3 + 4, n)
"""


def test_constant_expressions_shrink_like_numbers() -> None:
    """KernelBench writes sizes as ``8192 * 2``; left alone they kept a CPU check at 1 GiB per tensor."""
    small = shrink_sizes(SOURCE, factor=32)
    assert "batch_size = 2\n" in small
    assert "input_shape = (512,)" in small
    assert "dim = 1\n" in small
    assert "features = 128\n" in small
    assert "odd = (64, 3 + 4, n)" in small  # a tuple with a name in it is not a size list
