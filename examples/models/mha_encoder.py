import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim=64, heads=4, ff=128):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.GELU(), nn.Linear(ff, dim))
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x))


def get_inputs():
    return [torch.randn(4, 40, 64)]


def get_init_inputs():
    return []
