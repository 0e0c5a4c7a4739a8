import torch
import torch.nn as nn


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, hidden), nn.GELU(), nn.Linear(hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        y = self.norm1(x).transpose(1, 2)
        x = x + self.token_mlp(y).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, patch=4, dim=32, depth=2, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (32 // patch) ** 2
        self.blocks = nn.ModuleList([MixerBlock(tokens, dim, 64) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(dim=1))


batch_size = 4


def get_inputs():
    return [torch.randn(batch_size, 3, 32, 32)]


def get_init_inputs():
    return [4, 32, 2, 10]
