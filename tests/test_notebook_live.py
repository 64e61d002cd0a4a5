"""A watch's explorer inline in Jupyter, live (torchlens/train/backends/notebook.py): the feed of new steps,
a real kernel pushing them over the widget's comm while cells train, the static snapshot kept
beside the widget for nbconvert, and a real JupyterLab in Chromium whose inline explorer gains
the new columns of a second training cell without a reload."""

from __future__ import annotations

import base64
import gzip
import html
import json
import queue
import re
import time

import pytest
import torch

import torchlens as tl
from torchlens.train.backends.notebook import LiveFeed
from torchlens.web.stats import NUM_BINS

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

TRAIN_CELL = """
import tempfile, torch, torchlens as tl
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train(n):
    for _ in range(n):
        opt.zero_grad(); model(torch.randn(16, 4)).pow(2).mean().backward(); opt.step()
w = tl.watch(model, run_dir=tempfile.mkdtemp(), backend=None, verbose=False)
train(2)
w
"""


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _step(model):
    model(torch.randn(8, 4)).pow(2).mean().backward()


def test_feed_sends_only_what_is_new(tmp_path):
    model = _model()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    feed = LiveFeed(w.run_dir)
    try:
        first = feed.page_data()
        assert first["live"] is True and first["summary"]["steps"] == [] and first["call_series"] == {}
        for _ in range(2):
            _step(model)
        w.flush()
        news = feed.update()  # the calls appeared with the first step: sent with their layouts
        assert news["steps"] == [0, 1] and news["status"] == "running"
        assert {"0:1", "2:1"} <= set(news["summary"]["calls"]) and "" in news["layouts"]
        weight = next(s for s in news["series"]["0:1"]["series"] if s["name"] == "weight")
        assert weight["steps"] == [0, 1]
        assert feed.update() is None  # nothing new: nothing sent
        _step(model)
        w.flush()
        news = feed.update()
        assert news["steps"] == [2] and "summary" not in news  # no new call: no summary again
        weight = next(s for s in news["series"]["0:1"]["series"] if s["name"] == "weight")
        assert weight["steps"] == [2]  # only the new column
        again = feed.update(since=-1)  # a front end that lacks everything (reloaded) gets it all
        assert again["steps"] == [0, 1, 2] and "summary" in again
        assert feed.update(again=True)["series"]["0:1"]["series"][0]["steps"] == [2]
    finally:
        w.close()
    assert feed.update()["status"] == "finished"
    feed.close()


def test_feed_restarts_the_columns_when_the_stride_grows(tmp_path):
    model = _model()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, max_columns=4)
    feed = LiveFeed(w.run_dir)
    try:
        feed.page_data()
        for _ in range(3):
            _step(model)
        w.flush()
        assert "restart" not in feed.update()
        for _ in range(3):  # 6 steps in at most 4 columns: two steps a column
            _step(model)
        w.flush()
        news = feed.update()
        assert news["restart"] is True and news["stride"] > 1
        weight = next(s for s in news["series"]["0:1"]["series"] if s["name"] == "weight")
        assert weight["steps"][0] == 0  # every column again, merged at the new stride
        for _ in range(2):  # a column of two steps: sent when it begins, again when it fills
            _step(model)
            w.flush()
            news = feed.update()
            weight = next(s for s in news["series"]["0:1"]["series"] if s["name"] == "weight")
            assert len(weight["steps"]) == 1 and weight["last_steps"] == news["steps"][-1:]
        assert weight["steps"][0] < weight["last_steps"][0]
    finally:
        w.close()
        feed.close()


def test_outside_a_kernel_a_watch_shows_its_snapshot(tmp_path):
    model = _model()
    with tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False) as w:
        _step(model)
        bundle = w._repr_mimebundle_()
        assert set(bundle) == {"text/html", "text/plain"} and bundle["text/html"].startswith("<iframe srcdoc=")


# ----- a real kernel ---------------------------------------------------------------------------
@pytest.fixture
def kernel():
    manager = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("anywidget")
    km, kc = manager.start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _execute(kc, code, timeout=120):
    """Run ``code``; the iopub messages until the kernel is idle again, then those of 3 more s."""
    msg_id, messages = kc.execute(code), []
    deadline, idle_at = time.monotonic() + timeout, None
    while time.monotonic() < (deadline if idle_at is None else min(deadline, idle_at + 3)):
        try:
            message = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        messages.append(message)
        content = message["content"]
        if message["parent_header"].get("msg_id") == msg_id and content.get("execution_state") == "idle":
            idle_at = time.monotonic()
        assert message["msg_type"] != "error", content
    assert idle_at is not None, f"the cell did not finish in {timeout} s"
    return messages


def _srcdoc(frame):
    """The page inside an ``<iframe srcdoc>``."""
    return html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))


def _page_steps(page):
    """The steps in a packed explorer page's data."""
    packed = re.search(r'<script type="application/octet-stream" id="tl-packed">([^<]*)</script>', page).group(1)
    return json.loads(gzip.decompress(base64.b64decode(packed)))["data"]["summary"]["steps"]


def _updates(messages):
    return [
        m["content"]["data"]["content"]["update"]
        for m in messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "custom"
    ]


@pytest.mark.slow
def test_a_kernel_pushes_each_cells_steps_to_the_widget(kernel, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbconvert = pytest.importorskip("nbconvert")
    first = _execute(kernel, TRAIN_CELL)
    shown = next(m["content"] for m in first if m["msg_type"] == "display_data")
    result = shown["data"]
    assert WIDGET_VIEW in result and result["text/html"].startswith("<iframe srcdoc=")  # live, and the snapshot
    text = next(m["content"]["data"] for m in first if m["msg_type"] == "execute_result")
    assert "torchlens watch of Sequential" in text["text/plain"] and "iframe" not in text["text/html"]  # one view
    opened = next(
        m["content"]["data"]["state"]
        for m in first
        if m["msg_type"] == "comm_open"
        and m["content"]["data"]["state"].get("_anywidget_id", "").endswith("LiveExplorer")
    )
    assert opened["height"] == 640
    # step 1, the cell's last, is written when the cell ends at the latest (not when a next step
    # begins), and pushed if the snapshot lacks it
    seen = _page_steps(opened["page"]) + [s for u in _updates(first) for s in u["steps"]]
    assert seen == [0, 1]
    second = _execute(kernel, "import time\ntrain(3)\ntime.sleep(2)")
    pushed = _updates(second)
    assert [s for u in pushed for s in u["steps"]] == [2, 3, 4]
    idle = next(i for i, m in enumerate(second) if m["content"].get("execution_state") == "idle")
    assert _updates(second[:idle])  # live: pushed while the cell still runs, not only after it
    weight = [s for u in pushed for s in u["series"]["0:1"]["series"] if s["name"] == "weight"]
    assert weight[-1]["steps"][-1] == 4 and len(weight[-1]["counts"][-1]) == NUM_BINS
    closing = _execute(kernel, "w.close()")
    assert _updates(closing)[-1]["status"] == "finished"
    # then the output is replaced by the final snapshot: what a notebook saved now keeps
    final = next(m["content"] for m in closing if m["msg_type"] == "update_display_data")
    assert final["transient"]["display_id"] == shown["transient"]["display_id"]
    assert WIDGET_VIEW not in final["data"] and _page_steps(_srcdoc(final["data"]["text/html"])) == [0, 1, 2, 3, 4]
    # saved without widget state (JupyterLab's default) and converted: the snapshot shows
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TRAIN_CELL)])
    book.cells[0].outputs = [nbformat.v4.new_output("execute_result", data=result, execution_count=1)]
    page = nbconvert.HTMLExporter(require_js_url="", mathjax_url="").from_notebook_node(book)[0]
    shown = re.search(r"<iframe [^>]*srcdoc=[^>]*>", page)
    assert shown and "tl-packed" in shown.group(0) and f'<script type="{WIDGET_VIEW}">' not in page


# ----- a real JupyterLab, driven by Chromium --------------------------------------------------
def _notebook(path):
    nbformat = pytest.importorskip("nbformat")
    cells = [nbformat.v4.new_code_cell(code) for code in (TRAIN_CELL, "train(3)", "w.close()")]
    book = nbformat.v4.new_notebook(cells=cells)
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.write_text(json.dumps(book), encoding="utf-8")


def _run_cell(tab, index):
    tab.evaluate(
        """async (index) => {
            const app = window.jupyterapp;
            const panel = app.shell.currentWidget;
            await panel.sessionContext.ready;
            panel.content.activeCellIndex = index;
            await app.commands.execute("notebook:run-cell");
        }""",
        index,
    )


@pytest.mark.slow
def test_jupyterlab_inline_explorer_gains_the_next_cells_column(browser, tmp_path):
    pytest.importorskip("jupyterlab")
    pytest.importorskip("anywidget")
    from jupyter_lab import jupyter_lab

    _notebook(tmp_path / "live.ipynb")
    with jupyter_lab(str(tmp_path)) as lab:
        context = browser.new_context(viewport={"width": 1300, "height": 1000})
        context.set_default_timeout(60_000)
        outside, problems = [], []

        def route(r):
            if r.request.url.startswith((lab.url, "data:", "about:", "blob:")):
                r.continue_()
            else:
                outside.append(r.request.url)
                r.abort()

        try:
            context.route("**/*", route)
            tab = context.new_page()
            tab.goto(f"{lab.url}/lab/tree/live.ipynb?token={lab.token}")
            tab.wait_for_function(
                "window.jupyterapp && window.jupyterapp.shell.currentWidget "
                "&& window.jupyterapp.shell.currentWidget.sessionContext"
            )
            _run_cell(tab, 0)
            frame = tab.wait_for_selector('iframe[data-role="torchlens-live"]', timeout=120_000).content_frame()
            frame.on("framenavigated", lambda f: problems.append("the explorer was reloaded"))
            frame.wait_for_selector('[data-node="0:1"]')
            frame.evaluate("window.__sameDocument = true")
            frame.drag_and_drop('[data-node="0:1"]', '[data-role="panels"]')
            columns = '[data-panel="0:1"] canvas[data-series="params/weight"]'
            frame.wait_for_selector(f'{columns}[data-columns="2"]')  # steps 0 and 1: the first cell's
            assert "2 logged steps" in frame.inner_text('[data-role="status"]')
            _run_cell(tab, 1)
            frame.wait_for_selector(f'{columns}[data-columns="5"]', timeout=60_000)  # the second cell's 3 more
            assert "5 logged steps (last 4)" in frame.inner_text('[data-role="status"]')
            assert frame.evaluate("window.__sameDocument === true")  # updated in place, not reloaded
            assert problems == []
            # the run ends: the output becomes the final snapshot, which the saved notebook keeps
            _run_cell(tab, 2)
            tab.wait_for_selector('iframe[data-role="torchlens-live"]', state="detached")
            tab.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
            tab.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
            saved = json.loads((tmp_path / "live.ipynb").read_text(encoding="utf-8"))
            assert [WIDGET_VIEW in o.get("data", {}) for o in saved["cells"][0]["outputs"]] == [False, False]
            tab.reload()  # reopened without a kernel: the snapshot, with every step
            snapshot = tab.wait_for_selector(".jp-OutputArea-output iframe[srcdoc]").content_frame()
            snapshot.wait_for_selector('[data-node="0:1"]')
            assert "5 logged steps (last 4) · finished" in snapshot.inner_text('[data-role="status"]')
            assert outside == []
        finally:
            context.close()


# ----- the page's side alone, in Chromium: live.js fed as the widget feeds it ----------------------
def test_live_page_applies_pushed_updates(browser, tmp_path):
    """The live page in a sandboxed iframe, fed real updates by a parent page as the widget
    does: new columns drawn without a reload, an update applied twice counts once, and a
    stopped feed says so in the status line."""
    from torchlens.web.embed import packed_page

    model = _model()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    feed = LiveFeed(w.run_dir)
    try:
        for _ in range(2):
            _step(model)
        w.flush()
        page = packed_page("index.html", feed.page_data(), "TORCHLENS_EXPORT", extra_scripts=["live.js"])
        for _ in range(2):
            _step(model)
        w.flush()
        update = feed.update()
    finally:
        w.close()
        feed.close()
    wrapper = tmp_path / "wrapper.html"
    wrapper.write_text(
        f'<iframe id="f" sandbox="allow-scripts" style="width:1200px;height:800px" srcdoc="{html.escape(page)}">'
        "</iframe><script>window.addEventListener('message', (e) => { if (e.data.torchlens === 'ready') "
        "window.readyLast = e.data.last; });</script>",
        encoding="utf-8",
    )
    send = "(m) => document.getElementById('f').contentWindow.postMessage(m, '*')"
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.set_default_timeout(20_000)
    try:
        tab = context.new_page()
        problems = []
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.goto(wrapper.as_uri())
        tab.wait_for_function("window.readyLast === 1")  # the page says which steps it has
        frame = tab.frame_locator("#f")
        frame.locator('[data-node="0:1"]').drag_to(frame.locator('[data-role="panels"]'))
        strip = frame.locator('[data-panel="0:1"] canvas[data-series="params/weight"]')
        strip.and_(frame.locator('[data-columns="2"]')).wait_for()
        frame.locator("body").evaluate("b => { window.sameDocument = true; }")
        for _ in range(2):  # the widget replays what it has to a page that opens late: no double
            tab.evaluate(send, {"torchlens": "update", "update": update})
        strip.and_(frame.locator('[data-columns="4"]')).wait_for()
        status = frame.locator('[data-role="status"]')
        assert "4 logged steps (last 3)" in status.inner_text()
        assert frame.locator("body").evaluate("() => window.sameDocument === true")
        tab.evaluate(send, {"torchlens": "error", "message": "torchlens: the live view stopped: test"})
        frame.locator('[data-role="status"]:has-text("the live view stopped")').wait_for()
        assert problems == []
    finally:
        context.close()
