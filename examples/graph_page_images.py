"""Screenshots of the interactive graph page (``history.to_html``) for the README, in Debian's
Chromium.

Run with ``python -m examples.graph_page_images [outdir]`` (default ``images/``).
Needs torchvision, Playwright and ``/usr/bin/chromium``. Writes:

- ``graph_page_resnet18``: ResNet-18 with ``layer1`` open (its two BasicBlocks unfolded, the
  first one open) and the details of its first convolution;
- ``graph_page_gpt2``: a 12-layer GPT-2 with its blocks folded into one "x12" box;
- ``answer_nonfinite``: the page of a ``tl.find_nonfinite`` report, opened on the operation
  that made the NaN (``answer_nonfinite()`` makes this one alone).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

import torchlens as tl

from .browser import launch


def _pages(folder: str) -> dict:
    import torchvision

    torch.manual_seed(0)
    pages = {}
    resnet = torchvision.models.resnet18(weights=None).eval()
    pages["resnet18"] = tl.log_forward_pass(resnet, torch.rand(1, 3, 64, 64), random_seed=0).to_html(
        os.path.join(folder, "resnet18.html")
    )
    try:
        import transformers
    except ImportError:
        return pages
    config = transformers.GPT2Config(
        n_embd=32, n_head=2, vocab_size=100, n_layer=12, use_cache=False, bos_token_id=0, eos_token_id=0
    )
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    pages["gpt2"] = tl.log_forward_pass(gpt2, torch.randint(0, 100, (1, 16)), random_seed=0).to_html(
        os.path.join(folder, "gpt2.html")
    )
    return pages


class _Block(torch.nn.Module):
    """A residual block; ``root=True`` takes a square root of something that goes negative."""

    def __init__(self, root: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)
        self.root = root

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.norm(x))
        if self.root:
            h = torch.sqrt(h - 0.5)  # NaN wherever h < 0.5
        return x + torch.relu(h)


def answer_nonfinite(outdir: str = "images") -> str:
    """``answer_nonfinite.png``: the page of a ``find_nonfinite`` report of a small residual
    net whose third block takes ``sqrt`` of negatives, opened on that ``sqrt``. Returns the path."""
    from playwright.sync_api import sync_playwright

    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), _Block(), _Block(), _Block(root=True), _Block(), torch.nn.Linear(8, 2)]
    model = torch.nn.Sequential(*layers)
    report = tl.find_nonfinite(model, torch.randn(2, 4))
    folder = tempfile.mkdtemp()
    page_path = os.path.join(folder, "answer_nonfinite.html")
    report.to_html(page_path)
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, "answer_nonfinite.png")
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto("file://" + page_path)
        page.wait_for_selector('body[data-ready="1"]')
        page.click('[data-role="fit"]')  # the whole pass in view, the producer still open and selected
        page.wait_for_timeout(300)
        page.screenshot(path=out)
        browser.close()
    return out


def main(outdir: str = "images") -> None:
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    os.makedirs(outdir, exist_ok=True)
    folder = tempfile.mkdtemp()
    pages = _pages(folder)
    written = []
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto("file://" + os.path.join(folder, "resnet18.html"))
        page.wait_for_selector('body[data-ready="1"]')
        page.click('[data-module="layer1"]')
        page.click('[data-module="layer1.0"][data-repeat]')
        page.click('[data-module="layer1.0"]')
        page.click('[data-role="fit"]')
        page.click('[data-label="conv2d_2_7"]')
        page.wait_for_selector('[data-role="details"]', state="visible")
        page.wait_for_timeout(300)
        page.screenshot(path=os.path.join(outdir, "graph_page_resnet18.png"))
        written.append("graph_page_resnet18.png")
        if "gpt2" in pages:
            page.goto("file://" + os.path.join(folder, "gpt2.html"))
            page.wait_for_selector('body[data-ready="1"]')
            if page.query_selector('[data-module="transformer"]'):
                page.click('[data-module="transformer"]')
            page.wait_for_selector('[data-module="transformer.h.0"][data-repeat="12"]')
            page.click('[data-role="fit"]')
            page.hover('[data-module="transformer.h.0"][data-repeat="12"]')
            page.wait_for_timeout(300)
            page.screenshot(path=os.path.join(outdir, "graph_page_gpt2.png"))
            written.append("graph_page_gpt2.png")
        browser.close()
    answer_nonfinite(outdir)
    written.append("answer_nonfinite.png")
    print(f"wrote {', '.join(written)} into {outdir}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
