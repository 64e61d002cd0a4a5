"""Draw the README's example graphs into a folder (PNG and SVG).

Run with ``python -m examples.make_images [outdir]`` (default ``images/``). Needs
torchvision and Graphviz's ``dot`` program. Writes:

- ``recurrent_unrolled`` / ``recurrent_rolled``: a linear layer applied in a loop of four passes;
- ``conditional``: a branch chosen by ``if x.mean() > 0`` (the bool node and its ``if`` edge);
- ``alexnet``: AlexNet, every operation;
- ``resnet_basic_block``: ResNet-18's first basic block with its skip connection;
- ``resnet18_depth1``: the whole ResNet-18 with module boxes one level deep, deeper modules
  collapsed into single nodes;
- ``inception_depth0`` / ``inception_full``: GoogLeNet's ``inception3a`` module with its four
  branches collapsed into single nodes, and with every operation.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, List, Tuple

import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render import render_graph

from .models import SimpleRecurrent

PNG_DPI = "110"


class Conditional(nn.Module):
    """Python control flow on a tensor: the relu runs only when the input's mean is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if x.mean() > 0:
            y = torch.relu(y)
        return y * 2


def _examples() -> List[Tuple[str, Callable[[], Tuple[nn.Module, Any]], dict]]:
    import torchvision

    def recurrent():
        return SimpleRecurrent(), torch.rand(6, 5)

    def conditional():
        return Conditional(), torch.ones(2, 4)

    def alexnet():
        return torchvision.models.alexnet(weights=None), torch.rand(1, 3, 224, 224)

    def basic_block():
        return torchvision.models.resnet18(weights=None).layer1[0], torch.rand(1, 64, 56, 56)

    def resnet18():
        return torchvision.models.resnet18(weights=None), torch.rand(1, 3, 224, 224)

    def inception():
        model = torchvision.models.googlenet(weights=None, init_weights=True, aux_logits=False)
        return model.inception3a, torch.rand(1, 192, 28, 28)

    return [
        ("recurrent_unrolled", recurrent, {"vis_mode": "unrolled"}),
        ("recurrent_rolled", recurrent, {"vis_mode": "rolled"}),
        ("conditional", conditional, {}),
        ("alexnet", alexnet, {}),
        ("resnet_basic_block", basic_block, {}),
        ("resnet18_depth1", resnet18, {"vis_nesting_depth": 1}),
        ("inception_depth0", inception, {"vis_nesting_depth": 0}),
        ("inception_full", inception, {}),
    ]


def make_images(outdir: str = "images") -> List[str]:
    """Draw every example into ``outdir``; returns the paths written.

    Example:
        >>> paths = make_images("/tmp/torchlens_images")  # doctest: +SKIP
        >>> sorted(os.path.basename(p) for p in paths)[:2]  # doctest: +SKIP
        ['alexnet.png', 'alexnet.svg']
    """
    os.makedirs(outdir, exist_ok=True)
    written = []
    for name, factory, options in _examples():
        torch.manual_seed(0)
        model, x = factory()
        model.eval()
        start = time.perf_counter()
        history = tl.get_model_metadata(model, x, random_seed=0)
        out = os.path.join(outdir, name)
        render_graph(
            history, vis_outpath=out, vis_fileformat="png", vis_save_only=True, graph_attrs={"dpi": PNG_DPI}, **options
        )
        render_graph(history, vis_outpath=out, vis_fileformat="svg", vis_save_only=True, **options)
        written += [out + ".png", out + ".svg"]
        print(f"{out}.png/.svg: {len(history.layer_list)} tensors, {time.perf_counter() - start:.1f} s")
    return written


def main(argv: List[str]) -> None:
    make_images(argv[0] if argv else "images")


if __name__ == "__main__":
    main(sys.argv[1:])
