"""Attention references for the template expert's tests: ``scaled_dot_product_attention``.

Non-causal and causal, default and explicit scale, head dims and sequence lengths that are not
powers of two nor multiples of the tiles, cross-attention (more keys than queries), a value
width other than the head dim, and an epilogue after the attention.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_QKV = "torch.rand(2, 3, $L, $D), torch.rand(2, 3, $S, $D), torch.rand(2, 3, $S, $E)"

ATTN_CASES: tuple[Case, ...] = (
    Case(
        "sdpa_plain",
        _model("", "", "q, k, v", "return F.scaled_dot_product_attention(q, k, v)", _QKV, ""),
        ({"L": 37, "S": 37, "D": 20, "E": 20}, {"L": 16, "S": 70, "D": 64, "E": 24}),
    ),
    Case(
        "sdpa_causal_scaled_gelu",
        _model(
            "",
            "",
            "q, k, v",
            "return F.gelu(F.scaled_dot_product_attention(q * 2.0, k, v, is_causal=True, scale=0.3))",
            _QKV,
            "",
        ),
        ({"L": 45, "S": 45, "D": 17, "E": 33},),
    ),
)
"""Every attention problem the tests render and check."""
