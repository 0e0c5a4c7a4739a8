import torch
import torch.nn as nn


class ConvModule(nn.Module):
    def __init__(self, d_model, kernel_size=15):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.pw1 = nn.Conv1d(d_model, 2 * d_model, 1)
        self.glu = nn.GLU(dim=1)
        self.dw = nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model)
        self.bn = nn.BatchNorm1d(d_model)
        self.act = nn.SiLU()
        self.pw2 = nn.Conv1d(d_model, d_model, 1)

    def forward(self, x):
        y = self.norm(x).transpose(1, 2)
        y = self.glu(self.pw1(y))
        y = self.act(self.bn(self.dw(y)))
        y = self.pw2(y).transpose(1, 2)
        return x + y


class Model(nn.Module):
    def __init__(self, d_model=32):
        super().__init__()
        self.ff = nn.Sequential(
            nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.SiLU(), nn.Linear(4 * d_model, d_model)
        )
        self.conv = ConvModule(d_model)
        self.out_norm = nn.LayerNorm(d_model)

    def forward(self, x):
        x = x + 0.5 * self.ff(x)
        x = self.conv(x)
        return self.out_norm(x)


def get_inputs():
    return [torch.randn(2, 50, 32)]


def get_init_inputs():
    return []
