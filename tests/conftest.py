import os
import sys

import pytest

# the toy-model catalogue is imported by several test files as `models`
sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption(
        "--regen-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/*.dot from the current renderer instead of comparing",
    )


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the browser tests (skipped when there is none to launch)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")
    from examples.browser import find_chromium, launch

    playwright = sync_api.sync_playwright().start()
    try:
        browser = launch(playwright)
    except Exception as error:
        playwright.stop()
        if find_chromium() is None:
            pytest.skip(
                "the browser tests need Chromium: /usr/bin/chromium (or TORCHLENS_CHROMIUM), or "
                f"`playwright install chromium` ({type(error).__name__})"
            )
        raise
    yield browser
    browser.close()
    playwright.stop()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip where torch sees no CUDA device (CI has none)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
