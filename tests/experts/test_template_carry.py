"""What ``ModelNew`` carries over of the reference's construction code, and what it declines."""

from __future__ import annotations

import ast

import pytest

from actors.experts.template.carry import init_source
from actors.experts.template.errors import UnsupportedGraph
from tests.experts.template_norm_cases import GRAPH_CASES

_HELPERS = next(c for c in GRAPH_CASES if c.name == "resnet_helper_classes_and_methods").sources()[0]


def _defs(code: str) -> dict[str, list[str]]:
    """Top-level names of ``code`` with the method names of each class."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = [f.name for f in node.body if isinstance(f, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = []
        elif isinstance(node, ast.Assign):
            out.update({t.id: [] for t in node.targets if isinstance(t, ast.Name)})
    return out


def test_helper_classes_come_without_their_forward_and_each_definition_once_before_its_use() -> None:
    init, prelude = init_source(_HELPERS)
    defs = _defs(prelude)
    assert defs == {"norm_layer": [], "Block": ["__init__"], "Stem": ["__init__"], "WIDTHS": []}
    assert list(defs).index("Block") < list(defs).index("Stem")  # a base before the class built on it
    assert prelude.count("def norm_layer") == 1
    assert "expansion = 1" in prelude  # read as block.expansion: every literal class constant stays
    methods = [f.name for f in ast.parse(init).body if isinstance(f, ast.FunctionDef)]
    assert methods == ["__init__", "_make_layer"]  # not `unused`, not `forward`
    assert "super().__init__()" in init
    assert "super(Model" not in init


def _reference(init: str, extra: str = "") -> str:
    return (
        f"import torch\nimport torch.nn as nn\n{extra}\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        {init}\n\n    def forward(self, x):\n        return x\n"
    )


@pytest.mark.parametrize(
    ("init", "extra", "says"),
    [
        ("self.m = Missing(3)", "", "uses 'Missing', which the template cannot carry over"),
        ("self.m = Child()", "import foo\nclass Child(foo.Base):\n    pass", "derives from foo.Base"),
        ("self.m = build()", "SIZE = torch.arange(3)\ndef build():\n    return nn.Linear(SIZE, 2)", "not a plain"),
        ("self.m = ModelNew()", "class ModelNew(nn.Module):\n    pass", "a class named ModelNew"),
    ],
)
def test_what_cannot_be_carried_over_is_declined_by_name(init: str, extra: str, says: str) -> None:
    with pytest.raises(UnsupportedGraph, match=says):
        init_source(_reference(init, extra))


def test_model_read_by_its_own_name_becomes_modelnew() -> None:
    source = _reference("self.n = Model.WIDTH", "").replace(
        "class Model(nn.Module):\n", "class Model(nn.Module):\n    WIDTH = 3\n"
    )
    init, _ = init_source(source)
    assert "self.n = ModelNew.WIDTH" in init
    assert "WIDTH = 3" in init
