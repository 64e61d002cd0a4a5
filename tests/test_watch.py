"""tl.watch and tl.open_run on real training loops: what is recorded, the numbers, the graph,
training left bitwise unchanged, and bad input."""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import sqlite3
import threading
import urllib.request

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.web.stats import NUM_BINS


def quiet_watch(model, tmp_path, **options):
    options.setdefault("backend", None)
    return tl.watch(model, run_dir=str(tmp_path / "run"), verbose=False, **options)


def train(model, batches, lr=0.1, seed=0, make_loss=None):
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x in batches:
        out = model(*x) if isinstance(x, tuple) else model(x)
        loss = make_loss(out) if make_loss else out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


class TwoInTwoOut(nn.Module):
    """Two inputs, two outputs, a module called twice, an attached tensor, a conditional branch."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.mix = nn.Linear(8, 3)
        self.pos = nn.Tanh()
        self.neg = nn.Sigmoid()

    def forward(self, a, b):
        ha = self.shared(a)
        hb = self.shared(b)
        joined = tl.attach(torch.cat([ha, hb], dim=1), self, "joined")
        y = self.mix(joined)
        branch = self.pos if a.sum() > 0 else self.neg
        return branch(y), ha - hb


def test_call_graph_of_a_toy_model(tmp_path):
    model = TwoInTwoOut()
    w = quiet_watch(model, tmp_path)
    a, b = torch.ones(5, 4), torch.rand(5, 4)
    train(model, [(a, b)], make_loss=lambda out: out[0].sum() + out[1].sum())
    w.close()
    run = tl.open_run(w.run_dir)
    calls = run.calls
    assert list(calls) == ["", "shared:1", "shared:2", "mix:1", "pos:1"]
    root = calls[""]
    assert root.children == ["shared:1", "shared:2", "mix:1", "pos:1"]
    assert [n for n, _ in root.inputs] == ["input 0", "input 1"]
    assert [n for n, _ in root.outputs] == ["output 0", "output 1"]
    assert root.outputs[0][1] == [5, 3]
    assert set(root.edges) == {
        ("input 0", "shared:1"),
        ("input 1", "shared:2"),
        ("shared:1", "mix:1"),
        ("shared:2", "mix:1"),
        ("mix:1", "pos:1"),
        ("pos:1", "output 0"),
        ("shared:1", "output 1"),
        ("shared:2", "output 1"),
    }
    assert root.attached == ["joined"]
    assert calls["shared:2"].parent == "" and calls["shared:2"].class_name == "Linear"
    assert calls["shared:1"].extra_repr == "in_features=4, out_features=4, bias=True"
    assert calls["shared:1"].params == [("weight", [4, 4]), ("bias", [4])]
    names = run.series_names("")
    assert ("", "io", "joined") in names and ("", "io_grad", "joined") in names
    assert ("", "io", "input 1") in names and ("", "io_grad", "output 1") in names
    # the same module called twice: two calls, each with its own series
    assert run.series("shared:2", "io", "input 0").counts.sum() > 0
    assert run.series("shared:2", "params_grad", "weight").counts.sum() == 15  # 16 values, 10% rejected


def test_a_branch_taken_later_is_added_as_a_call(tmp_path):
    model = TwoInTwoOut()
    w = quiet_watch(model, tmp_path)
    train(
        model,
        [(torch.ones(3, 4), torch.ones(3, 4)), (-torch.ones(3, 4), torch.ones(3, 4))],
        make_loss=lambda out: out[0].sum(),
    )
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.calls["neg:1"].parent == "" and run.calls["neg:1"].class_name == "Sigmoid"
    assert run.series("neg:1", "io", "output 0").steps.tolist() == [1]
    assert run.series("pos:1", "io", "output 0").steps.tolist() == [0]


def test_numbers_match_the_tensors(tmp_path):
    """With sample_n=None and no outlier rejection each histogram holds every value exactly."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    seen = {}
    model[0].register_forward_hook(lambda m, i, o: seen.update(out=o.detach().clone()))
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0)
    x = torch.randn(7, 6)
    out = model(x)
    grads = {}
    h0 = seen["out"]
    # the gradient reaching the first layer's output, computed independently with autograd
    check = copy.deepcopy(model)
    y0 = check[0](x)
    y0.retain_grad()
    check[2](check[1](y0)).pow(2).mean().backward()
    grads["out0"] = y0.grad
    out.pow(2).mean().backward()
    weight_grad = model[0].weight.grad.clone()
    w.close()
    run = tl.open_run(w.run_dir)

    s = run.series("0:1", "io", "output 0")
    assert s.counts.sum() == h0.numel()
    assert s.min[0] == pytest.approx(h0.min().item()) and s.max[0] == pytest.approx(h0.max().item())
    expected, _ = np.histogram(h0.numpy(), bins=NUM_BINS, range=(h0.min().item(), h0.max().item()))
    assert s.counts[0].tolist() == pytest.approx(expected.tolist(), abs=1)  # float edge rounding
    assert s.bin_edges.shape == (1, NUM_BINS + 1)

    norms = grads["out0"].reshape(7, -1).norm(dim=1)
    g = run.series("0:1", "io_grad", "output 0")
    assert g.counts.sum() == 7
    assert g.min[0] == pytest.approx(norms.min().item(), rel=1e-5)
    assert g.max[0] == pytest.approx(norms.max().item(), rel=1e-5)

    p = run.series("0:1", "params", "weight")
    assert p.counts.sum() == 30 and p.min[0] == pytest.approx(model[0].weight.min().item())
    pg = run.series("0:1", "params_grad", "weight")
    assert pg.counts.sum() == 30
    assert pg.min[0] == pytest.approx(weight_grad.min().item()) and pg.max[0] == pytest.approx(weight_grad.max().item())
    assert ("1:1", "params", "weight") not in run.series_names()  # ReLU has no parameters


def test_sampling_and_outlier_rejection(tmp_path):
    model = nn.Linear(50, 40)
    w = quiet_watch(model, tmp_path, sample_n=100, reject_outlier_proportion=0.1, log=("io", "params"))
    with torch.no_grad():
        model.weight[0, 0] = 1e6  # an outlier that must not stretch the range
    model(torch.randn(8, 50)).sum().backward()
    w.close()
    run = tl.open_run(w.run_dir)
    p = run.series("", "params", "weight")
    assert p.counts.sum() == 90  # 100 sampled, the 10 farthest from the median dropped
    assert p.max[0] < 1.0
    assert run.series("", "io", "output 0").counts.sum() == 90
    assert {k for _, k, _ in run.series_names()} == {"io", "params"}


def test_nonfinite_values_are_counted_not_binned(tmp_path):
    class Bad(nn.Module):
        def forward(self, x):
            return x / torch.tensor([0.0, 1.0, 1.0, 1.0])

    model = nn.Sequential(nn.Linear(4, 4), Bad())
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0, log=("io",))
    model(torch.ones(3, 4))
    w.close()
    s = tl.open_run(w.run_dir).series("1:1", "io", "output 0")
    assert s.nonfinite[0] == 3 and s.counts.sum() == 9 and np.isfinite(s.max[0])


def make_resnet():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10)


def test_training_is_bitwise_unchanged_by_watch(tmp_path):
    """Same seed, same batches: parameters and BatchNorm buffers equal bit for bit."""

    class WithDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = make_resnet()
            self.drop = nn.Dropout(0.3)

        def forward(self, x):
            return self.drop(self.body(x))

    torch.manual_seed(0)
    batches = [torch.randn(4, 3, 32, 32) for _ in range(3)]
    plain = WithDropout()
    watched = copy.deepcopy(plain)
    train(plain, batches, seed=5)
    w = quiet_watch(watched, tmp_path)
    train(watched, batches, seed=5)
    w.close()
    for (name, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), name
    assert len(tl.open_run(w.run_dir).steps) == 3


def test_resnet_inplace_gradients_without_disable_inplace(tmp_path):
    model = make_resnet()
    w = quiet_watch(model, tmp_path)
    train(model, [torch.randn(2, 3, 32, 32)])
    w.close()
    run = tl.open_run(w.run_dir)
    # ReLU(inplace=True) is called twice per block; out += identity happens in the block's forward
    for cid in ("layer1.0.relu:1", "layer1.0.relu:2", "layer1.0:1", "relu:1"):
        for name in ("input 0", "output 0"):
            assert run.series(cid, "io_grad", name).counts.sum() == 2, (cid, name)
    edges = run.calls["layer1.0:1"].edges
    assert ("input 0", "layer1.0.relu:2") in edges  # the residual connection
    assert ("layer1.0.bn2:1", "layer1.0.relu:2") in edges


def test_ignore_io_grad_classes_and_disable_inplace(tmp_path):
    from torchvision.models.resnet import BasicBlock

    model = make_resnet()
    flags = {name: m.inplace for name, m in model.named_modules() if hasattr(m, "inplace")}
    w = quiet_watch(model, tmp_path, ignore_io_grad_classes=[BasicBlock], disable_inplace=True)
    assert not any(m.inplace for m in model.modules() if hasattr(m, "inplace"))
    train(model, [torch.randn(2, 3, 32, 32)])
    w.close()
    assert flags == {name: m.inplace for name, m in model.named_modules() if hasattr(m, "inplace")}
    names = tl.open_run(w.run_dir).series_names()
    assert ("layer1.0:1", "io", "output 0") in names
    assert ("layer1.0:1", "io_grad", "output 0") not in names
    assert ("layer1.0.conv1:1", "io_grad", "output 0") in names


def test_log_freq_and_eval_mode(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    w = quiet_watch(model, tmp_path, log_freq=3)
    for i in range(8):
        train(model, [torch.randn(4, 3)])
        model.eval()
        model(torch.randn(4, 3))  # validation: not a step
        with torch.no_grad():
            model.train()
            model(torch.randn(4, 3))  # no gradients: not a training step either
        model.train()
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 3, 6]
    assert run.series("0:1", "io", "output 0").steps.tolist() == [0, 3, 6]
    assert run.status == "finished"


def test_several_forwards_before_one_backward(tmp_path):
    model = nn.Linear(3, 2)
    w = quiet_watch(model, tmp_path, delay_log_multibackward=True, sample_n=None, reject_outlier_proportion=0.0)
    for _ in range(3):
        loss = model(torch.randn(4, 3)).sum() + model(torch.randn(5, 3)).sum()
        loss.backward()
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1, 2]
    s = run.series("", "io", "output 0")
    assert s.counts.sum(axis=1).tolist() == [18, 18, 18]  # both forwards overlaid
    assert run.series("", "io_grad", "output 0").counts.sum(axis=1).tolist() == [9, 9, 9]


def test_lstm_outputs_and_keyword_inputs(tmp_path):
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 6, batch_first=True)
            self.head = nn.Linear(6, 2)

        def forward(self, x, mask=None):
            out, (h, c) = self.lstm(x)
            return self.head(out) * mask[..., None]

    model = Tagger()
    w = quiet_watch(model, tmp_path)
    for _ in range(2):
        model(torch.randn(3, 5, 4), mask=torch.ones(3, 5)).sum().backward()
    w.close()
    run = tl.open_run(w.run_dir)
    lstm = run.calls["lstm:1"]
    assert [n for n, _ in lstm.outputs] == ["output 0", "output 1.0", "output 1.1"]
    assert ("", "io", "input mask") in run.series_names()
    assert ("input mask", "output 0") in run.calls[""].edges
    assert ("lstm:1", "head:1") in run.calls[""].edges
    # 96 values, 10% farthest from the median dropped
    assert run.series("lstm:1", "params_grad", "weight_ih_l0").counts.sum(axis=1).tolist() == [87, 87]


def test_gpt2_with_attention_mask(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    w = quiet_watch(model, tmp_path)
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    for _ in range(2):
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
    w.close()
    run = tl.open_run(w.run_dir)
    root = run.calls[""]
    assert {"input input_ids", "input attention_mask", "input labels"} <= {n for n, _ in root.inputs}
    assert "output loss" in {n for n, _ in root.outputs}
    assert ("input attention_mask", "transformer:1") in root.edges
    assert ("transformer:1", "lm_head:1") in root.edges
    block = run.calls["transformer.h.0:1"]
    assert block.parent == "transformer:1" and ("transformer.h.0.attn:1") in block.children
    assert len(run.series("transformer.h.1.mlp.c_fc:1", "params_grad", "weight").steps) == 2


def test_bounded_number_of_columns(tmp_path):
    model = nn.Linear(2, 2)
    w = quiet_watch(model, tmp_path, max_columns=4, sample_n=None, reject_outlier_proportion=0.0, log=("params",))
    for _ in range(21):
        model(torch.randn(1, 2))
    w.close()
    run = tl.open_run(w.run_dir)
    s = run.series("", "params", "weight")
    assert len(run.steps) == 21
    assert len(s.steps) <= 4 and run.stride == 8
    assert s.num_steps.sum() == 21 and s.counts.sum() == pytest.approx(21 * 4)
    assert s.steps[0] == 0 and s.last_steps[-1] == 20
    assert (s.steps[1:] > s.last_steps[:-1]).all()


def test_module_hooks_stay_between_logged_steps_and_record_only_their_forwards(tmp_path):
    """Logged steps in a row keep one set of module hooks (not registered anew each step); an
    evaluation pass between them records nothing, and a step that is not logged runs without them."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = quiet_watch(model, tmp_path, log_freq=2)
    hooks = lambda: [len(m._forward_pre_hooks) for m in model]  # noqa: E731
    train(model, [torch.randn(3, 4)])  # step 0, logged
    kept = [dict(m._forward_pre_hooks) for m in model]
    assert hooks() == [1, 1, 1]
    model.eval()
    with torch.no_grad():
        model(torch.full((5, 4), 7.0))  # not training: not a step, nothing recorded
    model.train()
    train(model, [torch.randn(3, 4)])  # step 1, not logged
    assert hooks() == [0, 0, 0]
    train(model, [torch.randn(3, 4)] * 2)  # steps 2 and 3
    w.flush()
    run = tl.open_run(w.run_dir)
    assert list(run.steps) == [0, 2]
    inputs = run.series("0:1", "io", "input 0")
    assert inputs.true_max.max() < 7.0  # the evaluation batch (all sevens) never reached it
    w.close()
    assert hooks() == [0, 0, 0] and kept[0]
    w = quiet_watch(model, tmp_path / "again")  # every step logged: the same hooks throughout
    train(model, [torch.randn(3, 4)])
    first = [list(m._forward_pre_hooks) for m in model]
    train(model, [torch.randn(3, 4)] * 3)
    assert [list(m._forward_pre_hooks) for m in model] == first
    w.close()
    assert hooks() == [0, 0, 0]


def test_parameter_hooks_stay_between_logged_steps_and_follow_a_changed_model(tmp_path):
    """Logged steps in a row keep one hook per parameter (not registered anew each step); a
    step that is not logged runs without them; a parameter replaced between steps gets the hook
    (and its gradients are recorded under its owner), the old one keeps none."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = quiet_watch(model, tmp_path, log_freq=3)
    hooks = lambda: [list(p._post_accumulate_grad_hooks or {}) for p in model.parameters()]  # noqa: E731
    train(model, [torch.randn(3, 4)])  # step 0, logged
    first = hooks()
    assert all(len(h) == 1 for h in first)
    train(model, [torch.randn(3, 4)])  # step 1, not logged
    assert hooks() == [[]] * 4
    train(model, [torch.randn(3, 4)])  # step 2, not logged
    train(model, [torch.randn(3, 4)])  # step 3, logged
    again = hooks()
    assert all(len(h) == 1 for h in again)
    w.close()
    w = quiet_watch(model, tmp_path / "every", log_freq=1)
    train(model, [torch.randn(3, 4)])
    kept = hooks()
    train(model, [torch.randn(3, 4)] * 2)
    assert hooks() == kept  # the same handles throughout
    old = model[2].weight
    model[2].weight = nn.Parameter(old.detach().clone())  # e.g. a weight re-tied or re-initialised
    train(model, [torch.randn(3, 4)])
    assert not old._post_accumulate_grad_hooks and len(model[2].weight._post_accumulate_grad_hooks) == 1
    w.close()
    assert hooks() == [[]] * 4
    run = tl.open_run(w.run_dir)
    grads = run.series("2:1", "params_grad", "weight")
    assert len(grads.steps) == 4 and (grads.counts.sum(axis=1) > 0).all()


def test_model_is_left_exactly_as_before(tmp_path):
    model = make_resnet()
    before = {name: sorted(vars(m)) for name, m in model.named_modules()}
    w = quiet_watch(model, tmp_path, disable_inplace=True)
    train(model, [torch.randn(2, 3, 32, 32)] * 2)
    w.close()
    assert before == {name: sorted(vars(m)) for name, m in model.named_modules()}
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    for p in model.parameters():
        assert not p._backward_hooks and not getattr(p, "_post_accumulate_grad_hooks", None)
    # a closed watch can be replaced by a new one
    tl.watch(model, run_dir=str(tmp_path / "again"), backend=None, verbose=False).close()


class QueryDecoder(nn.Module):
    """DETR's pattern: a parameter of the model is a child module's input."""

    def __init__(self):
        super().__init__()
        self.query = nn.Parameter(torch.randn(3, 4))
        self.decoder = nn.Linear(4, 4)

    def forward(self, memory):
        return self.decoder(self.query) + memory.mean()


def _hook_counts(*tensors):
    return [(len(t._backward_hooks or {}), len(getattr(t, "_post_accumulate_grad_hooks", None) or {})) for t in tensors]


def test_no_gradient_hook_outlives_its_step(tmp_path):
    """Leaf tensors (a parameter passed to a child, an input reused with requires_grad) keep
    their hooks; each logged step must take its own off again (when the next step starts, as
    another backward may still come), and close() the rest."""
    torch.manual_seed(0)
    model = QueryDecoder()
    memory = torch.randn(2, 4, requires_grad=True)  # the same input tensor every step
    leaves = [memory, *model.parameters()]
    before = _hook_counts(*leaves)
    w = quiet_watch(model, tmp_path)
    model(memory).sum().backward()
    one_step = _hook_counts(*leaves)  # the hooks of the step in flight
    for _ in range(4):
        model(memory).sum().backward()
        assert _hook_counts(*leaves) == one_step  # never more than one step's hooks
    model(memory)  # a step without backward keeps its hooks until the next step or close()
    w.close()
    assert _hook_counts(*leaves) == before
    run = tl.open_run(w.run_dir)
    assert run.series("decoder:1", "io_grad", "input 0").steps.tolist() == [0, 1, 2, 3, 4]
    assert run.series("", "io_grad", "input 0").steps.tolist() == [0, 1, 2, 3, 4]


def test_two_backward_passes_through_one_forward_are_one_step(tmp_path):
    """Two losses through one forward (retain_graph=True): the step has both passes' input and
    output gradients, and params_grad is .grad after both; it is written when each backward ends."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0)
    out = model(torch.randn(4, 3))
    out.sum().backward(retain_graph=True)
    out.pow(2).sum().backward()
    grad = model.weight.grad.clone()
    assert w.steps_logged == 1  # written when the first backward ended, rewritten by the second
    assert tl.open_run(w.run_dir).series("", "params_grad", "weight").max[0] == pytest.approx(grad.max().item())
    model.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    assert w.steps_logged == 2
    w.close()
    run = tl.open_run(w.run_dir)
    s = run.series("", "params_grad", "weight")
    assert (s.min[0], s.max[0]) == pytest.approx((grad.min().item(), grad.max().item()))
    assert run.series("", "io_grad", "output 0").counts.sum(axis=1).tolist() == [8, 4]  # 2 x 4 rows, then 4


def test_several_forwards_before_one_backward_are_one_step(tmp_path):
    model = nn.Linear(3, 2)
    w = quiet_watch(model, tmp_path, delay_log_multibackward=True, sample_n=None, reject_outlier_proportion=0.0)
    for step in range(2):
        loss = model(torch.randn(4, 3)).sum()
        loss = loss + model(torch.randn(5, 3)).sum()
        loss.backward()
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1]
    assert run.series("", "io", "output 0").counts.sum(axis=1).tolist() == [18, 18]


def test_manual_steps_overlay_micro_batches_and_keep_the_accumulated_grad(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    w = quiet_watch(model, tmp_path, manual_steps=True, sample_n=None, reject_outlier_proportion=0.0)
    accumulated = []
    for step in range(2):
        model.zero_grad()
        for _ in range(2):  # gradient accumulation: two backward passes, one optimizer step
            w.begin_step(step)
            model(torch.randn(4, 3)).pow(2).sum().backward()
            assert w.steps_logged == step + 1  # written (again) when each backward ends
        accumulated.append(model.weight.grad.clone())
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1]
    assert run.series("", "io", "output 0").counts.sum(axis=1).tolist() == [16, 16]
    s = run.series("", "params_grad", "weight")
    for step, grad in enumerate(accumulated):
        assert (s.min[step], s.max[step]) == pytest.approx((grad.min().item(), grad.max().item()))


class Recursive(nn.Module):
    """A child that calls itself: three nested calls of the same module."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, depth=2):
        y = torch.tanh(self.lin(x))
        return self(y, depth - 1) if depth > 0 else y


class SelfCalling(nn.Module):
    """The model itself calls itself once."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, again=True):
        y = self.lin(x)
        return self(y, again=False) if again else y


def test_recursive_modules(tmp_path):
    model = nn.Sequential(Recursive(), nn.Linear(4, 2))
    w = quiet_watch(model, tmp_path)
    train(model, [torch.randn(5, 4)] * 2)
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1]
    calls = run.calls
    assert list(calls) == ["", "0:1", "0.lin:1", "0:2", "0.lin:2", "0:3", "0.lin:3", "1:1"]
    assert calls[""].children == ["0:1", "1:1"]
    assert calls["0:1"].children == ["0.lin:1", "0:2"] and calls["0:2"].parent == "0:1"
    assert calls["0:3"].children == ["0.lin:3"] and calls["0:3"].parent == "0:2"
    assert set(calls["0:2"].edges) == {("input 0", "0.lin:2"), ("0.lin:2", "0:3"), ("0:3", "output 0")}
    for cid in ("0:1", "0:2", "0:3", "0.lin:3"):
        assert run.series(cid, "io", "output 0").steps.tolist() == [0, 1], cid
        assert run.series(cid, "io_grad", "output 0").steps.tolist() == [0, 1], cid
    assert run.series("0.lin:2", "params_grad", "weight").steps.tolist() == [0, 1]

    # the model calling itself: one step per training step, its inner calls are its children
    model = SelfCalling()
    w = quiet_watch(model, tmp_path / "self")
    train(model, [torch.randn(5, 4)] * 3)
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1, 2]
    assert list(run.calls) == ["", "lin:1", "lin:2"]
    assert run.calls[""].children == ["lin:1", "lin:2"]
    assert set(run.calls[""].edges) == {("input 0", "lin:1"), ("lin:1", "lin:2"), ("lin:2", "output 0")}
    for key in (("", "io_grad", "output 0"), ("lin:1", "io", "output 0"), ("lin:2", "params_grad", "bias")):
        assert run.series(*key).steps.tolist() == [0, 1, 2], key


def test_calls_with_non_differentiable_outputs(tmp_path):
    class Pick(nn.Module):
        def forward(self, x):
            return x, x.argmax(dim=1)  # an integer output: no gradient

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.pick = Pick()
            self.embed = nn.Embedding(4, 3)

        def forward(self, x):
            h, index = self.pick(self.lin(x))
            return h.sum(dim=1) + self.embed(index).sum(dim=1), index

    torch.manual_seed(0)
    model = Net()
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0)
    train(model, [torch.randn(6, 4)] * 2, make_loss=lambda out: out[0].pow(2).mean())
    w.close()
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1]
    pick, root = run.calls["pick:1"], run.calls[""]
    assert pick.outputs == [("output 0", [6, 4]), ("output 1", [6])]
    assert root.outputs == [("output 0", [6]), ("output 1", [6])]
    assert {
        ("lin:1", "pick:1"),
        ("pick:1", "embed:1"),
        ("pick:1", "output 0"),
        ("pick:1", "output 1"),
        ("embed:1", "output 0"),
    } == set(root.edges) - {("input 0", "lin:1")}
    index = run.series("pick:1", "io", "output 1")
    assert index.counts.sum(axis=1).tolist() == [6, 6] and index.min.min() >= 0 and index.max.max() <= 3
    names = run.series_names()
    assert ("pick:1", "io_grad", "output 0") in names
    # integer tensors have no gradient strip: their series is empty and says why
    for key, reason in (
        (("pick:1", "io_grad", "output 1"), "no gradient: this call's output is not differentiable"),
        (("embed:1", "io_grad", "input 0"), "no gradient: not a floating-point tensor"),
        (("", "io_grad", "output 1"), "no gradient: this call's output is not differentiable"),
    ):
        empty = run.series(*key)
        assert empty.steps.tolist() == [] and empty.reason == reason, key
    assert run.series("pick:1", "io_grad", "output 0").reason is None
    assert run.series("embed:1", "params_grad", "weight").steps.tolist() == [0, 1]
    assert run.series("embed:1", "io_grad", "output 0").counts.sum(axis=1).tolist() == [6, 6]


def test_default_run_dir_is_printed_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = nn.Linear(2, 1)
    w = tl.watch(model, backend=None)
    for _ in range(3):
        model(torch.ones(1, 2)).sum().backward()
    w.close()
    other = tl.watch(nn.Linear(2, 1), backend=None)  # the same second: a folder of its own
    other.close()
    out = capsys.readouterr().out
    runs = os.path.realpath(tmp_path / "torchlens_runs")
    assert os.path.dirname(os.path.realpath(w.run_dir)) == runs
    assert os.path.basename(w.run_dir).endswith("-Linear") and os.path.isfile(os.path.join(w.run_dir, "run.db"))
    assert other.run_dir != w.run_dir and os.path.dirname(os.path.realpath(other.run_dir)) == runs
    assert out.splitlines() == [
        f"torchlens: watching Linear, run saved in {w.run_dir}",
        f"torchlens: watching Linear, run saved in {other.run_dir}",
    ]
    assert tl.open_run(w.run_dir).steps.tolist() == [0, 1, 2]


def test_inplace_gradient_error_names_the_call_and_both_remedies(tmp_path):
    from torchlens.train.record.recorder import InplaceGradientError

    class Probe(nn.Module):
        def forward(self, x):
            return x.detach().abs().mean()  # looks at a view that no gradient reaches

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.probe = Probe()

        def forward(self, x):
            h = self.lin(x)
            _, second = h.split(2, dim=1)
            h.mul_(2)  # changes the base of split's views in place: autograd refuses hooks on them
            self.probe(second)
            return h

    model = Net()
    model(torch.randn(3, 4)).sum().backward()  # trains without a watch
    w = quiet_watch(model, tmp_path)
    with pytest.raises(InplaceGradientError) as caught:
        model(torch.randn(3, 4)).sum().backward()
    w.close()
    message = str(caught.value)
    assert "input 0 of call 'probe:1' (Probe)" in message
    assert "disable_inplace=True" in message and "ignore_io_grad_classes=[Probe]" in message
    assert ".." not in message
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    # the second remedy works
    w = quiet_watch(model, tmp_path / "again", ignore_io_grad_classes=[Probe])
    model(torch.randn(3, 4)).sum().backward()
    w.close()
    names = tl.open_run(w.run_dir).series_names()
    assert ("probe:1", "io", "input 0") in names and ("lin:1", "io_grad", "output 0") in names


def test_copies_of_a_watched_model_are_not_watched(tmp_path):
    import pickle

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    w = quiet_watch(model, tmp_path)
    model(torch.ones(1, 2)).sum().backward()
    best = copy.deepcopy(model)  # e.g. keeping the best checkpoint
    clone = pickle.loads(pickle.dumps(model))
    for other in (best, clone):
        other(torch.ones(1, 2)).sum().backward()
    w.close()
    assert tl.open_run(w.run_dir).steps.tolist() == [0]
    assert torch.equal(best(torch.ones(1, 2)), model(torch.ones(1, 2)))


def test_lazy_modules_train_as_without_watch(tmp_path):
    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(1))

    batches = [torch.randn(5, 3) for _ in range(3)]
    plain, watched = make(), make()
    train(plain, batches)
    w = quiet_watch(watched, tmp_path)
    train(watched, batches)
    w.close()
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)
    run = tl.open_run(w.run_dir)
    assert run.calls["0:1"].class_name in ("Linear", "LazyLinear")
    assert run.series("2:1", "params_grad", "weight").steps.tolist() == [0, 1, 2]


def test_attach_outside_a_watch_does_nothing():
    t = torch.ones(2)
    assert tl.attach(t, nn.Linear(2, 2), "x") is t


def test_with_block_and_unwatch(tmp_path):
    model = nn.Linear(2, 1)
    with quiet_watch(model, tmp_path) as w:
        model(torch.ones(1, 2)).sum().backward()
    assert w.closed and not model._forward_pre_hooks
    w2 = tl.watch(model, run_dir=str(tmp_path / "b"), backend=None, verbose=False)
    tl.unwatch(model)
    assert w2.closed
    with pytest.raises(ValueError, match="not being watched"):
        tl.unwatch(model)


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="nn.Module"):
        tl.watch(lambda x: x)
    with pytest.raises(
        ValueError, match="log takes one of 'io', 'io_grad', 'params', 'params_grad'.*'activations' unknown"
    ):
        tl.watch(nn.Linear(1, 1), log=("io", "activations"), backend=None)
    with pytest.raises(ValueError, match="backend"):
        tl.watch(nn.Linear(1, 1), backend="nope")
    model = nn.Linear(1, 1)
    w = quiet_watch(model, tmp_path)
    with pytest.raises(RuntimeError, match="already watched"):
        tl.watch(model, backend=None)
    w.close()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="run_dir takes a path that can be created"):
        tl.watch(model, run_dir=str(blocker / "run"), backend=None, verbose=False)
    assert not model._forward_pre_hooks  # nothing installed by the failed call


def test_busy_port_is_refused_before_training(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        model = nn.Linear(1, 1)
        with pytest.raises(OSError, match=f"port {port}.*port="):
            tl.watch(model, run_dir=str(tmp_path / "r"), port=port, verbose=False)
        assert not model._forward_pre_hooks
        assert not (tmp_path / "r").exists()
    finally:
        sock.close()


def test_standalone_server_serves_the_run_live(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    w = tl.watch(model, run_dir=str(tmp_path / "run"), port=0)
    assert w.url.startswith("http://localhost:") and w.url in capsys.readouterr().out
    for _ in range(3):
        model(torch.randn(2, 3)).sum().backward()
    w.flush()
    summary = json.load(urllib.request.urlopen(w.url + "/api/run"))
    assert summary["steps"] == [0, 1, 2] and "0:1" in summary["calls"]
    newer = json.load(urllib.request.urlopen(w.url + "/api/series?call=0:1&kind=io&name=output%200&since=2"))
    assert newer["steps"] == [2] and len(newer["counts"][0]) == NUM_BINS
    w.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(w.url + "/api/run", timeout=2)


def test_open_run_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folder"):
        tl.open_run(str(tmp_path / "missing"))
    with pytest.raises(tl.RunError, match="not a torchlens run"):
        tl.open_run(str(tmp_path))
    (tmp_path / "run.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(tl.RunError, match="corrupted"):
        tl.open_run(str(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "run.db").execute("CREATE TABLE meta (key TEXT, value TEXT)").connection.commit()
    with pytest.raises(tl.RunError, match="not a torchlens run database"):
        tl.open_run(str(other))


def test_unknown_series_names_what_exists(tmp_path):
    model = nn.Linear(2, 2)
    with quiet_watch(model, tmp_path) as w:
        model(torch.ones(1, 2)).sum().backward()
    run = tl.open_run(w.run_dir)
    with pytest.raises(KeyError, match="output 0"):
        run.series("", "io", "output 9")
    with pytest.raises(ValueError, match="kind"):
        run.series("", "weights", "weight")


def test_setup_raises_the_open_file_limit(capsys):
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        new = tl.setup()
        assert new == max(soft, min(hard, 50_000) if hard != resource.RLIM_INFINITY else 50_000)
        assert "open-file limit" in capsys.readouterr().err
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class SharedWide(nn.Module):
    """Two large weights, one used twice."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(160, 160)  # 25,600 weights: above the size measured in batches
        self.head = nn.Linear(160, 160)

    def forward(self, x):
        return self.head(self.shared(torch.relu(self.shared(x))))


def test_large_gradients_measured_as_they_arrive_keep_the_final_accumulated_values(tmp_path):
    torch.manual_seed(0)
    model = SharedWide()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0, optimizer=opt)
    handed = []
    measure_soon = w._steps.measure_soon
    w._steps.measure_soon = lambda lazies: (handed.append(len(lazies)), measure_soon(lazies))
    grads = []
    for _ in range(2):
        opt.zero_grad()
        for _ in range(2):  # two micro-batches in one step: the gradients change after they were handed over
            model(torch.randn(8, 160)).pow(2).mean().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        opt.step()
    w.close()
    assert handed, "no gradient was handed to the writer thread before the backward pass ended"
    run = tl.open_run(w.run_dir)
    for module in ("shared", "head"):
        s = run.series(f"{module}:1", "params_grad", "weight")
        for step, found in enumerate(grads):
            g = found[f"{module}.weight"].double()
            assert (s.min[step], s.max[step], s.mean[step]) == pytest.approx(
                (g.min().item(), g.max().item(), g.mean().item()), rel=1e-6
            ), (module, step)
    run.close()


class ShiftAfterUse(nn.Module):
    """A large weight read in place, and a large offset the forward changes in place after its
    call saw it (``add`` saves nothing for backward, so backward still runs)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(160, 160)  # 25,600 weights: above the size measured in batches
        self.shift = Shift(20000)

    def forward(self, x):
        y = self.shift(x.repeat(1, 125)).view(x.shape[0], 125, 160).mean(1)
        with torch.no_grad():
            self.shift.offset.add_(1.0)  # after the call: its reading may mix old and new values
        return self.lin(y)


class Shift(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.offset = nn.Parameter(torch.linspace(-1.0, 1.0, n))

    def forward(self, x):
        return x + self.offset


def test_parameters_read_where_they_lie_match_the_forward_and_a_changed_one_is_dropped(tmp_path):
    torch.manual_seed(0)
    model = ShiftAfterUse()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0, optimizer=opt)
    seen, offsets = [], []
    for _ in range(3):
        seen.append(model.lin.weight.detach().clone())
        offsets.append(model.shift.offset.detach().clone())
        opt.zero_grad()
        model(torch.randn(4, 160)).pow(2).mean().backward()
        opt.step()
    w.close()
    run = tl.open_run(w.run_dir)
    weight = run.series("lin:1", "params", "weight")
    for step, values in enumerate(seen):
        v = values.double()
        assert (weight.min[step], weight.max[step], weight.mean[step]) == pytest.approx(
            (v.min().item(), v.max().item(), v.mean().item()),
            rel=1e-6,
            abs=1e-9,  # a mean near 0
        )
    offset = run.series("shift:1", "params", "offset")
    assert math.isnan(offset.mean[0]) and math.isnan(offset.min[0]), "a reading of a changed parameter was kept"
    for step in (1, 2):  # copied when seen from then on: the values its call saw
        v = offsets[step].double()
        assert (offset.min[step], offset.max[step], offset.mean[step]) == pytest.approx(
            (v.min().item(), v.max().item(), v.mean().item()), rel=1e-6, abs=1e-9
        )
    run.close()


def test_handing_values_to_a_busy_writer_never_waits(tmp_path):
    from torchlens.train.measure import LazySummary

    w = quiet_watch(nn.Linear(3, 2), tmp_path)
    writer = w._steps
    gate = threading.Event()
    writer._start()
    writer._jobs.put((gate.wait, False))  # the writer thread is busy until the gate opens
    lazies = [LazySummary(torch.arange(float(n + 1))) for n in range(6)]
    handing = threading.Thread(target=lambda: [writer.measure_soon([lazy]) for lazy in lazies])
    handing.start()
    handing.join(timeout=10)
    try:
        assert not handing.is_alive(), "handing values to a busy writer thread waited for it"
    finally:
        gate.set()
    writer.wait_measured()
    assert all(lazy.measured for lazy in lazies)
    assert [lazy.summary[1].item() for lazy in lazies] == [n / 2 for n in range(6)]  # the means
    w.close()


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 24, 3, padding=1)
        self.bn = nn.BatchNorm2d(24)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(24 * 8 * 8, 10)  # 15,360 weights

    def forward(self, x):
        return self.fc(self.relu(self.bn(self.conv(x))).flatten(1))


def test_samples_do_not_depend_on_how_far_the_writer_thread_lags(tmp_path, monkeypatch):
    """Large gradients are handed to the writer thread one by one as they arrive: it measures
    each hand-over on its own, so their samples are drawn in the same order whether it took each
    as it came or several at once (those, grouped by length, would draw in another order: here
    the gradients' lengths come as 32768, 65536, 32768)."""
    import time

    from torchlens.train.step.writer import StepWriter

    def run_of(name, lag):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 64))
        if lag:  # the writer takes what was handed over only now and then: several at once
            measure = StepWriter._measure_handed
            monkeypatch.setattr(StepWriter, "_measure_handed", lambda self: (time.sleep(0.02), measure(self)))
        w = quiet_watch(model, tmp_path / name)
        train(model, [torch.randn(8, 256) for _ in range(3)])
        w.close()
        monkeypatch.undo()
        with sqlite3.connect(os.path.join(w.run_dir, "run.db")) as db:
            return db.execute("SELECT * FROM columns ORDER BY series_id, slot").fetchall()

    prompt, late = run_of("prompt", False), run_of("late", True)
    assert len(prompt) > 20
    assert prompt == late


def test_histograms_binned_during_backward_equal_those_binned_at_its_end(tmp_path, monkeypatch):
    from torchlens.train.measure import step_histograms
    from torchlens.train.step.writer import StepWriter

    def run_of(name, ahead):
        torch.manual_seed(0)
        model = SmallNet()
        w = quiet_watch(model, tmp_path / name, log=("io", "io_grad", "params", "params_grad", "updates"))
        if not ahead:  # every row binned when the step is written
            binned = lambda self, step, data: step_histograms(None, data, self.sink.reject, step)  # noqa: E731
            monkeypatch.setattr(StepWriter, "_histograms", binned)
        train(model, [torch.randn(4, 3, 8, 8) for _ in range(3)])
        w.close()
        monkeypatch.undo()
        with sqlite3.connect(os.path.join(w.run_dir, "run.db")) as db:
            return db.execute("SELECT * FROM columns ORDER BY series_id, slot").fetchall()

    binned_ahead, binned_at_end = run_of("ahead", True), run_of("end", False)
    assert len(binned_ahead) > 50
    assert binned_ahead == binned_at_end


class WideInPlace(nn.Module):
    """Large activations: one the forward changes in place after its call returned (``+=``),
    one an in-place ReLU overwrites, and steady ones."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 512)  # 64 x 512 = 32,768 values an output
        self.b = nn.Linear(512, 512)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.a(x)
        h += 1.0  # changes a's output after a's call saw it
        return self.relu(self.b(h))


def test_activations_read_where_they_lie_after_the_first_step_keep_the_values_their_calls_saw(tmp_path):
    torch.manual_seed(0)
    model = WideInPlace()
    seen = {}

    def keep(name):
        def hook(module, args, output):
            seen.setdefault(name, []).append(output.detach().clone())

        return hook

    handles = [model.a.register_forward_hook(keep("a")), model.b.register_forward_hook(keep("b"))]
    w = quiet_watch(model, tmp_path, sample_n=None, reject_outlier_proportion=0.0, log=("io",))
    train(model, [torch.randn(64, 64) for _ in range(4)])
    w.close()
    for h in handles:
        h.remove()
    assert ("b:1", "io", "input 0") in w.recorder._steady, "no activation was read where it lies"
    assert {("a:1", "io", "output 0"), ("b:1", "io", "output 0")} <= w.recorder._unsteady  # changed in place
    run = tl.open_run(w.run_dir)
    for name in ("a", "b"):
        s = run.series(f"{name}:1", "io", "output 0")
        assert list(s.steps) == [0, 1, 2, 3]
        for step, values in enumerate(seen[name][-4:]):  # before them: the watch's trace of the graph
            v = values.double()
            assert (s.min[step], s.max[step], s.mean[step]) == pytest.approx(
                (v.min().item(), v.max().item(), v.mean().item()), rel=1e-6, abs=1e-9
            ), (name, step)
    run.close()


def _step_while_the_writer_is_busy(model, opt, w) -> bool:
    """One training step taken while the watch's writer thread is held busy: whether it returned
    before the writer was let go (the writer is let go after 2 s either way)."""
    gate, done = threading.Event(), threading.Event()
    w._steps._jobs.put((gate.wait, False))  # the writer thread is busy until the gate opens

    def step():
        opt.zero_grad()
        model(torch.rand(8, 4)).sum().backward()
        opt.step()
        done.set()

    training = threading.Thread(target=step)
    training.start()
    returned = done.wait(timeout=2)
    gate.set()
    training.join(timeout=60)
    assert not training.is_alive()
    return returned


def test_durable_false_lets_training_run_ahead_of_the_writes_and_loses_nothing(tmp_path):
    runs = {}
    for durable in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = quiet_watch(model, tmp_path / f"run_{durable}", durable=durable)
        torch.manual_seed(1)
        for _ in range(2):  # the first logged step also writes the call graph, and waits for that
            opt.zero_grad()
            model(torch.rand(8, 4)).sum().backward()
            opt.step()
        # a durable step waits for its write when its optimizer step ends; the other goes on
        assert _step_while_the_writer_is_busy(model, opt, w) is (not durable)
        w.close()
        runs[durable] = tl.open_run(w.run_dir)
        assert runs[durable].options["durable"] is durable
    durable_run, fast_run = runs[True], runs[False]
    assert list(fast_run.steps) == list(durable_run.steps) == [0, 1, 2]
    assert fast_run.series_names() == durable_run.series_names()
    for key in durable_run.series_names():  # the same steps, written later
        a, b = durable_run.series(*key), fast_run.series(*key)
        np.testing.assert_array_equal(a.counts, b.counts)
        np.testing.assert_array_equal(a.min, b.min)
        np.testing.assert_array_equal(a.max, b.max)


def test_durable_false_still_raises_a_write_that_failed(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = quiet_watch(model, tmp_path / "run", durable=False)

    def step():
        opt.zero_grad()
        model(torch.rand(8, 4)).sum().backward()
        opt.step()

    step()
    w.flush()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    w._writer.write_step = full_disk
    with pytest.raises(RuntimeError, match="writing a logged step to the run failed"):
        step()  # raised here if the writer got to it already, else by the flush below
        w.flush()
    assert w._steps.failed
    w.close()
    assert tl.open_run(w.run_dir).status == "failed"
