"""Screenshots of the explorer page for the README, taken in Debian's Chromium.

Run with ``python -m examples.explorer_images [outdir]`` (default ``images/``). Needs
torchvision, Playwright (``pip install playwright``) and ``/usr/bin/chromium``. It trains a
ResNet-18 for 30 small steps under ``tl.watch`` and writes:

- ``explorer_resnet_block``: inside ``layer1.0`` with the panels of ``conv1`` and ``relu (2)``;
- ``explorer_root``: the whole model's graph with the panel of ``fc``;
- ``explorer_first_call``: the panel of ``conv1``, fed the data, whose gradient strip says why
  it has no values (the data's gradient is off by default).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

from .browser import launch


def train_run(run_dir: str, steps: int = 30) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with tl.watch(model, run_dir=run_dir, backend=None, verbose=False):
        for _ in range(steps):
            x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def main(outdir: str = "images") -> None:
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    os.makedirs(outdir, exist_ok=True)
    run_dir = os.path.join(tempfile.mkdtemp(), "resnet18")
    train_run(run_dir)
    server = explore(run_dir, port=0, block=False)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(server.url)
            page.wait_for_selector('[data-node="fc:1"]')
            page.drag_and_drop('[data-node="fc:1"]', '[data-role="panels"]')
            page.wait_for_selector('canvas[data-series="params_grad/weight"]')
            page.hover('[data-node="layer2:1"]')
            page.wait_for_timeout(1500)  # past the highlight of a new panel
            page.screenshot(path=os.path.join(outdir, "explorer_root.png"))
            page.locator('[data-panel="fc:1"] button.close').click()
            page.click('[data-node="layer1:1"]')
            page.wait_for_selector('[data-node="layer1.0:1"]')
            page.click('[data-node="layer1.0:1"]')
            page.wait_for_selector('[data-node="layer1.0.conv1:1"]')
            for node in ("layer1.0.conv1:1", "layer1.0.relu:2"):
                page.drag_and_drop(f'[data-node="{node}"]', '[data-role="panels"]')
            page.wait_for_selector('[data-panel="layer1.0.relu:2"] canvas')
            page.hover('[data-node="layer1.0.conv1:1"]')
            page.wait_for_timeout(1500)  # past the highlight of a new panel
            page.screenshot(path=os.path.join(outdir, "explorer_resnet_block.png"))
            first_call(browser, server.url, outdir)
            browser.close()
    finally:
        server.close()
    print(f"wrote explorer_root.png, explorer_resnet_block.png and explorer_first_call.png into {outdir}/")


def first_call(browser: Any, url: str, outdir: str) -> None:
    """The model's first call pinned: the data's gradient strip says why it is not there."""
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    page.goto(url)
    page.wait_for_selector('[data-node="conv1:1"]')
    page.drag_and_drop('[data-node="conv1:1"]', '[data-role="panels"]')
    page.wait_for_selector('[data-panel="conv1:1"] .reason')
    page.mouse.move(700, 700)  # no node's tooltip over the graph
    page.wait_for_timeout(1500)  # past the highlight of a new panel
    page.screenshot(path=os.path.join(outdir, "explorer_first_call.png"))


if __name__ == "__main__":
    main(*sys.argv[1:2])
