"""Screenshot of the explorer's Health panel for the README, taken in Debian's Chromium.

Run with ``python -m examples.health_images [outdir]`` (default ``images/``). Needs
Playwright (``pip install playwright``) and ``/usr/bin/chromium``. It trains ``SickNet`` (a small
model that goes wrong on purpose) under ``tl.watch(on_nonfinite="trace")`` and writes
``explorer_health.png``: the Health panel, the status line, the badges, and the finding's call
opened with its strips pinned and the step marked.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve import explore

from .browser import launch

NAN_STEP = 12


class LogFeatures(nn.Module):
    """log of its input: NaN once the input goes negative."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Block(nn.Module):
    def __init__(self, width: int, act: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


class SickNet(nn.Module):
    """A saturated Tanh in ``encoder.0``, dead ReLUs in ``encoder.1``, and a log in
    ``encoder.2.act`` whose input goes negative at step ``NAN_STEP``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        tanh, relu, log = Block(width, nn.Tanh()), Block(width, nn.ReLU()), Block(width, LogFeatures())
        self.encoder = nn.Sequential(tanh, relu, log)
        self.head = nn.Linear(width, 1)
        self.log_block = [log]  # a plain list: not a second registration of the module
        with torch.no_grad():
            tanh.linear.weight.mul_(400.0)  # saturates the Tanh
            relu.linear.bias.fill_(-20.0)  # kills the ReLUs
            log.linear.weight.uniform_(0.0, 0.05)
            log.linear.bias.fill_(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def train_run(run_dir: str, steps: int = 16) -> None:
    """Train SickNet for ``steps`` steps; at NAN_STEP a bad update drives encoder.2's input negative."""
    torch.manual_seed(0)
    model = SickNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.rand(32, 16), torch.rand(32, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.NonfiniteWarning)
        with tl.watch(model, run_dir=run_dir, backend=None, verbose=False, on_nonfinite="trace"):
            for step in range(steps):
                if step == NAN_STEP:
                    with torch.no_grad():
                        model.log_block[0].linear.bias.fill_(-5.0)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()


def main(outdir: str = "images") -> None:
    from playwright.sync_api import sync_playwright

    os.makedirs(outdir, exist_ok=True)
    run_dir = os.path.join(tempfile.mkdtemp(), "sicknet")
    train_run(run_dir)
    server = explore(run_dir, port=0, block=False)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(server.url)
            page.wait_for_selector('[data-role="health"] li')
            page.click('[data-role="health"] li')
            page.wait_for_selector(".health-mark")
            page.wait_for_timeout(1500)  # past the highlight of a new panel
            page.eval_on_selector('[data-role="panels"]', "el => { el.scrollTop = 0; }")  # the panel on top
            page.screenshot(path=os.path.join(outdir, "explorer_health.png"))
            browser.close()
    finally:
        server.close()
    print(f"wrote explorer_health.png into {outdir}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
