import torch
import torch.nn as nn


class Model(nn.Module):
    """A YOLO detection head's decoding: sigmoid offsets plus the cell grid, exponentiated sizes times anchors."""

    def __init__(self, c, na, nc):
        super().__init__()
        self.na, self.no = na, nc + 5
        self.conv = nn.Conv2d(c, na * (nc + 5), 1)
        self.register_buffer(
            "anchors", torch.tensor([[10.0, 13.0], [16.0, 30.0], [33.0, 23.0]][:na]).view(1, na, 1, 1, 2)
        )

    def forward(self, x):
        b, _, ny, nx = x.shape
        p = self.conv(x).view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2)
        yv, xv = torch.meshgrid(torch.arange(ny, device=x.device), torch.arange(nx, device=x.device), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
        xy = (p[..., :2].sigmoid() + grid) * 8.0
        wh = p[..., 2:4].exp() * self.anchors
        return torch.cat((xy, wh, p[..., 4:].sigmoid()), -1).view(b, -1, self.no)


def get_inputs():
    return [torch.randn(2, 8, 5, 6)]


def get_init_inputs():
    return [8, 3, 4]
