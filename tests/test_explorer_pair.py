"""Two runs side by side on the explorer page: ``torchlens explore RUN_A RUN_B``, the
``/api/pair`` route, and in Chromium the pinned panels showing both runs' strips."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main as cli_main
from torchlens.train.serve import explore
from torchlens.train.serve.data import NotFound
from torchlens.train.serve.pair import PairCatalog

TIMEOUT_MS = 15_000
MARGIN = {"left": 52, "right": 6, "top": 6, "bottom": 16}  # strips.js MARGIN
# pixels of heat (the strips' blue) inside a strip's plot area: 0 when no column is drawn
HEAT_JS = """(canvas, m) => {
    const r = window.devicePixelRatio || 1, ctx = canvas.getContext('2d');
    const x0 = Math.ceil((m.left + 2) * r), y0 = Math.ceil((m.top + 2) * r);
    const x1 = Math.floor(canvas.width - (m.right + 2) * r), y1 = Math.floor(canvas.height - (m.bottom + 2) * r);
    const d = ctx.getImageData(x0, y0, x1 - x0, y1 - y0).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && d[i + 2] - d[i] >= 10 && d[i] < 250) n++;
    return n;
}"""


class Net(nn.Module):
    """The same small network; ``extra`` adds a module only that run has."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)  # both runs start from the same weights
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 4)
        self.gate = nn.Tanh() if extra else None

    def forward(self, x):
        h = torch.relu(self.hidden(x))
        if self.gate is not None:
            h = self.gate(h)
        return self.out(h)


def _train(folder: str, lr: float, extra: bool = False, steps: int = 6) -> None:
    model = Net(extra)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        torch.manual_seed(1)  # the same batches
        for _ in range(steps):
            loss = model(torch.randn(16, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder with run ``slow`` (lr 0.01) and run ``fast`` (lr 3, and a Tanh ``gate``)."""
    root = tmp_path_factory.mktemp("pair")
    _train(str(root / "slow"), lr=0.01)
    _train(str(root / "fast"), lr=3.0, extra=True)
    return root


def get_json(port: int, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    return response.status, body


def test_pair_route_lists_calls_of_one_run_and_first_differences(runs):
    server = explore(str(runs), port=0, block=False)
    try:
        status, answer = get_json(server.port, "/api/pair?run=slow&other=fast")
        assert status == 200
        assert (answer["a"]["name"], answer["b"]["name"]) == ("slow", "fast")
        assert answer["only_in_a"] == [] and answer["only_in_b"] == ["gate:1"]
        assert "out:1" in answer["both"] and "gate:1" not in answer["both"]
        expected = {}
        for c in tl.open_run(str(runs / "slow")).compare(tl.open_run(str(runs / "fast"))):
            if c.first_step is not None:
                expected.setdefault(c.call_id, {})[f"{c.kind}/{c.name}"] = c.first_step
        assert answer["differs"] == expected
        assert answer["differs"]["out:1"]  # lr 3 against 0.01: the runs part
        status, back = get_json(server.port, "/api/pair?run=fast&other=slow")
        assert back["only_in_a"] == ["gate:1"] and back["only_in_b"] == []
    finally:
        server.close()


def test_pair_route_bad_queries(runs):
    server = explore(str(runs), port=0, block=False)
    try:
        status, answer = get_json(server.port, "/api/pair?run=slow")
        assert status == 400 and "other" in answer["error"]
        status, answer = get_json(server.port, "/api/pair?run=slow&other=nope")
        assert status == 404 and "nope" in answer["error"]
        status, answer = get_json(server.port, "/api/pair?run=slow&other=fast&tolerance=x")
        assert status == 400 and "tolerance" in answer["error"]
        status, answer = get_json(server.port, "/api/pair?run=slow&other=fast&tolerance=2")
        assert status == 400 and "tolerance" in answer["error"]
    finally:
        server.close()


def test_explore_two_run_folders_serves_exactly_those(runs):
    server = explore(str(runs / "slow"), port=0, block=False, other=str(runs / "fast"))
    try:
        status, answer = get_json(server.port, "/api/runs")
        assert status == 200 and answer["pair"] == ["slow", "fast"]
        assert [r["id"] for r in answer["runs"]] == ["slow", "fast"]
        assert str(runs) not in json.dumps(answer)  # the common folder stays on the server
        status, answer = get_json(server.port, "/api/pair?run=slow&other=fast")
        assert status == 200 and answer["only_in_b"] == ["gate:1"]
    finally:
        server.close()


def test_explore_two_runs_refuses_what_is_not_two_runs(runs, tmp_path, capsys):
    with pytest.raises(NotFound, match="not a run folder"):
        PairCatalog([str(runs / "slow"), str(tmp_path)])
    with pytest.raises(NotFound, match="twice"):
        PairCatalog([str(runs / "slow"), str(runs / "slow")])
    assert cli_main(["explore", str(runs / "slow"), str(tmp_path), "--port", "0"]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert cli_main(["explore", str(runs / "slow"), str(runs / "fast"), "--export", str(tmp_path / "x.html")]) == 2
    assert "--export" in capsys.readouterr().err


def test_command_line_serves_two_runs(runs):
    command = "import sys; from torchlens.cli import main; sys.exit(main(sys.argv[1:]))"
    serving = subprocess.Popen(
        [sys.executable, "-c", command, "explore", str(runs / "slow"), str(runs / "fast"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = serving.stdout.readline()
        assert "side by side" in line, line
        port = int(line.split(" at ", 1)[1].split()[0].rsplit(":", 1)[1].strip("/"))
        status, answer = get_json(port, "/api/runs")
        assert status == 200 and answer["pair"] == ["slow", "fast"]
    finally:
        serving.terminate()
        serving.wait(timeout=30)


# ----- in Chromium ----------------------------------------------------------------------------
def _open(browser, url):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    problems: list = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.goto(url)
    return context, page, problems


def _both_strips(page, panel):
    """Per series key: (run label, columns, heat) of this run's strip and of the other's."""
    out = {}
    for canvas in page.query_selector_all(f"{panel} canvas[data-series]"):
        key = canvas.get_attribute("data-series")
        other = page.query_selector(f'{panel} canvas[data-other-series="{key}"]')
        out[key] = [
            (
                c.evaluate("c => c.parentElement.querySelector('.run-name').textContent"),
                int(c.get_attribute("data-columns") or -1),
                c.evaluate(HEAT_JS, MARGIN),
                c.get_attribute("data-differs"),
            )
            for c in (canvas, other)
        ]
    return out


def test_page_shows_both_runs_strips_aligned_and_labelled(browser, runs):
    server = explore(str(runs / "slow"), port=0, block=False, other=str(runs / "fast"))
    context = None
    try:
        context, page, problems = _open(browser, server.url)
        page.wait_for_selector('[data-role="pair"] [data-only="b"]')
        assert page.input_value('[data-role="compare-picker"]') == "fast"
        assert "gate:1" in page.inner_text('[data-only="b"]') and "only in fast" in page.inner_text('[data-only="b"]')
        assert "every call of slow" in page.inner_text('[data-only="a"]')
        page.drag_and_drop('[data-node="out:1"]', '[data-role="panels"]')
        panel = '[data-panel="out:1"]'
        page.wait_for_selector(f"{panel} canvas[data-other-series][data-columns]")
        strips = _both_strips(page, panel)
        differs = page.evaluate("() => fetch('/api/pair?run=slow&other=fast').then(r => r.json())")["differs"]["out:1"]
        assert strips and len(strips) >= 4  # io, io grads, params, their grads
        for key, ((name_a, cols_a, heat_a, mark_a), (name_b, cols_b, heat_b, mark_b)) in strips.items():
            assert (name_a, name_b) == ("slow", "fast")
            assert cols_a == cols_b >= 6 and heat_a > 20 and heat_b > 20, key  # one step axis
            assert mark_a == mark_b == (str(differs[key]) if key in differs else ""), key
        label = page.inner_text(f'{panel} .strip.other[data-other="{next(iter(differs))}"] .label')
        assert f"first differs at step {differs[next(iter(differs))]}" in label
        for key in strips:  # the other run's summary line under its strip, as under the open run's
            line = page.query_selector(f'{panel} canvas[data-other-line="{key}"]')
            assert line.is_visible() and int(line.get_attribute("data-points")) >= 6, key
        line.scroll_into_view_if_needed()
        box = line.bounding_box()
        page.mouse.move(box["x"] + box["width"] - 30, box["y"] + box["height"] / 2)
        tip = page.wait_for_selector('[data-role="strip-tip"]:not([hidden])').inner_text()
        assert tip.startswith("fast · step") and ("norm" in tip or "ratio" in tip or "std" in tip), tip
        # no second run: the other strips go
        page.select_option('[data-role="compare-picker"]', "")
        page.wait_for_selector(f"{panel} .strip.other", state="detached")
        assert page.query_selector('[data-role="pair"]') is None and "compare=" not in page.url
        assert problems == []
    finally:
        if context is not None:
            context.close()
        server.close()


def test_run_picker_chooses_the_second_run(browser, runs):
    server = explore(str(runs), port=0, block=False)
    context = None
    try:
        context, page, problems = _open(browser, server.url + "/#run=fast")
        picker = page.wait_for_selector('[data-role="compare-picker"]', state="visible")
        values = picker.eval_on_selector_all("option", "os => os.map(o => o.value)")
        assert values == ["", "slow"]  # the open run is not offered
        page.select_option('[data-role="compare-picker"]', "slow")
        page.wait_for_selector('[data-role="pair"] [data-only="a"]')
        assert "gate:1" in page.inner_text('[data-only="a"]')
        assert "compare=slow" in page.url  # a reload keeps the pair
        page.drag_and_drop('[data-node="gate:1"]', '[data-role="panels"]')
        page.wait_for_selector('[data-panel="gate:1"] .pair-note')
        assert "not in slow" in page.inner_text('[data-panel="gate:1"] .pair-note')
        page.reload()
        page.wait_for_selector('[data-panel="gate:1"] .pair-note')
        assert page.input_value('[data-role="compare-picker"]') == "slow"
        assert problems == []
    finally:
        if context is not None:
            context.close()
        server.close()


def test_runs_of_different_lengths_share_the_step_axis(browser, tmp_path):
    _train(str(tmp_path / "short"), lr=0.01, steps=3)
    _train(str(tmp_path / "long"), lr=0.01, steps=6)
    server = explore(str(tmp_path / "short"), port=0, block=False, other=str(tmp_path / "long"))
    context = None
    try:
        context, page, problems = _open(browser, server.url)
        page.wait_for_selector('[data-role="pair"]')
        page.drag_and_drop('[data-node="out:1"]', '[data-role="panels"]')
        panel = '[data-panel="out:1"]'
        page.wait_for_selector(f'{panel} canvas[data-other-series="params/weight"][data-columns]')
        mine = page.query_selector(f'{panel} canvas[data-series="params/weight"]')
        theirs = page.query_selector(f'{panel} canvas[data-other-series="params/weight"]')
        assert mine.get_attribute("data-columns") == theirs.get_attribute("data-columns") == "6"
        assert mine.get_attribute("data-ticks") == theirs.get_attribute("data-ticks")  # same steps, same places
        # the hover of the short run's strip names the column under the pointer on the common axis
        mine.scroll_into_view_if_needed()
        box = mine.bounding_box()
        plot = box["width"] - MARGIN["left"] - MARGIN["right"]
        page.mouse.move(box["x"] + MARGIN["left"] + plot * 1.5 / 6, box["y"] + box["height"] / 2)
        tip = page.wait_for_selector('[data-role="strip-tip"]', state="visible")
        assert "short" in tip.inner_text() and "step 1 " in tip.inner_text() + " "
        page.mouse.move(box["x"] + MARGIN["left"] + plot * 4.5 / 6, box["y"] + box["height"] / 2)
        page.wait_for_selector('[data-role="strip-tip"]', state="hidden")  # no column of its own there
        assert problems == []
    finally:
        if context is not None:
            context.close()
        server.close()
