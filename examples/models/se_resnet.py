import torch
import torch.nn as nn


class SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(c, c // r),
            nn.ReLU(inplace=True),
            nn.Linear(c // r, c),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return x * self.fc(x)[:, :, None, None]


class Bottleneck(nn.Module):
    def __init__(self, cin, c, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.Conv2d(c, c * 4, 1, bias=False),
            nn.BatchNorm2d(c * 4),
            SE(c * 4),
        )
        self.short = (
            nn.Identity()
            if stride == 1 and cin == c * 4
            else nn.Sequential(nn.Conv2d(cin, c * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(c * 4))
        )

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class Model(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(Bottleneck(16, 8, 1), Bottleneck(32, 16, 2))
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


batch_size = 2


def get_inputs():
    return [torch.randn(batch_size, 3, 16, 16)]


def get_init_inputs():
    return [10]
