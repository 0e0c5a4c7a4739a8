import torch
import torch.nn as nn


class Model(nn.Module):
    """A ResNeXt-style bottleneck (grouped 3x3 convolution) with an AlexNet-era local response
    normalisation before the residual, and a reflection-padded stem."""

    def __init__(self, c=32, groups=8):
        super().__init__()
        self.stem = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, c, 3), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=groups, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.lrn = nn.LocalResponseNorm(5, alpha=1e-3, beta=0.75, k=2.0)

    def forward(self, x):
        x = self.stem(x)
        return torch.relu(self.lrn(self.c(self.b(self.a(x)))) + x)


def get_inputs():
    return [torch.randn(2, 3, 12, 12)]


def get_init_inputs():
    return []
