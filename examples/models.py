"""Small example models shared by the demo, the README pictures and the tests."""

from __future__ import annotations

import torch
from torch import nn


class SimpleRecurrent(nn.Module):
    """The recurrent example: one linear layer applied four times in a loop, with an add and a
    multiply in each pass.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(SimpleRecurrent(), torch.rand(6, 5))
        >>> h['linear_1_1:2'].pass_num, h['linear_1_1:2'].num_passes
        (2, 4)
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features=5, out_features=5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x
