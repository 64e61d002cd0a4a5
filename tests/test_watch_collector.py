"""A logged forward pass runs with automatic garbage collection paused (as a traced pass does),
and the collector is as the user left it once the forward has ended, however it ended."""

import gc

import pytest
import torch
from torch import nn

import torchlens as tl


class Probe(nn.Module):
    """Notes whether automatic collection is on while its forward runs; raises on request."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.seen = []
        self.fail = None

    def forward(self, x):
        self.seen.append(gc.isenabled())
        if self.fail is not None:
            raise self.fail
        return self.lin(x)


def _watch(model, tmp_path, **options):
    return tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, **options)


def _step(model, opt):
    loss = model(torch.randn(2, 3)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_paused_in_logged_forwards_only_and_enabled_after_each(tmp_path):
    model = Probe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _watch(model, tmp_path, log_freq=2):
        for _ in range(4):
            _step(model, opt)
            assert gc.isenabled()
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 3))  # evaluation logs nothing
    assert model.seen[-5:] == [False, True, False, True, True]  # steps 0 and 2 logged
    assert gc.isenabled()


@pytest.mark.parametrize("error", [RuntimeError("in the model"), KeyboardInterrupt()])
def test_a_forward_that_raises_leaves_the_collector_enabled(tmp_path, error):
    """An error reaches the post-hook (always called): enabled at once. KeyboardInterrupt skips
    torch's always-called hooks: the next flush, forward or close enables it."""
    model = Probe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = _watch(model, tmp_path)
    try:
        _step(model, opt)
        model.fail = error
        with pytest.raises(type(error)):
            _step(model, opt)
        if isinstance(error, KeyboardInterrupt):
            w.flush()
        assert gc.isenabled()
        model.fail = None
        _step(model, opt)  # the next step is logged as usual
        assert gc.isenabled() and model.seen[-1] is False
    finally:
        w.close()
    assert gc.isenabled()


def test_a_collector_the_user_disabled_stays_disabled(tmp_path):
    model = Probe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gc.disable()
    try:
        with _watch(model, tmp_path):
            _step(model, opt)
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_steps_after_a_keyboard_interrupt_in_a_forward_are_logged(tmp_path, error):
    """Ctrl-C inside a logged forward (a notebook cell stopped): torch skips the post-hooks, so
    the watch took every later call of the model for a call of itself and logged nothing more.
    The next call finds no call of the model running and goes on as after any error: the
    stopped step has no values, the next ones are logged."""
    model = Probe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _watch(model, tmp_path) as w:
        _step(model, opt)
        model.fail = error()
        with pytest.raises(error):
            _step(model, opt)
        model.fail = None
        for _ in range(3):
            _step(model, opt)
        assert gc.isenabled()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1, 2, 3, 4]
    assert run.series("lin:1", "params_grad", "weight").steps.tolist() == [0, 2, 3, 4]


class CallsItself(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.depth = 0

    def forward(self, x):
        self.depth += 1
        try:
            return self.lin(x) if self.depth > 1 else self(self.lin(x))
        finally:
            self.depth -= 1


def test_a_model_calling_itself_is_still_one_forward(tmp_path):
    model = CallsItself()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _watch(model, tmp_path) as w:
        for _ in range(2):
            _step(model, opt)
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1]
    assert "lin:2" in run.calls and ":2" not in "".join(c for c in run.calls if not c.startswith("lin"))
