"""The small residual net the tests of the watch's batched measuring train, on the CPU and on
CUDA: it has the in-place changes a ResNet has (ReLU(inplace), out += x)."""

from __future__ import annotations

import torch
from torch import nn

KINDS = ("io", "io_grad", "params", "params_grad", "updates")


class Block(nn.Module):
    """A residual block with ReLU(inplace=True) and ``out += x``."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


def small_net(side: int = 8):
    """For inputs of ``side`` x ``side`` pixels, 3 channels."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), Block(8), Block(8), nn.Flatten(), nn.Linear(8 * side * side, 10)
    )
