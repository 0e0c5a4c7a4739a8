"""Reference problems for the template expert's tests, in KernelBench format, at small sizes.

Each case is a source template (``$NAME`` placeholders for sizes) and a list of size sets,
including sizes that are not powers of two. Together they cover every op of the issue's list
and the common spellings of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


@dataclass(frozen=True)
class Case:
    """One reference problem and the sizes to test it at."""

    name: str
    template: str
    sizes: tuple[dict[str, int], ...]

    def sources(self) -> list[str]:
        """The reference source at each size set."""
        return [HEAD + Template(self.template).substitute(s) for s in self.sizes]


def _model(init_sig: str, init_body: str, fwd_sig: str, fwd_body: str, inputs: str, init_vals: str) -> str:
    init = "\n".join("        " + line for line in init_body.strip().splitlines()) or "        pass"
    fwd = "\n".join("        " + line for line in fwd_body.strip().splitlines())
    return (
        "class Model(nn.Module):\n"
        f"    def __init__(self{init_sig}):\n"
        "        super(Model, self).__init__()\n"
        f"{init}\n"
        f"    def forward(self, {fwd_sig}):\n"
        f"{fwd}\n\n"
        "def get_inputs():\n"
        f"    return [{inputs}]\n\n"
        "def get_init_inputs():\n"
        f"    return [{init_vals}]\n"
    )


_XY = "torch.randn($B, $N), torch.randn($B, $N)"
_ROWS = ({"B": 3, "N": 37}, {"B": 17, "N": 100})
_ROWS3 = ({"B": 3, "C": 5, "L": 7}, {"B": 4, "C": 33, "L": 20})
_MM = ({"M": 33, "K": 65, "N": 47}, {"M": 16, "K": 16, "N": 24})

CASES: tuple[Case, ...] = (
    Case(
        "act_relu_gelu_swish",
        _model(
            "",
            "",
            "x, y",
            "x = F.leaky_relu(x, 0.2)\nx = F.gelu(x)\nx = torch.sigmoid(x) * x\nx = x.tanh()\n"
            "x = torch.relu(x * 2.0 + y)\nreturn x",
            _XY,
            "",
        ),
        _ROWS,
    ),
    Case(
        "act_modules",
        _model(
            "",
            "self.a = nn.Mish()\nself.b = nn.Softplus()\nself.c = nn.Hardtanh(-0.5, 0.5)\n"
            "self.d = nn.ELU(alpha=1.2)\nself.e = nn.SELU()\nself.f = nn.LeakyReLU()\nself.g = nn.ReLU(inplace=True)",
            "x",
            "x = self.a(x) - 0.5\ny = self.b(x)\nz = F.hardswish(x) + F.hardsigmoid(x)\nw = self.d(x) + self.e(x)\n"
            "return self.g(self.c(y) + z * w + self.f(x))",
            "torch.randn($B, $N) * 3",
            "",
        ),
        _ROWS,
    ),
    Case(
        "act_more",
        _model(
            "",
            "",
            "x",
            "a = F.gelu(x, approximate='tanh') + F.silu(x)\nb = torch.clamp(x, min=-0.3, max=0.8) + x.clamp_min(0.1)\n"
            "c = F.relu6(x * 4) + F.softsign(x) + F.logsigmoid(x) + torch.exp(x) / 3.0 - 1.0\n"
            "d = x ** 2 + torch.pow(x, 3) + x.square() - torch.clamp(x, max=0.2)\nreturn a * b + c - d",
            "torch.randn($B, $N)",
            "",
        ),
        _ROWS,
    ),
    Case(
        "act_mingpt_gelu",
        _model(
            "",
            "",
            "x",
            "return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))",
            "torch.randn($B, $N) * 2",
            "",
        ),
        _ROWS,
    ),
    Case(
        "act_math",
        _model(
            "",
            "",
            "x, y",
            "a = torch.log(torch.abs(x) + 1.0) + torch.sqrt(torch.abs(y)) + torch.rsqrt(x * x + 1.0)\n"
            "b = torch.erf(x) + torch.reciprocal(y * y + 2.0) - (-x) + F.tanhshrink(x)\n"
            "c = torch.maximum(x, y) * torch.minimum(x, y) + torch.max(x, y) - x.sub(y, alpha=2)\n"
            "return a + b + c + 1 - x",
            _XY,
            "",
        ),
        _ROWS,
    ),
    Case(
        "compare_where_masked_fill",
        _model(
            "",
            "",
            "x, y",
            "a = torch.where(x > 0.5, x, y * 2.0).masked_fill(y <= -0.3, -1.5)\n"
            "b = x.masked_fill(torch.eq(y, x), 0.0) + (x < y) * 2.0 + (x != 0.25) * y\n"
            "return a - torch.where(x.ge(y), 1.0, b)",
            _XY,
            "",
        ),
        _ROWS,
    ),
    Case(
        "ew_channel_bias",
        _model(
            ", c",
            "self.bias = nn.Parameter(torch.randn(c, 1, 1))\nself.scale = nn.Parameter(torch.randn(()))\n"
            "self.row = nn.Parameter(torch.randn($L))",
            "x",
            "x = x * self.scale + self.bias\nx = x.view(x.size(0), -1)\n"
            "return torch.sigmoid(x.view($B, $C, $L, $L) - self.row)",
            "torch.randn($B, $C, $L, $L)",
            "$C",
        ),
        _ROWS3,
    ),
    Case(
        "softmax_scale",
        _model("", "", "x", "return torch.softmax(x, dim=1) * 3.0 + 1.0", "torch.randn($B, $N) * 4", ""),
        _ROWS,
    ),
    Case(
        "log_softmax_module",
        _model(
            "",
            "self.sm = nn.LogSoftmax(dim=-1)",
            "x",
            "return self.sm(F.relu(x))",
            "torch.randn($B, $C, $L)",
            "",
        ),
        _ROWS3,
    ),
    Case(
        "softmax_middle_dim",
        _model("", "", "x", "return F.softmax(x, dim=1) + x.log_softmax(1)", "torch.randn($B, $C, $L)", ""),
        _ROWS3,
    ),
    Case(
        "layer_norm",
        _model(
            ", n",
            "self.ln = nn.LayerNorm(n)",
            "x",
            "return F.gelu(self.ln(x * 2.0))",
            "torch.randn($B, $N) * 3 + 1",
            "$N",
        ),
        _ROWS,
    ),
    Case(
        "layer_norm_multi_dim",
        _model(
            ", c, l",
            "self.w = nn.Parameter(torch.randn(c, l))\nself.b = nn.Parameter(torch.randn(c, l))",
            "x",
            "return F.layer_norm(x, (x.shape[1], x.shape[2]), self.w, self.b, 1e-6)",
            "torch.randn($B, $C, $L)",
            "$C, $L",
        ),
        _ROWS3,
    ),
    Case(
        "rms_norm_kernelbench",
        _model(
            ", features, eps",
            "self.features = features\nself.eps = eps",
            "x",
            "rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)\nreturn x / rms",
            "torch.randn($B, $C, $L, 3)",
            "$C, 1e-5",
        ),
        _ROWS3,
    ),
    Case(
        "rms_norm_module",
        _model(
            ", n", "self.norm = nn.RMSNorm(n, eps=1e-6)", "x", "return self.norm(x) * 0.5", "torch.randn($B, $N)", "$N"
        ),
        _ROWS,
    ),
    Case(
        "group_norm",
        _model(
            ", c",
            "self.gn = nn.GroupNorm(num_groups=$G, num_channels=c)",
            "x",
            "x = self.gn(x)\nreturn x * torch.sigmoid(x)",
            "torch.randn($B, $C, $L)",
            "$C",
        ),
        ({"B": 3, "C": 6, "L": 7, "G": 3}, {"B": 2, "C": 32, "L": 5, "G": 8}),
    ),
    Case(
        "reductions_last",
        _model(
            "",
            "",
            "x",
            "s = torch.sum(x, dim=-1, keepdim=True)\nm = x.mean(1, keepdim=True)\nhi = torch.amax(x, 1, keepdim=True)\n"
            "lo = x.min(dim=1, keepdim=True).values\nreturn (s + m * hi - lo) * 0.5",
            "torch.randn($B, $N)",
            "",
        ),
        _ROWS,
    ),
    Case(
        "reduce_middle",
        _model("", "", "x", "return torch.sum(x, dim=1) * 0.5 + x.amin(dim=1)", "torch.randn($B, $C, $L)", ""),
        _ROWS3,
    ),
    Case(
        "reduce_first_dim_mean",
        _model("", "", "x", "return x.mean(dim=0)", "torch.randn($C, $B, $L)", ""),
        _ROWS3,
    ),
    Case(
        "reduce_multi_dims",
        _model("", "", "x", "return torch.mean(x, dim=(1, 2))", "torch.randn($B, $C, $L)", ""),
        _ROWS3,
    ),
    Case(
        "argmax_middle",
        _model("", "", "x", "return torch.argmax(x, dim=1)", "torch.randn($B, $C, $L)", ""),
        _ROWS3,
    ),
    Case(
        "argmin_last",
        _model("", "", "x", "return x.argmin(dim=-1, keepdim=True)", "torch.randn($B, $N)", ""),
        _ROWS,
    ),
    Case(
        "max_dim_values",
        _model("", "", "x", "v = torch.max(x, dim=2)[0]\nreturn torch.relu(v - 0.5)", "torch.randn($B, $C, $L)", ""),
        _ROWS3,
    ),
    Case(
        "logsumexp_then_ew",
        _model("", "", "x", "return F.silu(torch.logsumexp(x, dim=1))", "torch.randn($B, $N) * 5", ""),
        _ROWS,
    ),
    Case(
        "full_sum",
        _model("", "", "x", "return torch.sum(x * x)", "torch.randn($B, $N)", ""),
        _ROWS,
    ),
    Case(
        "linear_relu",
        _model(
            ", k, n",
            "self.fc = nn.Linear(k, n)\nself.act = nn.ReLU()",
            "x",
            "return self.act(self.fc(x))",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "matvec_column_and_linear_to_one_output",
        _model(
            ", k",
            "self.head = nn.Linear(k, 1)",
            "a, v",
            "return torch.matmul(a, v) * 0.5 + self.head(a)",
            "torch.rand($M, $K), torch.rand($K, 1)",
            "$K",
        ),
        ({"M": 33, "K": 300}, {"M": 5, "K": 7000}),
    ),
    Case(
        "linear_functional_no_bias",
        _model(
            ", k, n",
            "self.weight = nn.Parameter(torch.randn(n, k) * 0.1)",
            "x",
            "return F.gelu(F.linear(x, self.weight)) * 2.0",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "matmul_scale_residual",
        _model(
            "",
            "",
            "a, b, r",
            "return torch.matmul(a, b) * 0.5 + r",
            "torch.randn($M, $K), torch.randn($K, $N), torch.randn($M, $N)",
            "",
        ),
        _MM,
    ),
    Case(
        "matmul_transposed_param",
        _model(
            ", k, n",
            "self.weight = nn.Parameter(torch.randn(n, k))\nself.bias = nn.Parameter(torch.randn(n))",
            "x",
            "return torch.tanh(x @ self.weight.t() + self.bias)",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "matmul_transposed_input",
        _model("", "", "a, b", "return torch.matmul(a.T, b)", "torch.randn($K, $M), torch.randn($K, $N)", ""),
        _MM,
    ),
    Case(
        "diag_products",
        _model(
            "",
            "",
            "a, b, c",
            "return torch.relu(torch.diag(a) @ b) + torch.matmul(b, c.diag()) * 0.5",
            "torch.randn($M), torch.randn($M, $N), torch.randn($N)",
            "",
        ),
        _MM,
    ),
    Case(
        "triangular_products",
        _model(
            "",
            "",
            "a, b",
            "u = torch.triu(torch.matmul(a, b))\nl = torch.tril(a @ b, diagonal=-1)\n"
            "return u + l * 0.5 + torch.softmax(torch.tril(a, 1) * 2.0, dim=-1).triu(-2)",
            "torch.randn($M, $M), torch.randn($M, $M)",
            "",
        ),
        ({"M": 33}, {"M": 16}),
    ),
    Case(
        "batched_triangles",
        _model(
            "",
            "",
            "x, y",
            "return torch.bmm(x, y).tril() - (x + 1.0).triu(2) + x.sum(dim=0).triu(1)",
            "torch.randn(3, $M, $M), torch.randn(3, $M, $M)",
            "",
        ),
        ({"M": 9}, {"M": 20}),
    ),
    Case(
        "cosine_similarity_loss",
        _model(
            "",
            "self.cos = nn.CosineSimilarity(dim=-1, eps=1e-6)",
            "x, y",
            "c = F.cosine_similarity(x, y, dim=1)\nreturn torch.mean(1 - c) + self.cos(x * 0.5, y).sum()",
            "torch.randn($B, $N), torch.randn($B, $N)",
            "",
        ),
        _ROWS,
    ),
    Case(
        "products_over_rows",
        _model(
            "",
            "",
            "x",
            "y = 1.0 + 0.1 * x\nreturn torch.prod(y, dim=1) + y.prod(dim=-1, keepdim=True).sum(dim=1) * 0.5",
            "torch.randn($B, $C, $L)",
            "",
        ),
        _ROWS3,
    ),
    Case(
        "bmm_scale_softmax",
        _model(
            "",
            "",
            "q, k",
            "s = torch.bmm(q, k.transpose(1, 2)) / 8.0\nreturn torch.softmax(s, dim=-1)",
            "torch.randn(3, $M, $K), torch.randn(3, $N, $K)",
            "",
        ),
        _MM,
    ),
    Case(
        "linear_3d_input",
        _model(
            ", k, n",
            "self.proj = nn.Linear(k, n)",
            "x",
            "return F.hardswish(self.proj(x))",
            "torch.randn(2, $M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "gemm_groupnorm_swish",
        _model(
            ", k, n, g",
            "self.gemm = nn.Linear(k, n)\nself.gn = nn.GroupNorm(g, n)\nself.mw = nn.Parameter(torch.randn(n))",
            "x",
            "x = self.gemm(x)\nx = self.gn(x)\nx = x * torch.sigmoid(x)\nx = x * self.mw\nreturn x * torch.sigmoid(x)",
            "torch.randn($M, $K)",
            "$K, $N, 4",
        ),
        ({"M": 9, "K": 30, "N": 48}, {"M": 16, "K": 16, "N": 32}),
    ),
    Case(
        "gemm_sigmoid_sum_logsumexp",
        _model(
            ", k, n",
            "self.linear1 = nn.Linear(k, n)",
            "x",
            "x = torch.sigmoid(self.linear1(x))\nx = torch.sum(x, dim=1)\nreturn torch.logsumexp(x, dim=0)",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "mlp_two_linears",
        _model(
            ", k, n",
            "self.net = nn.Sequential(nn.Linear(k, n), nn.ReLU(), nn.Dropout(0.0), nn.Linear(n, 10))",
            "x",
            "return self.net(x)",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "gemm_mean_softmax",
        _model(
            ", k, n",
            "self.fc = nn.Linear(k, n)",
            "x",
            "x = self.fc(x)\nm = x.mean(dim=1, keepdim=True)\nreturn torch.softmax(x - m, dim=1) + m",
            "torch.randn($M, $K)",
            "$K, $N",
        ),
        _MM,
    ),
    Case(
        "broadcasts_in_the_middle",
        _model(
            "",
            "",
            "x, y, z",
            "a = x * y + z\nreturn torch.relu(a - a.sum(dim=1, keepdim=True) * 0.1) * y",
            "torch.randn($B, 5, $N), torch.randn($B, 1, $N), torch.randn(1, 5, 1)",
            "",
        ),
        ({"B": 3, "N": 7}, {"B": 2, "N": 16}),
    ),
    Case(
        "transposed_operands_elementwise_and_in_a_row",
        _model(
            "",
            "",
            "x, y, b",
            "t = torch.tanh(x)\na = t.transpose(1, 2) * y + b\n"
            "s = torch.relu(y).transpose(-1, -2).sum(dim=1, keepdim=True)\n"
            "return torch.softmax(a, dim=-1) + s.transpose(1, 2)",
            "torch.randn($B, 5, $N), torch.randn($B, $N, 5), torch.randn($N, 1)",
            "",
        ),
        ({"B": 2, "N": 7}, {"B": 3, "N": 1}),
    ),
)
"""Every covered problem the tests render and check."""

UNSUPPORTED: dict[str, str] = {
    "conv_reflect_padding": _model(
        "",
        "self.conv = nn.Conv2d(3, 4, 3, padding='same', padding_mode='reflect')",
        "x",
        "return torch.relu(self.conv(x))",
        "torch.randn(2, 3, 8, 8)",
        "",
    ),
    "dropout_training": _model("", "self.d = nn.Dropout(0.5)", "x", "return self.d(x) * 2", "torch.randn(4, 8)", ""),
    "data_dependent_branch": _model(
        "", "", "x", "if x.sum() > 0:\n    return x * 2\nreturn x", "torch.randn(4, 8)", ""
    ),
    "cumsum_with_dtype": _model(
        "", "", "x", "return torch.cumsum(x, dim=1, dtype=torch.float64).float()", "torch.randn(4, 8)", ""
    ),
    "integer_input": _model("", "", "x", "return x * 2", "torch.randint(0, 5, (4, 8))", ""),
    "returns_input": _model("", "", "x", "return x.view(-1)", "torch.randn(4, 8)", ""),
    "outputs_sharing_memory": _model("", "", "x", "y = x * 2\nreturn y, y.view(-1)", "torch.randn(4, 8)", ""),
    "pow_tensor_exponent": _model("", "", "x", "return torch.pow(torch.abs(x), x)", "torch.randn(4, 8)", ""),
    "non_adjacent_reduce": _model("", "", "x", "return x.sum(dim=(0, 2))", "torch.randn(4, 8, 3)", ""),
    "maxpool_return_indices": _model(
        "", "", "x", "return F.max_pool1d(x, 2, return_indices=True)[0]", "torch.randn(4, 8, 6)", ""
    ),
    "no_model": "import torch\n\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n",
}
"""References the template expert must decline, by what makes them unsupported."""
UNSUPPORTED = {name: (HEAD + src if src.startswith("class") else src) for name, src in UNSUPPORTED.items()}
