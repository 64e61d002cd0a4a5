#!/usr/bin/env python
"""Speed of the explorer page in headless Chromium, against its targets.

* first paint: navigation start to the first graph node of a 40-layer GPT-2 run (~490 calls);
  target 2,000 ms;
* drill-down: click on a node to its inside drawn (``transformer:1``, ``transformer.h.5:1``);
  target 200 ms;
* long strip: pinning a run of 10,000 logged steps (at most 512 columns kept) to its strips
  drawn; target 500 ms.

Each is the median of ``--repeats`` fresh pages. Torch runs on one thread. Needs Playwright and
Chromium (``/usr/bin/chromium`` or ``TORCHLENS_CHROMIUM``), as the browser tests do.

    .venv/bin/python benchmarks/explorer_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's examples/
from examples.browser import launch  # noqa: E402

TARGETS_MS = {"first paint": 2000, "drill transformer:1": 200, "drill transformer.h.5:1": 200, "long strip": 500}
FIRST_NODE_JS = """(() => {
    const seen = () => { if (document.querySelector('[data-node]')) { window.__firstNodeAt = performance.now(); return true; } return false; };
    const watch = new MutationObserver(() => { if (seen()) watch.disconnect(); });
    watch.observe(document, { childList: true, subtree: true });
})();"""
STRIP_DRAWN_JS = """() => {
    window.addEventListener('pointerup', () => { window.__dropAt = performance.now(); }, true);
    new MutationObserver((changes) => {
        if (window.__drawnAt === undefined && changes.some(c => c.attributeName === 'data-columns'))
            window.__drawnAt = performance.now();
    }).observe(document.querySelector('[data-role="panels"]'),
               { attributes: true, subtree: true, attributeFilter: ['data-columns'] });
}"""


def gpt2_run(folder: str) -> str:
    import transformers

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


def long_run(folder: str, steps: int = 10_000) -> str:
    model = nn.Linear(2, 2)
    with tl.watch(model, log=("params",), backend=None, run_dir=folder, verbose=False):
        x = torch.ones(1, 2)
        for _ in range(steps):
            model(x)
    return folder


def time_graph(browser, url: str) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.add_init_script(FIRST_NODE_JS)
    page.goto(url)
    page.wait_for_selector('[data-node="transformer:1"]')
    out = {"first paint": page.evaluate("window.__firstNodeAt")}
    for cid, child in (("transformer:1", "transformer.h.5:1"), ("transformer.h.5:1", "transformer.h.5.attn:1")):
        page.click(f'[data-node="{cid}"]')
        page.wait_for_selector(f'[data-node="{child}"]')
    for t in page.evaluate("window.__torchlensTimings"):
        if t["call"]:
            out[f"drill {t['call']}"] = t["ms"]
    page.close()
    return out


def time_strip(browser, url: str) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    page.wait_for_selector('[data-node="input 0"]')
    page.evaluate(STRIP_DRAWN_JS)
    page.drag_and_drop('[data-node="input 0"]', '[data-role="panels"]')
    page.wait_for_function("() => window.__drawnAt !== undefined")
    ms = page.evaluate("window.__drawnAt - window.__dropAt")
    page.close()
    return {"long strip": ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    samples: dict[str, list[float]] = {key: [] for key in TARGETS_MS}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        graph_dir, strip_dir = gpt2_run(os.path.join(tmp, "gpt2")), long_run(os.path.join(tmp, "long"))
        browser = launch(playwright)
        for folder, measure in ((graph_dir, time_graph), (strip_dir, time_strip)):
            server = explore(folder, port=0, block=False)
            try:
                for _ in range(args.repeats):
                    for key, ms in measure(browser, server.url).items():
                        samples[key].append(ms)
            finally:
                server.close()
        browser.close()
    print(f"{'measure':28s}{'median ms':>10s}{'max ms':>9s}{'target':>9s}")
    for key, target in TARGETS_MS.items():
        values = samples[key]
        print(f"{key:28s}{statistics.median(values):10.0f}{max(values):9.0f}{target:9d}")


if __name__ == "__main__":
    main()
