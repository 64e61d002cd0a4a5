"""What the module-call graph keeps of each module: its constructor arguments by name."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.embed = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)
        self.odd = Odd(5, 7)

    def forward(self, x, ids):
        return self.bn(self.conv(x)).mean() + self.odd(self.norm(self.embed(ids))).mean()


class Odd(nn.Module):
    """A module whose extra_repr has more positional parts than its constructor names."""

    def __init__(self, *sizes: int) -> None:
        super().__init__()
        self.sizes = sizes

    def extra_repr(self) -> str:
        return ", ".join(map(str, self.sizes)) + ", scale=2"

    def forward(self, x):
        return x * 2


def test_extra_repr_parts_are_named_by_the_constructor(tmp_path):
    model = Block()
    with tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False):
        model(torch.randn(2, 3, 5, 5), torch.tensor([[1, 2]])).backward()
    calls = tl.open_run(str(tmp_path / "run")).calls
    conv = calls["conv:1"]
    assert conv.extra_repr == "3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False"  # kept
    assert conv.arguments == [
        ("in_channels", "3"),
        ("out_channels", "8"),
        ("kernel_size", "(3, 3)"),
        ("stride", "(1, 1)"),
        ("padding", "(1, 1)"),
        ("bias", "False"),
    ]
    assert calls["bn:1"].arguments[0] == ("num_features", "8")
    assert calls["embed:1"].arguments == [("num_embeddings", "10"), ("embedding_dim", "4")]
    assert calls["norm:1"].arguments[0] == ("normalized_shape", "(4,)")
    # *sizes names no single part: those stay unnamed ('-'), named parts keep their names
    assert calls["odd:1"].arguments == [("-", "5"), ("-", "7"), ("scale", "2")]
