"""``run_a.compare(run_b)``: exact statistics decide before sampled histograms."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl


def _train(folder, lr: float, steps: int = 4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(1)
    with tl.watch(model, run_dir=str(folder), backend=None, verbose=False) as w:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(32, 8, generator=data)).pow(2).mean().backward()
            opt.step()
    return tl.open_run(w.run_dir)


def test_a_thousandfold_learning_rate_differs_at_the_first_step_after_it(tmp_path):
    """Adam's lr 0.1 vs 1e-4, nothing else: every weight and every output after the first update
    differs at step 1 (the histograms of a sample of 100 alone left the first Linear's output
    within the sampling noise, distance 0.09, and no differing step)."""
    fast, slow = _train(tmp_path / "fast", 0.1), _train(tmp_path / "slow", 1e-4)
    found = {(c.call_id, c.kind, c.name): c for c in fast.compare(slow)}
    for key in [("0:1", "io", "output 0"), ("0:1", "params", "weight"), ("2:1", "params", "bias")]:
        assert found[key].first_step == 1, (key, found[key])
        assert found[key].detail and " vs " in found[key].detail
    assert found[("0:1", "io", "input 0")].first_step is None  # the data is the same
    assert found[("0:1", "io", "output 0")].steps_compared == 2  # step 0 was the same, step 1 not


def test_the_same_training_twice_does_not_differ(tmp_path):
    a, b = _train(tmp_path / "a", 1e-3), _train(tmp_path / "b", 1e-3)
    rows = a.compare(b)
    assert all(c.first_step is None and c.detail is None for c in rows)
    # every series with values compared at every step; the data's gradients (off) have none
    assert {(c.call_id, c.name) for c in rows if c.steps_compared != 4} == {("", "input 0"), ("0:1", "input 0")}
    assert all(c.steps_compared == 0 and c.kind == "io_grad" for c in rows if c.steps_compared != 4)
