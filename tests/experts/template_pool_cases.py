"""Pooling references for the template expert's tests, at small and odd sizes.

Max and average pooling in 1D/2D/3D with kernel, stride, padding, dilation and ``ceil_mode``
(KernelBench's spellings: modules with keyword arguments, and ``F.*_pool*d``), average pooling
with and without ``count_include_pad`` and with a ``divisor_override``, adaptive pooling (global
and evenly divided), and pooling in a graph after a convolution with fused elementwise work.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_ONE: tuple[dict[str, int], ...] = ({},)

POOL_CASES: tuple[Case, ...] = (
    Case(
        "maxpool1d_dilated_ceil",
        _model(
            "",
            "self.pool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)",
            "x",
            "return self.pool(x)",
            "torch.randn($B, 3, $L)",
            "",
        ),
        ({"B": 2, "L": 37}, {"B": 1, "L": 16}),
    ),
    Case(
        "maxpool2d_padded_then_relu",
        _model(
            "",
            "self.pool = nn.MaxPool2d(kernel_size=4, stride=1, padding=1, dilation=1)",
            "x",
            "return torch.relu(self.pool(x) - 0.1)",
            "torch.randn(2, 3, $H, 9)",
            "",
        ),
        ({"H": 11}, {"H": 4}),
    ),
    Case(
        "maxpool3d_strided_functional",
        _model(
            "",
            "",
            "x",
            "return F.max_pool3d(x, (2, 3, 2), stride=(2, 2, 1), padding=(1, 1, 0))",
            "torch.randn(2, 3, 5, 7, 6)",
            "",
        ),
        _ONE,
    ),
    Case(
        "avgpool1d_padded_exclude_pad_ceil",
        _model(
            "",
            "self.pool = nn.AvgPool1d(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)",
            "x",
            "return self.pool(x)",
            "torch.randn(2, 4, $L)",
            "",
        ),
        ({"L": 23}, {"L": 10}),
    ),
    Case(
        "avgpool2d_include_pad",
        _model(
            "",
            "self.pool = nn.AvgPool2d(kernel_size=3, stride=2, padding=1)",
            "x",
            "return self.pool(x) * 2.0",
            "torch.randn(2, 3, $H, 10)",
            "",
        ),
        ({"H": 11}, {"H": 6}),
    ),
    Case(
        "avgpool2d_ceil_divisor_override",
        _model(
            "",
            "",
            "x",
            "return F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, divisor_override=5)",
            "torch.randn(1, 2, 8, 7)",
            "",
        ),
        _ONE,
    ),
    Case(
        "avgpool3d_default_stride",
        _model(
            "", "self.pool = nn.AvgPool3d(kernel_size=2)", "x", "return self.pool(x)", "torch.randn(2, 3, 5, 6, 7)", ""
        ),
        _ONE,
    ),
    Case(
        "adaptive_pools",
        _model(
            "",
            "self.gap = nn.AdaptiveAvgPool2d((1, 1))\nself.amp = nn.AdaptiveMaxPool2d((2, 3))",
            "x",
            "return self.amp(x) + self.gap(x)",
            "torch.randn(2, 3, 8, 9)",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv_maxpool_hardtanh",
        _model(
            "",
            "self.conv = nn.Conv2d(3, 6, 3)\nself.pool = nn.MaxPool2d(2)",
            "x",
            "return F.hardtanh(self.pool(torch.relu(self.conv(x))), -0.5, 0.5)",
            "torch.randn(2, 3, 11, 12)",
            "",
        ),
        _ONE,
    ),
)
"""Every pooling problem the tests render and check."""
