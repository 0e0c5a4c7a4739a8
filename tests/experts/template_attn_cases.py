"""Attention references for the template expert's tests: ``scaled_dot_product_attention`` and the
explicit ``softmax(Q @ K^T * scale [causal mask]) @ V`` pattern in its common spellings.

Non-causal and causal, default and explicit scale, head dims and sequence lengths that are not
powers of two nor multiples of the tiles, cross-attention (more keys than queries), a value
width other than the head dim, an epilogue after the attention, and value heads wider than one
flash tile (lowered unfused: two products and a row softmax).
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_QKV = "torch.rand(2, 3, $L, $D), torch.rand(2, 3, $S, $D), torch.rand(2, 3, $S, $E)"

ATTN_CASES: tuple[Case, ...] = (
    Case(
        "sdpa_wide_value_head_unfused",  # more than one flash tile of values: two products and a softmax
        _model("", "", "q, k, v", "return F.scaled_dot_product_attention(q, k, v, scale=0.05)", _QKV, ""),
        ({"L": 21, "S": 19, "D": 150, "E": 136},),
    ),
    Case(
        "explicit_softmax_wide_head_unfused",
        _model(
            "",
            "",
            "q, k, v",
            "return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v",
            _QKV,
            "",
        ),
        ({"L": 9, "S": 23, "D": 130, "E": 260},),
    ),
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
    Case(
        "explicit_softmax_qk_scaled_v",
        _model(
            "",
            "",
            "q, k, v",
            "return torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1)), dim=-1) @ v",
            _QKV,
            "",
        ),
        ({"L": 19, "S": 45, "D": 12, "E": 7},),
    ),
    Case(
        "explicit_causal_tril_buffer_dropout0",
        _model(
            ", n",
            'self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))\nself.drop = nn.Dropout(0.0)',
            "q, k, v",
            "T = q.size(2)\natt = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
            "att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))\n"
            "return self.drop(F.softmax(att, dim=-1)) @ v",
            _QKV,
            "$L",
        ),
        ({"L": 29, "S": 29, "D": 20, "E": 9},),
    ),
    Case(
        "relu_attention_causal_tril_buffer",
        _model(
            ", n",
            'self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))',
            "q, k, v",
            "T = q.size(2)\natt = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
            "att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))\n"
            "return F.relu(att) @ v",
            _QKV,
            "$L",
        ),
        ({"L": 29, "S": 29, "D": 20, "E": 9},),
    ),
    Case(
        "explicit_softmax_triu_mask_op_by_op",
        _model(
            ", n",
            'self.register_buffer("bias", torch.triu(torch.ones(n, n)).view(1, 1, n, n))',
            "q, k, v",
            "att = (q @ k.transpose(-2, -1)) * 0.5\n"
            "att = att.masked_fill(self.bias[:, :, :$L, :$L] == 0, float('-inf'))\n"
            "return F.softmax(att, dim=-1) @ v",
            _QKV,
            "$L",
        ),
        ({"L": 21, "S": 21, "D": 6, "E": 11},),
    ),
    Case(
        "multihead_self_attention_then_norm",
        _model(
            ", e, h",
            "self.attn = nn.MultiheadAttention(e, h)\nself.norm = nn.LayerNorm(e)",
            "x",
            "out, _ = self.attn(x, x, x)\nreturn self.norm(out + x)",
            "torch.rand($L, 2, $E)",
            "$E, 3",
        ),
        ({"L": 37, "E": 24},),
    ),
    Case(
        "transformer_encoder_layer_post_norm_relu",
        _model(
            ", e, h, f",
            "self.layer = nn.TransformerEncoderLayer(e, h, dim_feedforward=f, dropout=0.0)",
            "x",
            "return self.layer(x)",
            "torch.rand($L, 2, $E)",
            "$E, 2, $F",
        ),
        ({"L": 9, "E": 16, "F": 24},),
    ),
    Case(
        "transformer_encoder_pre_norm_gelu_batch_first_final_norm",
        _model(
            ", e, h, f",
            "layer = nn.TransformerEncoderLayer(e, h, f, dropout=0.1, activation='gelu', batch_first=True,\n"
            "                                   norm_first=True)\n"
            "self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(e), enable_nested_tensor=False)\n"
            "self.encoder.eval()",
            "x",
            "return self.encoder(x)[:, 0]",
            "torch.rand(2, $L, $E)",
            "$E, 2, $F",
        ),
        ({"L": 7, "E": 12, "F": 20},),
    ),
    Case(
        "multihead_cross_attention_batch_first_no_bias",
        _model(
            ", e, h",
            "self.attn = nn.MultiheadAttention(e, h, bias=False, batch_first=True)",
            "q, kv",
            "return self.attn(q, kv, kv, need_weights=False)[0]",
            "torch.rand(2, $L, $E), torch.rand(2, $S, $E)",
            "$E, 2",
        ),
        ({"L": 13, "S": 21, "E": 10},),
    ),
    Case(
        "explicit_module_softmax_bmm_3d",
        _model(
            "",
            "self.softmax = nn.Softmax(dim=2)",
            "q, k, v",
            "return torch.bmm(self.softmax(0.25 * torch.bmm(q, k.transpose(1, 2))), v)",
            "torch.rand(3, $L, $D), torch.rand(3, $S, $D), torch.rand(3, $S, $E)",
            "",
        ),
        ({"L": 33, "S": 21, "D": 16, "E": 5},),
    ),
    Case(
        "sdpa_bool_and_float_masks_and_a_row_with_every_key_dropped",
        _model(
            "",
            "",
            "q, k, v, keep, bias",
            "return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)"
            " + F.scaled_dot_product_attention(q, k, v, attn_mask=bias)",
            "torch.rand(2, 3, $L, 8), torch.rand(2, 3, $S, 8), torch.rand(2, 3, $S, 6),"
            " (torch.arange($L * $S).view($L, $S) % 3 != 1) & (torch.arange($L)[:, None] != 2),"
            " torch.randn(2, 1, $L, $S)",
            "",
        ),
        ({"L": 9, "S": 13},),
    ),
    Case(
        "multihead_attention_with_a_causal_mask_and_key_padding",
        _model(
            ", e",
            "self.attn = nn.MultiheadAttention(e, 2, batch_first=True)",
            "x, pad",
            "t = x.shape[1]\n"
            "causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)\n"
            "return self.attn(x, x, x, attn_mask=causal, key_padding_mask=pad, need_weights=False)[0]",
            "torch.rand(2, $L, $E), torch.arange($L)[None, :] >= torch.tensor([[$L], [$L - 3]])",
            "$E",
        ),
        ({"L": 7, "E": 12},),
    ),
    Case(
        "transformer_encoder_and_decoder_with_masks",
        _model(
            ", e",
            "self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(e, 2, 16, dropout=0.0, batch_first=True,"
            " norm_first=True), 2, enable_nested_tensor=False)\n"
            "self.dec = nn.TransformerDecoderLayer(e, 2, 16, dropout=0.0, batch_first=True)",
            "x, y, pad",
            "m = self.enc(x, src_key_padding_mask=pad)\n"
            "t = y.shape[1]\n"
            "causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)\n"
            "return self.dec(y, m, tgt_mask=causal, memory_key_padding_mask=pad)",
            "torch.rand(2, $S, $E), torch.rand(2, $L, $E), torch.arange($S)[None, :] >= torch.tensor([[$S], [$S - 2]])",
            "$E",
        ),
        ({"L": 5, "S": 6, "E": 8},),
    ),
    Case(
        "transformer_module_with_a_causal_target_mask",
        _model(
            ", e",
            "self.t = nn.Transformer(e, 2, 1, 1, 16, dropout=0.0, batch_first=True)",
            "src, tgt",
            "t = tgt.shape[1]\n"
            "causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).triu(1)\n"
            "return self.t(src, tgt, tgt_mask=causal)",
            "torch.rand(2, $S, $E), torch.rand(2, $L, $E)",
            "$E",
        ),
        ({"L": 5, "S": 7, "E": 8},),
    ),
)
"""Every attention problem the tests render and check."""
