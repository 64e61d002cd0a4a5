"""The op-level graph page (``history.to_html(path)``) in a real browser (headless Chromium
driven by Playwright), opened from its file: every operation reachable, modules that open and
close, repeated blocks folded, the rolled view of a loop, search, the details panel with the
call stack, the keyboard, and no network.

The page's stable hooks: an operation's node has ``data-label``, a closed module (or a folded
run, which also has ``data-repeat``) ``data-module``; a drawn edge ``data-edge="<tail>><head>"``
(each end named as in those); the search box is ``data-role="search"``, the side panel
``data-role="details"``."""

from __future__ import annotations

import os

import pytest
import torch

import torchlens as tl
from examples.models import SimpleRecurrent

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")


VIEWPORT = {"width": 1400, "height": 900}
TIMEOUT_MS = 15_000


# ----- pages of traced models (each model traced once) ---------------------------------------
@pytest.fixture(scope="module")
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _write(history, tmp_path_factory, name):
    path = str(tmp_path_factory.mktemp(name) / f"{name}.html")
    history.to_html(path)
    return path


@pytest.fixture(scope="module")
def alexnet(tmp_path_factory, threads):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.alexnet(weights=None).eval()  # 64 px: the smallest its layers take is 63
    history = tl.log_forward_pass(model, torch.randn(1, 3, 64, 64), random_seed=0)
    return history, _write(history, tmp_path_factory, "alexnet")


@pytest.fixture(scope="module")
def resnet_page(tmp_path_factory, threads):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None).eval()
    history = tl.log_forward_pass(model, torch.randn(1, 3, 32, 32), random_seed=0)
    return _write(history, tmp_path_factory, "resnet18")


@pytest.fixture(scope="module")
def gpt2_page(tmp_path_factory, threads):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_embd=32, n_head=2, vocab_size=100, n_layer=12, use_cache=False, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    history = tl.log_forward_pass(model, torch.randint(0, 100, (1, 16)), random_seed=0)
    return _write(history, tmp_path_factory, "gpt2")


@pytest.fixture(scope="module")
def gpt2_cache_page(tmp_path_factory, threads):
    """GPT-2 returning its cache (``use_cache=True``): 2 layers, a key and a value each."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    history = tl.log_forward_pass(model, torch.randint(0, 100, (1, 8)), input_kwargs={"use_cache": True}, random_seed=0)
    return history, _write(history, tmp_path_factory, "gpt2_cache")


@pytest.fixture(scope="module")
def recurrent_page(tmp_path_factory, threads):
    history = tl.log_forward_pass(SimpleRecurrent(), torch.rand(6, 5), random_seed=0)
    return _write(history, tmp_path_factory, "recurrent")


# the browser: the module-scoped `browser` fixture of tests/conftest.py


class Page:
    """A page in a fresh context, opened from a file, recording every request and what went
    wrong in it (uncaught errors, console errors)."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.requests, self.console_errors, self.page_errors = [], [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        self.page.on("pageerror", lambda e: self.page_errors.append(str(e)))

    def open(self, path):
        self.page.goto("file://" + os.path.abspath(path))
        self.page.wait_for_selector('body[data-ready="1"]')
        return self.page

    def problems(self):
        return self.console_errors + self.page_errors

    def close(self):
        if self.context is not None:
            self.context.close()
            self.context = None


@pytest.fixture
def open_page(browser):
    opened = []

    def make(path):
        p = Page(browser)
        opened.append(p)
        p.open(path)
        return p

    yield make
    for p in opened:
        p.close()


ROWS_JS = "trs => trs.filter(tr => tr.cells.length === 2).map(tr => Array.from(tr.cells, c => c.textContent))"


def rows(handle, selector):
    """The two-cell rows (key, value) of the table rows ``selector`` under ``handle``, as a dict."""
    return dict(handle.eval_on_selector_all(selector, ROWS_JS))


def wait_for_text(page, selector, start):
    """Wait until the text of ``selector`` starts with ``start``."""
    page.wait_for_function(
        "([sel, start]) => (document.querySelector(sel) || {textContent: ''}).textContent.startsWith(start)",
        arg=[selector, start],
    )


def labels(page):
    return page.eval_on_selector_all("[data-label]", "els => els.map(e => e.dataset.label)")


def modules(page):
    """The closed modules shown, as ``[address, repeat or None]``."""
    return page.eval_on_selector_all(
        "[data-module]", "els => els.map(e => [e.dataset.module, e.dataset.repeat || null])"
    )


def click_module(page, address, repeat=None):
    """Click the closed module (or folded run) ``address``, with the view fitted first so that it
    is on screen; waits until it is gone."""
    page.click('[data-role="fit"]')
    selector = f'[data-module="{address}"]' + ("[data-repeat]" if repeat else ":not([data-repeat])")
    page.click(selector)
    page.wait_for_selector(selector, state="detached")


OVERLAPS_JS = """() => {
    const boxes = [...document.querySelectorAll('.item')].map(e => [e.dataset.id, e.getBoundingClientRect()]);
    const out = [];
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const [a, A] = boxes[i], [b, B] = boxes[j];
        if (A.left < B.right - 1 && B.left < A.right - 1 && A.top < B.bottom - 1 && B.top < A.bottom - 1) out.push([a, b]);
    }
    return out;
}"""


def overlaps(page):
    """Pairs of drawn nodes (operations, modules, folded runs) that cover each other."""
    return page.evaluate(OVERLAPS_JS)


EDGE_CROSSINGS_JS = """([only, selectors]) => {
    // points along each drawn edge (every 1.5 units of its length) against the boxes of nodes,
    // in the coordinates of the graph (edges and nodes share them); a node an edge ends at
    // does not count
    const nodes = selectors ? selectors.map(s => document.querySelector(s)) : [...document.querySelectorAll('.item')];
    const boxes = nodes.map(e => [e.dataset.label || e.dataset.module, e.dataset.id, e.getBBox()]);
    const paths = only ? [document.querySelector(`path[data-edge="${only}"]`)] : [...document.querySelectorAll('path.edge')];
    const crossed = [], beside = boxes.map(() => false);
    for (const path of paths) {
        const length = path.getTotalLength();
        for (let s = 0; s <= length; s += 1.5) {
            const p = path.getPointAtLength(s);
            boxes.forEach(([name, id, b], i) => {
                if (id === path.dataset.from || id === path.dataset.to) return;
                if (p.y >= b.y && p.y <= b.y + b.height) beside[i] = true;
                if (p.x > b.x + 0.5 && p.x < b.x + b.width - 0.5 && p.y > b.y + 0.5 && p.y < b.y + b.height - 0.5) crossed.push([path.dataset.edge, name]);
            });
        }
    }
    return {crossed: [...new Set(crossed.map(c => c.join(" through ")))], beside};
}"""


def edge_crossings(page, edge=None, selectors=None):
    """The drawn edges (all, or the one ``data-edge=edge``) passing through nodes (all, or those
    of ``selectors``) they do not connect, as "tail>head through node"; and, per node of
    ``selectors``, whether the edge passes its height (runs beside it)."""
    return page.evaluate(EDGE_CROSSINGS_JS, [edge, selectors])


def inside_graph(page, selector):
    graph = page.locator('[data-role="graph"]').bounding_box()
    rect = page.locator(selector).bounding_box()
    return (
        rect["x"] >= graph["x"]
        and rect["x"] + rect["width"] <= graph["x"] + graph["width"]
        and rect["y"] >= graph["y"]
        and rect["y"] + rect["height"] <= graph["y"] + graph["height"]
    )


# ----- tests ----------------------------------------------------------------------------------
def test_alexnet_every_label_is_reachable(open_page, alexnet):
    history, path = alexnet
    p = open_page(path)
    page = p.page
    assert "AlexNet" in page.inner_text('[data-role="title"]')
    assert len(history.layer_labels) == 24
    # it starts with the path from input to output on screen, the big modules closed
    shown = labels(page)
    assert {"input_1_0", "output_1_23"} <= set(shown)
    assert inside_graph(page, '[data-label="input_1_0"]') and inside_graph(page, '[data-label="output_1_23"]')
    assert {"features", "classifier"} <= {m for m, _ in modules(page)}
    assert page.is_hidden('[data-role="mode"]')  # nothing recurrent: no rolled view to offer
    # opening every closed module shows every operation, each once
    while modules(page):
        address, repeat = modules(page)[0]
        click_module(page, address, repeat)
    shown = labels(page)
    assert sorted(shown) == sorted(history.layer_labels)
    assert overlaps(page) == []
    # ...and closing one again by its header hides its operations
    page.click('[data-role="fit"]')
    page.click('[data-box="features"] [data-collapse]')
    page.wait_for_selector('[data-module="features"]')
    assert "conv2d_1_1" not in labels(page) and "linear_1_17" in labels(page)
    assert p.problems() == []


def test_resnet18_starts_collapsed_and_layer1_opens(open_page, resnet_page):
    p = open_page(resnet_page)
    page = p.page
    shown = {m for m, _ in modules(page)}
    assert {"layer1", "layer2", "layer3", "layer4"} <= shown
    assert not any(m.startswith("layer1.") for m in shown)
    assert not any(label.startswith(("conv2d_2", "relu_2")) for label in labels(page))  # nothing inside layer1
    assert inside_graph(page, '[data-label="output_1_110"]')
    click_module(page, "layer1")
    page.wait_for_selector('[data-box="layer1"]')
    # the two BasicBlocks of layer1 have the same inside: one box "x2" naming both
    fold = page.wait_for_selector('[data-module="layer1.0"][data-repeat]')
    assert fold.get_attribute("data-repeat") == "2"
    assert fold.get_attribute("data-members") == "layer1.0 layer1.1"
    assert "BasicBlock ×2" in fold.text_content()
    assert {"layer2", "layer3", "layer4"} <= {m for m, _ in modules(page)}  # the rest stays closed
    click_module(page, "layer1.0", repeat=True)
    blocks = [m for m, r in modules(page) if m.startswith("layer1.")]
    assert blocks == ["layer1.0", "layer1.1"]
    assert not any(r for m, r in modules(page) if m.startswith("layer1."))
    click_module(page, "layer1.1")
    page.wait_for_selector('[data-box="layer1.1"]')
    assert page.locator('[data-box="layer1.1"] text').first.text_content().endswith("layer1.1 · BasicBlock")
    assert p.problems() == []


def test_resnet18_skip_connection_runs_beside_the_open_block(open_page, resnet_page):
    """The skip connection from outside an open BasicBlock to its addition deep inside is drawn
    beside the block's own chain of nodes, not through it (nor through any other node)."""
    p = open_page(resnet_page)
    page = p.page
    click_module(page, "layer1")
    click_module(page, "layer1.0", repeat=True)
    click_module(page, "layer1.0")
    page.wait_for_selector('[data-box="layer1.0"]')
    edges = page.eval_on_selector_all("path.edge", "els => els.map(e => e.dataset.edge)")
    assert {"maxpool2d_1_6>conv2d_2_7", "maxpool2d_1_6>iadd_1_16", "layer1.0.bn2>iadd_1_16"} <= set(edges)
    chain = [
        '[data-label="conv2d_2_7"]',
        '[data-module="layer1.0.bn1"]',
        '[data-label="relu_2_11"]',
        '[data-label="conv2d_3_12"]',
        '[data-module="layer1.0.bn2"]',
    ]
    found = edge_crossings(page, "maxpool2d_1_6>iadd_1_16", chain)
    assert found["crossed"] == []
    assert all(found["beside"])  # it does run down the whole chain, beside it
    assert edge_crossings(page)["crossed"] == []
    # every block open: no edge runs through a node it does not connect
    page.click('[data-role="expand-all"]')
    page.wait_for_selector('[data-box="layer4.1"]')
    assert edge_crossings(page)["crossed"] == []
    assert overlaps(page) == []
    assert p.problems() == []


def test_gpt2_twelve_layers_fold_into_one_block(open_page, gpt2_page):
    p = open_page(gpt2_page)
    page = p.page
    assert not page.query_selector('[data-module="transformer.h.0"]:not([data-repeat])')
    if page.query_selector('[data-module="transformer"]'):  # how deep it starts open depends on the window
        click_module(page, "transformer")
    folds = page.eval_on_selector_all(
        "[data-repeat]", "els => els.map(e => [e.dataset.module, e.dataset.repeat, e.dataset.members])"
    )
    members = " ".join(f"transformer.h.{i}" for i in range(12))
    assert folds == [["transformer.h.0", "12", members]]
    assert "GPT2Block ×12" in page.text_content("[data-repeat]")
    assert not any(m.startswith("transformer.h.") for m, r in modules(page) if not r)
    click_module(page, "transformer.h.0", repeat=True)
    assert page.query_selector("[data-repeat]") is None
    blocks = [m for m, r in modules(page) if m.startswith("transformer.h.")]
    assert blocks == [f"transformer.h.{i}" for i in range(12)]
    assert overlaps(page) == []
    # Esc goes back: the run folds again
    page.keyboard.press("Escape")
    page.wait_for_selector('[data-module="transformer.h.0"][data-repeat="12"]')
    assert [m for m, r in modules(page) if m.startswith("transformer.h.")] == ["transformer.h.0"]
    assert p.problems() == []


def test_recurrent_rolled_view_shows_passes(open_page, recurrent_page):
    p = open_page(recurrent_page)
    page = p.page
    toggle = page.locator('[data-role="mode"]')
    assert toggle.is_visible()
    assert page.is_checked('[name="tl-mode"][value="unrolled"]')
    assert [label for label in labels(page) if label.startswith("linear_1_1")] == [
        f"linear_1_1:{i}" for i in range(1, 5)
    ]
    page.check('[name="tl-mode"][value="rolled"]')
    node = page.wait_for_selector('[data-label="linear_1_1"]')
    assert node.get_attribute("data-passes") == "4"
    assert "×4" in node.text_content()
    assert sorted(labels(page)) == ["add_1_2", "input_1_0", "linear_1_1", "mul_1_3", "output_1_4"]
    assert page.query_selector('[data-label="mul_1_3"]').get_attribute("data-passes") == "4"
    assert page.query_selector('[data-label="input_1_0"]').get_attribute("data-passes") is None
    # the loop back from mul to linear is drawn, saying in which passes
    ids = dict(page.eval_on_selector_all("[data-label]", "els => els.map(e => [e.dataset.label, e.dataset.id])"))
    edges = page.eval_on_selector_all(".edge", "els => els.map(e => [e.dataset.from, e.dataset.to])")
    assert [ids["mul_1_3"], ids["linear_1_1"]] in edges and [ids["input_1_0"], ids["linear_1_1"]] in edges
    assert "passes 2-4" in page.eval_on_selector_all(".edge-label", "els => els.map(e => e.textContent)")
    page.click('[data-label="linear_1_1"]')
    details = page.wait_for_selector('[data-role="details"]', state="visible")
    assert "linear_1_1 (4 passes)" in details.inner_text()
    # and back to the unrolled view
    page.check('[name="tl-mode"][value="unrolled"]')
    page.wait_for_selector('[data-label="linear_1_1:4"]')
    assert page.is_hidden('[data-role="details"]')
    assert p.problems() == []


def test_search_finds_a_hidden_operation(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    assert "conv2d_3_7" not in labels(page)  # inside the closed "features"
    box = page.locator('[data-role="search"]')
    box.fill("conv2d_3_7")
    box.press("Enter")
    node = page.wait_for_selector('[data-label="conv2d_3_7"]', state="visible")
    classes = node.get_attribute("class").split()
    assert "match" in classes and "selected" in classes
    assert inside_graph(page, '[data-label="conv2d_3_7"]')  # the view jumped to it
    assert page.inner_text('[data-role="matches"]') == "1 of 1"
    details = page.wait_for_selector('[data-role="details"]', state="visible")
    assert details.inner_text().startswith("conv2d_3_7")
    # a new query starts from its first match: a module address finds the module first, then
    # Enter steps through the operations in it (typed and entered at once, before the page's
    # search-as-you-type has run)
    box.fill("classifier")
    box.press("Enter")
    page.wait_for_selector('[data-module="classifier"].match')
    assert inside_graph(page, '[data-module="classifier"]')
    assert page.inner_text('[data-role="matches"]') == "1 of 8"  # the module and its 7 operations
    box.press("Enter")
    page.wait_for_selector('[data-label="dropout_1_16"].selected')
    assert inside_graph(page, '[data-label="dropout_1_16"]')
    assert page.inner_text('[data-role="matches"]') == "2 of 8"
    assert len(page.query_selector_all(".item.match")) == 7
    box.fill("no_such_layer")
    box.press("Enter")
    wait_for_text(page, '[data-role="matches"]', "0 matches")
    assert page.query_selector(".match") is None
    assert p.problems() == []


def test_details_of_a_node(open_page, alexnet):
    history, path = alexnet
    p = open_page(path)
    page = p.page
    assert page.is_hidden('[data-role="details"]')
    click_module(page, "features")
    page.click('[data-role="fit"]')
    page.click('[data-label="conv2d_2_4"]')
    details = page.wait_for_selector('[data-role="details"]', state="visible")
    text = details.inner_text()
    entry = history["conv2d_2_4"]
    info = rows(details, "table:not([data-role]) tr")
    assert info["type"] == "conv2d"
    assert info["shape"] == "(" + ", ".join(map(str, entry.shape)) + ")"
    assert info["dtype"] == "float32"
    assert info["module"] == "features:1 › features.3:1"
    assert "features.3.weight" in info["params"] and "features.3.bias" in info["params"]
    stats = rows(details, '[data-role="stats"] tr')
    assert stats["values"] == f"{entry.activation.numel():,}"
    assert details.query_selector('[data-role="histogram"] rect')
    # the call stack, with the source lines of each frame, the calling line marked
    frames = details.eval_on_selector_all(".frame", "els => els.map(e => e.textContent)")
    assert len(frames) == len(entry.func_call_stack)
    assert any("alexnet.py:" in f for f in frames)
    here = details.eval_on_selector_all("pre .here", "els => els.map(e => e.textContent)")
    assert any("x = self.features(x)" in line for line in here)
    assert any("input = module(input)" in line for line in here)
    assert "def forward(self, x: torch.Tensor)" in text  # context around the line
    # parents and children are links that move the selection
    page.click('[data-role="details"] a[data-goto="relu_2_5"]')
    wait_for_text(page, '[data-role="details"] h3', "relu_2_5")
    assert "selected" in page.get_attribute('[data-label="relu_2_5"]', "class").split()
    # the close button
    page.click('[data-role="details"] h3 button')
    page.wait_for_selector('[data-role="details"]', state="hidden")
    assert p.problems() == []


def test_tooltip_of_a_module(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    page.hover('[data-module="classifier"]')
    tip = page.wait_for_selector('[data-role="tooltip"]', state="visible")
    info = rows(tip, "tr")
    assert "classifier" in tip.inner_text()
    assert info["type"] == "Sequential" and info["operations"] == "7"
    page.mouse.move(2, VIEWPORT["height"] - 2)
    page.wait_for_selector('[data-role="tooltip"]', state="hidden")
    assert p.problems() == []


def test_no_network_request(browser, alexnet, gpt2_page):
    for path in (alexnet[1], gpt2_page):
        p = Page(browser)
        outside = []

        def block(route, outside=outside):
            if route.request.url.startswith("file:"):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        try:
            p.page.route("**/*", block)
            page = p.open(path)
            page.click('[data-role="expand-all"]')  # everything drawn once
            page.click("[data-label]")
            page.wait_for_selector('[data-role="details"]', state="visible")
            page.wait_for_timeout(300)  # late requests, if any
            assert outside == []
            assert p.requests and all(u.startswith(("file:", "data:", "about:")) for u in p.requests), p.requests
            assert p.problems() == []
        finally:
            p.close()


def test_keyboard_slash_and_escape(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    focused_role = "() => document.activeElement && document.activeElement.dataset.role"
    # `/` focuses the search box (and is not typed into it); Esc there clears it and leaves it
    page.keyboard.press("/")
    assert page.evaluate(focused_role) == "search"
    page.keyboard.type("relu")
    assert page.input_value('[data-role="search"]') == "relu"
    wait_for_text(page, '[data-role="matches"]', "7 matches")
    page.keyboard.press("Escape")
    assert page.input_value('[data-role="search"]') == ""
    assert page.evaluate(focused_role) != "search"
    assert page.inner_text('[data-role="matches"]') == ""
    # Esc closes the details panel, then goes back one step (the module opened closes again)
    click_module(page, "features")
    page.click('[data-role="fit"]')
    page.click('[data-label="conv2d_1_1"]')
    page.wait_for_selector('[data-role="details"]', state="visible")
    page.keyboard.press("Escape")
    page.wait_for_selector('[data-role="details"]', state="hidden")
    assert "conv2d_1_1" in labels(page)
    page.keyboard.press("Escape")
    page.wait_for_selector('[data-module="features"]')
    assert "conv2d_1_1" not in labels(page)
    # back from a search that opened a module
    page.keyboard.press("/")
    page.keyboard.type("linear_2_20")
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-label="linear_2_20"].selected')
    page.keyboard.press("Escape")  # leaves the search box
    page.keyboard.press("Escape")  # closes the details
    page.keyboard.press("Escape")  # closes "classifier" again
    page.wait_for_selector('[data-module="classifier"]')
    assert "linear_2_20" not in labels(page)
    assert p.problems() == []


def test_a_cache_is_one_node_that_opens(open_page, gpt2_cache_page):
    history, path = gpt2_cache_page
    cache = [e for e in history if e.is_output and e.address != "output.logits"]
    container = cache[0].address.rsplit(".", 3)[0]  # 'output.cache' (the name depends on transformers)
    p = open_page(path)
    page = p.page
    node = page.wait_for_selector(f'[data-module="{container}"][data-group="4"]')
    assert f"{container} (4 tensors)" in node.text_content()
    assert not {e.label for e in cache} & set(labels(page))
    assert "output_1_104" in labels(page)  # the logits stay a node
    assert inside_graph(page, f'[data-module="{container}"]')
    click_module(page, container)
    page.wait_for_selector(f'[data-box="{container}"]')
    assert {e.label for e in cache} <= set(labels(page))
    assert inside_graph(page, f'[data-box="{container}"]')
    rows = {round(page.locator(f'[data-label="{e.label}"]').bounding_box()["y"]) for e in cache}
    assert len(rows) == 2  # a grid (2 x 2), not one row as wide as the cache is long
    assert overlaps(page) == []
    page.keyboard.press("Escape")  # back: closed again
    page.wait_for_selector(f'[data-module="{container}"][data-group="4"]')
    # search finds a tensor inside and opens the group
    box = page.locator('[data-role="search"]')
    box.fill(cache[2].label)
    box.press("Enter")
    page.wait_for_selector(f'[data-label="{cache[2].label}"].selected')
    assert p.problems() == []


def test_opening_a_big_module_shows_it_whole(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    page.click('[data-role="fit"]')
    page.click('[data-module="features"]')
    page.wait_for_selector('[data-box="features"]')
    assert inside_graph(page, '[data-box="features"]')  # was anchored at the clicked node, mostly off screen
    assert inside_graph(page, '[data-label="conv2d_1_1"]') and inside_graph(page, '[data-label="maxpool2d_3_13"]')
    assert p.problems() == []


MARKERS_JS = """() => [...document.querySelectorAll('path.edge')].map(e => {
    const id = e.getAttribute('marker-end').match(/#([^)]+)/)[1];
    const m = document.getElementById(id);
    const units = m.getAttribute('markerUnits') || 'strokeWidth';
    const scale = units === 'strokeWidth' ? parseFloat(getComputedStyle(e).strokeWidth) : 1;
    return {hot: e.classList.contains('hot'), size: parseFloat(m.getAttribute('markerWidth')) * scale,
            refX: m.getAttribute('refX'), refY: m.getAttribute('refY'),
            head: getComputedStyle(m.querySelector('path')).fill, stroke: getComputedStyle(e).stroke};
})"""


def test_highlighted_edges_have_heads_like_the_others(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    click_module(page, "features")
    page.click('[data-role="fit"]')
    page.click('[data-label="conv2d_2_4"]')
    page.wait_for_selector("path.edge.hot", state="attached")
    heads = page.evaluate(MARKERS_JS)
    hot, normal = [h for h in heads if h["hot"]], [h for h in heads if not h["hot"]]
    assert len(hot) == 2 and normal
    for h in hot + normal:
        assert (h["size"], h["refX"], h["refY"]) == (normal[0]["size"], normal[0]["refX"], normal[0]["refY"])
        assert h["head"] == h["stroke"]  # the head has its edge's colour
    assert hot[0]["stroke"] != normal[0]["stroke"]
    assert p.problems() == []


def test_escape_and_search_hide_the_hover_card(open_page, alexnet):
    p = open_page(alexnet[1])
    page = p.page
    page.hover('[data-module="classifier"]')
    page.wait_for_selector('[data-role="tooltip"]', state="visible")
    page.keyboard.press("Escape")
    page.wait_for_selector('[data-role="tooltip"]', state="hidden")
    page.mouse.move(2, VIEWPORT["height"] - 2)
    page.hover('[data-module="classifier"]')
    page.wait_for_selector('[data-role="tooltip"]', state="visible")
    page.fill('[data-role="search"]', "relu")  # typing: the card goes with the first results
    wait_for_text(page, '[data-role="matches"]', "7 matches")
    assert page.is_hidden('[data-role="tooltip"]')
    page.mouse.move(2, VIEWPORT["height"] - 2)
    page.hover('[data-module="classifier"]')
    page.wait_for_selector('[data-role="tooltip"]', state="visible")
    page.press('[data-role="search"]', "Enter")
    page.wait_for_selector('[data-role="tooltip"]', state="hidden")
    assert p.problems() == []
