"""Outputs' nesting as a worker reports it and the parent compares it (:mod:`gpu_runner.structure`):
nesting and lengths must match, a tuple and a list are alike, and a report not in the wire form
(what a candidate's process may send) is no structure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_runner.sandboxed.common import output_structure
from gpu_runner.structure import MAX_DEPTH, MAX_NODES, describe, difference, read

pytestmark = pytest.mark.timeout(30)


def test_an_lstms_outputs_are_reported_and_described_as_they_nest() -> None:
    out = nn.LSTM(4, 3, batch_first=True)(torch.randn(2, 5, 4))
    said = read(output_structure(out))
    assert said is not None
    assert describe(said) == "(tensor, (tensor, tensor))"


def test_a_flat_tuple_differs_from_a_nested_one_naming_both() -> None:
    t = torch.zeros(1)
    assert difference(output_structure((t, (t, t))), output_structure((t, t, t))) == (
        "output structure differs: the reference returns (tensor, (tensor, tensor)), "
        "the candidate (tensor, tensor, tensor)"
    )


def test_a_tensor_and_a_tuple_of_one_tensor_differ() -> None:
    t = torch.zeros(1)
    assert difference(output_structure(t), output_structure((t,))) == (
        "output structure differs: the reference returns tensor, the candidate (tensor,)"
    )


def test_a_list_where_the_reference_returns_a_tuple_is_alike() -> None:
    t = torch.zeros(1)
    assert difference(output_structure((t, (t, t))), output_structure([t, [t, t]])) is None
    assert difference(output_structure(t), output_structure(t)) is None


def test_a_report_not_in_the_wire_form_is_no_structure() -> None:
    deep: object = "tensor"
    for _ in range(MAX_DEPTH + 1):
        deep = ["tuple", deep]
    for bad in (None, 5, [], ["dict", "tensor"], ["tuple", 3], {"tuple": []}, deep, ["tuple"] + ["tensor"] * MAX_NODES):
        assert read(bad) is None, bad
        assert difference("tensor", bad) == (
            "output structure differs: the candidate's process reported no readable output structure"
        )


def test_no_reference_structure_compares_nothing() -> None:
    assert difference(None, ["tuple", "tensor"]) is None
