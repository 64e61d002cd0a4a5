"""The heat map of decomposed attention in the graph page's details panel, in headless Chromium."""

from __future__ import annotations

import base64
import os

import pytest
import torch
from torch import nn

import torchlens as tl

pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 4).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _open(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.goto("file://" + os.path.abspath(path))
    page.wait_for_selector('body[data-ready="1"]')
    return page, problems


def _pixel(page, row, col):
    """The red channel of the canvas cell (row, col): 255 white (0) .. 30 (the head's max)."""
    return page.eval_on_selector(
        '[data-role="attention"] canvas',
        "(c, [r, k]) => c.getContext('2d').getImageData(k, r, 1, 1).data[0]",
        [row, col],
    )


def test_the_probabilities_op_shows_a_heat_map_of_the_chosen_head(browser, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    history = tl.log_forward_pass(Block(), x, decompose=("sdpa",), random_seed=0)
    label = next(e.label for e in history if e.layer_type == "attnsoftmax")
    path = str(tmp_path / "attention.html")
    history.to_html(path, focus=label)
    page, problems = _open(browser, path)
    details = page.wait_for_selector('[data-role="details"] [data-role="attention"]')
    assert "batch item 0 of 2" in details.inner_text() and "6 queries × 6 keys" in details.inner_text()
    probs = history.attention()[0].detach()
    assert page.eval_on_selector('[data-role="attention-head"]', "s => s.options.length") == 4
    for head in (0, 3):
        page.select_option('[data-role="attention-head"]', str(head))
        top = probs[head].max()
        for row, col in ((0, 0), (5, 2), (1, 4)):  # the causal upper triangle is white
            expected = 255 - 225 * round(255 * float(probs[head, row, col] / top)) / 255
            assert abs(_pixel(page, row, col) - expected) <= 1, (head, row, col)
    box = page.locator('[data-role="attention"] canvas').bounding_box()
    page.mouse.move(box["x"] + box["width"] * 2.5 / 6, box["y"] + box["height"] * 4.5 / 6)
    text = page.inner_text('[data-role="attention-cell"]')
    assert text.startswith("query 4, key 2: ") and abs(float(text.split(": ")[1]) - float(probs[3, 4, 2])) < 0.01
    # another op has no heat map
    page.click(f'[data-role="details"] a[data-goto="{history[label].child_layers[0]}"]')
    page.wait_for_function('() => !document.querySelector(\'[data-role="details"] [data-role="attention"]\')')
    assert problems == []
    page.close()


def test_long_sequences_are_averaged_to_a_grid_the_page_can_carry():
    from torchlens.trace.render.graph_page.attention import MAX_SIDE, attention_map

    probs = torch.softmax(torch.randn(1, 2, 200, 130), -1)
    data = attention_map(probs)
    assert (data["rows"], data["cols"], data["queries"], data["keys"]) == (MAX_SIDE, MAX_SIDE, 200, 130)
    cells = torch.frombuffer(bytearray(base64.b64decode(data["grids"][1])), dtype=torch.uint8).view(MAX_SIDE, MAX_SIDE)
    pooled = torch.nn.functional.adaptive_avg_pool2d(probs[0, 1][None], (MAX_SIDE, MAX_SIDE))[0]
    torch.testing.assert_close(cells.float() / 255 * data["max"][1], pooled, atol=data["max"][1] / 255, rtol=0)
