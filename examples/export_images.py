"""Screenshots of exported histories in the tools that read them, for the documentation.

Run with ``python -m examples.export_images [outdir]`` (default ``images/``). Needs
Playwright, ``/usr/bin/chromium``, ``onnx`` and Netron (``pip install netron``; it is not a
dependency of torchlens). It traces a ResNet-18 (metadata only), exports it with
``history.export("resnet18.onnx")`` and once with ``weights=model``, opens both in Netron's own
page, served locally, and writes ``export_netron.png`` (parameters as inputs, by shape) and
``export_netron_weights.png`` (parameters as initializers, folded into their operations).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

import torchlens as tl

from .browser import launch


def _shoot(netron, model_path: str, png: str, port: int) -> None:
    from playwright.sync_api import sync_playwright

    address = ("127.0.0.1", port)
    netron.serve(model_path, None, address=address, browse=False)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(f"http://{address[0]}:{port}/", timeout=60000)
            page.wait_for_timeout(2000)
            if page.locator("text=Accept").count():  # Netron's first-visit notice
                page.click("text=Accept")
            page.wait_for_timeout(6000)  # the model is read and laid out
            page.screenshot(path=png)
            browser.close()
    finally:
        netron.stop(address)


def main(outdir: str = "images") -> None:
    import netron  # noqa: PLC0415 - only this script needs it
    import torchvision

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    history = tl.log_forward_pass(model, torch.rand(1, 3, 64, 64), layers_to_save=None, random_seed=0)
    folder = tempfile.mkdtemp()
    plain = history.export(os.path.join(folder, "resnet18.onnx"))
    weighted = history.export(os.path.join(folder, "resnet18_weights.onnx"), weights=model)
    _shoot(netron, plain, os.path.join(outdir, "export_netron.png"), 8791)
    _shoot(netron, weighted, os.path.join(outdir, "export_netron_weights.png"), 8792)
    print(f"wrote {outdir}/export_netron.png and {outdir}/export_netron_weights.png")


if __name__ == "__main__":
    main(*sys.argv[1:2])
