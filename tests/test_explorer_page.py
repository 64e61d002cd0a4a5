"""The explorer page in a real browser: the step labels of the heat strips, and where a new
pinned panel appears. The helpers and fixtures are those of test_explorer_browser.py."""

from __future__ import annotations

import math

import pytest
import test_explorer_browser as shared
import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")

VIEWPORT, open_node, pin = shared.VIEWPORT, shared.open_node, shared.pin
# the fixtures, found by these names
new_page, threads, resnet_run, resnet_url = shared.new_page, shared.threads, shared.resnet_run, shared.resnet_url


def ticks(page, canvas):
    """``[(step, x)]`` of the step labels drawn under a strip."""
    text = page.get_attribute(canvas, "data-ticks")
    return [(int(step), float(x)) for step, x in (t.split("@") for t in text.split())]


def is_nice(every):
    exponent = 10 ** math.floor(math.log10(every))
    return every / exponent in (1, 2, 5)


@pytest.mark.parametrize(
    "steps, log_freq",
    [(19, 1), (7, 1), (100, 1), (60, 3)],  # 0..18: it drew 0, 4, 10, 14, 18
)
def test_step_labels_are_evenly_spaced_nice_steps_from_the_first(new_page, tmp_path, threads, steps, log_freq):
    model = nn.Linear(2, 2)
    run_dir = str(tmp_path / "run")
    with tl.watch(model, log=("params",), log_freq=log_freq, backend=None, run_dir=run_dir, verbose=False):
        for _ in range(steps):
            model(torch.ones(1, 2)).sum().backward()
    logged = tl.open_run(run_dir).steps.tolist()
    server = explore(run_dir, port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url)
        p.page.wait_for_selector('[data-node="input 0"]')
        panel = pin(p.page, "input 0", panel_id="")
        drawn = ticks(p.page, f'{panel} canvas[data-series="params/weight"]')
        assert p.problems() == []
    finally:
        server.close()
    labels = [step for step, _ in drawn]
    assert labels[0] == logged[0]  # the first step is always labelled
    assert len(labels) >= 3, labels
    rest = labels[1:]
    every = rest[1] - rest[0] if len(rest) > 1 else rest[0] - labels[0]
    assert is_nice(every) and all(step % every == 0 for step in rest), labels
    assert [b - a for a, b in zip(rest, rest[1:])] == [every] * (len(rest) - 1), labels  # none missing
    assert logged[-1] - rest[-1] < every  # up to the end
    xs = [x for _, x in drawn[1:]]
    gaps = [b - a for a, b in zip(xs, xs[1:])]
    assert max(gaps) - min(gaps) <= 1.0, drawn  # evenly spaced on the strip


def test_a_new_pinned_panel_is_in_view(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="layer1:1"]')
    open_node(p.page, "layer1:1", "layer1.0:1")
    open_node(p.page, "layer1.0:1", "layer1.0.conv1:1")
    first = pin(p.page, "layer1.0.conv1:1")
    for cid in ("layer1.0.bn1:1", "layer1.0.conv2:1"):
        panel = pin(p.page, cid)
        p.page.wait_for_timeout(100)
        column = p.page.query_selector('[data-role="panels"]').bounding_box()
        box = p.page.query_selector(panel).bounding_box()
        # its heading and its first strips are inside the visible part of the column
        assert box["y"] >= column["y"] - 1, (cid, box, column)
        assert box["y"] + min(box["height"], 250) <= min(column["y"] + column["height"], VIEWPORT["height"]) + 1
    assert p.page.query_selector(first) is not None
    assert p.problems() == []


def test_a_gradient_series_without_values_shows_its_reason(new_page, tmp_path, threads):
    class Quantize(nn.Module):
        def forward(self, x):
            return x.round().long()  # stops the gradient

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4)
            self.quant = Quantize()

        def forward(self, x):
            h = self.lin(x)
            return h + self.quant(h).float()

    model = Net()
    run_dir = str(tmp_path / "run")
    with tl.watch(model, backend=None, run_dir=run_dir, verbose=False):
        for _ in range(3):
            model(torch.randn(4, 3)).pow(2).mean().backward()
    server = explore(run_dir, port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url)
        p.page.wait_for_selector('[data-node="quant:1"]')
        panel = pin(p.page, "quant:1")
        reasons = p.page.eval_on_selector_all(
            f"{panel} .strip",
            "els => els.map(e => [e.querySelector('canvas').dataset.series, "
            "e.querySelector('canvas').hidden, (e.querySelector('.reason') || {}).textContent || null])",
        )
        assert p.problems() == []
    finally:
        server.close()
    shown = {key: (hidden, text) for key, hidden, text in reasons}
    why = "no gradient: this call's output is not differentiable"
    assert shown["io_grad/input 0"] == (True, why) and shown["io_grad/output 0"] == (True, why)
    assert shown["io/input 0"] == (False, None)  # a series with values keeps its strip
