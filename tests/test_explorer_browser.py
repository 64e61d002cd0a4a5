"""The explorer page in a real browser (headless Chromium driven by Playwright): the graph,
drill-down and breadcrumbs, tooltips, drag-to-pin histogram panels, search, live updates while a
model trains, the exported self-contained file, folders of runs, unreadable runs, and speed.

Run with ``-s`` to see the measured timings."""

from __future__ import annotations

import os
import time
from urllib.parse import parse_qs, urlparse

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore, export_html

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")


VIEWPORT = {"width": 1400, "height": 900}
TIMEOUT_MS = 15_000

# the margins around a strip's plot area (strips.js MARGIN), in CSS pixels
PLOT_MARGIN = {"left": 52, "right": 6, "top": 6, "bottom": 16}

# pixels of heat (the blue of the strips, at any opacity) inside the plot area of a strip; the
# frame and the zero line are grey, the background white, so a strip with no column drawn gives 0
HEAT_PIXELS_JS = """(canvas, m) => {
    const ctx = canvas.getContext('2d');
    const r = window.devicePixelRatio || 1;
    const x0 = Math.ceil((m.left + 2) * r), y0 = Math.ceil((m.top + 2) * r);
    const x1 = Math.floor(canvas.width - (m.right + 2) * r), y1 = Math.floor(canvas.height - (m.bottom + 2) * r);
    if (x1 <= x0 || y1 <= y0) return 0;
    const d = ctx.getImageData(x0, y0, x1 - x0, y1 - y0).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
        const [red, green, blue, alpha] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
        const white = red > 250 && green > 250 && blue > 250;
        if (alpha > 0 && !white && blue - red >= 10) n++;
    }
    return n;
}"""


# ----- runs ---------------------------------------------------------------------------------
def _train_resnet_steps(model, steps, seed=0):
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _train_small(model, steps, width=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        loss = model(torch.randn(3, width)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


@pytest.fixture(scope="module")
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory, threads):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    run_dir = str(tmp_path_factory.mktemp("resnet") / "run")
    with tl.watch(model, run_dir=run_dir, backend=None, verbose=False):
        _train_resnet_steps(model, 3)
    return run_dir


@pytest.fixture(scope="module")
def resnet_url(resnet_run):
    server = explore(resnet_run, port=0, block=False)
    yield server.url
    server.close()


# the browser: the module-scoped `browser` fixture of tests/conftest.py


class Page:
    """A page in a fresh context (no saved state), recording what went wrong in it."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.console_errors, self.page_errors, self.failed, self.bad_responses = [], [], [], []
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        self.page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.bad_responses.append(f"{r.status} {r.url}"))

    def problems(self):
        return self.console_errors + self.page_errors + self.failed + self.bad_responses

    def close(self):
        if self.context is not None:
            self.context.close()
            self.context = None


@pytest.fixture
def new_page(browser):
    opened = []

    def make():
        p = Page(browser)
        opened.append(p)
        return p

    yield make
    for p in opened:
        p.close()


def node_ids(page):
    return page.eval_on_selector_all("[data-node]", "els => els.map(e => e.dataset.node)")


def crumbs(page):
    return page.eval_on_selector_all("[data-crumb]", "els => els.map(e => [e.dataset.crumb, e.textContent])")


def open_node(page, cid, child):
    """Click ``cid`` and wait until its inside (with ``child``) is shown."""
    page.click(f'[data-node="{cid}"]')
    page.wait_for_selector(f'[data-node="{child}"]')
    page.wait_for_selector(f'[data-crumb="{cid}"].here')


def pin(page, cid, panel_id=None):
    """Drag node ``cid`` onto the panels column; returns the panel (of ``panel_id``, by default
    ``cid``) once its strips are drawn."""
    page.drag_and_drop(f'[data-node="{cid}"]', '[data-role="panels"]')
    panel = f'[data-panel="{cid if panel_id is None else panel_id}"]'
    page.wait_for_selector(f"{panel} canvas[data-columns]")
    return panel


def strips(page, panel):
    """``{series key: (columns drawn, heat pixels)}`` of a panel's canvases shown (a series
    without values shows its reason instead)."""
    out = {}
    for canvas in page.query_selector_all(f"{panel} canvas[data-series]:not([hidden])"):
        key = canvas.get_attribute("data-series")
        out[key] = (int(canvas.get_attribute("data-columns") or -1), canvas.evaluate(HEAT_PIXELS_JS, PLOT_MARGIN))
    return out


def panel_ids(page):
    return page.eval_on_selector_all("[data-panel]", "els => els.map(e => e.dataset.panel)")


# ----- tests ----------------------------------------------------------------------------------
def test_load_shows_the_root_graph(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="fc:1"]')
    ids = node_ids(p.page)
    for cid in ("conv1:1", "layer1:1", "fc:1", "input 0", "output 0"):
        assert cid in ids
    assert "layer1.0:1" not in ids  # only the model's own children
    assert crumbs(p.page) == [["", "ResNet"]]
    status = p.page.inner_text('[data-role="status"]')
    assert "ResNet" in status and "3 logged steps" in status
    assert p.page.is_hidden('[data-role="error"]')
    assert p.page.is_hidden('[data-role="run-picker"]')  # one run: no picker
    p.page.wait_for_timeout(300)  # let late requests finish
    assert p.problems() == []


def test_drill_down_and_breadcrumbs(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="layer1:1"]')
    open_node(p.page, "layer1:1", "layer1.0:1")
    assert "conv1:1" not in node_ids(p.page)
    assert {"layer1.0:1", "layer1.1:1", "input 0", "output 0"} <= set(node_ids(p.page))
    open_node(p.page, "layer1.0:1", "layer1.0.conv1:1")
    assert {"layer1.0.conv1:1", "layer1.0.bn1:1", "layer1.0.conv2:1", "layer1.0.bn2:1"} <= set(node_ids(p.page))
    # each crumb is the full address ('layer1.0', not '0', which every block has)
    assert crumbs(p.page) == [["", "ResNet"], ["layer1:1", "layer1"], ["layer1.0:1", "layer1.0"]]
    # a node without an inside does not open
    p.page.click('[data-node="layer1.0.conv1:1"]')
    p.page.wait_for_timeout(300)
    assert crumbs(p.page)[-1][0] == "layer1.0:1"
    # back up two levels at once
    p.page.click('[data-crumb=""]')
    p.page.wait_for_selector('[data-node="conv1:1"]')
    assert crumbs(p.page) == [["", "ResNet"]]
    assert "layer1.0.conv1:1" not in node_ids(p.page)
    timings = p.page.evaluate("window.__torchlensTimings")
    assert [t["call"] for t in timings] == ["", "layer1:1", "layer1.0:1", ""]
    assert p.problems() == []


def test_tooltip_of_a_conv(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="layer1:1"]')
    open_node(p.page, "layer1:1", "layer1.0:1")
    open_node(p.page, "layer1.0:1", "layer1.0.conv1:1")
    p.page.mouse.move(5, VIEWPORT["height"] - 5)  # off every node
    p.page.wait_for_selector('[data-role="tooltip"]', state="hidden")
    p.page.hover('[data-node="layer1.0.conv1:1"]')
    tip = p.page.wait_for_selector('[data-role="tooltip"]', state="visible")
    assert "layer1.0.conv1" in tip.inner_text() and "Conv2d" in tip.inner_text()
    rows = tip.eval_on_selector_all("tr", "trs => trs.map(tr => Array.from(tr.cells, c => c.textContent))")
    pairs = [tuple(r) for r in rows if len(r) == 2]
    # extra_repr's positional parts named by Conv2d's constructor
    assert ("in_channels", "64") in pairs and ("out_channels", "64") in pairs
    assert not [key for key, _ in pairs if key == "-"]
    assert ("kernel_size", "(3, 3)") in pairs
    assert ("input 0", "[4, 64, 8, 8]") in pairs
    assert ("output 0", "[4, 64, 8, 8]") in pairs
    assert ("weight", "[64, 64, 3, 3]") in pairs
    # the tooltip stays in the window
    box = tip.bounding_box()
    assert box["x"] >= 0 and box["y"] >= 0
    assert box["x"] + box["width"] <= VIEWPORT["width"] and box["y"] + box["height"] <= VIEWPORT["height"]
    p.page.mouse.move(5, VIEWPORT["height"] - 5)
    p.page.wait_for_selector('[data-role="tooltip"]', state="hidden")
    assert p.problems() == []


def test_pinned_panels_draw_close_and_survive_a_reload(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="layer1:1"]')
    open_node(p.page, "layer1:1", "layer1.0:1")
    open_node(p.page, "layer1.0:1", "layer1.0.conv1:1")
    panel = pin(p.page, "layer1.0.conv1:1")
    # dropping is not a click: the view did not change
    assert crumbs(p.page)[-1][0] == "layer1.0:1"
    drawn = strips(p.page, panel)
    for key in (
        "io/input 0",
        "io/output 0",
        "io_grad/input 0",
        "io_grad/output 0",
        "params/weight",
        "params_grad/weight",
    ):
        assert key in drawn, sorted(drawn)
    for key, (columns, heat) in drawn.items():
        assert columns == 3, key
        assert heat > 50, f"strip {key} is blank"
    assert "pinned" in p.page.get_attribute('[data-node="layer1.0.conv1:1"]', "class")
    # a second panel, then close it
    second = pin(p.page, "layer1.0.bn1:1")
    assert panel_ids(p.page) == ["layer1.0.conv1:1", "layer1.0.bn1:1"]
    assert "params/bias" in strips(p.page, second)
    p.page.click(f"{second} button.close")
    p.page.wait_for_selector(second, state="detached")
    assert panel_ids(p.page) == ["layer1.0.conv1:1"]
    assert "pinned" not in p.page.get_attribute('[data-node="layer1.0.bn1:1"]', "class")
    # the view and the panels are kept across a reload
    p.page.reload()
    p.page.wait_for_selector(f"{panel} canvas[data-columns]")
    assert panel_ids(p.page) == ["layer1.0.conv1:1"]
    assert crumbs(p.page)[-1][0] == "layer1.0:1"
    assert all(heat > 50 for _, heat in strips(p.page, panel).values())
    # closing the last one brings back the hint, and a reload keeps it closed
    p.page.click(f"{panel} button.close")
    p.page.wait_for_selector(panel, state="detached")
    assert p.page.is_visible('[data-role="panels"] .empty')
    p.page.reload()
    p.page.wait_for_selector('[data-node="layer1.0.conv1:1"]')
    p.page.wait_for_timeout(300)
    assert panel_ids(p.page) == []
    assert p.problems() == []


def test_search_opens_the_parent_of_a_module(new_page, resnet_url):
    p = new_page()
    p.page.goto(resnet_url)
    p.page.wait_for_selector('[data-node="layer1:1"]')
    box = p.page.locator('[data-role="search"]')
    box.fill("layer3.1.conv2")
    box.press("Enter")
    p.page.wait_for_selector('[data-crumb="layer3.1:1"].here')
    assert [c for c, _ in crumbs(p.page)] == ["", "layer3:1", "layer3.1:1"]
    node = p.page.wait_for_selector('[data-node="layer3.1.conv2:1"]', state="visible")
    graph = p.page.locator('[data-role="graph"]').bounding_box()
    rect = node.bounding_box()
    assert rect["x"] >= graph["x"] and rect["x"] + rect["width"] <= graph["x"] + graph["width"]
    assert rect["y"] >= graph["y"] and rect["y"] + rect["height"] <= graph["y"] + graph["height"]
    assert p.page.is_hidden('[data-role="error"]')
    # an unknown name is said so, in words
    box.fill("no.such.module")
    box.press("Enter")
    error = p.page.wait_for_selector('[data-role="error"]', state="visible")
    assert "no.such.module" in error.inner_text()
    assert p.problems() == []


def test_live_page_gets_new_columns_without_reload(new_page, tmp_path, threads):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    w = tl.watch(model, run_dir=str(tmp_path / "live"), port=0, verbose=False)
    try:
        _train_small(model, 2)
        w.flush()
        p = new_page()
        p.page.goto(w.url)
        p.page.wait_for_selector('[data-node="0:1"]')
        panel = pin(p.page, "0:1")
        canvas = f'{panel} canvas[data-series="params/weight"]'
        before = int(p.page.get_attribute(canvas, "data-columns"))
        assert before == 2
        assert "2 logged steps" in p.page.inner_text('[data-role="status"]')
        requests = []
        p.page.on("request", lambda r: "/api/" in r.url and requests.append(r.url))
        navigations = []
        p.page.on("framenavigated", lambda f: navigations.append(f.url))
        _train_small(model, 1)
        w.flush()
        p.page.wait_for_function(
            "([sel, n]) => { const c = document.querySelector(sel); return c && Number(c.dataset.columns) === n; }",
            arg=[canvas, before + 1],
            timeout=10_000,
        )
        p.page.wait_for_function(
            "() => document.querySelector('[data-role=\"status\"]').textContent.includes('3 logged steps')",
            timeout=5_000,
        )
        assert navigations == []  # no reload
        assert all(heat > 20 for _, heat in strips(p.page, panel).values())
        # after the new step, the page asked only for what is new
        asked = [(urlparse(u).path, parse_qs(urlparse(u).query)) for u in requests]
        paths = [path for path, _ in asked]
        assert "/api/call_series" in paths, paths
        assert set(paths) <= {"/api/poll", "/api/call_series"}, paths
        for path, query in asked:
            assert "since" in query, (path, query)
            if path == "/api/call_series":
                assert query["call"] == ["0:1"] and int(query["since"][0]) == 1
        assert p.problems() == []
        p.close()  # before the server goes away
    finally:
        w.close()


def test_exported_file_works_offline(new_page, resnet_run, tmp_path):
    page_file = export_html(resnet_run, str(tmp_path / "page.html"))
    p = new_page()
    outside = []

    def block(route):
        url = route.request.url
        if url.startswith("file:"):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    p.page.route("**/*", block)
    requested = []
    p.page.on("request", lambda r: requested.append(r.url))
    p.page.goto("file://" + os.path.abspath(page_file))
    p.page.wait_for_selector('[data-node="layer1:1"]')
    assert {"conv1:1", "fc:1", "input 0", "output 0"} <= set(node_ids(p.page))
    open_node(p.page, "layer1:1", "layer1.0:1")
    open_node(p.page, "layer1.0:1", "layer1.0.conv1:1")
    panel = pin(p.page, "layer1.0.conv1:1")
    drawn = strips(p.page, panel)
    assert {"io/input 0", "io/output 0", "params/weight", "params_grad/weight"} <= set(drawn)
    for key, (columns, heat) in drawn.items():
        assert columns == 3 and heat > 50, key
    p.page.click('[data-crumb=""]')
    p.page.wait_for_selector('[data-node="conv1:1"]')
    p.page.wait_for_timeout(2500)  # longer than a poll period: an exported page does not poll
    assert outside == []
    assert [u for u in requested if not u.startswith(("file:", "data:"))] == []
    assert p.problems() == []


def test_folder_of_runs_has_a_run_picker(new_page, tmp_path, threads):
    folder = tmp_path / "runs"
    first = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with tl.watch(first, run_dir=str(folder / "a"), backend=None, verbose=False):
        _train_small(first, 2)
    second = TinyMLP()
    with tl.watch(second, run_dir=str(folder / "b"), backend=None, verbose=False):
        _train_small(second, 3)
    server = explore(str(folder), port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url)
        picker = p.page.wait_for_selector('[data-role="run-picker"]', state="visible")
        options = picker.eval_on_selector_all("option", "os => os.map(o => [o.value, o.textContent])")
        assert [v for v, _ in options] == ["a", "b"]
        assert "Sequential" in options[0][1] and "TinyMLP" in options[1][1]
        p.page.wait_for_selector('[data-node="hidden:1"]')  # the newest run first
        assert "TinyMLP" in p.page.inner_text('[data-role="status"]')
        p.page.select_option('[data-role="run-picker"]', "a")
        p.page.wait_for_function(
            "() => document.querySelector('[data-role=\"status\"]').textContent.includes('Sequential')"
        )
        p.page.wait_for_selector('[data-node="0:1"]')
        assert "hidden:1" not in node_ids(p.page)
        assert "TinyMLP" not in p.page.inner_text('[data-role="status"]')
        assert "2 logged steps" in p.page.inner_text('[data-role="status"]')
        panel = pin(p.page, "0:1")
        drawn = strips(p.page, panel)
        assert "params/weight" in drawn and "io/output 0" in drawn
        assert all(columns == 2 and heat > 20 for columns, heat in drawn.values())
        # the data's gradient is off by default: its strip says why it has none, and how to
        # get it, in place of the strip (whose canvas takes no room)
        reason = p.page.locator(f"{panel} .reason")
        assert "input_grads=True" in reason.inner_text()
        assert p.page.locator(f"{panel} canvas[data-series='io_grad/input 0']").bounding_box() is None
        assert p.problems() == []
        p.close()
    finally:
        server.close()


def test_corrupted_run_is_shown_as_an_error(new_page, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "run.db").write_bytes(b"this is not a database, only some garbage bytes\x00\xff" * 200)
    server = explore(str(folder), port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url)
        error = p.page.wait_for_selector('[data-role="error"]', state="visible")
        text = error.inner_text()
        assert "corrupted" in text
        assert "run.db" in text
        assert "Traceback" not in text and 'File "' not in text
        assert p.page.query_selector("[data-node]") is None
        assert p.page_errors == []  # shown by the page, not thrown
        p.close()
    finally:
        server.close()


def test_unreadable_run_in_a_folder_of_runs(new_page, tmp_path, threads):
    folder = tmp_path / "runs"
    model = TinyMLP()
    with tl.watch(model, run_dir=str(folder / "good"), backend=None, verbose=False):
        _train_small(model, 2)
    (folder / "bad").mkdir()
    (folder / "bad" / "run.db").write_bytes(b"garbage" * 600)
    server = explore(str(folder), port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url + "#run=good")
        p.page.wait_for_selector('[data-node="hidden:1"]')
        options = p.page.eval_on_selector_all('[data-role="run-picker"] option', "os => os.map(o => o.textContent)")
        assert "unreadable" in options[0] and "TinyMLP" in options[1]
        p.page.select_option('[data-role="run-picker"]', "bad")
        error = p.page.wait_for_selector('[data-role="error"]', state="visible", timeout=1500)  # before any poll
        assert "corrupted" in error.inner_text() and "Traceback" not in error.inner_text()
        # nothing of the readable run is left on screen as if it were the one chosen
        assert p.page.query_selector("[data-node]") is None and p.page.query_selector("[data-crumb]") is None
        assert "TinyMLP" not in p.page.inner_text('[data-role="status"]')
        p.page.wait_for_timeout(2500)  # a poll period: the message stays as it is
        assert "corrupted" in error.inner_text() and "Lost contact" not in error.inner_text()
        p.page.select_option('[data-role="run-picker"]', "good")
        p.page.wait_for_selector('[data-node="hidden:1"]')
        assert p.page.is_hidden('[data-role="error"]')
        assert "TinyMLP" in p.page.inner_text('[data-role="status"]')
        assert p.page_errors == []
        p.close()
    finally:
        server.close()


def _gpt2_run(folder):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=40, n_embd=64, n_head=2, vocab_size=500, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        for _ in range(2):
            ids = torch.randint(0, 500, (2, 8))
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return folder


FIRST_NODE_JS = """(() => {
    const seen = () => { if (document.querySelector('[data-node]')) { window.__firstNodeAt = performance.now(); return true; } return false; };
    const watch = new MutationObserver(() => { if (seen()) watch.disconnect(); });
    watch.observe(document, { childList: true, subtree: true });
})();"""


def test_big_graph_and_long_strip(new_page, tmp_path, threads):
    # Timings are printed for the record, never asserted: speed is measured by
    # benchmarks/explorer_speed.py, since a shared CI machine makes timed tests flaky.
    run_dir = _gpt2_run(str(tmp_path / "gpt2"))
    num_calls = len(tl.open_run(run_dir).calls)
    assert num_calls >= 450
    server = explore(run_dir, port=0, block=False)
    try:
        p = new_page()
        p.page.add_init_script(FIRST_NODE_JS)
        p.page.goto(server.url)
        p.page.wait_for_selector('[data-node="transformer:1"]')
        seen_at = p.page.evaluate("performance.now()")
        first_node = p.page.evaluate("window.__firstNodeAt")
        root = p.page.evaluate("window.__torchlensTimings")[0]
        assert root["call"] == ""
        open_node(p.page, "transformer:1", "transformer.h.5:1")
        open_node(p.page, "transformer.h.5:1", "transformer.h.5.attn:1")
        timings = {t["call"]: t["ms"] for t in p.page.evaluate("window.__torchlensTimings")}
        blocks = len(p.page.query_selector_all('[data-node^="transformer.h."]'))
        assert p.problems() == []
        p.close()
    finally:
        server.close()
    print(
        f"\n[explorer speed] GPT-2 with {num_calls} module calls: first paint {first_node:.0f} ms after "
        f"navigation start (seen by the test at {seen_at:.0f} ms; root graph fetch+draw {root['ms']:.0f} ms); "
        f"drill-down transformer:1 {timings['transformer:1']:.0f} ms, "
        f"transformer.h.5:1 {timings['transformer.h.5:1']:.0f} ms"
    )
    assert blocks == 4  # the inside of one block: ln_1, attn, ln_2, mlp

    # a strip of 10,000 logged steps: at most 512 columns are kept, so drawing it stays quick
    steps = 10_000
    model = nn.Linear(2, 2)
    long_dir = str(tmp_path / "long")
    started = time.perf_counter()
    with tl.watch(model, log=("params",), backend=None, run_dir=long_dir, verbose=False):
        x = torch.ones(1, 2)
        for _ in range(steps):
            model(x)
    writing = time.perf_counter() - started
    run = tl.open_run(long_dir)
    assert len(run.steps) == steps
    stored = len(run.series("", "params", "weight").steps)
    run.close()
    assert 256 < stored <= 512
    server = explore(long_dir, port=0, block=False)
    try:
        p = new_page()
        p.page.goto(server.url)
        p.page.wait_for_selector('[data-node="input 0"]')
        p.page.evaluate("""() => {
            window.addEventListener('pointerup', () => { window.__dropAt = performance.now(); }, true);
            new MutationObserver((changes) => {
                if (window.__drawnAt === undefined && changes.some(c => c.attributeName === 'data-columns'))
                    window.__drawnAt = performance.now();
            }).observe(document.querySelector('[data-role="panels"]'),
                       { attributes: true, subtree: true, attributeFilter: ['data-columns'] });
        }""")
        panel = pin(p.page, "input 0", panel_id="")  # the inputs of the viewed call: its own series
        p.page.wait_for_function("() => window.__drawnAt !== undefined")
        draw_ms = p.page.evaluate("window.__drawnAt - window.__dropAt")
        drawn = strips(p.page, panel)
        assert p.problems() == []
        p.close()
    finally:
        server.close()
    print(
        f"[explorer speed] strip of {steps} logged steps ({stored} columns stored, written in {writing:.1f} s): "
        f"drop to drawn {draw_ms:.0f} ms"
    )
    assert set(drawn) == {"params/weight", "params/bias"}
    for key, (columns, heat) in drawn.items():
        assert columns == stored and heat > 50, key


def test_exported_folder_of_runs_has_a_working_run_picker(new_page, tmp_path, threads):
    folder = tmp_path / "runs"
    first = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with tl.watch(first, run_dir=str(folder / "a"), backend=None, verbose=False):
        _train_small(first, 2)
    second = TinyMLP()
    with tl.watch(second, run_dir=str(folder / "b"), backend=None, verbose=False):
        _train_small(second, 3)
    page_file = export_html(str(folder), str(tmp_path / "all.html"))
    p = new_page()
    p.page.goto("file://" + os.path.abspath(page_file))
    picker = p.page.wait_for_selector('[data-role="run-picker"]', state="visible")
    assert picker.eval_on_selector_all("option", "os => os.map(o => o.value)") == ["a", "b"]
    p.page.wait_for_selector('[data-node="hidden:1"]')  # the newest run first, as served
    assert "3 logged steps" in p.page.inner_text('[data-role="status"]')
    p.page.select_option('[data-role="run-picker"]', "a")
    p.page.wait_for_selector('[data-node="0:1"]')
    assert "Sequential" in p.page.inner_text('[data-role="status"]')
    panel = pin(p.page, "0:1")
    assert all(columns == 2 and heat > 20 for columns, heat in strips(p.page, panel).values())
    assert p.problems() == []
