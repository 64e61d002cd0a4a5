"""The README's activation-patching example, and its pictures.

Run with ``python -m examples.patching_images [outdir]`` (default ``images/``). Needs
transformers (the model is built from a config, random weights, no download); the graph page
screenshot also needs Playwright and ``/usr/bin/chromium``. Writes:

- ``patching_heatmap.svg``: the share of the clean metric each block x position patch recovers;
- ``patching_graph_page.png``: the graph page of the corrupted run, each block's output painted
  by the strongest effect of patching it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Tuple

import torch

import torchlens as tl


def readme_example() -> Tuple[Any, Any]:
    """(model, grid): the sweep of the README's example."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=6, n_embd=128, n_head=4, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    clean_ids = torch.randint(0, config.vocab_size, (1, 10))
    corrupt_ids = clean_ids.clone()
    corrupt_ids[0, 3] = 42  # one token changed

    def logit_diff(out):
        return out.logits[0, -1, 100] - out.logits[0, -1, 200]

    clean = tl.log_forward_pass(model, clean_ids)
    grid = tl.patch_sweep(model, corrupt_ids, source=clean, metric=logit_diff)
    return model, grid


def main(outdir: str = "images") -> None:
    torch.set_num_threads(1)
    os.makedirs(outdir, exist_ok=True)
    _, grid = readme_example()
    print(grid)
    print(grid.to_pandas(recovered=True).round(2))
    grid.heatmap_svg(os.path.join(outdir, "patching_heatmap.svg"), title="GPT-2 (random weights): share recovered")
    written = ["patching_heatmap.svg"]
    try:
        from playwright.sync_api import sync_playwright

        from .browser import launch
    except ImportError:
        print(f"wrote {', '.join(written)} into {outdir}/ (no Playwright: no graph page screenshot)")
        return
    page_path = os.path.join(tempfile.mkdtemp(), "patching.html")
    grid.to_html(page_path)
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto("file://" + page_path)
        page.wait_for_selector('body[data-ready="1"]')
        page.click('[data-role="fit"]')
        page.wait_for_timeout(300)
        page.screenshot(path=os.path.join(outdir, "patching_graph_page.png"))
        browser.close()
    written.append("patching_graph_page.png")
    print(f"wrote {', '.join(written)} into {outdir}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
