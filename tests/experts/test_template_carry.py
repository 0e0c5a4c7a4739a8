"""What ``ModelNew`` carries over of the reference's construction code, and what it declines."""

from __future__ import annotations

import ast

import pytest

from actors.experts.template import Plan, analyse
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
        ("self.m = build()", "SIZE = missing(3)\ndef build():\n    return nn.Linear(SIZE, 2)", "uses 'missing'"),
        ("self.m = nn.Linear(os.cpu_count(), 2)", "import os", "uses 'os' from `import os`, which a candidate may not"),
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


def test_a_computed_module_constant_comes_with_what_it_reads_and_its_imports() -> None:
    extra = (
        "import collections.abc\nfrom itertools import repeat\n\n"
        "def _ntuple(n):\n    def parse(x):\n        if isinstance(x, collections.abc.Iterable):\n"
        "            return x\n        return tuple(repeat(x, n))\n    return parse\n\n"
        "to_2tuple = _ntuple(2)"
    )
    _, prelude = init_source(_reference("self.k = nn.Conv2d(3, 4, to_2tuple(3))", extra))
    assert list(_defs(prelude)) == ["_ntuple", "to_2tuple"]
    assert "import collections.abc" in prelude
    assert "from itertools import repeat" in prelude
    namespace: dict[str, object] = {}
    exec(compile(prelude, "<prelude>", "exec"), namespace)  # the carried code, as a candidate runs it
    assert namespace["to_2tuple"](3) == (3, 3)  # type: ignore[operator]


def test_a_model_whose_construction_reads_a_value_is_built_on_the_cpu_for_its_analysis() -> None:
    """``.item()`` cannot run on the meta device (Swin's stochastic depth rates)."""
    source = _reference(
        "rates = [r.item() for r in torch.linspace(0, 0.5, 2)]\n        self.fc = nn.Linear(4, 3)\n"
        "        self.scale = rates[1] + 1.0",
        "",
    ).replace("return x", "return self.fc(x) * self.scale")
    source += "\n\ndef get_inputs():\n    return [torch.randn(2, 4)]\n\n\ndef get_init_inputs():\n    return []\n"
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    assert plan.template == "mm"
