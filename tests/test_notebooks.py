"""The notebooks in local_jupyter_tests/ run top to bottom without errors, as a user runs them."""

import pathlib

import pytest
from frames import unpack_frame

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "local_jupyter_tests").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    book = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if "drawing" in path.stem:  # the history and show_model_graph display inline as SVG
        assert sum("image/svg+xml" in o.get("data", {}) for o in outputs) >= 2


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.slow
def test_inline_pages_work_in_the_notebook_as_html(browser, tmp_path):
    """04_inline_pages executed, converted to HTML with nbconvert and opened in Chromium with
    every request that would leave the machine failed: the inline ResNet-18 graph opens
    layer1 on a click, the entry card shows its histogram, the watch's explorer draws its
    modules, and no request other than file:/data:/about: was made."""
    nbconvert = pytest.importorskip("nbconvert")
    from torchlens.web.stats import NUM_BINS

    path = next(p for p in NOTEBOOKS if p.stem == "04_inline_pages")
    book = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    graph = outputs[0]["data"]  # the history as the last expression: every form of it
    assert {"text/plain", "text/html", "image/svg+xml"} <= set(graph)
    page = tmp_path / "inline.html"
    # nbconvert's own template loads require.js and MathJax from a CDN; the notebook needs neither
    exporter = nbconvert.HTMLExporter(require_js_url="", mathjax_url="")
    page.write_text(exporter.from_notebook_node(book)[0], encoding="utf-8")

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(30_000)
    outside, problems = [], []

    def route(r):
        if r.request.url.startswith(("file:", "data:", "about:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    try:
        context.route("**/*", route)
        tab = context.new_page()
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.goto(page.as_uri())
        frames = tab.locator("iframe")
        assert frames.count() == 3  # the history, history.show(), the watch
        inner = frames.nth(0).element_handle().content_frame()
        inner.wait_for_selector('body[data-ready="1"]')
        inner.click('[data-role="fit"]')
        inner.click('[data-module="layer1"]')
        inner.wait_for_selector('[data-box="layer1"]')
        assert inner.locator('[data-module="layer1.0"][data-repeat="2"]').count() == 1
        card = tab.locator(".torchlens-card[data-label]").first
        bars = card.locator('svg[data-role="histogram"] rect')
        assert bars.count() == NUM_BINS and card.locator("svg").bounding_box()["height"] > 20
        assert "layer1.0.conv1" in card.inner_text()
        frames.nth(2).scroll_into_view_if_needed()
        explorer = frames.nth(2).element_handle().content_frame()
        explorer.wait_for_selector('[data-node="0:1"]')
        assert "4 logged steps" in explorer.inner_text("body")
        tab.wait_for_timeout(300)  # late requests, if any
        assert outside == [] and problems == []
    finally:
        context.close()


# ----- what Jupyter is given (no kernel needed) ---------------------------------------------


_unpacked = unpack_frame  # (page, bundle) of a notebook output's iframe


def test_history_gives_jupyter_the_page_the_drawing_and_the_text():
    import torch

    import torchlens as tl

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    h = tl.log_forward_pass(model, torch.ones(1, 3), random_seed=0)
    bundle = h._repr_mimebundle_()
    assert bundle["text/plain"] == str(h)
    assert bundle["image/svg+xml"] == h._repr_svg_() and "<svg" in bundle["image/svg+xml"]
    frame = bundle["text/html"]
    assert frame == h._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame and 'loading="lazy"' in frame
    page, packed = _unpacked(frame)
    assert packed["name"] == "TORCHLENS_GRAPH"
    assert [op["label"] for op in packed["data"]["ops"]] == h.layer_labels
    assert len(packed["scripts"]) >= 2 and "TORCHLENS_GRAPH" in "".join(packed["scripts"])
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert set(h._repr_mimebundle_(include=["text/plain"])) == {"text/plain"}
    assert "text/html" not in h._repr_mimebundle_(exclude=["text/html"])


def test_show_height_and_outside_a_notebook():
    import torch

    import torchlens as tl
    from torchlens.trace.render.graph_page.inline import notebook_html

    h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    assert "height: 300px" in notebook_html(h, height=300)
    with pytest.raises(ValueError, match="at least 100"):
        notebook_html(h, height=20)
    with pytest.raises(RuntimeError, match="to_html"):
        h.show(height=300)


def test_a_large_graph_has_no_inline_drawing_in_any_form():
    """Past SVG_MAX_OPS the drawing is left out of the bundle, and _repr_svg_ agrees (Jupyter
    would otherwise call it for the missing type and store a drawing larger than the page)."""
    import torch

    import torchlens as tl
    from torchlens.trace.render.graph_page.inline import SVG_MAX_OPS

    class Deep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            for _ in range(SVG_MAX_OPS // 2 + 1):
                x = torch.relu(self.fc(x))
            return x

    h = tl.log_forward_pass(Deep(), torch.ones(1, 2), random_seed=0)
    assert len(h) > SVG_MAX_OPS
    bundle = h._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert h._repr_svg_() is None


@pytest.mark.slow
def test_gpt2_inline_page_is_under_a_megabyte():
    transformers = pytest.importorskip("transformers")
    import json

    import torch

    import torchlens as tl

    config = transformers.GPT2Config(n_layer=12, n_embd=64, n_head=2, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config).eval()
    h = tl.log_forward_pass(model, torch.randint(0, 100, (1, 16)), random_seed=0)
    stored = json.dumps(h._repr_mimebundle_())  # what the notebook file holds for the output
    assert len(stored) <= 1_000_000, len(stored)
    _, packed = _unpacked(h._repr_html_())
    assert len(packed["data"]["ops"]) == len(h)  # every op is in it, nothing dropped to fit


def test_entry_card_shows_statistics_histogram_neighbours_module_and_source():
    import re

    import torch

    import torchlens as tl
    from torchlens.web.stats import NUM_BINS, tensor_stats

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 64)

        def forward(self, x):
            y = self.fc(x)
            return torch.relu(y) * 2  # the source line of relu

    h = tl.log_forward_pass(Net(), torch.randn(8, 3), random_seed=0)
    entry = h["relu_1_2"]
    card = entry._repr_html_()
    rows = dict(re.findall(r"<th[^>]*>([^<]*)</th><td[^>]*>([^<]*)</td>", card))
    stats = tensor_stats(entry.activation)
    assert rows["shape"] == "(8, 64)" and rows["dtype"] == "float32" and rows["size"] == entry.tensor_size_text
    assert float(rows["min"]) == pytest.approx(stats["min"], rel=1e-3)
    assert float(rows["max"]) == pytest.approx(stats["max"], rel=1e-3)
    assert float(rows["mean"]) == pytest.approx(stats["mean"], rel=1e-3)
    assert float(rows["std"]) == pytest.approx(stats["std"], rel=1e-3)
    assert rows["parents"] == "linear_1_1" and rows["children"] == ", ".join(entry.child_layers)
    assert rows["module"] == "none (outside every module)"
    assert "test_notebooks.py" in rows["source"] and "torch.relu(y) * 2" in rows["source"]
    assert h["linear_1_1"]._repr_html_().count("fc") >= 1
    assert re.search(r"<th[^>]*>module</th><td[^>]*>fc</td>", h["linear_1_1"]._repr_html_())
    # the histogram: the bins of the shared statistics rule, tallest bar the fullest bin
    hist = re.search(r'<svg data-role="histogram".*?</svg>', card).group(0)
    heights = [float(x) for x in re.findall(r'<rect [^>]*height="([\d.]+)"', hist)]
    assert len(heights) == NUM_BINS == len(stats["hist"])
    assert heights.index(max(heights)) == stats["hist"].index(max(stats["hist"]))
    assert [t for t in re.findall(r"<title>(\d+)</title>", hist)] == [str(c) for c in stats["hist"]]


def test_entry_card_of_an_unsaved_entry_says_so():
    import torch

    import torchlens as tl

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    h = tl.log_forward_pass(
        model, torch.ones(1, 3), layers_to_save=["relu_1_2"], keep_unsaved_layers=True, random_seed=0
    )
    card = h["linear_1_1"]._repr_html_()
    assert "not saved" in card and 'data-role="histogram"' not in card
    assert 'data-role="histogram"' in h["relu_1_2"]._repr_html_()


def test_ten_inline_graphs_lay_out_only_when_on_screen(browser, tmp_path):
    """A notebook of ten graphs stays responsive: a graph scrolled out of view is not unpacked
    nor laid out until it comes into view."""
    import torch

    import torchlens as tl

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    frame = tl.log_forward_pass(model, torch.ones(1, 3), random_seed=0)._repr_html_()
    gap = '<div style="height: 1500px"></div>'
    host = tmp_path / "ten.html"
    host.write_text(f"<!doctype html><html><body>{gap.join([frame] * 10)}</body></html>", encoding="utf-8")
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    context.set_default_timeout(20_000)
    try:
        tab = context.new_page()
        tab.goto(host.as_uri())
        frames = [tab.locator("iframe").nth(i) for i in range(10)]
        first = frames[0].element_handle().content_frame()
        first.wait_for_selector('body[data-ready="1"]')
        tab.wait_for_timeout(500)
        ready = [
            f.element_handle().content_frame() is not None
            and f.element_handle().content_frame().evaluate("document.body.dataset.ready || ''") == "1"
            for f in frames
        ]
        assert ready[0] and not any(ready[2:]), ready  # only what is on screen (and next to it)
        frames[7].scroll_into_view_if_needed()
        frames[7].element_handle().content_frame().wait_for_selector('body[data-ready="1"]')
    finally:
        context.close()


def test_watch_shows_its_explorer_snapshot_inline(tmp_path):
    import torch

    import torchlens as tl

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    try:
        _, before = _unpacked(w._repr_html_())  # nothing written yet: still a page
        assert before["name"] == "TORCHLENS_EXPORT" and before["data"]["call_series"] == {}
        for _ in range(3):
            model(torch.randn(5, 4)).sum().backward()
        _, packed = _unpacked(w._repr_html_())
        summary = packed["data"]["summary"]
        assert summary["model"] == "Sequential" and {"0:1", "2:1"} <= set(summary["calls"])
        assert summary["steps"] == [0, 1, 2] and summary["status"] == "running"  # each written as its backward ended
        with pytest.raises(RuntimeError, match="torchlens explore"):
            w.show(height=300)
    finally:
        w.close()
    _, after = _unpacked(w._repr_html_())  # a closed watch still shows its run
    assert after["data"]["summary"]["steps"] == [0, 1, 2] and after["data"]["summary"]["status"] == "finished"
