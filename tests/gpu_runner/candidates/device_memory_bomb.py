# Hostile: ask for a terabyte on the device (or the host, on the CPU).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        hoard = torch.empty(1 << 38, device=x.device)
        return hoard[: x.numel()].view_as(x)
