"""Convolution references for the template expert's tests, at small and odd sizes.

Every geometry KernelBench uses: 1D/2D/3D, stride, padding (ints, per-dim, ``"same"``),
dilation, groups (depthwise and pointwise as cases), with and without bias, transposed with
``output_padding``, through modules and through ``F.conv*``, followed by fused elementwise
epilogues (activations, scaling, clamps, a residual add of the input), and convolutions in a
graph with a second convolution or a normalisation.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_ONE: tuple[dict[str, int], ...] = ({},)

CONV_CASES: tuple[Case, ...] = (
    Case(
        "conv1d_strided_dilated_relu",
        _model(
            "",
            "self.conv = nn.Conv1d(3, 5, 4, stride=2, padding=3, dilation=2)",
            "x",
            "return torch.relu(self.conv(x)) * 0.5",
            "torch.randn($B, 3, $L)",
            "",
        ),
        ({"B": 2, "L": 37}, {"B": 3, "L": 16}),
    ),
    Case(
        "conv2d_grouped_asymmetric_mish_scale",
        _model(
            "",
            "self.conv = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)\n"
            "self.scale = nn.Parameter(torch.randn(6, 1, 1))",
            "x",
            "return F.mish(self.conv(x)) * self.scale",
            "torch.randn($B, 4, $H, $W)",
            "",
        ),
        ({"B": 2, "H": 9, "W": 7}, {"B": 1, "H": 16, "W": 5}),
    ),
    Case(
        "conv3d_no_bias_hardswish",
        _model(
            "",
            "self.conv = nn.Conv3d(3, 5, 3, padding=1, bias=False)",
            "x",
            "return F.hardswish(self.conv(x))",
            "torch.randn(2, 3, $D, 6, 5)",
            "",
        ),
        ({"D": 5}, {"D": 3}),
    ),
    Case(
        "conv3d_strided_asymmetric_kernel",
        _model(
            "",
            "self.conv = nn.Conv3d(2, 4, (3, 1, 2), stride=(1, 2, 2), padding=(0, 1, 1), dilation=(2, 1, 1))",
            "x",
            "return self.conv(x)",
            "torch.randn(2, 2, 7, 6, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv2d_depthwise_residual",
        _model(
            "",
            "self.conv = nn.Conv2d(6, 6, 3, padding=1, groups=6)",
            "x",
            "return x + torch.tanh(self.conv(x))",
            "torch.randn($B, 6, $H, 11)",
            "",
        ),
        ({"B": 2, "H": 7}, {"B": 1, "H": 20}),
    ),
    Case(
        "conv2d_pointwise_sigmoid",
        _model(
            "",
            "self.conv = nn.Conv2d(5, 7, 1)",
            "x",
            "return torch.sigmoid(self.conv(x))",
            "torch.randn(3, 5, 6, 7)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv2d_functional_same_padding",
        _model(
            "",
            "self.w = nn.Parameter(torch.randn(4, 3, 3, 5) * 0.2)\nself.b = nn.Parameter(torch.randn(4))",
            "x",
            "return F.conv2d(x, self.w, self.b, padding='same').clamp(-0.5, 0.75)",
            "torch.randn(2, 3, 9, 10)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose2d_grouped_clamp_divide",
        _model(
            "",
            "self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)",
            "x",
            "x = self.conv(x)\nx = torch.clamp(x, min=-0.3)\nreturn x / 2.0",
            "torch.randn($B, 4, $H, $W)",
            "",
        ),
        ({"B": 2, "H": 5, "W": 7}, {"B": 1, "H": 8, "W": 3}),
    ),
    Case(
        "conv_transpose1d_strided_dilated",
        _model(
            "",
            "self.conv = nn.ConvTranspose1d(3, 5, 3, stride=3, padding=2, dilation=2, bias=False)",
            "x",
            "return self.conv(x)",
            "torch.randn(2, 3, 13)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose_phases_without_taps",
        _model(
            "",
            "self.conv = nn.ConvTranspose2d(16, 8, 2, stride=3, padding=0, output_padding=1)",
            "x",
            "return torch.sigmoid(self.conv(x))",
            "torch.randn(2, 16, 4, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose1d_dilation_inverse_mod_stride",
        _model(
            "",
            "self.conv = nn.ConvTranspose1d(16, 16, 5, stride=4, padding=2, dilation=3, output_padding=2)",
            "x",
            "return self.conv(x)",
            "torch.randn(2, 16, 7)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose2d_dilation_shares_stride",
        _model(
            "",
            "self.conv = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, dilation=2)",
            "x",
            "return self.conv(x)",
            "torch.randn(2, 3, 5, 6)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose3d_bias_gelu",
        _model(
            "",
            "self.conv = nn.ConvTranspose3d(3, 4, (2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))",
            "x",
            "return F.gelu(self.conv(x))",
            "torch.randn(2, 3, 3, 4, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_relu_conv",
        _model(
            "",
            "self.c1 = nn.Conv2d(3, 8, 3)\nself.c2 = nn.Conv2d(8, 5, 3, stride=2)",
            "x",
            "return self.c2(torch.relu(self.c1(x)))",
            "torch.randn(2, 3, 12, 13)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_min_with_tensor_constants",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 4, 3)\nself.c = 0.2",
            "x",
            "x = torch.min(self.conv(x), torch.tensor(self.c))\n"
            "return torch.max(x, torch.tensor(-0.1, device=x.device))",
            "torch.randn(2, 3, 7, 8)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv2d_gelu_global_avg_pool",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 5, 3)",
            "x",
            "x = F.gelu(self.conv(x))\nx = F.adaptive_avg_pool2d(x, 1)\nreturn x.squeeze(-1).squeeze(-1)",
            "torch.randn($B, 3, $H, $W)",
            "",
        ),
        ({"B": 3, "H": 10, "W": 10}, {"B": 4, "H": 11, "W": 13}),
    ),
    Case(
        "conv3d_spatial_mean_and_sum_plus_bias",
        _model(
            "",
            "self.conv = nn.Conv3d(2, 4, 2, padding=1)\nself.b = nn.Parameter(torch.randn(4))",
            "x",
            "y = torch.relu(self.conv(x))\n"
            "return y.mean(dim=[2, 3, 4]) + self.b, (y * 0.5).sum(dim=(2, 3, 4), keepdim=True)",
            "torch.randn(3, 2, 4, 5, 3)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_transpose2d_strided_spatial_sum",
        _model(
            "",
            "self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)",
            "x",
            "return torch.sum(torch.sigmoid(self.conv(x)), dim=(2, 3))",
            "torch.randn(5, 4, 4, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_groupnorm_tanh",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)",
            "x",
            "return torch.tanh(self.gn(self.conv(x) * 2.0))",
            "torch.randn(2, 3, 9, 10)",
            "",
        ),
        _ONE,
    ),
    Case(
        # KernelBench L2-92's structure: the convolution's output is read by the group norm (through
        # its (N, G, -1) view) and again by the residual add
        "conv_groupnorm_residual_logsumexp",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)",
            "x",
            "y = self.conv(x)\nz = F.hardswish(torch.tanh(self.gn(y)))\n"
            "return torch.logsumexp(y + z, dim=1, keepdim=True)",
            "torch.randn(2, 3, 9, 10)",
            "",
        ),
        _ONE,
    ),
)
"""Every convolution problem the tests render and check."""
