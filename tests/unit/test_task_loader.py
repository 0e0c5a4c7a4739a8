"""The task loader accepts any KernelBench-valid file: ``get_inputs`` and ``get_init_inputs`` may
be bound to a lambda, any callable or an import, not only defined with ``def``."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.commands.run import check_task_source
from actors.runtime.errors import ConfigError
from gpu_runner.errors import InvalidReference
from gpu_runner.probe import validate_reference

LAMBDAS = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


get_inputs = lambda: [torch.randn(8, 8)]  # noqa: E731
get_init_inputs: object = lambda: []
"""

CALLABLE_AND_IMPORT = """import functools
import torch
from torch import nn as Model  # a class bound by import is still bound


def _inputs(n):
    return [torch.randn(n, n)]


get_inputs = functools.partial(_inputs, 8)
from builtins import list as get_init_inputs
"""

MISSING = """import torch


class Model(torch.nn.Module):
    pass


inputs = lambda: []
"""


@pytest.mark.parametrize("source", [LAMBDAS, CALLABLE_AND_IMPORT], ids=["lambda", "callable-and-import"])
def test_a_task_binding_get_inputs_to_any_callable_is_accepted(source: str, tmp_path: Path) -> None:
    path = tmp_path / "task.py"
    path.write_text(source)
    assert check_task_source(path) == source
    validate_reference(source)  # the evaluator's own check agrees


def test_a_task_missing_its_functions_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "task.py"
    path.write_text(MISSING)
    with pytest.raises(ConfigError, match="missing get_inputs, get_init_inputs"):
        check_task_source(path)
    with pytest.raises(InvalidReference, match="get_inputs, get_init_inputs"):
        validate_reference(MISSING)


def test_a_directory_given_as_a_task_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a task file"):
        check_task_source(tmp_path)
    with pytest.raises(ConfigError, match="task file not found"):
        check_task_source(tmp_path / "nothing.py")
