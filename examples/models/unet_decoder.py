import torch
import torch.nn as nn
import torch.nn.functional as F


class Up(nn.Module):
    def __init__(self, cin, cskip, cout, groups=8):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(cin + cskip, cout, 3, padding=1),
            nn.GroupNorm(groups, cout),
            nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.GroupNorm(groups, cout),
            nn.SiLU(),
        )

    def forward(self, x, skip):
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return self.conv(torch.cat([x, skip], dim=1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up1 = Up(64, 32, 32)
        self.up2 = Up(32, 16, 16)
        self.head = nn.Conv2d(16, 2, 1)

    def forward(self, bottom, skip1, skip2):
        return self.head(self.up2(self.up1(bottom, skip1), skip2))


def get_inputs():
    return [torch.randn(1, 64, 4, 4), torch.randn(1, 32, 8, 8), torch.randn(1, 16, 16, 16)]


def get_init_inputs():
    return []
