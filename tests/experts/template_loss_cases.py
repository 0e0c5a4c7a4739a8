"""Loss references for the template expert's tests: every loss, reductions to a scalar.

KernelBench's spellings (``torch.mean((p - t) ** 2)``, ``F.smooth_l1_loss``, ``F.kl_div(log(p),
t, reduction='batchmean')``, ``nn.TripletMarginLoss``, the hinge ``mean(clamp(1 - p * t,
min=0))``) and the other reductions, at odd sizes whose total exceeds one chunk.
"""

from __future__ import annotations

from tests.experts.template_cases import Case, _model

_PT = "torch.rand($B, $N), torch.rand($B, $N)"
_SIZES: tuple[dict[str, int], ...] = ({"B": 7, "N": 300}, {"B": 2, "N": 5})

LOSS_CASES: tuple[Case, ...] = (
    Case("mse_mean", _model("", "", "p, t", "return torch.mean((p - t) ** 2)", _PT, ""), _SIZES),
    Case("smooth_l1", _model("", "", "p, t", "return F.smooth_l1_loss(p * 3.0, t, beta=0.5)", _PT, ""), _SIZES),
    Case(
        "huber_sum_and_l1_none",
        _model(
            "",
            "self.h = nn.HuberLoss(reduction='sum', delta=0.7)\nself.l1 = nn.L1Loss(reduction='none')",
            "p, t",
            "return self.h(p * 2.0, t) + self.l1(p, t)",
            _PT,
            "",
        ),
        ({"B": 3, "N": 37},),
    ),
    Case(
        "kl_div_batchmean",
        _model(
            "",
            "",
            "p, t",
            "return F.kl_div(torch.log(p), t, reduction='batchmean')",
            "torch.rand($B, $N).softmax(dim=-1), torch.rand($B, $N).softmax(dim=-1)",
            "",
        ),
        _SIZES,
    ),
    Case(
        "triplet_margin",
        _model(
            ", margin",
            "self.loss_fn = nn.TripletMarginLoss(margin=margin)",
            "a, p, n",
            "return self.loss_fn(a, p, n)",
            "torch.rand($B, $N), torch.rand($B, $N), torch.rand($B, $N)",
            "1.0",
        ),
        _SIZES,
    ),
    Case(
        "cross_entropy_class_indices",
        _model(
            "", "", "p, t", "return F.cross_entropy(p, t)", "torch.randn($B, $N) * 3, torch.randint(0, $N, ($B,))", ""
        ),
        _SIZES,
    ),
    Case(
        "cross_entropy_ignored_sum_and_nll_of_log_softmax",
        _model(
            "",
            "self.ce = nn.CrossEntropyLoss(ignore_index=1, reduction='sum')",
            "p, t",
            "return self.ce(p, t) + F.nll_loss(torch.log_softmax(p * 0.5, dim=1), t, reduction='none').sum()",
            "torch.randn($B, $N), torch.randint(0, 3, ($B,))",
            "",
        ),
        ({"B": 33, "N": 7},),
    ),
    Case(
        "cross_entropy_class_probabilities",
        _model(
            "",
            "",
            "p, t",
            "return F.cross_entropy(p, t.softmax(dim=1))",
            "torch.randn($B, $N), torch.randn($B, $N)",
            "",
        ),
        _SIZES,
    ),
    Case(
        "cross_entropy_label_smoothing_with_ignored_rows_in_each_reduction_and_of_probabilities",
        _model(
            "",
            "self.ce = nn.CrossEntropyLoss(ignore_index=1, label_smoothing=0.1)",
            "p, t",
            "mean = self.ce(p, t)\n"
            "rows = F.cross_entropy(p * 2, t, reduction='none', label_smoothing=0.25)\n"
            "total = F.cross_entropy(p, t, reduction='sum', ignore_index=0, label_smoothing=0.05)\n"
            "soft = F.cross_entropy(p, (p * 0.3).softmax(dim=1), label_smoothing=0.2)\n"
            "return mean, rows, total, soft",
            "torch.randn($B, $N), torch.randint(0, 3, ($B,))",
            "",
        ),
        ({"B": 33, "N": 7},),
    ),
    Case(
        "margin_embedding_and_likelihood_losses_in_each_reduction",
        _model(
            "",
            "self.rank = nn.MarginRankingLoss(margin=0.3, reduction='sum')\nself.multi = nn.MultiLabelSoftMarginLoss()",
            "p, t",
            "y = torch.where(t[:, 0] > 0, 1.0, -1.0)\n"
            "ym = torch.where(t > 0, 1.0, -1.0)\n"
            "a = self.rank(p[:, 0], p[:, 1], y) + F.margin_ranking_loss(p[:, 1], t[:, 1], -y, reduction='none')\n"
            "b = F.soft_margin_loss(p * 3, ym) + F.soft_margin_loss(p, ym, reduction='sum')\n"
            "c = F.cosine_embedding_loss(p, t, y, margin=0.2, reduction='none')\n"
            "d = F.hinge_embedding_loss(p, ym, margin=0.5) + F.hinge_embedding_loss(p, ym * 0.0, reduction='sum')\n"
            "f = F.poisson_nll_loss(p, t.abs())\n"
            "f = f + F.poisson_nll_loss(p.abs(), t.abs(), log_input=False, reduction='sum')\n"
            "g = self.multi(p, (t > 0).float())\n"
            "g = g + F.multilabel_soft_margin_loss(p, (t > 0.5).float(), reduction='none')\n"
            "return a, b, c, d, f, g",
            "torch.randn($B, $N), torch.randn($B, $N)",
            "",
        ),
        ({"B": 9, "N": 7},),
    ),
    Case(
        "hinge_mean",
        _model(
            "",
            "",
            "p, t",
            "return torch.mean(torch.clamp(1 - p * t, min=0))",
            "torch.randn($B, $N), torch.randint(0, 2, ($B, 1)).float() * 2 - 1",
            "",
        ),
        _SIZES,
    ),
)
"""Every loss problem the tests render and check."""
