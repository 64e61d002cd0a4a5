"""What a step of ``tl.watch`` is: micro-batches of one step are overlaid into its module calls
with manual steps (as the Lightning callback does), and with the optimizer known a step is an
optimizer step, whatever the number of forwards before it."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl


def quiet_watch(model, tmp_path, **options):
    options.setdefault("backend", None)
    return tl.watch(model, run_dir=str(tmp_path / "run"), verbose=False, **options)


def _counts(run, cid, kind="io", name="output 0"):
    return run.series(cid, kind, name).count.tolist()


def test_manual_steps_overlay_the_micro_batches_of_a_step_into_one_call(tmp_path):
    """begin_step(n) once per optimizer step, three micro-batches of 32: '0:1' holds all 96 rows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with quiet_watch(model, tmp_path, manual_steps=True) as w:
        for step in range(2):
            w.begin_step(step)
            for _ in range(3):
                model(torch.randn(32, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    run = tl.open_run(w.run_dir)
    assert sorted(run.calls) == ["", "0:1", "1:1", "2:1"]  # no 0:2, 0:3
    assert run.steps.tolist() == [0, 1]
    assert _counts(run, "0:1") == [96 * 8, 96 * 8]
    assert _counts(run, "2:1") == [96, 96]


def test_manual_steps_count_a_module_called_twice_in_one_forward_as_two_calls(tmp_path):
    """Overlaying forwards leaves the calls within one forward as they are."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(self.lin(x))

    model = Twice()
    with quiet_watch(model, tmp_path, manual_steps=True) as w:
        w.begin_step(0)
        for _ in range(2):
            model(torch.randn(5, 3)).sum().backward()
    run = tl.open_run(w.run_dir)
    assert sorted(run.calls) == ["", "lin:1", "lin:2"]
    assert _counts(run, "lin:1") == _counts(run, "lin:2") == [2 * 5 * 3]


def test_with_the_optimizer_known_two_forwards_per_update_are_one_step(tmp_path):
    """4 updates with 2 forwards each: 4 steps (not 8), each with params_grad, calls overlaid."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    grads = []
    with quiet_watch(model, tmp_path, optimizer=opt) as w:
        for _ in range(4):
            opt.zero_grad()
            for _ in range(2):
                model(torch.randn(16, 4)).pow(2).mean().backward()
            grads.append(model[0].weight.grad.clone())
            opt.step()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1, 2, 3]
    assert sorted(run.calls) == ["", "0:1", "1:1", "2:1"]
    assert _counts(run, "2:1") == [32] * 4
    s = run.series("0:1", "params_grad", "weight")
    assert s.steps.tolist() == [0, 1, 2, 3]  # every step, not only odd ones
    for i, grad in enumerate(grads):  # the accumulated gradient of each update
        assert s.true_max[i] == grad.max().item()


def test_with_the_optimizer_known_log_freq_counts_updates(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with quiet_watch(model, tmp_path, optimizer=opt, log_freq=2) as w:
        for _ in range(5):
            for _ in range(3):
                model(torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 2, 4]
    assert _counts(run, "") == [6, 6, 6]
