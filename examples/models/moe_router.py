import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Model(nn.Module):
    """A mixture of experts: a softmax gate picks each token's top two experts, whose outputs are
    gathered and weighted (every expert runs on every token, as small MoE layers are written)."""

    def __init__(self, d=32, hidden=64, experts=4, k=2):
        super().__init__()
        self.k = k
        self.norm = nn.LayerNorm(d)
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([Expert(d, hidden) for _ in range(experts)])

    def forward(self, x):
        h = self.norm(x)
        weights = F.softmax(self.gate(h), dim=-1)
        top, idx = weights.topk(self.k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        outs = torch.stack([expert(h) for expert in self.experts], dim=-2)
        picked = torch.gather(outs, -2, idx[..., None].expand(*idx.shape, x.shape[-1]))
        return x + (picked * top[..., None]).sum(dim=-2)


def get_inputs():
    return [torch.randn(2, 6, 32)]


def get_init_inputs():
    return []
