"""Screenshot of two runs side by side on the explorer page, for the README (Debian's Chromium).

Run with ``python -m examples.tworuns_images [outdir]`` (default ``images/``). Needs
Playwright (``pip install playwright``) and ``/usr/bin/chromium``. It trains the same small MLP
twice under ``tl.watch``, with learning rates 0.02 and 0.5 (the second with a dropout layer
the first has not), serves them as ``torchlens explore RUN_A RUN_B`` does, pins ``out`` and
writes ``explorer_two_runs.png``.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

from .browser import launch


class MLP(nn.Module):
    def __init__(self, dropout: bool) -> None:
        super().__init__()
        torch.manual_seed(0)  # both runs start from the same weights
        self.hidden = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.1) if dropout else None
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden(x))
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)


def train_run(run_dir: str, lr: float, dropout: bool = False, steps: int = 40) -> None:
    """Train ``MLP`` for ``steps`` steps on the same batches, watched into ``run_dir``."""
    model = MLP(dropout)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    torch.manual_seed(1)
    target = torch.randn(16, 4)
    with tl.watch(model, run_dir=run_dir, backend=None, verbose=False):
        for _ in range(steps):
            x = torch.randn(64, 16)
            loss = (model(x) - x[:, :4] @ target[:4]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def main(outdir: str = "images") -> None:
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    os.makedirs(outdir, exist_ok=True)
    root = tempfile.mkdtemp()
    train_run(os.path.join(root, "lr0.02"), lr=0.02)
    train_run(os.path.join(root, "lr0.5"), lr=0.5, dropout=True)
    server = explore(os.path.join(root, "lr0.02"), port=0, block=False, other=os.path.join(root, "lr0.5"))
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url)
            page.wait_for_selector('[data-role="pair"] [data-only="b"]')
            page.drag_and_drop('[data-node="out:1"]', '[data-role="panels"]')
            page.wait_for_selector('[data-panel="out:1"] canvas[data-other-series="params/weight"][data-columns]')
            page.wait_for_timeout(1500)  # past the highlight of a new panel
            page.evaluate("document.querySelector('[data-role=panels]').scrollTop = 0")  # the calls of one run
            page.screenshot(path=os.path.join(outdir, "explorer_two_runs.png"))
            browser.close()
    finally:
        server.close()
    print(f"wrote explorer_two_runs.png into {outdir}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
