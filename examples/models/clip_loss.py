import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """CLIP's symmetric contrastive loss over projected image and text features."""

    def __init__(self, di, dt, d):
        super().__init__()
        self.pi = nn.Linear(di, d, bias=False)
        self.pt = nn.Linear(dt, d, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, img, txt):
        a = F.normalize(self.pi(img), dim=-1)
        b = F.normalize(self.pt(txt), dim=-1)
        logits = self.logit_scale.exp() * a @ b.t()
        labels = torch.arange(a.shape[0], device=a.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def get_inputs():
    return [torch.randn(8, 20), torch.randn(8, 12)]


def get_init_inputs():
    return [20, 12, 16]
