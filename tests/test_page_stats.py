"""The graph page's statistics (a histogram and moments per saved activation) are the values' own,
also where an op's are taken from its parent. What building the page costs next to the trace is
measured by ``benchmarks/page_build_cost.py`` (a timing, not a test)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render.graph_page.data import page_data
from torchlens.web.stats import tensor_stats


class Rearranges(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 12)

    def forward(self, x):
        y = self.fc(x)
        z = y.view(3, 2, 12).transpose(1, 2).contiguous()  # the same values, rearranged
        w = z.view(-1)
        w.mul_(2)  # in place: a new op with new values
        return w.unsqueeze(0), z.flatten() + 1


def test_every_ops_statistics_are_of_its_own_values():
    h = tl.log_forward_pass(Rearranges(), torch.randn(6, 6), random_seed=0)
    ops = page_data(h)["ops"]
    assert [op["label"] for op in ops] == h.layer_labels
    for op in ops:
        own = tensor_stats(h[op["label"]].activation)
        assert op["stats"]["hist"] == own["hist"], op["label"]
        for key in ("n", "min", "max", "mean", "std", "zeros", "nonfinite"):
            assert op["stats"][key] == pytest.approx(own[key], rel=1e-6, abs=1e-9), (
                op["label"],
                key,
            )  # summation order


def test_tensor_stats_counts_and_bins():
    s = tensor_stats(torch.tensor([0.0, 0.0, 1.0, 3.0, float("nan"), float("inf")]), bins=3)
    assert (s["n"], s["nonfinite"], s["min"], s["max"], s["hist"]) == (6, 2, 0.0, 3.0, [2, 1, 1])
    assert s["zeros"] == pytest.approx(2 / 6) and s["mean"] == pytest.approx(1.0)
    assert s["std"] == pytest.approx(torch.tensor([0.0, 0.0, 1.0, 3.0]).std(correction=0).item())
    ints = tensor_stats(torch.arange(10))
    assert ints["min"] == 0 and ints["max"] == 9 and sum(ints["hist"]) == 10
    assert tensor_stats(torch.full((4,), 2.0, dtype=torch.bfloat16))["hist"] == [4]
    assert tensor_stats(torch.zeros(2, 0)) == {"n": 0, "nonfinite": 0}
