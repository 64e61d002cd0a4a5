"""A watched step's life (torchlens/train/step/state.py): its states change through one
transition table, an event the table does not list raises, and a real training loop walks the
states the table names; ``WatchOptions`` is one frozen value, checked once."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import torchlens as tl
from torchlens.arguments import ArgumentTypeError, ArgumentValueError
from torchlens.train import WatchOptions
from torchlens.train.step import TRANSITIONS, StepEvent, StepMachine, StepState, StepTransitionError


def test_every_event_a_state_does_not_take_raises():
    for state, event in itertools.product(StepState, StepEvent):
        m = StepMachine(log_freq=1)
        m.state = state
        if (state, event) in TRANSITIONS:
            assert m.apply(event) is TRANSITIONS[(state, event)]
        else:
            with pytest.raises(StepTransitionError, match=f"from {state.name} on {event.value}"):
                m.apply(event)
            assert m.state is state  # a refused event changes nothing


def test_finished_ends_every_state_and_a_step_begins_only_from_idle():
    assert all(TRANSITIONS[(s, StepEvent.FINISHED)] is StepState.IDLE for s in StepState)
    begins = {s for (s, e) in TRANSITIONS if e in (StepEvent.BEGIN_LOGGED, StepEvent.BEGIN_UNLOGGED)}
    assert begins == {StepState.IDLE}


def test_the_machine_logs_by_log_freq_and_only_when_the_hooks_can_run():
    m = StepMachine(log_freq=3)
    seen = []
    for step in range(4):
        m.finish()
        seen.append(m.begin(step, ready=True))
    assert seen == [StepState.LOGGED, StepState.UNLOGGED, StepState.UNLOGGED, StepState.LOGGED]
    m.finish()
    assert m.begin(6, ready=False) is StepState.UNLOGGED  # compiled code running: no hooks
    assert (m.finish(), m.state, m.next_step) == ((6, False), StepState.IDLE, 7)


def _states_of_a_step(tmp_path, log_freq, steps):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log_freq=log_freq)
    machine = w._machine
    seen = []
    try:
        for _ in range(steps):
            out = model(torch.rand(2, 3))
            seen.append(("after forward", machine.state))
            h = out.register_hook(lambda g: seen.append(("in backward", machine.state)))
            out.sum().backward()
            h.remove()
            seen.append(("after backward", machine.state))
    finally:
        w.close()
    seen.append(("closed", machine.state))
    return seen


def test_a_training_loop_walks_the_states(tmp_path):
    seen = _states_of_a_step(tmp_path, log_freq=2, steps=2)
    logged, unlogged = StepState.LOGGED, StepState.UNLOGGED
    assert seen == [
        ("after forward", logged),
        ("in backward", StepState.BACKWARD),  # the watch's hook on the output ran first: its end is awaited
        ("after backward", logged),  # the backward pass ended: the step was written
        ("after forward", unlogged),
        ("in backward", unlogged),
        ("after backward", unlogged),
        ("closed", StepState.IDLE),
    ]


def test_a_logged_backward_pass_is_awaited_until_it_ends(tmp_path):
    model = torch.nn.Linear(3, 1)
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    inside = []
    try:
        x = torch.rand(2, 3, requires_grad=True)
        out = model(x)
        x.register_hook(lambda g: inside.append(w._machine.state))  # after the model's gradients
        out.sum().backward()
        assert inside == [StepState.BACKWARD] and w._machine.state is StepState.LOGGED
    finally:
        w.close()


def test_watch_options_are_one_frozen_checked_value():
    o = WatchOptions(log="io", backend=["wandb", "tensorboard"], ignore_io_grad_classes=[torch.nn.ReLU])
    assert (o.kinds, o.backends, o.ignore_io_grad_classes) == (("io",), ("wandb", "tensorboard"), (torch.nn.ReLU,))
    assert WatchOptions(backend=None).backends == () and WatchOptions().optimizers == ()
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    assert WatchOptions(optimizer=opt).optimizers == (opt,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.log_freq = 2  # type: ignore[misc]
    with pytest.raises(ArgumentTypeError, match="port takes an int"):
        WatchOptions(port=True)
    with pytest.raises(ArgumentValueError, match="log"):
        WatchOptions(log="io2")
    assert WatchOptions(log_freq=5).stored()["log_freq"] == 5


def test_watch_refuses_a_bad_option_before_touching_the_model(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ArgumentValueError, match="on_nonfinite"):
        tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, on_nonfinite="loud")
    assert not model._forward_pre_hooks and not (tmp_path / "run").exists()


def test_a_step_is_complete_once_its_backward_came_and_no_forward_runs(tmp_path):
    """What a notebook cell asks before writing the step it ran (backends/notebook.py)."""
    model = torch.nn.Linear(3, 1)
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log_freq=2)
    try:
        out = model(torch.rand(2, 3))
        assert not w.step_complete()  # the backward is still to come
        out.sum().backward()
        assert w.step_complete()
        model(torch.rand(2, 3)).sum().backward()  # step 1: not logged
        assert not w.step_complete()
    finally:
        w.close()
    assert not w.step_complete()
