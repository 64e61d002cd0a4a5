"""Headless Chromium for the screenshot scripts, the browser tests and the page benchmarks:
Debian's ``chromium`` (Playwright cannot download its own browser here), or the one named by
``TORCHLENS_CHROMIUM``."""

from __future__ import annotations

import os
from typing import Optional

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> Optional[str]:
    """The Chromium executable, or None (then Playwright's own, if ``playwright install`` put one there)."""
    for path in (os.environ.get("TORCHLENS_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def launch(playwright):
    """A headless Chromium browser of ``playwright`` (a started ``sync_playwright()``)."""
    return playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
