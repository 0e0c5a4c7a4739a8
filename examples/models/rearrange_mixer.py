import torch
import torch.nn as nn


class Model(nn.Module):
    """Token and channel mixing written with movedim / swapaxes / flatten(start_dim)."""

    def __init__(self, tokens=16, dim=24):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Linear(32, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 48), nn.GELU(), nn.Linear(48, dim))

    def forward(self, x):
        h, w = x.shape[-2:]
        x = x.flatten(2).movedim(1, -1)
        x = x + self.token_mlp(self.norm1(x).swapaxes(1, 2)).swapaxes(1, 2)
        x = x + self.channel_mlp(self.norm2(x))
        return x.movedim(-1, 1).unflatten(2, (h, w))


def get_inputs():
    return [torch.randn(2, 24, 4, 4)]


def get_init_inputs():
    return []
