"""io_grad of a call's input is what that call sends back into it (its grad_input), not the
input's total gradient; the data gets a gradient strip through an alias; a gradient series
without values says why; training stays bitwise the same."""

from __future__ import annotations

import copy
import sqlite3

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.web.stats import histograms


def quiet_watch(model, folder, **options):
    options.setdefault("backend", None)
    options.setdefault("sample_n", None)  # every value: histograms compare exactly
    options.setdefault("reject_outlier_proportion", 0.0)
    return tl.watch(model, run_dir=str(folder), verbose=False, **options)


def norms(grad: torch.Tensor) -> torch.Tensor:
    """Per-sample L2 norms, as the gradient strips hold them."""
    return grad.detach().reshape(grad.shape[0], -1).norm(dim=1)


def assert_strip_holds(series, expected: torch.Tensor) -> None:
    """The one column of ``series`` is the histogram of ``expected`` (a 1-d tensor)."""
    want = histograms([expected.float()], 0.0)
    assert series.steps.tolist() == [0]
    np.testing.assert_allclose(series.min, want.lo, rtol=1e-5)
    np.testing.assert_allclose(series.max, want.hi, rtol=1e-5)
    assert series.counts.sum() == expected.numel()
    assert np.array_equal(series.counts, want.counts)


class Block(nn.Module):
    """Two inputs; with ``inplace`` it changes its first input in place after reading it."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.inplace = inplace

    def forward(self, x, y):
        out = self.a(y) * (x * 2)  # reads x in a way whose backward does not need x itself
        if self.inplace:
            x.relu_()
            return out + x
        return out + x.relu()


class Skip(nn.Module):
    """``h`` feeds the block twice (directly and through tanh) and a skip around it."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.blk = Block(inplace)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.lin(x)
        skip = h * 3
        return self.head(self.blk(h, torch.tanh(h)) + skip)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def by_hand(model: Skip, x: torch.Tensor):
    """On a copy: the block's grad_input (autograd w.r.t. leaves standing in for its inputs)
    and the total gradient of ``h`` (the block's first input)."""
    twin = copy.deepcopy(model)
    leaves, total = [], []

    def pre(module, args):
        leaves[:] = [a.detach().requires_grad_() for a in args]
        return tuple(leaf.clone() for leaf in leaves)  # a clone: the block may change it in place

    twin.blk.register_forward_pre_hook(pre)
    share = torch.autograd.grad(loss_of(twin(x)), leaves)

    twin2 = copy.deepcopy(model)

    def keep_total(module, args, out):  # registered before the block can change h in place
        out.register_hook(total.append)

    twin2.lin.register_forward_hook(keep_total)
    loss_of(twin2(x)).backward()
    return share, total[0]


@pytest.mark.parametrize("inplace", [False, True], ids=["plain", "inplace"])
def test_input_gradient_is_what_the_call_sends_back_not_the_total(tmp_path, inplace):
    torch.manual_seed(0)
    model = Skip(inplace)
    x = torch.randn(6, 3)
    share, total = by_hand(model, x)
    assert not torch.allclose(norms(share[0]), norms(total), rtol=1e-3)  # the skip makes them differ
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(x)).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("blk:1", "io_grad", "input 0"), norms(share[0]))
    assert_strip_holds(run.series("blk:1", "io_grad", "input 1"), norms(share[1]))
    # the output of lin is h itself: what arrives there is the total
    assert_strip_holds(run.series("lin:1", "io_grad", "output 0"), norms(total))


def test_inplace_relu_module_input_gradient(tmp_path):
    """A ReLU(inplace=True) module changes its whole input: its share is the ReLU's grad_input."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    twin = copy.deepcopy(model)
    h = twin[0](x)
    after = torch.relu(h)
    grad_after = torch.autograd.grad(loss_of(twin[2](after)), after, retain_graph=True)[0]
    expected = torch.autograd.grad(after, h, grad_after)[0]
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(x)).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("1:1", "io_grad", "input 0"), norms(expected))
    assert_strip_holds(run.series("1:1", "io_grad", "output 0"), norms(grad_after))


class ReadBeforeActivation(nn.Module):
    """Its hidden tensor is read twice before an in-place activation changes it."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.lin, self.act, self.out = nn.Linear(3, 4), act, nn.Linear(4, 2)

    def forward(self, x):
        h = self.lin(x)
        early = h * 3  # a use of h's old value, outside the activation's call
        return self.out(self.act(h)) + early[:, :2]


class MyReLU(nn.ReLU):
    """A subclass may do anything in forward: it gets an alias like any module."""


@pytest.mark.parametrize("act", [nn.ReLU(inplace=True), nn.SiLU(inplace=True), MyReLU(inplace=True)])
def test_an_inplace_activation_input_gets_its_own_share_only(tmp_path, act):
    torch.manual_seed(0)
    model = ReadBeforeActivation(act)
    x = torch.randn(6, 3)
    twin = copy.deepcopy(model)
    h = twin.lin(x)
    after = twin.act.__class__()(h)  # out of place: h keeps its old value
    loss = loss_of(twin.out(after) + (h * 3)[:, :2])
    grad_after, grad_h = torch.autograd.grad(loss, [after, h], retain_graph=True)
    expected = torch.autograd.grad(after, h, grad_after)[0]  # without the early use's share
    plain = copy.deepcopy(model)
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(x)).backward()
    w.close()
    loss_of(plain(x)).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), plain.parameters()))
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("act:1", "io_grad", "input 0"), norms(expected))
    assert_strip_holds(run.series("act:1", "io_grad", "output 0"), norms(grad_after))
    assert_strip_holds(run.series("lin:1", "io_grad", "output 0"), norms(grad_h))  # both uses


def test_an_inplace_activation_that_changes_nothing_says_why(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    model[1].forward = lambda x: x  # its forward replaced: the input comes back unchanged
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(torch.randn(4, 3))).backward()
    w.close()
    s = tl.open_run(w.run_dir).series("1:1", "io_grad", "input 0")
    assert s.steps.tolist() == [] and "left its input unchanged" in s.reason


class Quantize(nn.Module):
    def forward(self, x):
        return x.round().long()  # stops the gradient


class StopsGradient(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.quant = Quantize()

    def forward(self, x):
        h = self.lin(x)
        return h + self.quant(h).float()  # h also reaches the loss around the quantizer


def test_a_call_that_stops_the_gradient_has_no_input_gradient_and_says_why(tmp_path):
    torch.manual_seed(0)
    model = StopsGradient()
    w = quiet_watch(model, tmp_path / "run")
    for _ in range(2):
        loss_of(model(torch.randn(5, 3))).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    for name in ("input 0", "output 0"):
        s = run.series("quant:1", "io_grad", name)
        assert s.steps.tolist() == [] and s.counts.shape[0] == 0
        assert s.reason == "no gradient: this call's output is not differentiable"
    lin = run.series("lin:1", "io_grad", "output 0")
    assert lin.steps.tolist() == [0, 1] and lin.reason is None


def test_the_data_gets_a_gradient_strip(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(7, 3)
    leaf = x.clone().requires_grad_()
    expected = torch.autograd.grad(loss_of(copy.deepcopy(model)(leaf)), leaf)[0]
    w = quiet_watch(model, tmp_path / "run", input_grads=True)
    loss_of(model(x)).backward()
    w.close()
    assert not x.requires_grad and x.grad is None  # the user's batch is untouched
    assert all(p.grad is not None for p in model.parameters())
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("", "io_grad", "input 0"), norms(expected))
    assert_strip_holds(run.series("0:1", "io_grad", "input 0"), norms(expected))
    assert run.options["input_grads"] is True


@pytest.mark.parametrize("options", [{}, {"input_grads": False}], ids=["default", "off"])
def test_input_grads_off_says_why(tmp_path, options):
    """Off by default: the watch adds no gradient work training does not do itself. The data's
    series say so wherever the data goes in (the model, its first call); an input made from the
    data that needs no gradient either is only that."""

    class Rounded(nn.Module):
        def forward(self, x):
            return x.round()

    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    model.add_module("3", Rounded())  # beside the chain: fed the data, its output feeds 4
    model.add_module("4", nn.Linear(3, 2))

    def forward(x):
        return model[2](model[1](model[0](x))) + model[4](model[3](x))

    model.forward = forward
    w = quiet_watch(model, tmp_path / "run", **options)
    loss_of(model(torch.randn(4, 3))).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    off = "no gradient: input does not require grad and input gradients are off"
    for cid in ("", "0:1", "3:1"):  # the data itself
        s = run.series(cid, "io_grad", "input 0")
        assert s.steps.tolist() == [] and s.reason.startswith(off), cid
        assert "input_grads=True" in s.reason  # what to do about it
    assert run.options["input_grads"] is False
    assert run.series("4:1", "io_grad", "input 0").reason == "no gradient: this input does not require grad"
    assert run.series("1:1", "io_grad", "input 0").steps.tolist() == [0]


def test_the_same_tensor_twice_stays_the_same_tensor(tmp_path):
    """One alias per distinct tensor: ``query is key`` checks inside the call still hold."""
    seen = []

    class SelfAttention(nn.Module):
        def forward(self, q, k):
            seen.append(q is k)
            return q * k

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.attn = SelfAttention()

        def forward(self, x):
            h = self.lin(x)
            return self.attn(h, h)

    model = Net()
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(torch.randn(4, 3))).backward()
    w.close()
    assert seen == [True, True]  # the metadata pass, then the logged pass
    run = tl.open_run(w.run_dir)
    both = [run.series("attn:1", "io_grad", f"input {i}") for i in (0, 1)]
    assert np.array_equal(both[0].counts, both[1].counts) and both[0].steps.tolist() == [0]


def _resnet():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10)


def _train(model, batches, seed=3):
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x in batches:
        loss = loss_of(model(x))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_resnet18_inplace_trains_bitwise_the_same_and_hooks_go(tmp_path):
    plain = _resnet()
    assert any(getattr(m, "inplace", False) for m in plain.modules())  # in-place ReLUs, not disabled
    watched = copy.deepcopy(plain)
    torch.manual_seed(1)
    batches = [torch.randn(2, 3, 32, 32) for _ in range(3)]
    kept = [b.clone() for b in batches]
    _train(plain, batches)
    # the data's gradient too: training stays bitwise the same with its alias in the graph
    w = quiet_watch(watched, tmp_path / "run", sample_n=100, reject_outlier_proportion=0.1, input_grads=True)
    _train(watched, batches)
    w.close()
    for (name, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) and not b.requires_grad for a, b in zip(kept, batches))
    for m in watched.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks), m
    for p in watched.parameters():
        assert not p._backward_hooks and not p._post_accumulate_grad_hooks
    run = tl.open_run(w.run_dir)
    assert len(run.steps) == 3
    for cid in ("", "conv1:1", "relu:1", "layer1.0.relu:1", "layer1.0.relu:2", "layer1.0:1"):
        assert run.series(cid, "io_grad", "input 0").counts.sum(axis=1).tolist() == [2, 2, 2], cid


def test_runs_written_before_reasons_stay_readable(tmp_path):
    model = nn.Linear(3, 2)
    w = quiet_watch(model, tmp_path / "run", input_grads=True)
    loss_of(model(torch.randn(4, 3))).backward()
    w.close()
    db = sqlite3.connect(str(tmp_path / "run" / "run.db"))
    db.execute("ALTER TABLE series DROP COLUMN reason")  # the schema of older runs
    db.commit()
    db.close()
    run = tl.open_run(w.run_dir)
    s = run.series("", "io_grad", "input 0")
    assert s.reason is None and s.steps.tolist() == [0]


def test_a_logged_step_keeps_no_activation_alive(tmp_path):
    """The aliases are let go when their call returns: after backward, before the step is
    written, an activation nothing else holds is freed (the memory is the user's again)."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = Skip(inplace=True)
    refs = []
    model.lin.register_forward_hook(lambda m, a, out: refs.append(weakref.ref(out)) and None)
    w = quiet_watch(model, tmp_path / "run")
    out = model(torch.randn(4, 3))
    loss_of(out).backward()
    del out
    gc.collect()
    assert refs and all(r() is None for r in refs)
    assert w.steps_logged == 1  # written when its backward ended
    w.close()
    assert tl.open_run(w.run_dir).series("blk:1", "io_grad", "input 0").steps.tolist() == [0]


def test_a_reason_lasts_until_the_series_has_values(tmp_path):
    from torchlens.train.store import RunWriter

    bins = 4
    writer = RunWriter(str(tmp_path / "run"), "M", {}, bins)
    key = ("a:1", "io_grad", "input 0")
    row = (np.ones((1, bins)), np.zeros(1), np.ones(1), np.zeros(1))

    def write(step, keys, reasons):
        counts, lo, hi, nonfinite = (r[: len(keys)] for r in row)
        writer.write_step(step, keys, counts, lo, hi=hi, nonfinite=nonfinite, reasons=reasons)

    write(0, [], {key: "no gradient: no backward pass reached it in this step"})
    run = tl.open_run(str(tmp_path / "run"))
    assert run.series(*key).reason == "no gradient: no backward pass reached it in this step"
    write(1, [key], {})
    assert run.series(*key).reason is None and run.series(*key).steps.tolist() == [1]
    write(2, [], {key: "no gradient: this call's output is not differentiable"})
    assert run.series(*key).reason is None  # it has values: the strip shows them
    writer.close()


def test_tensors_inside_a_list_get_aliases_and_the_list_stays_as_it_was(tmp_path):
    lists = []

    class Pair(nn.Module):
        def forward(self, xs, scale=None):
            return xs[0] * xs[1] * scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4)
            self.pair = Pair()

        def forward(self, x):
            h = self.lin(x)
            xs = [h, h.sin()]
            lists.append((xs, list(xs)))
            return self.pair(xs, scale=h) + h  # h also goes around the call

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(5, 3)
    twin = copy.deepcopy(model)
    h = twin.lin(x)
    leaves = [h.detach().requires_grad_(), h.sin().detach().requires_grad_(), h.detach().requires_grad_()]
    out = twin.pair(leaves[:2], scale=leaves[2]) + h
    share = torch.autograd.grad(loss_of(out), leaves)
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(x)).backward()
    w.close()
    for xs, before in lists:
        assert len(xs) == 2 and all(a is b for a, b in zip(xs, before))  # the caller's list is untouched
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("pair:1", "io_grad", "input 0.1"), norms(share[1]))
    # xs[0] and scale are the same tensor: one alias, its share is the sum of both uses
    both = norms(share[0] + share[2])
    assert_strip_holds(run.series("pair:1", "io_grad", "input 0.0"), both)
    assert_strip_holds(run.series("pair:1", "io_grad", "input scale"), both)


def test_a_gradient_passed_on_unchanged_is_measured_once_and_a_summed_one_again(tmp_path):
    """lin's output gradient reaches tanh's input alias as a view of the same memory (measured
    once, shared); ``h`` also feeds a skip, so its total gradient is a new sum, measured anew."""

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.act, self.head = nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)

        def forward(self, x):
            h = self.lin(x)
            return self.head(self.act(h)) + h[:, :2]

    torch.manual_seed(0)
    model, x = Chain(), torch.randn(6, 3)
    twin, grads = copy.deepcopy(model), {}
    twin.lin.register_forward_hook(lambda m, a, out: out.register_hook(lambda g: grads.setdefault("h", g)) and None)
    twin.act.register_forward_hook(lambda m, a, out: out.register_hook(lambda g: grads.setdefault("act", g)) and None)
    loss_of(twin(x)).backward()
    share = grads["act"] * (1 - torch.tanh(twin.lin(x)) ** 2)  # what tanh sends back into h
    assert not torch.allclose(norms(share), norms(grads["h"]), rtol=1e-3)
    w = quiet_watch(model, tmp_path / "run")
    loss_of(model(x)).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    assert_strip_holds(run.series("act:1", "io_grad", "output 0"), norms(grads["act"]))
    assert_strip_holds(run.series("head:1", "io_grad", "input 0"), norms(grads["act"]))
    assert_strip_holds(run.series("act:1", "io_grad", "input 0"), norms(share))
    assert_strip_holds(run.series("lin:1", "io_grad", "output 0"), norms(grads["h"]))


class _Scale(torch.autograd.Function):
    """x * 2, noting in ``asked`` whether backward was asked for the input's gradient."""

    asked: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _Scale.asked.append(ctx.needs_input_grad[0])
        return grad * 2


@pytest.mark.parametrize("input_grads", [None, False, True], ids=["default", "off", "on"])
def test_backward_computes_the_datas_gradient_only_when_asked(tmp_path, input_grads):
    """By default a logged step's backward does what the plain step's does: it never reaches the
    operations on data that does not require grad (here: ``First``), let alone their input's
    gradient; with ``input_grads=True`` it computes that gradient on every logged step."""

    class First(nn.Module):
        def forward(self, x):
            return _Scale.apply(x)

    model = nn.Sequential(First(), nn.Linear(3, 2))
    _Scale.asked = []
    options = {} if input_grads is None else {"input_grads": input_grads}
    w = quiet_watch(model, tmp_path / "run", **options)
    for _ in range(2):
        loss_of(model(torch.randn(4, 3))).backward()
    w.close()
    assert _Scale.asked == ([True, True] if input_grads else [])
