"""save_gradients=True: every layer the gradient flowed through has it on its entry."""

import gc
import weakref

import torch
from torch import nn

import torchlens as tl


class Loop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.fc(x))
        return x


def test_gradients_match_autograd_per_pass():
    torch.manual_seed(0)
    model = Loop()
    x = torch.rand(2, 3, requires_grad=True)
    h = tl.log_forward_pass(model, x, save_gradients=True)
    out = model(x)  # the same computation by hand, keeping intermediate gradients
    assert all(e.gradient is None for e in h)
    h["output_1_3"].activation.sum().backward()

    x2 = x.detach().clone().requires_grad_(True)
    steps, y = [], x2
    for _ in range(3):
        z = model.fc(y)
        z.retain_grad()
        y = torch.tanh(z)
        y.retain_grad()
        steps.append((z, y))
    y.sum().backward()
    for p, (z, t) in enumerate(steps, 1):
        assert torch.allclose(h[f"linear_1_1:{p}"].gradient, z.grad)
        assert torch.allclose(h[f"tanh_1_2:{p}"].gradient, t.grad)
    assert torch.allclose(h["input_1_0"].gradient, x2.grad)
    assert out.shape == h["output_1_3"].shape


def test_inplace_ops_each_get_their_gradient():
    class Inplace(nn.Module):
        def forward(self, x):
            y = x * 2
            y.mul_(3)
            return y.sum()  # a 0-d output

    x = torch.ones(3, requires_grad=True)
    h = tl.log_forward_pass(Inplace(), x, save_gradients=True)
    assert h.layer_labels == ["input_1_0", "mul_1_1", "mul_2_2", "sum_1_3", "output_1_4"]
    h["output_1_4"].activation.backward()
    assert torch.equal(h["mul_2_2"].gradient, torch.ones(3))
    assert torch.equal(h["mul_1_1"].gradient, torch.full((3,), 3.0))
    assert torch.equal(h["input_1_0"].gradient, torch.full((3,), 6.0))
    assert h["output_1_4"].gradient.shape == ()
    text = str(h["mul_1_1"])
    assert "Gradient: shape=(3,), dtype=torch.float32, size=12 B" in text
    frame = h.to_pandas()
    assert frame.set_index("label").loc["mul_1_1", "has_gradient"]


def test_backward_from_an_intermediate_layer_twice_and_never():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    h = tl.log_forward_pass(model, torch.rand(4, 2), save_gradients=True)
    relu = h["relu_1_2"].activation
    relu.sum().backward(retain_graph=True)
    assert h["linear_2_3"].gradient is None  # downstream of the starting point: no gradient
    first = h["linear_1_1"].gradient.clone()
    relu.sum().backward()
    assert torch.allclose(h["linear_1_1"].gradient, 2 * first)  # accumulates like .grad
    never = tl.log_forward_pass(model, torch.rand(4, 2), save_gradients=True)
    assert all(e.gradient is None for e in never) and "Gradient" not in str(never["relu_1_2"])


def test_without_save_gradients_no_hooks_are_left():
    model = nn.Linear(2, 2)
    h = tl.log_forward_pass(model, torch.rand(1, 2))
    h["output_1_2"].activation.sum().backward()
    assert all(e.gradient is None for e in h)


def test_histories_with_save_gradients_are_freed():
    """The gradient hooks live in the autograd graph; they must not keep their history alive
    (a cycle through C++ autograd nodes that gc cannot break leaked every history)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(144, 2))
    x = torch.rand(2, 3, 10, 10, requires_grad=True)
    saved = []
    for i in range(50):
        h = tl.log_forward_pass(model, x, save_gradients=True)
        saved.append(weakref.ref(h["conv2d_1_1"].activation))
        if i % 2:
            h["output_1_6"].activation.sum().backward()
        del h
    gc.collect()
    assert sum(ref() is not None for ref in saved) == 0
    assert not x._backward_hooks  # the hooks of dead histories are removed from the input
    assert all(p.grad is not None for p in model.parameters())


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.b = nn.Linear(3, 2)
        self.use_reentrant = use_reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.b(checkpoint(self.block, self.a(x), use_reentrant=self.use_reentrant))


def test_layers_inside_a_reentrant_checkpoint_say_they_get_no_gradient():
    from torchlens.trace.render import build_dot

    torch.manual_seed(0)
    h = tl.log_forward_pass(Checkpointed(True), torch.rand(2, 3, requires_grad=True), save_gradients=True)
    h[h.output_layers[0]].activation.sum().backward()
    inside = ["linear_2_2", "relu_1_3"]
    assert [e.label for e in h if e.gradient is None] == inside
    assert [e.label for e in h if e.gradient_note] == inside
    assert "use_reentrant=True" in h["relu_1_3"].gradient_note and "Gradient: none" in str(h["relu_1_3"])
    assert len(h.notes) == 1 and "2 layers ran inside torch.utils.checkpoint" in h.notes[0]
    assert "use_reentrant=False" in str(h) and h.to_pandas()["gradient_note"].notna().sum() == 2
    assert "no gradient (reentrant checkpoint)" in build_dot(h).source
    plain = tl.log_forward_pass(Checkpointed(False), torch.rand(2, 3, requires_grad=True), save_gradients=True)
    plain[plain.output_layers[0]].activation.sum().backward()
    assert all(e.gradient is not None for e in plain) and not plain.notes  # non-reentrant: recorded
    assert not tl.log_forward_pass(Checkpointed(True), torch.rand(2, 3)).notes  # no gradients asked: no note
