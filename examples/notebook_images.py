"""The README's screenshot of a notebook with an inline graph, in Debian's Chromium: a notebook
(ResNet-18's history as the last expression of a cell, `layer1` opened, then an entry's card) is
executed with nbclient, converted to HTML with nbconvert and photographed.

Run with ``python -m examples.notebook_images [outdir]`` (default ``images/``). Needs
torchvision, nbclient, nbconvert, ipykernel, Playwright and ``/usr/bin/chromium``. Writes
``notebook_inline.png``.
"""

from __future__ import annotations

import os
import sys
import tempfile

from .browser import launch

CELLS = [
    "import torch, torchvision\nimport torchlens as tl\n\n"
    "resnet = torchvision.models.resnet18(weights=None)\n"
    "history = tl.log_forward_pass(resnet, torch.rand(1, 3, 64, 64), random_seed=0)\nhistory",
    "history['layer1.0.conv1']",
]


def _notebook_html(folder: str) -> str:
    import nbclient
    import nbconvert
    import nbformat

    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3").execute()
    path = os.path.join(folder, "notebook.html")
    with open(path, "w", encoding="utf-8") as f:  # no CDN scripts: the page must work offline
        f.write(nbconvert.HTMLExporter(require_js_url="", mathjax_url="").from_notebook_node(book)[0])
    return path


def notebook_inline(outdir: str = "images") -> str:
    """Write ``outdir/notebook_inline.png``; returns its path."""
    from playwright.sync_api import sync_playwright

    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, "notebook_inline.png")
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        page_path = _notebook_html(folder)
        browser = launch(playwright)
        try:
            tab = browser.new_page(viewport={"width": 1100, "height": 1180})
            tab.goto("file://" + page_path)
            frame = tab.locator("iframe").first.element_handle().content_frame()
            frame.wait_for_selector('body[data-ready="1"]')
            frame.click('[data-role="fit"]')
            frame.click('[data-module="layer1"]')
            frame.wait_for_selector('[data-box="layer1"]')
            tab.wait_for_timeout(400)
            tab.screenshot(path=out, full_page=False)
        finally:
            browser.close()
    return out


if __name__ == "__main__":
    print(notebook_inline(sys.argv[1] if len(sys.argv) > 1 else "images"))
