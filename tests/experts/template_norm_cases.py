"""Batch norm, instance norm and vector-norm references for the template expert's tests.

Batch norm with batch statistics (modules in training mode, 1D after a GEMM and 2D/3D after a
convolution) and with running statistics (``F.batch_norm(training=False)``), instance norm with
and without affine parameters, and p-norms (Frobenius over everything, L2 and L1 along a dim,
infinity), at small and odd sizes.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_ONE: tuple[dict[str, int], ...] = ({},)

NORM_CASES: tuple[Case, ...] = (
    Case(
        "batchnorm2d_training_relu",
        _model(
            "", "self.bn = nn.BatchNorm2d(5)", "x", "return torch.relu(self.bn(x))", "torch.randn($B, 5, 7, $W)", ""
        ),
        ({"B": 3, "W": 6}, {"B": 1, "W": 9}),
    ),
    Case(
        "gemm_scale_batchnorm1d",
        _model(
            "",
            "self.fc = nn.Linear(10, 12)\nself.bn = nn.BatchNorm1d(12, eps=1e-4)",
            "x",
            "return self.bn(self.fc(x) * 1.5)",
            "torch.randn(9, 10)",
            "",
        ),
        _ONE,
    ),
    Case(
        # rows enough to be split in parts (16384 rows in 64 of 256), merged (``norm._row_parts``)
        "batchnorm1d_many_rows",
        _model(
            "",
            "self.bn = nn.BatchNorm1d(12)",
            "x",
            "return torch.relu(self.bn(x)) * 2.0",
            "torch.randn(16384, 12) + 3.0",
            "",
        ),
        _ONE,
    ),
    Case(
        "conv3d_batchnorm_no_affine",
        _model(
            "",
            "self.conv = nn.Conv3d(2, 4, 3)\nself.bn = nn.BatchNorm3d(4, affine=False)",
            "x",
            "return self.bn(self.conv(x)) * 0.5",
            "torch.randn(2, 2, 5, 6, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "batchnorm_running_stats",
        _model(
            "",
            "self.register_buffer('rm', torch.randn(6))\nself.register_buffer('rv', torch.rand(6) + 0.5)\n"
            "self.w = nn.Parameter(torch.randn(6))",
            "x",
            "return F.batch_norm(x, self.rm, self.rv, self.w, None, False, 0.1, 1e-3)",
            "torch.randn(4, 6, 5)",
            "",
        ),
        _ONE,
    ),
    Case(
        "instancenorm2d_divide",
        _model(
            "", "self.inorm = nn.InstanceNorm2d(4)", "x", "return self.inorm(x) / 2.0", "torch.randn(3, 4, $H, 7)", ""
        ),
        ({"H": 5}, {"H": 16}),
    ),
    Case(
        "instancenorm1d_affine",
        _model(
            "",
            "self.inorm = nn.InstanceNorm1d(6, affine=True)",
            "x",
            "return self.inorm(x)",
            "torch.randn(2, 6, 33)",
            "",
        ),
        _ONE,
    ),
    Case(
        "vector_norms",
        _model(
            "",
            "",
            "x",
            "a = x / torch.norm(x, p='fro')\nb = x / torch.norm(x, p=2, dim=1, keepdim=True)\n"
            "c = x / torch.linalg.vector_norm(x, ord=1, dim=1, keepdim=True)\n"
            "return a + b + c + torch.norm(x, p=float('inf'), dim=1, keepdim=True)",
            "torch.randn($B, $N)",
            "",
        ),
        ({"B": 5, "N": 37}, {"B": 16, "N": 100}),
    ),
    Case(
        "normalize_behind_a_device_guard_with_a_default_argument",
        _model(
            "",
            "self.fc = nn.Linear(6, $N)",
            "x, mask=None",
            "if x.device != self.fc.weight.device:\n    raise ValueError('x is elsewhere')\n"
            "return F.normalize(self.fc(x), dim=1) + F.normalize(x, p=1.0, dim=0, eps=1e-3).sum()",
            "torch.randn(5, 6)",
            "",
        ),
        ({"N": 7}, {"N": 33}),
    ),
)
"""Every normalisation problem the tests render and check."""

_RESNET_BLOCK = """class Model(nn.Module):
    expansion = 1

    def __init__(self, cin, cout, stride):
        super(Model, self).__init__()

        def conv_bn(a, b, k, s, p):
            return nn.Sequential(nn.Conv2d(a, b, k, s, p, bias=False), nn.BatchNorm2d(b))

        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride, 1), nn.ReLU(inplace=True), conv_bn(cout, cout, 3, 1, 1))
        self.down = conv_bn(cin, cout * self.expansion, 1, stride, 0)

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))

def get_inputs():
    return [torch.randn(2, 3, $H, 9)]

def get_init_inputs():
    return [3, 5, 2]
"""

_RESNET_HELPERS = """WIDTHS = (4, 6)


def norm_layer(c):
    return nn.BatchNorm2d(c)


class Block(nn.Module):
    expansion = 1

    def __init__(self, cin, cout, stride=1, down=None):
        super(Block, self).__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn = norm_layer(cout)
        self.down = down

    def forward(self, x):
        out = self.bn(self.conv(x))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class Stem(Block):
    def __init__(self, cout):
        super().__init__(3, cout)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()
        self.cin = WIDTHS[0]
        self.stem = Stem(WIDTHS[0])
        self.layer = self._make_layer(Block, WIDTHS[1], 2, stride=2)
        self.fc = nn.Linear(WIDTHS[1] * Block.expansion, 3)

    def _make_layer(self, block, cout, blocks, stride):
        down = nn.Sequential(nn.Conv2d(self.cin, cout, 1, stride, bias=False), norm_layer(cout))
        layers = [block(self.cin, cout, stride, down)]
        self.cin = cout * block.expansion
        layers += [block(self.cin, cout) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def unused(self):
        return self.fc.weight.sum()

    def forward(self, x):
        x = self.layer(self.stem(x))
        return self.fc(torch.mean(x, dim=(2, 3)))

def get_inputs():
    return [torch.randn(2, 3, $H, 7)]

def get_init_inputs():
    return []
"""

GRAPH_CASES: tuple[Case, ...] = (
    Case("resnet_block_class_constant_helper", _RESNET_BLOCK, ({"H": 10}, {"H": 7})),
    Case("resnet_helper_classes_and_methods", _RESNET_HELPERS, ({"H": 8},)),
)
"""Whole blocks split into kernels: a class-level constant and a helper defined in __init__; helper
classes (one deriving from another), a helper method and a module-level function and constant."""
