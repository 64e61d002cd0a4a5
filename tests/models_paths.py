"""Catalogue models that compute through paths other than the public torch functions: fused fast
paths (private torch functions), ``torch.ops`` operators (aten, torchvision, ``torch.library``
custom operators), ``torch.sparse``, functorch transforms and parametrizations.

Plain models, like ``models.py`` (whose ``REGISTRY`` includes ``PATHS_REGISTRY``). Before
torchlens traced these paths, each of them left an operation without the parent it was computed
from.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn


# A custom operator, as a C++/CUDA extension would register one (here with a Python kernel).
@torch.library.custom_op("torchlens_catalogue::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor, shift: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + shift


class FusedEncoder(nn.Module):
    """A frozen ``nn.TransformerEncoder`` in eval mode with a padding mask: torch takes its fast
    path (``torch._transformer_encoder_layer_fwd`` per layer) even with gradients enabled, since
    no parameter requires grad. (Nested tensors, the default, are in tests/test_coverage.py:
    torch warns that they are a prototype.)"""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.requires_grad_(False)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding)


class FusedAttention(nn.Module):
    """A frozen ``nn.MultiheadAttention`` in eval mode: ``torch._native_multi_head_attention``."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.requires_grad_(False)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0] * 2


class RoiAlignNms(nn.Module):
    """A detection head in miniature: ``torchvision.ops.roi_align`` and ``nms`` (torch.ops.torchvision)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image, boxes):
        features = self.conv(image)
        pooled = torchvision.ops.roi_align(features, [boxes], output_size=2)
        keep = torchvision.ops.nms(boxes, pooled.mean((1, 2, 3)), 0.5)
        return pooled[keep].flatten(1)


class AtenOps(nn.Module):
    """``torch.ops.aten`` called directly: an overload, a packet, and an in-place overload."""

    def forward(self, x):
        y = torch.ops.aten.add.Tensor(x, x.exp())
        z = torch.ops.aten.mul(y, 3)
        torch.ops.aten.add_.Tensor(z, 1)
        return z.relu()


class CustomOp(nn.Module):
    """A ``torch.library`` custom operator between two ordinary operations."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return scale_shift(self.fc(x), x.sin(), 2.0).tanh()


class SparseMatmul(nn.Module):
    """``torch.sparse.mm`` of a sparse tensor made from the input."""

    def forward(self, x):
        sparse = (x * (x > 0)).to_sparse()
        return torch.sparse.mm(sparse, x.t()) + 1


class Vmapped(nn.Module):
    """``torch.vmap`` inside forward, and a function vmapped once when the model was built."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.per_row = torch.vmap(lambda row: row.sin() * row.sum())

    def forward(self, x):
        y = torch.vmap(lambda row: row.cos() + row.max())(self.fc(x))
        return self.per_row(y) * 2


class WeightNormLinear(nn.Module):
    """``parametrizations.weight_norm``: the weight is ``torch._weight_norm(v, g)`` at every call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))

    def forward(self, x):
        return self.fc(x).relu()


def _boxes() -> torch.Tensor:
    return torch.tensor([[0.0, 0.0, 6.0, 6.0], [1.0, 1.0, 7.0, 7.0], [4.0, 2.0, 9.0, 9.0]])


def _padding() -> torch.Tensor:
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, -2:] = True
    return padding


def paths_registry(seeded, inputs, randn):
    """``(name, model_factory, inputs_factory)`` entries, built with ``models.py``'s helpers."""
    return [
        ("fused_encoder", seeded(FusedEncoder, train=False), inputs(randn(2, 5, 8), _padding())),
        ("fused_attention", seeded(FusedAttention, train=False), inputs(randn(2, 5, 8))),
        (
            "roi_align_nms",
            seeded(RoiAlignNms),
            inputs(torch.rand(1, 3, 10, 10, generator=torch.Generator().manual_seed(3)), _boxes()),
        ),
        ("aten_ops", seeded(AtenOps), inputs(randn(2, 3))),
        ("custom_op", seeded(CustomOp), inputs(randn(2, 4))),
        ("sparse_matmul", seeded(SparseMatmul), inputs(randn(3, 3))),
        ("vmapped", seeded(Vmapped), inputs(randn(4, 3))),
        ("weight_norm", seeded(WeightNormLinear), inputs(randn(2, 4))),
    ]
