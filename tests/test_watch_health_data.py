"""What tl.watch records for a run's health: statistics over ALL values of each tensor (not
the sample), the summary line under each strip, old runs still readable."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl


def quiet_watch(model, tmp_path, **options):
    options.setdefault("backend", None)
    return tl.watch(model, run_dir=str(tmp_path / "run"), verbose=False, **options)


class Spiky(nn.Module):
    """A linear layer whose output gets a spike, a NaN and infinities at known places."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 256)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def _capture(module, seen):
    """Keep each output of ``module`` (the watch's first step also runs one tracing pass: tests
    read the last outputs)."""
    return module.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))


def test_exact_statistics_cover_all_values_while_the_histogram_is_sampled(tmp_path):
    torch.manual_seed(0)
    model = Spiky()
    seen = []
    handle = _capture(model.lin, seen)
    with quiet_watch(model, tmp_path, sample_n=20, reject_outlier_proportion=0.2) as w:
        for step in range(3):
            x = torch.randn(16, 64)
            x[3, 5] = 1000.0 * (step + 1)  # one spike: the sample almost surely misses it
            model(x).sum().backward()
    handle.remove()
    run = tl.open_run(w.run_dir)
    s = run.series("lin:1", "io", "output 0")
    for i, out in enumerate(seen[-3:]):
        flat = out.double().flatten()
        assert s.true_min[i] == flat.min().item() and s.true_max[i] == flat.max().item()
        assert s.mean[i] == pytest.approx(flat.mean().item(), rel=1e-6)
        assert s.std[i] == pytest.approx(flat.std(correction=0).item(), rel=1e-6)
        assert s.count[i] == flat.numel() and s.zeros[i] == (flat == 0).sum().item()
        assert s.nan[i] == s.posinf[i] == s.neginf[i] == 0
    # the sample's range is inside the true range, and the spike is outside the sample's
    assert (s.max < s.true_max).all() and (s.min >= s.true_min).all()
    relu = run.series("act:1", "io", "output 0")
    assert (relu.zeros == [(torch.relu(o) == 0).sum().item() for o in seen[-3:]]).all()
    assert (relu.line == relu.std).all() and relu.line_label == "std"


@pytest.mark.parametrize("width", [8, 2048])  # 16 x 8: measured with the step's small tensors; 16 x 2048: at once
def test_statistics_are_of_the_values_a_call_returned_not_of_a_later_in_place_change(tmp_path, width):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(inplace=True))
    seen = []
    handle = _capture(model[0], seen)
    with quiet_watch(model, tmp_path, log=("io", "params"), sample_n=10) as w:
        for _ in range(2):
            x = torch.randn(16, 4)
            model(x).sum().backward()
            with torch.no_grad():
                model[0].bias.add_(-0.5)  # the parameters change between steps too
    handle.remove()
    run = tl.open_run(w.run_dir)
    lin, relu = run.series("0:1", "io", "output 0"), run.series("1:1", "io", "output 0")
    bias = run.series("0:1", "params", "bias")
    for i, out in enumerate(seen[-2:]):
        assert lin.true_min[i] == out.min().item() < 0  # before the ReLU changed it in place
        assert lin.min[i] < 0  # the sample too (of a copy, drawn on the writer thread for 2048)
        assert relu.true_min[i] == 0 and relu.zeros[i] == (out <= 0).sum().item()
    assert bias.mean[1] == pytest.approx(bias.mean[0] - 0.5, abs=1e-6)


def test_nan_and_infinities_are_counted_and_left_out_of_min_max_mean_std(tmp_path):
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.out = nn.Identity()

        def forward(self, x):
            h = self.lin(x)
            bad = torch.zeros_like(h)
            bad[0, 0], bad[0, 1], bad[1, 0], bad[1, 1] = float("nan"), float("inf"), -float("inf"), float("inf")
            return self.out(h + bad)

    torch.manual_seed(0)
    model = Bad()
    seen = []
    handle = _capture(model.out, seen)
    with quiet_watch(model, tmp_path, log=("io",), sample_n=None, reject_outlier_proportion=0.0) as w:
        model(torch.randn(3, 4))
    handle.remove()
    s = tl.open_run(w.run_dir).series("out:1", "io", "output 0")
    values = seen[-1].double().flatten()
    finite = values[torch.isfinite(values)]
    assert (s.nan.tolist(), s.posinf.tolist(), s.neginf.tolist(), s.count.tolist()) == ([1], [2], [1], [12])
    assert s.true_min[0] == finite.min().item() and s.true_max[0] == finite.max().item()
    assert s.mean[0] == pytest.approx(finite.mean().item(), rel=1e-12)
    assert s.std[0] == pytest.approx(finite.std(correction=0).item(), rel=1e-12)


def test_the_lines_are_std_median_per_sample_norm_and_gradient_norm(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(10, 8)
    with quiet_watch(model, tmp_path, sample_n=3) as w:
        model(x).pow(2).sum().backward()
        weight_grad = model[0].weight.grad.detach().clone()
    run = tl.open_run(w.run_dir)
    pg = run.series("0:1", "params_grad", "weight")
    assert pg.line[0] == pytest.approx(weight_grad.double().norm().item(), rel=1e-6)
    assert pg.line_label == "norm"
    grads = []  # the same gradient again, seen by a plain hook after the watch
    handle = model[0].register_forward_hook(lambda m, a, out: [out.register_hook(grads.append)] and None)
    model(x).pow(2).sum().backward()
    handle.remove()
    norms = grads[0].reshape(10, -1).norm(dim=1)
    ig = run.series("0:1", "io_grad", "output 0")
    assert ig.line[0] == pytest.approx(norms.median().item(), rel=1e-6)
    assert ig.count[0] == 10 and ig.true_max[0] == pytest.approx(norms.max().item(), rel=1e-6)
    assert ig.line_label == "median per-sample norm"


def test_several_forwards_of_one_step_and_merged_columns_pool_the_statistics(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(6, 5)
    seen = []
    handle = _capture(model, seen)
    with quiet_watch(model, tmp_path, log=("io",), delay_log_multibackward=True, max_columns=2) as w:
        for _ in range(4):  # four steps of two forwards each: 4 columns, compacted to 2
            loss = model(torch.randn(3, 6)).sum() + model(torch.randn(2, 6) * 5).sum()
            loss.backward()
    handle.remove()
    s = tl.open_run(w.run_dir).series("", "io", "output 0")
    assert s.num_steps.tolist() == [2, 2]
    for column in range(2):
        values = torch.cat([o.double().flatten() for o in seen[-8:][4 * column : 4 * column + 4]])
        assert s.count[column] == values.numel()
        assert s.true_min[column] == values.min().item() and s.true_max[column] == values.max().item()
        assert s.mean[column] == pytest.approx(values.mean().item(), rel=1e-6)
        assert s.std[column] == pytest.approx(values.std(correction=0).item(), rel=1e-6)


def test_a_run_written_before_exact_statistics_opens_and_says_why_they_are_missing(tmp_path):
    model = nn.Linear(3, 2)
    with quiet_watch(model, tmp_path) as w:
        model(torch.rand(4, 3)).sum().backward()
    db = sqlite3.connect(str(tmp_path / "run" / "run.db"))
    for column in (
        "x_count",
        "x_min",
        "x_max",
        "x_mean",
        "x_std",
        "x_nan",
        "x_posinf",
        "x_neginf",
        "x_zeros",
        "x_line",
    ):
        db.execute(f"ALTER TABLE columns DROP COLUMN {column}")  # the seed's schema
    db.commit()
    db.close()
    s = tl.open_run(w.run_dir).series("", "params", "weight")
    assert s.counts.sum() == 6 and len(s.true_min) == 1 and np.isnan(s.true_min).all() and np.isnan(s.line).all()
    assert "written before" in s.reason


def test_the_page_marks_values_beyond_the_histogram_and_draws_the_line(browser, tmp_path):
    from torchlens.train.serve import export_html

    torch.manual_seed(0)
    model = Spiky()
    with quiet_watch(model, tmp_path, sample_n=20) as w:
        for step in range(4):
            x = torch.randn(16, 64)
            if step != 2:  # a spike the sample misses, in three of the four steps
                x[3, 5] = 1000.0 * (step + 1)
            model(x).sum().backward()
    page_file = export_html(w.run_dir, str(tmp_path / "page.html"))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("file://" + page_file)
        page.drag_and_drop('[data-node="lin:1"]', '[data-role="panels"]')
        strip = page.wait_for_selector('[data-panel="lin:1"] canvas[data-series="io/output 0"][data-columns]')
        assert int(strip.get_attribute("data-far")) == 3  # each spike is marked far beyond the axis
        assert int(strip.get_attribute("data-carets")) == 3  # and only the spikes get a caret
        line = page.wait_for_selector('[data-panel="lin:1"] canvas[data-line="io/output 0"]')
        assert line.get_attribute("data-points") == "4" and line.is_visible()
        box = line.bounding_box()
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + box["height"] / 2)
        tip = page.wait_for_selector('[data-role="strip-tip"]:not([hidden])')
        text = tip.inner_text()
        std = tl.open_run(w.run_dir).series("lin:1", "io", "output 0").std[-1]
        assert "step 3" in text and "std" in text and f"{std:.3g}"[:4] in text
        assert errors == []
    finally:
        context.close()


# ----- the optimizer's updates ------------------------------------------------------------------
FIVE = ("io", "io_grad", "params", "params_grad", "updates")


def test_updates_of_plain_sgd_are_minus_lr_times_grad_bitwise(tmp_path):
    from torchlens.web.stats import histograms

    model = nn.Linear(4, 3, bias=False)
    with torch.no_grad():  # small integers and lr = 1/2: every step of SGD is exact in float32
        model.weight.copy_(torch.arange(12.0).reshape(3, 4) - 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.tensor([[1.0, -2.0, 3.0, 0.0], [2.0, 1.0, -1.0, 4.0]])
    with quiet_watch(model, tmp_path, log=("updates",), sample_n=None, reject_outlier_proportion=0.0) as w:
        opt.zero_grad()
        model(x).sum().backward()
        expected = -0.5 * model.weight.grad.clone()
        before = model.weight.detach().clone()
        opt.step()
    s = tl.open_run(w.run_dir).series("", "updates", "weight")
    assert torch.equal(model.weight.detach() - before, expected)
    h = histograms([expected.flatten()], reject_proportion=0.0)
    assert np.array_equal(s.counts[0], h.counts[0]) and s.min[0] == h.lo[0] and s.max[0] == h.hi[0]
    assert s.true_min[0] == expected.min().item() and s.true_max[0] == expected.max().item()
    assert s.mean[0] == expected.double().mean().item() and s.count[0] == 12
    assert s.line[0] == pytest.approx((expected.norm() / before.norm()).item(), rel=1e-6)
    assert s.line_label.startswith("update ratio")


def test_the_update_ratio_of_a_large_weight_uses_its_norm_before_the_step(tmp_path):
    """The weight's norm comes from its forward statistics (a weight of more than 16384 values)."""
    torch.manual_seed(0)
    model = nn.Linear(256, 128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_watch(model, tmp_path, log=("params", "updates")) as w:
        opt.zero_grad()
        model(torch.randn(5, 256)).sum().backward()
        before = model.weight.detach().clone()
        opt.step()
        change = model.weight.detach() - before
    s = tl.open_run(w.run_dir).series("", "updates", "weight")
    assert s.line[0] == pytest.approx((change.norm() / before.norm()).item(), rel=1e-5)
    assert tl.open_run(w.run_dir).series("", "params", "weight").true_max[0] == before.max().item()


def test_the_update_of_a_large_weight_is_measured_exactly_from_the_weight_and_its_copy(tmp_path):
    """More than 16384 values: measured in one pass over the weight and its copy from before the
    step (the update is never written out), in steps that reuse the copies."""
    from torchlens.web.stats import histograms

    torch.manual_seed(0)
    model = nn.Linear(256, 128)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    changes = []
    with quiet_watch(model, tmp_path, log=("updates",), sample_n=None, reject_outlier_proportion=0.0) as w:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(5, 256)).sum().backward()
            before = model.weight.detach().clone()
            opt.step()
            changes.append(model.weight.detach() - before)
    s = tl.open_run(w.run_dir).series("", "updates", "weight")
    assert s.steps.tolist() == [0, 1, 2]
    for i, change in enumerate(changes):
        assert s.true_min[i] == change.min().item() and s.true_max[i] == change.max().item()
        assert s.count[i] == change.numel() and s.zeros[i] == (change == 0).sum().item()
        assert s.mean[i] == pytest.approx(change.double().mean().item(), abs=1e-6 * change.std().item())
        h = histograms([change.flatten()], reject_proportion=0.0)  # the sample holds every update
        assert np.array_equal(s.counts[i], h.counts[0])


def test_a_weight_that_starts_at_zero_gets_no_update_ratio_and_the_run_goes_on(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.bias.zero_()  # as norm layers' biases start: ||w|| = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_watch(model, tmp_path, log=("params", "updates")) as w:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            opt.step()
    run = tl.open_run(w.run_dir)
    bias, weight = run.series("", "updates", "bias"), run.series("", "updates", "weight")
    assert bias.steps.tolist() == [0, 1] and np.isnan(bias.line[0]) and np.isfinite(bias.line[1])  # inf: not stored
    assert np.isfinite(weight.line).all() and (weight.line > 0).all()
    assert not any("bias" in s for s in run.health().series)  # no finding from a ratio that is not finite


def test_updates_are_after_minus_before_and_training_stays_bitwise_the_same(tmp_path):
    def run(watched):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        changes = []
        w = quiet_watch(model, tmp_path / str(watched), log=FIVE, log_freq=2) if watched else None
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 6)).pow(2).mean().backward()
            before = model[2].weight.detach().clone()
            opt.step()
            changes.append((model[2].weight.detach() - before, before))
        if w is not None:
            w.close()
        return model, changes, w

    plain, _, _ = run(False)
    watched, changes, w = run(True)
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)
    s = tl.open_run(w.run_dir).series("2:1", "updates", "weight")
    assert s.steps.tolist() == [0, 2, 4]
    for i, step in enumerate([0, 2, 4]):  # the CPU copies of step 0 are reused by steps 2 and 4
        change, before = changes[step]
        assert s.true_min[i] == change.min().item() and s.true_max[i] == change.max().item()
        # ||w|| from the statistics the forward took of the weight: the same as the norm of before
        assert s.line[i] == pytest.approx((change.double().norm() / before.double().norm()).item(), rel=1e-6)


def _prefetch_threads(monkeypatch):
    """The threads that copied parameters ahead of an optimizer step (``UpdateHooks.prefetch``)."""
    import threading

    from torchlens.train.record import updates

    threads = []
    run = updates._Prefetch.run

    def recorded(self):
        threads.append(threading.current_thread().name)
        run(self)

    monkeypatch.setattr(updates._Prefetch, "run", recorded)
    return threads


def _train_with_updates(tmp_path, steps=3, before=None, between=None, skip=()):
    """A ``Linear(256, 128)`` trained by SGD for ``steps`` steps, watched for its ``updates``
    alone: each step's change of the weight, taken by hand, and the run. ``before(step,
    model)``: first in each step; ``between(model, watch)``: between the backward pass and the
    optimizer step; the steps in ``skip`` end after their forward pass."""
    torch.manual_seed(0)
    model = nn.Linear(256, 128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    changes = []
    with quiet_watch(model, tmp_path, log=("updates",), sample_n=None, reject_outlier_proportion=0.0) as w:
        for step in range(steps):
            if before is not None:
                before(step, model)
            opt.zero_grad()
            loss = model(torch.randn(5, 256, dtype=model.weight.dtype)).sum()
            if step in skip:
                continue
            loss.backward()
            if between is not None:
                between(model, w)
            start = model.weight.detach().clone()
            opt.step()
            changes.append(model.weight.detach() - start)
    return changes, tl.open_run(w.run_dir)


def _assert_updates_are(run, changes):
    s = run.series("", "updates", "weight")
    assert len(s.steps) == len(changes)
    for i, change in enumerate(changes):
        assert s.true_min[i] == change.min().item() and s.true_max[i] == change.max().item()
        assert s.zeros[i] == (change == 0).sum().item()


def test_the_parameters_are_copied_for_their_update_on_the_writer_thread_during_backward(tmp_path, monkeypatch):
    threads = _prefetch_threads(monkeypatch)
    changes, run = _train_with_updates(tmp_path)
    # step 0 copies on the training thread; steps 1 and 2 into its copies, on the writer thread
    assert threads == ["torchlens-step-writer"] * 2
    _assert_updates_are(run, changes)


@pytest.mark.parametrize("write", ["in place", "data assigned"])
def test_a_parameter_written_after_its_copy_ahead_of_the_optimizer_step_is_copied_again(tmp_path, monkeypatch, write):
    """The copy taken during backward is stale when something writes into the weight before
    the optimizer step: its version counter tells (or, for an assignment to ``.data``, which
    leaves the counter as it was, its memory), and the update is measured from the value the
    step started from (-lr * grad, not that less half the weight)."""
    threads = _prefetch_threads(monkeypatch)

    def halve(model, w):
        w._steps.wait()  # the copy ahead is taken by now
        if write == "in place":
            with torch.no_grad():
                model.weight.mul_(0.5)  # written after it
        else:
            model.weight.data = model.weight.data * 0.5

    changes, run = _train_with_updates(tmp_path, between=halve)
    assert len(threads) == 2
    _assert_updates_are(run, changes)


def test_a_model_converted_between_logged_steps_gets_its_updates_from_fresh_copies(tmp_path, monkeypatch):
    threads = _prefetch_threads(monkeypatch)

    def convert(step, model):
        if step == 1:
            model.double()  # the parameters keep their objects; their values become float64

    changes, run = _train_with_updates(tmp_path, before=convert)
    assert len(threads) == 1  # step 1's copies of step 0 are float32: not copied into ahead
    _assert_updates_are(run, changes)


def test_after_a_step_that_raised_before_its_optimizer_step_the_copies_are_taken_ahead_again(tmp_path, monkeypatch):
    threads = _prefetch_threads(monkeypatch)
    changes, run = _train_with_updates(tmp_path, steps=4, skip={1})  # step 1: no backward, no optimizer step
    assert len(threads) == 3  # steps 1, 2 and 3; step 2's into the copies step 1 took and never used
    assert run.series("", "updates", "weight").steps.tolist() == [0, 2, 3]
    _assert_updates_are(run, changes)


def test_a_copy_ahead_that_fails_is_taken_again_on_the_training_thread_and_the_run_goes_on(tmp_path, monkeypatch):
    import threading

    copy = torch._foreach_copy_

    def fails_on_the_writer(*args, **kwargs):
        if threading.current_thread().name == "torchlens-step-writer":
            raise RuntimeError("a copy that fails")
        return copy(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", fails_on_the_writer)
    changes, run = _train_with_updates(tmp_path)
    assert run.status == "finished"
    _assert_updates_are(run, changes)


def test_a_copy_ahead_not_started_when_the_optimizer_step_begins_is_called_off():
    from torchlens.train.record.updates import _Prefetch

    weight = torch.ones(3)
    late = _Prefetch(7, [weight], [torch.zeros(3)])
    assert late.take(7, [weight]) is None  # the training thread copies itself
    late.run()  # the writer thread comes to it afterwards: it copies nothing
    assert late.copies[0].tolist() == [0.0, 0.0, 0.0]
    done = _Prefetch(7, [weight], [torch.zeros(3)])
    done.run()
    assert done.take(8, [weight]) is None and done.take(7, [torch.ones(3)]) is None  # another step, tensor
    assert done.take(7, [weight])[0].tolist() == [1.0, 1.0, 1.0]


def test_updates_come_only_from_the_optimizer_passed(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with quiet_watch(model, tmp_path, log=("updates",), optimizer=first) as w:
        model(torch.randn(2, 3)).sum().backward()
        first.step()
        second.step()
    names = {(c, n) for c, k, n in tl.open_run(w.run_dir).series_names() if k == "updates"}
    assert names == {("0:1", "weight"), ("0:1", "bias")}


def test_manual_steps_get_updates_of_their_optimizer_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with quiet_watch(model, tmp_path, log=("params_grad", "updates"), manual_steps=True) as w:
        for step in range(2):
            w.begin_step(step)
            for _ in range(2):  # two micro-batches, one optimizer step
                model(torch.randn(2, 3)).sum().backward()
            before = model.weight.detach().clone()
            opt.step()
            opt.zero_grad()
    s = tl.open_run(w.run_dir).series("", "updates", "weight")
    assert s.steps.tolist() == [0, 1]
    assert s.true_max[1] == (model.weight.detach() - before).max().item()


# ----- live -------------------------------------------------------------------------------------
def test_a_step_is_readable_within_a_second_of_its_backward_and_a_second_backward_updates_it(tmp_path):
    from torchlens.train.serve.data import Catalog

    torch.manual_seed(0)
    model = nn.Linear(5, 4)
    w = quiet_watch(model, tmp_path, log=("params_grad",))
    try:
        out = model(torch.randn(3, 5))
        out.sum().backward(retain_graph=True)
        ended = time.monotonic()
        run = tl.open_run(w.run_dir)
        while 0 not in run.steps.tolist() and time.monotonic() - ended < 1.0:
            time.sleep(0.02)
        assert run.steps.tolist() == [0]  # no next step has started
        first = run.series("", "params_grad", "weight").true_max[0]
        assert first == model.weight.grad.max().item()
        assert Catalog(w.run_dir).poll_json(None, -1)["steps"] == [0]  # the page sees it too
        (3 * out).sum().backward()  # a second backward in the same step: .grad accumulates
        ended = time.monotonic()
        s = run.series("", "params_grad", "weight")
        while s.true_max[0] == first and time.monotonic() - ended < 1.0:  # written by the writer thread
            time.sleep(0.02)
            s = run.series("", "params_grad", "weight")
        assert s.steps.tolist() == [0] and s.true_max[0] == model.weight.grad.max().item() != first
    finally:
        w.close()
    assert tl.open_run(w.run_dir).series("", "params_grad", "weight").true_max[0] == model.weight.grad.max().item()


# ----- two runs ---------------------------------------------------------------------------------
def test_compare_finds_the_first_step_where_two_runs_differ_and_not_sampling_noise(tmp_path):
    def train(folder, jump_at=None, extra=False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        if extra:
            model.append(nn.Identity())
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with quiet_watch(model, tmp_path / folder, log=("io", "params")) as w:
            for step in range(6):
                if step == jump_at:
                    with torch.no_grad():
                        model[0].weight.mul_(8.0)  # the first layer's weights blow up here
                opt.zero_grad()
                model(torch.randn(32, 8)).pow(2).mean().backward()
                opt.step()
        return tl.open_run(w.run_dir)

    a, same, jumped, longer = train("a"), train("same"), train("jumped", jump_at=3), train("longer", extra=True)
    assert all(c.first_step is None and c.steps_compared == 6 for c in a.compare(same))  # only the samples differ
    found = {(c.call_id, c.kind, c.name): c for c in a.compare(jumped)}
    assert found[("0:1", "params", "weight")].first_step == 3
    assert found[("0:1", "io", "output 0")].first_step == 3
    assert found[("0:1", "io", "input 0")].first_step is None  # the data did not change
    only = [(c.call_id, c.only_in) for c in a.compare(longer) if c.only_in]
    assert only and all(o == ("3:1", "b") for o in only)


def test_lightning_runs_get_updates(tmp_path):
    L = pytest.importorskip("lightning")
    from torchlens.train.callbacks.lightning import TorchlensCallback

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    callback = TorchlensCallback(run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=("updates",))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2,  # two micro-batches per optimizer step
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
    run = tl.open_run(str(tmp_path / "run"))
    s = run.series("net.0:1", "updates", "weight")
    assert run.steps.tolist() == [0, 1] and s.steps.tolist() == [0, 1]
    assert (s.line > 0).all() and (s.count == 24).all()


def test_exact_statistics_leave_the_tensors_storage_resizable(tmp_path):
    # FSDP frees a parameter by resizing its storage to nothing: measuring it must not pin it
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    try:
        out = model(torch.randn(3, 4))
        out.sum().backward()
    finally:
        w.close()
    for tensor in (model[0].weight, model[0].weight.grad, out):
        storage = tensor.detach().untyped_storage()
        size = storage.nbytes()
        storage.resize_(0)  # raises "Trying to resize storage that is not resizable" when pinned
        storage.resize_(size)
