"""Answers on the graph page: ``history.to_html(overlay=..., focus=...)``, ``report.to_html()``
(``find_nonfinite``) and ``cmp.to_html()`` (``compare``), in headless Chromium (the ``browser``
fixture of tests/conftest.py) and, for what needs no browser, in Python.

A page opened on an answer has that operation selected and on screen, its modules open, its
details (parents, source line) shown; every node with a value is filled with its colour
(``data-overlay`` holds the value's text) and the legend (``data-role="legend"``) is shown."""

from __future__ import annotations

import os

import pytest
import torch
from frames import unpack_frame

import torchlens as tl
from torchlens.trace.render.graph_page import OverlayError, page_data
from torchlens.trace.render.graph_page.overlay import SEQUENTIAL

VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 15_000


class Block(torch.nn.Module):
    def __init__(self, log: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if self.log:
            y = torch.log(y - 10.0)  # every value below 10: NaN made here
        return y + 1


class Net(torch.nn.Module):
    """Blocks two levels deep; the NaN is made in ``stage2.1``, out of the page's first view."""

    def __init__(self, log: bool = False) -> None:
        super().__init__()
        self.stage1 = torch.nn.Sequential(Block(), Block())
        self.stage2 = torch.nn.Sequential(Block(), Block(log), Block())
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.stage1(x)))


def _rgb(color: str) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture
def page_of(browser, tmp_path):
    contexts = []

    def open_(html: str):
        path = tmp_path / f"page{len(contexts)}.html"
        path.write_text(html, encoding="utf-8")
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        errors: list = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_selector('body[data-ready="1"]')
        page.errors = errors
        return page

    yield open_
    for context in contexts:
        context.close()


def _fill(page, label: str) -> str:
    return page.eval_on_selector(f'[data-label="{label}"] rect', "e => getComputedStyle(e).fill")


def _on_screen(page, label: str) -> bool:
    box = page.query_selector(f'[data-label="{label}"]').bounding_box()
    graph = page.query_selector('[data-role="graph"]').bounding_box()
    return (
        box is not None
        and box["x"] >= graph["x"]
        and box["y"] >= graph["y"]
        and box["x"] + box["width"] <= graph["x"] + graph["width"]
        and box["y"] + box["height"] <= graph["y"] + graph["height"]
    )


def test_nonfinite_page_opens_on_the_producer(page_of):
    torch.manual_seed(0)
    report = tl.find_nonfinite(Net(log=True), torch.randn(3, 4))
    assert report.phase == "forward" and report.module == "stage2.1"
    page = page_of(report.to_html())
    label = report.label
    # opened on the producer: its modules open, selected, on screen, details with parents and source
    assert "selected" in page.get_attribute(f'[data-label="{label}"]', "class").split()
    assert _on_screen(page, label)
    details = page.wait_for_selector('[data-role="details"]', state="visible")
    assert details.query_selector("h3").inner_text().startswith(label)
    parents = details.eval_on_selector_all("a[data-goto]", "els => els.map(e => e.dataset.goto)")
    assert {p.label for p in report.parents} <= set(parents)
    here = details.eval_on_selector_all("pre .here", "els => els.map(e => e.textContent)")
    assert any("torch.log(y - 10.0)" in line for line in here)
    source = details.eval_on_selector_all("table tr", "trs => trs.map(tr => tr.textContent)")
    line = report.source.line_number
    assert any(
        r.startswith("source") and f"test_graph_page_answers.py:{line}" in r and "torch.log(y - 10.0)" in r
        for r in source
    )
    # coloured as the producer; what it reached as propagated; the rest finite
    assert page.get_attribute(f'[data-label="{label}"]', "data-overlay") == "producer"
    colors = dict(report.overlay()["colors"])
    assert _fill(page, label) == _rgb(colors["producer"])
    reached = [p for p in report.propagated if page.query_selector(f'[data-label="{p}"]')]
    assert reached and all(_fill(page, p) == _rgb(colors["propagated"]) for p in reached)
    assert _fill(page, report.parents[0].label) == _rgb(colors["finite"])
    legend = page.wait_for_selector('[data-role="legend"]', state="visible").inner_text()
    assert "producer (1)" in legend and "propagated" in legend and "finite" in legend
    # closed, a module shows the worst inside: stage2 holds the producer
    page.click('[data-role="collapse-all"]')
    dot = page.eval_on_selector('[data-module="stage2"] .ov-dot', "e => getComputedStyle(e).fill")
    assert dot == _rgb(colors["producer"])
    assert page.query_selector('[data-module="stage1"]').get_attribute("data-overlay") == "finite"
    assert page.errors == []


def test_compare_page_opens_on_the_first_divergence(page_of):
    torch.manual_seed(0)
    a = Net()
    b = Net()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.stage2[1].fc.weight[0, 0] += 0.5  # a weight changed in the middle
    x = torch.randn(3, 4)
    cmp = tl.compare((a, x), (b, x))
    first = cmp.first_divergence
    assert first is not None and first.module == "stage2.1.fc"
    page = page_of(cmp.to_html())
    label = first.label_b
    assert "selected" in page.get_attribute(f'[data-label="{label}"]', "class").split()
    assert _on_screen(page, label)
    assert page.query_selector('[data-role="details"] h3').inner_text().startswith(label)
    legend = page.wait_for_selector('[data-role="legend"]', state="visible").inner_text()
    assert "relative error" in legend and label in legend
    # the origin darker than the lightest colour; before the change (within tolerance): the lightest
    assert _fill(page, label) != _rgb(SEQUENTIAL[0])
    page.click('[data-role="expand-all"]')
    before = cmp.rows[1]
    assert before.within and before.module == "stage1.0.fc"
    assert _fill(page, before.label_b) == _rgb(SEQUENTIAL[0])
    assert page.errors == []


def test_overlay_colours_follow_the_values(page_of):
    torch.manual_seed(0)
    history = tl.log_forward_pass(Net(), torch.randn(2, 4), random_seed=0)
    low, high = [e.label for e in history.layer_list if e.layer_type == "linear"][:2]  # stage1.0.fc, stage1.1.fc
    plain_label = next(e.label for e in history.layer_list if e.layer_type == "relu")
    page = page_of(history.to_html(overlay={"values": {low: 0.0, high: 3.0}, "name": "score"}, focus=high))
    assert _fill(page, low) == _rgb(SEQUENTIAL[0])
    assert _fill(page, high) == _rgb(SEQUENTIAL[-1])
    assert page.get_attribute(f'[data-label="{high}"]', "data-overlay") == "3"
    plain = page.eval_on_selector(f'[data-label="{plain_label}"] rect', "e => getComputedStyle(e).fill")
    assert plain == "rgb(255, 255, 255)"  # no value: the usual look
    # swapped values swap the colours; categories take the colours given
    page = page_of(history.to_html(overlay={low: 3.0, high: 0.0}, focus=high))
    assert _fill(page, low) == _rgb(SEQUENTIAL[-1]) and _fill(page, high) == _rgb(SEQUENTIAL[0])
    colors = {"hot": "#ff0000", "cold": "#0000ff"}
    page = page_of(history.to_html(overlay={"values": {low: "cold", high: "hot"}, "colors": colors}, focus=low))
    assert _fill(page, low) == "rgb(0, 0, 255)" and _fill(page, high) == "rgb(255, 0, 0)"
    assert "hot (1)" in page.inner_text('[data-role="legend"]')
    assert page.errors == []


def test_no_overlay_no_legend(page_of):
    history = tl.log_forward_pass(Net(), torch.randn(2, 4), random_seed=0)
    page = page_of(history.to_html())
    assert page.is_hidden('[data-role="legend"]')
    assert page.query_selector("[data-overlay]") is None
    assert page.is_hidden('[data-role="details"]')


# ----- without a browser ------------------------------------------------------------------------
def test_rolled_layer_takes_the_worst_of_its_passes():
    from examples.models import SimpleRecurrent

    history = tl.log_forward_pass(SimpleRecurrent(), torch.rand(6, 5), random_seed=0)
    entry = next(e for e in history.layer_list if e.num_passes > 1)
    passes = [e.label for e in history.layer_list if e.layer_label == entry.layer_label]
    values = {label: float(i) for i, label in enumerate(passes)}
    nodes = page_data(history, overlay=values)["overlay"]["nodes"]
    assert nodes[entry.layer_label] == nodes[passes[-1]]
    assert nodes[passes[0]] != nodes[passes[-1]]


def test_bad_overlay_and_focus_say_what_to_give():
    history = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    with pytest.raises(OverlayError, match="labels"):
        history.to_html(overlay={"fc.weight": 1.0})
    with pytest.raises(OverlayError, match="not an operation"):
        history.to_html(focus="nope_1_1")
    with pytest.raises(OverlayError, match="scale"):
        history.to_html(overlay={"values": {"linear_1_1": 1.0}, "scale": "rainbow"})
    with pytest.raises(OverlayError, match="unknown"):
        history.to_html(overlay={"values": {"linear_1_1": 1.0}, "colour": "red"})


def test_answers_in_a_notebook_are_their_page():
    torch.manual_seed(0)
    report = tl.find_nonfinite(Net(log=True), torch.randn(3, 4))
    shown = report._repr_html_()
    assert shown.startswith("<pre>") and "height: 600px" in shown
    _, packed = unpack_frame(shown)  # packed as a history's own inline page, opened on the producer
    assert packed["name"] == "TORCHLENS_GRAPH" and packed["data"]["focus"] == report.label
    assert packed["data"]["overlay"]["nodes"][report.label]
    model = Net()
    cmp = tl.compare((model, torch.ones(2, 4)), (model, torch.ones(2, 4)))
    assert "<iframe srcdoc=" in cmp._repr_html_() and "Every matched op is within tolerance" in cmp._repr_html_()
    assert unpack_frame(cmp._repr_html_())[1]["name"] == "TORCHLENS_GRAPH"


def test_a_nan_parameter_marks_the_ops_that_read_it():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    report = tl.find_nonfinite(model, torch.ones(1, 2))
    assert report.phase == "parameter" and report.label == "0.weight"
    reader = next(e.label for e in report.history.layer_list if "0.weight" in (e.param_addresses or ()))
    values = report.overlay()["values"]
    assert values[reader] == "producer" and list(values.values()).count("producer") == 1
    assert page_data(report.history, report.overlay(), reader)["focus"] == reader
    assert f'"focus":"{reader}"' in report.to_html().replace(" ", "")


def test_precision_page_colours_the_error_added():
    torch.manual_seed(0)
    cmp = tl.compare_precision(torch.nn.Softmax(-1), torch.randn(2, 8) * 10, dtype=torch.float16)
    overlay = cmp.overlay()
    assert overlay["name"] == "error added" and overlay["log"]
    assert overlay["values"] == {r.label_b: r.added for r in cmp.rows}
    worst = max(cmp.rows, key=lambda r: r.added or 0)
    nodes = page_data(cmp.history_b, overlay)["overlay"]["nodes"]
    assert nodes[worst.label_b]["fill"] == SEQUENTIAL[-1]


def test_an_answer_without_a_history_shows_its_story():
    report = tl.find_nonfinite(torch.nn.Linear(2, 2), torch.ones(1, 2))
    report.history = None
    assert report._repr_html_() == f"<pre>{report}</pre>"
