"""Scan references for the template expert's tests: cumsum/cumprod, reversed, along any dim.

KernelBench's spellings (``torch.cumsum(x, dim=self.dim)``, ``torch.cumprod``, the reversed
``cumsum(x.flip(d), d).flip(d)``), a scan along a middle dim, a masked scan whose mask is a
float tensor, and a scan with a fused epilogue, at sizes longer than one chunk and not powers
of two.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_ONE: tuple[dict[str, int], ...] = ({},)

SCAN_CASES: tuple[Case, ...] = (
    Case(
        "cumsum_last_dim",
        _model(", dim", "self.dim = dim", "x", "return torch.cumsum(x, dim=self.dim)", "torch.rand($B, $N)", "1"),
        ({"B": 5, "N": 300}, {"B": 33, "N": 7}),
    ),
    Case(
        "cumprod_last_dim",
        _model(
            ", dim", "self.dim = dim", "x", "return torch.cumprod(x, dim=self.dim)", "torch.rand($B, $N) + 0.5", "1"
        ),
        ({"B": 3, "N": 130}, {"B": 9, "N": 16}),
    ),
    Case(
        "cumsum_reverse",
        _model(
            ", dim",
            "self.dim = dim",
            "x",
            "return torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim)",
            "torch.rand($B, $N)",
            "1",
        ),
        ({"B": 4, "N": 257}, {"B": 2, "N": 5}),
    ),
    Case(
        "cumsum_middle_dim_masked_scaled",
        _model(
            "",
            "",
            "x, mask",
            "return torch.relu(x * mask).cumsum(1) * 0.5",
            "torch.randn(3, $R, 5), (torch.rand(3, $R, 5) > 0.5).float()",
            "",
        ),
        ({"R": 70}, {"R": 3}),
    ),
    Case(
        "masked_cumsum_bool_mask",
        _model(
            "",
            "",
            "x, mask",
            "return torch.cumsum(x * mask, dim=1)",
            "torch.rand(3, $R), torch.randint(0, 2, (3, $R)).bool()",
            "",
        ),
        ({"R": 300}, {"R": 9}),
    ),
    Case(
        "cumprod_first_dim_reversed",
        _model(
            "", "", "x", "return torch.flip(torch.cumprod(torch.flip(x, [0]), 0), [0])", "torch.rand(37, 6) + 0.5", ""
        ),
        _ONE,
    ),
)
"""Every scan problem the tests render and check."""
