"""Ops that ordinary models call beside the families' main ones: ``torch.addmm`` /
``torch.baddbmm`` (``families/addmm.py``), ``nn.PReLU`` / ``F.prelu`` (``families/prelu.py``),
``nn.LocalResponseNorm`` / ``F.local_response_norm`` (``families/lrn.py``), ``torch.gather`` /
``torch.topk`` (``families/gather.py``), weight-normalised layers (``families/weight_norm.py``),
``var``/``std``/``cdist``/``pairwise_distance`` (``families/moments.py``), CELU, threshold and softmin
(``families/activations.py``), int64 inputs compared and converted and ``F.one_hot``
(``families/one_hot.py``), ``F.affine_grid`` and ``F.grid_sample`` (``families/grid_sample.py``),
binary cross entropy of logits and of probabilities (``families/loss.py``), RReLU outside
training (``families/activations.py``), ``F.unfold`` (``families/unfold.py``) and
``torch.full`` / ``new_full`` / ``new_zeros`` / ``new_ones`` (``families/fill.py``), int64
arithmetic on positions from ``torch.arange`` (``Lowerer.int_bound``), selections of int64 inputs
(``families/slicing.py``), ``sin``/``cos``/``tan`` and
their inverses (``families/trig.py``), ``torch.meshgrid``, ``torch.linspace`` and int64 ``stack``
(``families/split.py``, ``families/concat.py``), against PyTorch on the CPU
under the Triton interpreter, in the variants of ``template_interp``."""

from __future__ import annotations

import pytest

from actors.experts.template import Plan, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = [
    pytest.mark.timeout(300),
    # the TCN case builds its layers with the deprecated hook-based weight_norm, as old code does
    pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning"),
]

CASES: tuple[Case, ...] = (
    Case(
        "addmm_and_baddbmm_with_beta_and_alpha",
        _model(
            "",
            "",
            "x, w, b, y",
            "out = torch.addmm(b, x, w) + x.addmm(x, w, beta=0.5, alpha=2.0)\n"
            "batched = torch.baddbmm(y, y, y.transpose(1, 2), alpha=0.1) + torch.baddbmm(y, y, y, beta=0)\n"
            "return out.sum() + batched",
            "torch.randn(5, $K), torch.randn($K, $K), torch.randn($K), torch.randn(3, 4, 4)",
            "",
        ),
        ({"K": 6},),
    ),
    Case(
        "prelu_per_channel_after_a_conv_and_a_shared_slope",
        _model(
            "",
            "self.conv = nn.Conv1d(3, 5, 3, padding=1)\nself.act = nn.PReLU(5, init=0.1)\nself.one = nn.PReLU()",
            "x",
            "return self.one(self.act(self.conv(x))) + F.prelu(x.sum(1, keepdim=True), self.one.weight)",
            "torch.randn(2, 3, $L)",
            "",
        ),
        ({"L": 9},),
    ),
    Case(
        "local_response_norm_after_a_conv_odd_and_even_windows",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 7, 3, padding=1)\n"
            "self.lrn = nn.LocalResponseNorm(5, alpha=1e-2, beta=0.75, k=2.0)",
            "x, y",
            "z = self.lrn(F.relu(self.conv(x)))\n"
            "w = F.local_response_norm(y, 4, alpha=0.5, beta=2.0, k=1.0) + F.local_response_norm(y, 1)\n"
            "return z, w",
            "torch.randn(2, 3, $H, 5), torch.randn(3, 6, $H)",
            "",
        ),
        ({"H": 6},),
    ),
    Case(
        "gather_along_each_dim_and_topk_largest_and_smallest",
        _model(
            "",
            "",
            "x, i, j, k",
            "a = torch.gather(x, 1, i)\n"
            "a0 = x.gather(0, j)\n"
            "b = torch.gather(x, -1, k)\n"
            "top, idx = x.topk(3)\n"
            "low, where = torch.topk(x * 2 + 1, 2, dim=-1, largest=False)\n"
            "one = x.topk(1, dim=2)\n"
            "return a, a0, b, top, idx, low, where, one.values * 2, one.indices",
            "torch.randn(3, $N, 5), torch.randint(0, $N, (3, 4, 5)), torch.randint(0, 3, (2, 4, 5)), "
            "torch.randint(0, 5, (3, $N, 2))",
            "",
        ),
        ({"N": 6},),
    ),
    Case(
        "weight_norm_parametrized_convolution_and_linear",
        _model(
            "",
            "wn = torch.nn.utils.parametrizations.weight_norm\n"
            "self.conv = wn(nn.Conv1d(3, 6, 3, padding=1))\n"
            "self.fc = wn(nn.Linear($L, 4), dim=None)\n"
            "self.last = wn(nn.Linear(4, 5, bias=False), dim=1)",
            "x",
            "return self.last(self.fc(torch.relu(self.conv(x))))",
            "torch.randn(2, 3, $L)",
            "",
        ),
        ({"L": 7},),
    ),
    Case(
        "weight_norm_hooked_dilated_convolutions_of_a_tcn",
        _model(
            "",
            "wn = torch.nn.utils.weight_norm  # deprecated: a forward pre-hook sets conv.weight\n"
            "self.c1 = wn(nn.Conv1d(3, 5, 3, padding=2, dilation=2))\n"
            "self.c2 = wn(nn.Conv1d(5, 5, 3, padding=4, dilation=4), dim=None)",
            "x",
            "return torch.relu(self.c2(torch.relu(self.c1(x)))) + self.c1(x)",
            "torch.randn(2, 3, $L)",
            "",
        ),
        ({"L": 11},),
    ),
    Case(
        "variance_and_standard_deviation_with_corrections",
        _model(
            "",
            "",
            "x",
            "a = x.var(dim=-1, unbiased=False) + torch.std(x, dim=-1)\n"
            "b = torch.var(x, dim=1, keepdim=True, correction=0) * x.std(1, keepdim=True)\n"
            "return a, b, x.var(), torch.std(x, (1, 2))",
            "torch.randn(3, $C, 7) * 3 + 1",
            "",
        ),
        ({"C": 5},),
    ),
    Case(
        "celu_threshold_softmin_activations",
        _model(
            "",
            "self.act = nn.Sequential(nn.CELU(0.5), nn.Threshold(0.1, -2.0))\nself.soft = nn.Softmin(dim=1)",
            "x",
            "return self.act(x) + F.celu(x, 2.0) + F.threshold(x, -0.2, 3.0) + self.soft(x) + F.softmin(x, dim=-1)",
            "torch.randn(4, $N)",
            "",
        ),
        ({"N": 9},),
    ),
    Case(
        "cdist_of_points_and_learned_prototypes",
        _model(
            "",
            "self.protos = nn.Parameter(torch.randn(6, 5))",
            "x, y",
            "a = torch.cdist(x, self.protos)\n"
            "b = torch.cdist(y, y, p=1) + torch.cdist(y, y * 2, p=float('inf'))\n"
            "return a, b",
            "torch.randn($P, 5), torch.randn(2, 4, 3)",
            "",
        ),
        ({"P": 7},),
    ),
    Case(
        "bool_masks_converted_to_floats",
        _model(
            "",
            "",
            "x, y",
            "gate = (x > 0).float() * x + (y < 0.5).to(x.dtype) + (x > y).type_as(y) * 2\n"
            "hits = (x.amax(-1) == y.amax(-1)).float().mean()\n"
            "return gate + hits, (x.abs() > 1).half().float().sum(-1)",
            "torch.randn(4, $N), torch.randn(4, $N)",
            "",
        ),
        ({"N": 9},),
    ),
    Case(
        "powers_fractional_whole_and_negative",
        _model(
            "",
            "",
            "x",
            "p = x.abs() + 0.1\n"
            "a = p ** 1.5 + p.pow(0.75) + torch.pow(p, -2.5) + p ** 0\n"
            "b = x ** 10 * 1e-3 + x ** 3 + x.pow(-3) * 1e-3 + torch.pow(x, 7)\n"
            "return a, b, p.pow(0.5) + p ** 2.25",
            "torch.randn(4, $N) * 1.5",
            "",
        ),
        ({"N": 9},),
    ),
    Case(
        "mixture_of_experts_routing_topk_then_gather",
        _model(
            "",
            "self.gate = nn.Linear(8, 4)\nself.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])",
            "x",
            "w = F.softmax(self.gate(x), dim=-1)\n"
            "top, idx = w.topk(2, dim=-1)\n"
            "out = torch.stack([ex(x) for ex in self.experts], dim=-2)\n"
            "picked = torch.gather(out, -2, idx[..., None].expand(*idx.shape, x.shape[-1]))\n"
            "return (picked * top[..., None]).sum(-2)",
            "torch.randn(2, $T, 8)",
            "",
        ),
        ({"T": 5},),
    ),
    Case(
        "int64_inputs_compared_converted_and_made_one_hot",
        _model(
            "",
            "self.emb = nn.Embedding(20, 6)\nself.fc = nn.Linear(6, 5)",
            "ids, target",
            "pad = (ids != 0).unsqueeze(-1).float()\n"
            "h = self.emb(ids) * pad\n"
            "logits = self.fc(h.sum(1) / pad.sum(1).clamp(min=1.0))\n"
            "hit = (logits.argmax(-1) == target).float() + logits.argmax(-1) / 2\n"
            "oh = F.one_hot(target, 5)\n"
            "brier = (logits.softmax(-1) - oh).pow(2).sum(-1)\n"
            "scaled = ids.float() / 20.0 + ids / 7 + torch.arange(ids.shape[1], device=ids.device) * 0.5\n"
            "ranks = target.unsqueeze(-1) >= torch.arange(5, device=ids.device)\n"
            "return logits + hit[:, None], brier, oh, scaled, ranks",
            "torch.randint(0, 20, ($B, 7)), torch.randint(0, 5, ($B,))",
            "",
        ),
        ({"B": 3},),
    ),
    Case(
        "spatial_transformer_affine_grid_and_grid_sample_in_each_mode",
        _model(
            "",
            "self.fc = nn.Linear(12, 6)",
            "x, z",
            "theta = self.fc(z).view(-1, 2, 3)\n"
            "grid = F.affine_grid(theta, x.size(), align_corners=False)\n"
            "a = F.grid_sample(x, grid * 1.5, align_corners=False)\n"
            "b = F.grid_sample(x, grid, mode='nearest', align_corners=False)\n"
            "g = F.affine_grid(theta, [x.shape[0], 1, 5, $W], align_corners=True)\n"
            "c = F.grid_sample(x.relu(), g * 1.2, padding_mode='border', align_corners=True) * 2\n"
            "d = F.grid_sample(x, g, mode='nearest', padding_mode='border', align_corners=False)\n"
            "return a, b, c, d",
            "torch.randn(2, 3, 6, $W), torch.randn(2, 12)",
            "",
        ),
        ({"W": 7},),
    ),
    Case(
        "binary_cross_entropy_of_logits_and_of_probabilities_in_each_reduction",
        _model(
            "",
            "self.fc = nn.Linear(6, 6)\n"
            "self.weighted = nn.BCEWithLogitsLoss(weight=torch.rand(6) + 0.5, pos_weight=torch.rand(6) * 3)\n"
            "self.plain = nn.BCELoss(reduction='sum')",
            "x, t",
            "z = self.fc(x)\n"
            "a = self.weighted(z, t)\n"
            "b = F.binary_cross_entropy_with_logits(z * 4, t, reduction='none')\n"
            "two = torch.full((6,), 2.0, device=x.device)\n"
            "c = F.binary_cross_entropy_with_logits(z, t, reduction='sum', pos_weight=two)\n"
            "p = z.relu().clamp(max=1.0)  # exact 0 and 1: the logs clamped at -100\n"
            "d = self.plain(p, t) + F.binary_cross_entropy(torch.sigmoid(z), t, weight=x.abs())\n"
            "e = F.binary_cross_entropy(p, t, reduction='none')\n"
            "return a, b, c, d, e",
            "torch.randn($B, 6), (torch.rand($B, 6) > 0.5).float()",
            "",
        ),
        ({"B": 5},),
    ),
    Case(
        "rrelu_outside_training_as_a_module_and_a_function_and_new_tensors_of_a_value",
        _model(
            "",
            "self.conv = nn.Conv1d(3, 4, 3)\nself.act = nn.RReLU(0.1, 0.3)\nself.eval()",
            "x",
            "y = self.act(self.conv(x)) + F.rrelu(x[:, :1, 2:], 0.2, 0.5) + torch.rrelu(x[:, 1:2, 2:])\n"
            "return y + x.new_zeros(2, 1, y.shape[-1]) + x.new_full((1, y.shape[-1]), 0.5) + x.new_ones((4, 1))",
            "torch.randn(2, 3, $L)",
            "",
        ),
        ({"L": 9},),
    ),
    Case(
        "unfold_windows_as_columns_padded_dilated_strided_and_embedded",
        _model(
            "",
            "self.proj = nn.Linear(3 * 4 * 4, 8)\n"
            "self.cols = nn.Unfold((2, 3), dilation=(2, 1), padding=1, stride=(1, 2))",
            "x",
            "patches = self.proj(F.unfold(x, 4, stride=4).transpose(1, 2))\n"
            "windows = self.cols(x.relu()) * 2\n"
            "single = F.unfold(x[0], kernel_size=3, padding=(0, 1))\n"
            "return patches, windows, single",
            "torch.randn(2, 3, $H, 9)",
            "",
        ),
        ({"H": 8},),
    ),
    Case(
        "positions_from_arange_in_int64_arithmetic_an_alibi_bias_and_an_int64_output",
        _model(
            "",
            "self.register_buffer('slopes', torch.tensor([0.5, 0.25]).view(1, 2, 1, 1))\n"
            "self.pos = nn.Embedding(16, 4)",
            "q, k",
            "s = q.shape[-2]\n"
            "pos = torch.arange(s, device=q.device)\n"
            "rel = pos[None, :] - pos[:, None]\n"
            "scores = q @ k.transpose(-2, -1) + self.slopes * rel - (rel.abs() * 3).float() / 8\n"
            "scores = scores.masked_fill(rel > 0, float('-inf'))\n"
            "offsets = (pos + 1) * 2 - (-pos)\n"
            "learned = self.pos(pos + 2) + self.pos(2 * pos - (-1))  # OPT's offset positions\n"
            "return scores.softmax(-1), offsets, rel.float() * 0.5, learned",
            "torch.randn(2, 2, $S, 4), torch.randn(2, 2, $S, 4)",
            "",
        ),
        ({"S": 7},),
    ),
    Case(
        "int64_inputs_selected_a_language_model_s_shifted_targets_and_categorical_columns",
        _model(
            "",
            "self.emb = nn.Embedding(11, 6)\nself.head = nn.Linear(6, 11)\n"
            "self.cols = nn.ModuleList([nn.Embedding(4, 3), nn.Embedding(5, 3)])",
            "ids, cats",
            "logits = self.head(self.emb(ids[:, :-1]))\n"
            "loss = F.cross_entropy(logits.reshape(-1, 11), ids[:, 1:].reshape(-1))\n"
            "tab = torch.cat([emb(cats[:, i]) for i, emb in enumerate(self.cols)], dim=1)\n"
            "return loss, tab * 2, ids[:, ::2], (cats[..., 1] == 3).float()",
            "torch.randint(0, 11, ($B, 6)), torch.randint(0, 4, ($B, 2))",
            "",
        ),
        ({"B": 3},),
    ),
    Case(
        "pairwise_distance_in_each_norm_a_module_and_broadcast_rows",
        _model(
            "",
            "self.enc = nn.Linear(5, 4)\nself.dist = nn.PairwiseDistance(p=1.0, keepdim=True)",
            "a, b",
            "ea, eb = self.enc(a), self.enc(b)\n"
            "d2 = F.pairwise_distance(ea, eb)\n"
            "d3 = F.pairwise_distance(ea, eb, p=3.0, eps=0.0)\n"
            "dinf = torch.pairwise_distance(ea, eb[0], float('inf'))\n"
            "return d2, d3 + dinf, self.dist(ea, eb), F.pairwise_distance(a[0], b[1])",
            "torch.randn($B, 5), torch.randn($B, 5)",
            "",
        ),
        ({"B": 6},),
    ),
    Case(
        "sine_cosine_and_tangent_a_timestep_embedding_and_a_siren_layer",
        _model(
            "",
            "self.register_buffer('freqs', torch.exp(-math.log(10000.0) * torch.arange(8) / 8))\n"
            "self.fc = nn.Linear(5, 5)",
            "t, x",
            "emb = t[:, None] * self.freqs[None, :]\n"
            "steps = torch.cat([emb.sin(), torch.cos(emb)], dim=-1)\n"
            "siren = torch.sin(30.0 * self.fc(x))\n"
            "return steps, siren, torch.tan(x * 0.7) + x.cos()",
            "torch.rand($B) * 1000.0, torch.randn($B, 5)",
            "",
        ),
        ({"B": 9},),
    ),
    Case(
        "transposes_returned_and_class_indices_into_a_transpose_a_clip_loss",
        _model(
            "",
            "self.norm = nn.LayerNorm(5)\nself.scale = nn.Parameter(torch.tensor(2.0))",
            "a, b, x",
            "logits = self.scale.exp() * F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).t()\n"
            "labels = torch.arange(a.shape[0], device=a.device)\n"
            "loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2\n"
            "return loss, self.norm((x * 2).transpose(1, 2)).transpose(1, 2), (x[0] + 1).t()",
            "torch.randn($B, 6), torch.randn($B, 6), torch.randn(2, 5, 4)",
            "",
        ),
        ({"B": 5},),
    ),
    Case(
        "inverse_trigonometry_an_arcface_margin_and_angles",
        _model(
            "",
            "self.w = nn.Parameter(torch.randn(7, 6))",
            "x, labels",
            "cos = F.linear(F.normalize(x), F.normalize(self.w)).clamp(-1 + 1e-7, 1 - 1e-7)\n"
            "onehot = F.one_hot(labels, 7).float()\n"
            "logits = 30.0 * (onehot * torch.cos(torch.acos(cos) + 0.5) + (1 - onehot) * cos)\n"
            "angles = torch.atan(x * 3) + torch.arcsin(torch.tanh(x)) + x.sigmoid().arccos()\n"
            "return F.cross_entropy(logits, labels), angles",
            "torch.randn($B, 6), torch.randint(0, 7, ($B,))",
            "",
        ),
        ({"B": 6},),
    ),
    Case(
        "meshgrid_cell_grids_in_each_indexing_stacked_as_int64_a_detection_head",
        _model(
            "",
            "self.conv = nn.Conv2d(4, 6, 1)",
            "x",
            "b, _, ny, nx = x.shape\n"
            "rows, cols = torch.arange(ny, device=x.device), torch.arange(nx, device=x.device)\n"
            "p = self.conv(x).view(b, 2, 3, ny, nx).permute(0, 1, 3, 4, 2)\n"
            "yv, xv = torch.meshgrid(rows, cols, indexing='ij')\n"
            "grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()\n"
            "xy = (p[..., :2].sigmoid() + grid) * 8.0\n"
            "gx, gy = torch.meshgrid(x[0, 0, 0, :] * 0.25, x[0, 0, :, 0], indexing='xy')\n"
            "depth = torch.linspace(0.3, 7.1, 11, device=x.device)\n"
            "ray = depth[:, None] * torch.linspace(-1, 1, nx, device=x.device)\n"
            "cells = torch.stack(torch.meshgrid(rows[:3], cols[:2], indexing='ij'))\n"
            "one = torch.linspace(2, 2, 1, device=x.device)\n"
            "return torch.cat((xy, p[..., 2:].exp()), -1), gx * gy, cells, ray + one",
            "torch.randn(2, 4, $H, 6)",
            "",
        ),
        ({"H": 5},),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "mm_block_m": 16, "mm_block_n": 16, "mm_block_k": 16, "conv_block_m": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CASES, _STRESS, tmp_path_factory.mktemp("interp-model-ops"))


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_model_ops_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_an_addmm_with_beta_zero_does_not_read_its_input() -> None:
    plan = analyse(
        HEAD
        + _model(
            "",
            "",
            "x, w, b",
            "return torch.addmm(b, x, w, beta=0)",
            "torch.randn(4, 3), torch.randn(3, 2), torch.randn(2)",
            "",
        )
    )
    assert isinstance(plan, Plan), plan
    assert plan.template == "mm"  # the product alone: no epilogue adds the input
    assert not [n for n in plan.nodes if n.op == "add"]


def test_local_response_norm_of_two_dims_is_declined_with_pytorch_s_reason() -> None:
    plan = analyse(
        HEAD
        + _model("", "", "x", "return F.local_response_norm(x.unsqueeze(1), 2).squeeze(1) + x", "torch.randn(4, 6)", "")
    )
    assert isinstance(plan, Plan), plan  # three dims: covered
    declined = analyse(HEAD + _model("", "", "x", "return F.local_response_norm(x, 2)", "torch.randn(4, 6)", ""))
    assert not isinstance(declined, Plan)
    assert "Expected 3D or higher dimensionality" in str(declined)  # PyTorch's own refusal, named


def test_an_int64_result_of_int64_inputs_is_declined_naming_the_use() -> None:
    declined = analyse(HEAD + _model("", "", "ids", "return (ids + 1).float()", "torch.randint(0, 9, (4, 3))", ""))
    assert not isinstance(declined, Plan)
    assert "input ids is torch.int64 and function _operator.add reads it" in str(declined)
    inferred = analyse(HEAD + _model("", "", "t", "return F.one_hot(t).float()", "torch.randint(0, 9, (4,))", ""))
    inputs = "torch.randn(4).half(), torch.randint(0, 9, (4,))"
    half = analyse(HEAD + _model("", "", "x, t", "return x * t", inputs, ""))
    assert not isinstance(half, Plan)  # PyTorch's result is float16: not a float32 product of converted ints
    assert "int64 tensor and a float16/bfloat16 tensor" in str(half)
    assert not isinstance(inferred, Plan)  # the class count read from the data: the trace stops at it
    assert "item() cannot be called on meta tensors" in str(inferred)


def test_rrelu_in_training_mode_is_declined_naming_its_random_slopes() -> None:
    source = _model("", "self.act = nn.RReLU()", "x", "return self.act(x)", "torch.randn(4, 6)", "")
    declined = analyse(HEAD + source)
    assert not isinstance(declined, Plan)
    assert "rrelu in training mode draws a random slope" in str(declined)
    assert isinstance(analyse(HEAD + source.replace("self.act = nn.RReLU()", "self.act = nn.RReLU().eval()")), Plan)


def test_int64_arithmetic_past_float32_s_exact_integers_is_declined() -> None:
    body = "i = torch.arange({n}, device=x.device)\nreturn x + (i * i).float()"
    small = analyse(HEAD + _model("", "", "x", body.format(n=4000), "torch.randn(4000)", ""))
    assert isinstance(small, Plan), small  # 3999 ** 2 < 2 ** 24
    large = analyse(HEAD + _model("", "", "x", body.format(n=5000), "torch.randn(5000)", ""))
    assert not isinstance(large, Plan)  # 4999 ** 2 > 2 ** 24: not exact in float32
    assert "mul of int64 tensors and ints (an int64 result) is not covered" in str(large)
