import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.dec = nn.TransformerDecoderLayer(dim, heads, 64, dropout=0.0, batch_first=True)

    def forward(self, tgt, memory):
        return self.dec(tgt, memory)


def get_inputs():
    return [torch.randn(2, 6, 32), torch.randn(2, 9, 32)]


def get_init_inputs():
    return []
