"""The attention template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_attn_cases`` at each of its sizes, in the variants of
``template_interp``, and the declines of what attention does not cover.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, Unsupported, analyse, default_params, render
from actors.experts.template.interp_check import Verdict, check_in_subprocess
from actors.experts.template.ir import NodeKind
from tests.experts.template_attn_cases import ATTN_CASES
from tests.experts.template_cases import HEAD, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

_STRESS = {"attn_block_m": 16, "attn_block_n": 16, "attn_block_k": 16, "attn_block_d": 16, "attn_warps": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(ATTN_CASES, _STRESS, tmp_path_factory.mktemp("interp-attn"))


@pytest.mark.parametrize("case", [c.name for c in ATTN_CASES])
def test_attention_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "return F.scaled_dot_product_attention(q.half(), k.half(), v.half(), attn_mask=m > 0.5)",
            "mask of other than float32",
        ),
        ("return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)", "dropout"),
    ],
)
def test_uncovered_attention_is_declined_with_its_reason(body: str, reason: str) -> None:
    inputs = "torch.rand(2, 4, 8), torch.rand(2, 4, 8), torch.rand(2, 4, 8), torch.rand(4, 4)"
    result = analyse(HEAD + _model("", "", "q, k, v, m", body, inputs, ""))
    assert isinstance(result, Unsupported)
    assert reason in result.detail


@pytest.mark.parametrize(
    ("layer", "body", "reason"),
    [
        ("nn.TransformerEncoderLayer(8, 2, 16)", "return self.m(x)", "random"),
        ("nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=F.silu)", "return self.m(x)", "silu"),
        (
            "nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2)",
            "return self.m(x.transpose(0, 1), src_key_padding_mask=m[:2] > 0.5)",
            "nested-tensor path",
        ),
    ],
)
def test_uncovered_transformer_encoders_are_declined_with_their_reason(layer: str, body: str, reason: str) -> None:
    source = HEAD + _model("", f"self.m = {layer}", "x, m", body, "torch.rand(5, 2, 8), torch.rand(5, 5)", "")
    result = analyse(source)
    assert isinstance(result, Unsupported)
    assert reason in result.detail


_HALF_BODIES = (
    "return F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "return torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v",
)


def _half_source(dtype: str, body: str) -> str:
    qkv = ", ".join(f"torch.rand(2, 3, {n}, {d}, dtype=torch.{dtype})" for n, d in ((37, 20), (37, 20), (37, 12)))
    return HEAD + _model("", "", "q, k, v", body, qkv, "")


def test_half_attention_matches_pytorch_under_the_interpreter(tmp_path: Path) -> None:
    jobs: list[dict[str, object]] = []
    for dtype in ("float16", "bfloat16"):
        for body in _HALF_BODIES:
            plan = analyse(_half_source(dtype, body))
            assert isinstance(plan, Plan), plan
            assert plan.template == "attn"
            assert plan.nodes[plan.output].dtype == dtype
            source = render(plan, default_params(plan))
            # half operands into tl.dot as they are (widened only where the interpreter runs), the
            # probabilities rounded to their type for the second product, as PyTorch's flash kernels do
            assert "WIDE=_KF_INTERPRETED" in source
            assert "pr = pr.to(v.dtype)" in source
            jobs.append(
                {"reference": _half_source(dtype, body), "candidate": source, "seeds": [1], "atol": 1e-2, "rtol": 1e-2}
            )
    verdicts = check_in_subprocess(jobs, tmp_path, timeout=280)
    assert all(v.ok for v in verdicts), [v.detail for v in verdicts]
    for v in verdicts:
        assert v.err_vs_fp64 is not None
        assert v.ref_err_vs_fp64 is not None
        assert v.err_vs_fp64 <= 4 * v.ref_err_vs_fp64


def test_wide_float32_value_heads_are_two_products_and_a_softmax_and_causal_or_half_ones_stay_flash() -> None:
    def plan(body: str, d: int, e: int, dtype: str = "") -> Plan:
        cast = f".to(torch.{dtype})" if dtype else ""
        inputs = f"torch.rand(2, 3, 21, {d}){cast}, torch.rand(2, 3, 19, {d}){cast}, torch.rand(2, 3, 19, {e}){cast}"
        result = analyse(HEAD + _model("", "", "q, k, v", body, inputs, ""))
        assert isinstance(result, Plan), result
        return result

    sdpa = "return F.scaled_dot_product_attention(q, k, v)"
    assert plan(sdpa, 256, 1024).template == "mm+row+mm"
    assert plan(sdpa, 64, 129).template == "mm+row+mm"
    assert plan(sdpa, 256, 128).template == "attn"  # one tile of values: the scores are computed once
    causal = "return F.scaled_dot_product_attention(q, k, v, is_causal=True)"
    assert plan(causal, 256, 1024).template == "attn"
    assert plan(sdpa, 256, 1024, "bfloat16").template == "attn"


def test_half_products_outside_attention_are_products() -> None:
    result = analyse(_half_source("float16", "return q @ k.transpose(-2, -1)"))
    assert isinstance(result, Plan), result
    assert result.template == "mm"
    assert result.nodes[result.output].dtype == "float16"


def test_half_attention_followed_by_elementwise_ops_matches_pytorch(tmp_path: Path) -> None:
    source = _half_source("bfloat16", "return F.scaled_dot_product_attention(q, k, v) * 2.0 + 1.0")
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    assert plan.nodes[plan.output].dtype == "bfloat16"
    job = {
        "reference": source,
        "candidate": render(plan, default_params(plan)),
        "seeds": [2],
        "atol": 2e-2,
        "rtol": 2e-2,
    }
    verdicts = check_in_subprocess([job], tmp_path, timeout=280)
    assert verdicts[0].ok, verdicts[0].detail


def _masked_attention(mask_buffer: str, between: str) -> str:
    body = (
        "att = (q @ k.transpose(-2, -1)) * 0.5\n"
        "att = att.masked_fill(self.bias[:, :, :8, :8] == 0, float('-inf'))\n"
        f"att = F.softmax(att, dim=-1)\n{between}return att @ v"
    )
    qkv = "torch.rand(2, 3, 8, 4), torch.rand(2, 3, 8, 4), torch.rand(2, 3, 8, 4)"
    return HEAD + _model(", n", f'self.register_buffer("bias", {mask_buffer})', "q, k, v", body, qkv, "8")


def test_explicit_attention_with_another_mask_is_lowered_op_by_op() -> None:
    """Not the flash kernel (its mask is causal only): the scores are materialised, masked by the
    buffer and soft-maxed by the row template."""
    result = analyse(_masked_attention("torch.triu(torch.ones(n, n)).view(1, 1, n, n)", ""))
    assert isinstance(result, Plan), result
    assert all(node.kind is not NodeKind.ATTN for node in result.nodes)
    assert any(node.op == "where" for node in result.nodes)


def test_explicit_attention_with_a_random_dropout_is_declined() -> None:
    result = analyse(_masked_attention("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "att = F.dropout(att, 0.2)\n"))
    assert isinstance(result, Unsupported)
    assert "dropout" in result.detail


@pytest.mark.parametrize(
    ("init", "body", "reason"),
    [
        ("nn.MultiheadAttention(8, 2)", "out, w = self.attn(x, x, x)\nreturn out + w.mean()", "averaged attention"),
        ("nn.MultiheadAttention(8, 2, dropout=0.1)", "return self.attn(x, x, x)[0]", "dropout"),
        ("nn.MultiheadAttention(8, 2, add_bias_kv=True)", "return self.attn(x, x, x)[0]", "add_bias_kv"),
        ("nn.MultiheadAttention(8, 2, kdim=2, vdim=2)", "return self.attn(x, m.view(5, 2, 2), m.view(5, 2, 2))[0]",
         "kdim"),
    ],
)  # fmt: skip
def test_uncovered_multihead_attention_is_declined_with_its_reason(init: str, body: str, reason: str) -> None:
    source = HEAD + _model("", f"self.attn = {init}", "x, m", body, "torch.rand(5, 2, 8), torch.rand(5, 4)", "")
    result = analyse(source)
    assert isinstance(result, Unsupported)
    assert reason in result.detail


def test_a_causal_mask_built_in_forward_is_flash_attentions_own_causal_blocks() -> None:
    # The decoder's target mask (``ones(t, t).triu(1)``, dropped where true) and an SDPA mask
    # (``ones(t, t).tril()``, kept where true) are causal: one causal ATTN node each; the memory
    # attention with its key padding mask stays unfused.
    case = next(c for c in ATTN_CASES if c.name == "transformer_encoder_and_decoder_with_masks")
    decoder = analyse(case.sources()[0])
    assert isinstance(decoder, Plan), decoder
    assert [n.attrs[1] for n in decoder.nodes if n.kind is NodeKind.ATTN] == [1.0]
    body = "t = q.shape[-2]\nkeep = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()\n"
    body += "return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)"
    sdpa = analyse(
        HEAD + _model("", "", "q, k, v", body, "torch.rand(2, 5, 8), torch.rand(2, 5, 8), torch.rand(2, 5, 8)", "")
    )
    assert isinstance(sdpa, Plan), sdpa
    assert [n.attrs[1] for n in sdpa.nodes if n.kind is NodeKind.ATTN] == [1.0]
