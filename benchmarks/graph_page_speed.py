"""Size and speed of the interactive graph page (``history.to_html``) in headless Chromium.

For each model: the seconds ``to_html`` takes, the page's size, the first paint and the time
until the graph is drawn after opening the file, and the re-layout times of the page's own
timings (``window.__torchlensGraph.timings``): the first drawing, "expand all" (every module
open, every repeated block unfolded), and opening one module while about that many nodes are
visible (collapse, then expand again: the time a click costs on the biggest view).

    python benchmarks/graph_page_speed.py                 # alexnet resnet50 gpt2 swin_v2_b
    python benchmarks/graph_page_speed.py resnet18 gpt2

Numbers are printed, not asserted (they depend on the machine).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

import torchlens as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's examples/
from examples.browser import launch  # noqa: E402


def build(name: str):
    """(model, input) with random weights."""
    if name == "gpt2":
        import transformers

        config = transformers.GPT2Config(n_embd=32, n_head=2, vocab_size=100, n_layer=12, use_cache=False)
        return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 16))
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval(), torch.rand(1, 3, 224, 224)


def measure_page(browser, path: str) -> dict:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.route(
        "**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:")) else route.abort()
    )
    started = time.perf_counter()
    page.goto("file://" + os.path.abspath(path))
    page.wait_for_selector("body[data-ready]", timeout=120_000)
    opened = time.perf_counter() - started
    paint = page.evaluate("(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null")
    page.click('[data-role="expand-all"]')
    page.wait_for_function("window.__torchlensGraph.timings.some(t => t.what === 'expand all')")
    # a top-level module of the fully opened view: close it and open it again
    cid = page.evaluate("""() => {
        const mods = window.__torchlensGraph.model.view.modules;
        let best = null;
        for (const [cid, m] of Object.entries(mods)) if (cid && m.parent === '' && (!best || m.ops > mods[best].ops)) best = cid;
        return best;
    }""")
    if cid is not None:
        page.dispatch_event(f'[data-collapse="{cid}"]', "click")
        page.wait_for_selector(f'[data-cid="{cid}"].module')
        page.dispatch_event(f'[data-cid="{cid}"].module', "click")
        page.wait_for_function(f"window.__torchlensGraph.timings.some(t => t.what === 'expand {cid}')")
    timings = page.evaluate("window.__torchlensGraph.timings")
    context.close()
    return {"opened": opened, "paint": paint, "timings": timings}


def main(names) -> None:
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    folder = tempfile.mkdtemp()
    with sync_playwright() as p:
        browser = launch(p)
        print(
            f"{'model':<11} {'ops':>5} {'to_html':>8} {'size':>9} {'1st paint':>9} {'drawn':>7} "
            f"{'start':>6} {'expand all':>17} {'expand 1 module':>22}"
        )
        for name in names:
            model, x = build(name)
            history = tl.log_forward_pass(model, x, random_seed=0)
            path = os.path.join(folder, f"{name}.html")
            t = time.perf_counter()
            history.to_html(path)
            written = time.perf_counter() - t
            kb = os.path.getsize(path) / 1024
            m = measure_page(browser, path)
            by = {t["what"]: t for t in m["timings"]}
            start, full = by.get("start"), by.get("expand all")
            one = next((t for t in m["timings"] if t["what"].startswith("expand ") and t["what"] != "expand all"), None)
            paint = f"{m['paint']:.0f} ms" if m["paint"] else "–"
            print(
                f"{name:<11} {len(history):>5} {written:>7.2f}s {kb:>6.0f} KB {paint:>9} {m['opened'] * 1000:>5.0f} ms "
                f"{start['totalMs']:>4.0f}ms {full['totalMs']:>6.0f} ms ({full['visible']:>4} n) "
                + (f"{one['totalMs']:>6.0f} ms ({one['visible']:>4} n; layout {one['layoutMs']:.0f})" if one else "")
            )
            del model, history
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1:] or ["alexnet", "resnet50", "gpt2", "swin_v2_b"])
