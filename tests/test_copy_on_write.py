"""Saved activations are not copied until something could write into them (capture/shared.py),
and every saved value is still the one the operation produced."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.seen = None

    def forward(self, x):
        h = self.fc(x)
        self.seen = h
        v = h[:, :2]  # a view: writing into it writes into h
        torch.relu_(h)
        v.mul_(3)
        buf = x * 0
        torch.add(h.detach(), 1, out=buf)  # out= writes into the saved x * 0
        return h + buf


def test_the_saved_value_is_the_one_before_each_write():
    model, x = InPlace(), torch.randn(2, 4)
    h = tl.log_forward_pass(model, x, random_seed=0)
    linear = model.fc(x).detach()
    assert torch.equal(h["linear_1_1"].activation, linear)  # before relu_ and mul_ wrote into it
    relu = torch.relu(linear)
    relu_entry = next(e for e in h if e.func_name == "relu_")
    assert torch.equal(relu_entry.activation, relu)  # before mul_ wrote into its first two columns
    mul_entry = next(e for e in h if e.func_name == "mul_")
    assert torch.equal(mul_entry.activation, relu[:, :2] * 3)
    times_zero = next(e for e in h if e.func_name == "__mul__")
    assert torch.equal(times_zero.activation, torch.zeros(2, 4))  # before out= wrote into it
    assert not any("second time" in note for note in h.notes)  # each write was seen coming: one pass
    assert tl.validate_model_activations(InPlace(), x, random_seed=0)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def test_activations_nobody_writes_into_are_not_copied():
    model, x = Plain(), torch.randn(2, 4)
    produced = {}
    model.fc1.register_forward_hook(lambda m, i, out: produced.setdefault("fc1", out))
    h = tl.log_forward_pass(model, x)
    assert h["linear_1_1"].activation.data_ptr() == produced["fc1"].data_ptr()  # the same memory
    assert h["linear_1_1"].activation.grad_fn is not None  # still part of the graph, as the model's tensor


def test_writing_into_inputs_and_outputs_after_the_pass_changes_nothing():
    model, x = Plain(), torch.randn(2, 4)
    h = tl.log_forward_pass(model, x)
    expected_in, expected_out = x.clone(), model(x).detach()
    out_entry = h[h.output_layers[0]]
    last_op = h[out_entry.parent_layers[0]]
    x.add_(100)  # e.g. a data loader reusing its input buffer
    with torch.no_grad():
        model.fc2.weight.zero_()  # an optimizer step
    assert torch.equal(h["input_1_0"].activation, expected_in)
    assert torch.allclose(out_entry.activation, expected_out) and torch.allclose(last_op.activation, expected_out)


def test_the_output_of_a_history_is_not_copied():
    # log_forward_pass hands the model's output to no one: nothing can write into it afterwards
    model, x = Plain(), torch.randn(2, 4)
    produced = {}
    model.fc2.register_forward_hook(lambda m, i, out: produced.setdefault("fc2", out))
    h = tl.log_forward_pass(model, x)
    out_entry = h[h.output_layers[0]]
    last_op = h[out_entry.parent_layers[0]]
    assert out_entry.activation.data_ptr() == last_op.activation.data_ptr() == produced["fc2"].data_ptr()


def test_a_pass_that_hands_out_its_output_copies_it_once():
    from torchlens.trace.capture.save_plan import SavePlan
    from torchlens.trace.traced_pass import traced_pass

    model, x = Plain(), torch.randn(2, 4)
    expected = model(x).detach()
    traced = traced_pass(model, (x,), {}, SavePlan(save_all=True), seed=0)
    h = traced.history
    out_entry = h[h.output_layers[0]]
    last_op = h[out_entry.parent_layers[0]]
    with torch.no_grad():
        traced.output.add_(100)  # the caller's output is not the saved one
    assert torch.equal(out_entry.activation, expected) and torch.equal(last_op.activation, expected)
    assert out_entry.activation.data_ptr() == last_op.activation.data_ptr()  # one copy for both


class KeepsState(nn.Module):
    """Stores an intermediate on itself and writes into it in a later call (a static cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = None

    def forward(self, x):
        y = x * 2
        if self.cache is None:
            self.cache = y
        else:
            self.cache.add_(x)
        return y + 1


def test_tensors_the_model_keeps_are_copied_at_the_end():
    model, x = KeepsState(), torch.ones(3)
    h = tl.log_forward_pass(model, x)
    model(torch.ones(3))  # the next call writes into the kept tensor
    assert torch.equal(h["mul_1_1"].activation, torch.full((3,), 2.0))


class KeepsStateBesideScalars(nn.Module):
    """Keeps an intermediate in a tuple beside plain numbers, and a tuple of numbers alone
    (``kernel_size``-like), and writes into the intermediate in a later call."""

    def __init__(self) -> None:
        super().__init__()
        self.size = (3, 3)
        self.cache = None

    def forward(self, x):
        y = x * 2
        if self.cache is None:
            self.cache = (1, 2.0, "step", y)
        else:
            self.cache[-1].add_(x)
        return y + 1


def test_a_tensor_kept_in_a_tuple_beside_scalars_is_copied_at_the_end():
    model, x = KeepsStateBesideScalars(), torch.ones(3)
    h = tl.log_forward_pass(model, x)
    model(torch.ones(3))  # the next call writes into the kept tensor
    assert torch.equal(h["mul_1_1"].activation, torch.full((3,), 2.0))


class UnseenWrite(nn.Module):
    def forward(self, x):
        y = x * 2
        torch._C.TensorBase.mul_(y, 0)  # an in-place call torchlens does not trace
        return y + 1


def test_a_write_torchlens_cannot_see_reruns_the_pass_copying():
    h = tl.log_forward_pass(UnseenWrite(), torch.ones(3))
    assert torch.equal(h["mul_1_1"].activation, torch.full((3,), 2.0))  # as computed, before the write
    assert any("run a second time, copying every activation" in note for note in h.notes)


class UnseenWriteAndInputWrite(nn.Module):
    def forward(self, x):
        x.add_(1)
        y = x * 2
        torch._C.TensorBase.mul_(y, 0)
        return y + 1


def test_a_rerun_that_would_start_elsewhere_is_refused_with_the_way_out():
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="activation_postfunc=lambda t: t"):
        tl.log_forward_pass(UnseenWriteAndInputWrite(), x)
    h = tl.log_forward_pass(UnseenWriteAndInputWrite(), torch.ones(3), activation_postfunc=lambda t: t)
    assert torch.equal(h["mul_1_2"].activation, torch.full((3,), 4.0))


def _bn_stack() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))


def _aten_counts(run) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    counts: dict = {}
    for event in prof.events():
        counts[event.name] = counts.get(event.name, 0) + 1
    return counts


@pytest.fixture
def copies_together_on_the_cpu(monkeypatch):
    """The CPU treated as a GPU is: buffers kept until the end, copies made together."""
    from torchlens.trace.capture import copy_on_write

    monkeypatch.setattr(copy_on_write, "CPU_COPIES_AT_ONCE", False)


def test_on_the_cpu_each_buffer_is_copied_when_first_read():
    counts = _aten_counts(lambda: tl.log_forward_pass(_bn_stack().eval(), torch.randn(2, 3, 8, 8)))
    assert counts.get("aten::clone") == 5 and "aten::_foreach_copy_" not in counts  # 4 buffers, the input


@pytest.mark.usefixtures("copies_together_on_the_cpu")
def test_the_buffers_of_an_eval_model_are_copied_together_at_the_end():
    model, x = _bn_stack().eval(), torch.randn(2, 3, 8, 8)
    before = {name: b.clone() for name, b in model.named_buffers()}
    counts = _aten_counts(lambda: tl.log_forward_pass(model, x))
    # four buffer records (the running mean and variance of each BatchNorm; eval mode reads no
    # counter) and the input the caller holds: one multi-tensor copy, no copy of its own each
    assert counts.get("aten::_foreach_copy_") == 1 and "aten::clone" not in counts
    h = tl.log_forward_pass(model, x)
    model.train()(torch.randn(2, 3, 8, 8) * 5)  # training moves the running statistics in place
    for address, value in before.items():
        if address.endswith("num_batches_tracked"):
            continue  # never read in eval mode: no record
        assert torch.equal(h[address].activation, value)
        assert not torch.equal(model.get_buffer(address), value)


@pytest.mark.usefixtures("copies_together_on_the_cpu")
def test_the_buffers_of_a_training_model_hold_their_values_before_the_update():
    model, x = _bn_stack().train(), torch.randn(2, 3, 8, 8)
    mean = model[1].running_mean.clone()
    h = tl.log_forward_pass(model, x)
    assert torch.equal(h["1.running_mean"].activation, mean)
    assert not torch.equal(model[1].running_mean, mean)  # the pass itself updated it


class WritesItsBufferUnseen(nn.Module):
    """A module of the user's (its forward unknown to torchlens) that updates a buffer in eval
    mode through a call torchlens does not trace."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        y = x + self.count
        torch._C.TensorBase.add_(self.count, 1)
        return y


@pytest.mark.usefixtures("copies_together_on_the_cpu")
def test_a_buffer_the_user_s_module_writes_unseen_keeps_its_value_without_a_second_pass():
    model = WritesItsBufferUnseen().eval()
    h = tl.log_forward_pass(model, torch.ones(3))
    assert torch.equal(h["count"].activation, torch.zeros(3))
    assert torch.equal(model.count, torch.ones(3))
    assert not any("second time" in note for note in h.notes)


@pytest.mark.usefixtures("copies_together_on_the_cpu")
def test_copies_equal_clones_whatever_the_tensors():
    from torchlens.trace.capture.copy_on_write import copies

    w = torch.randn(3, 4, requires_grad=True)
    tensors = [
        torch.randn(4, 5).t(),  # not contiguous: the copy keeps clone's layout
        torch.tensor([-0.0, float("nan"), float("inf")]),
        torch.arange(6).reshape(2, 3),
        torch.tensor([True, False]),
        torch.randn(2, dtype=torch.complex64),
        w * 2,  # autograd history: cloned, the copy keeps it
        torch.randn(3),
    ]
    made = copies(tensors)
    for t, c in zip(tensors, made):
        clone = t.clone()
        assert c.dtype == t.dtype and c.stride() == clone.stride() and c.data_ptr() != t.data_ptr()
        bits = (lambda v: v.contiguous().view(torch.uint8)) if c.dtype.is_floating_point else (lambda v: v)
        assert torch.equal(bits(c), bits(clone))  # bit for bit: -0.0 and NaN as they were
    assert made[5].grad_fn is not None and not made[0].requires_grad
