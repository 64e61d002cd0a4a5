"""The README's and the documentation's examples are tests: every python block runs (a page's
blocks in order, in one namespace, in a fresh folder), every shown output marked as such is what
they print, and every block that is not run says why (see tests/docs_blocks.py for the rules)."""

from __future__ import annotations

import contextlib
import doctest
import gc
import io
import runpy

import pytest
import torch
from docs_blocks import ROOT, Page, pages, parse

PAGES = [parse(path) for path in pages()]
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _params():
    for page in PAGES:
        if not any(
            block.language == "python" and not (block.directive or "").startswith("skip") for block in page.blocks
        ):
            continue
        marks = [pytest.mark.slow] if "slow" in page.options else []
        yield pytest.param(page, id=str(page.path.relative_to(ROOT)), marks=marks)


def test_every_block_is_run_or_says_why_not():
    """A block runs (python), is a checked output, or carries a reason; none is left unmarked."""
    unmarked, no_reason = [], []
    for page in PAGES:
        for block in page.blocks:
            directive = block.directive or ""
            if directive.startswith("skip"):
                if not directive.partition(":")[2].strip():
                    no_reason.append(block.where)
            elif block.language != "python" and not directive.startswith(("output", "file")):
                unmarked.append(f"{block.where} ({block.language or 'no language'})")
    assert not unmarked, "blocks neither run nor marked (add <!-- docs-test: skip: REASON -->):\n" + "\n".join(unmarked)
    assert not no_reason, "skip directives without a reason:\n" + "\n".join(no_reason)


def _varies(directive: str):
    _, _, rest = directive.partition("varies:")
    return [part.strip() for part in rest.split(",") if part.strip()]


def _kept(text: str, varies) -> str:
    return "\n".join(line for line in text.splitlines() if not any(v in line for v in varies)) + "\n"


@pytest.mark.parametrize("page", list(_params()))
def test_page_examples_run(page: Page, tmp_path, monkeypatch):
    for module in page.options.get("requires", []):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__docs__"}
    printed = io.StringIO()
    state = torch.random.get_rng_state()
    try:
        for block in page.blocks:
            directive = block.directive or ""
            if directive.startswith("skip") or block.language not in ("python", "text", ""):
                continue
            if directive.startswith("output"):
                varies = _varies(directive)
                want, got = _kept(block.code, varies), _kept(printed.getvalue(), varies)
                assert _CHECKER.check_output(want, got, _FLAGS), (
                    f"{block.where}: the output shown is not what the examples print.\n--- shown:\n{want}"
                    f"--- printed:\n{got}"
                )
                printed = io.StringIO()
                continue
            if block.language != "python":
                continue
            with contextlib.redirect_stdout(printed):
                try:
                    if directive.startswith("file "):
                        name = directive.split()[1]
                        (tmp_path / name).write_text(block.code + "\n")
                        namespace.update(runpy.run_path(name, run_name="__main__"))
                    else:
                        exec(compile(block.code, block.where, "exec"), namespace)
                except Exception as error:
                    raise AssertionError(
                        f"{block.where}: the example raised {type(error).__name__}: {error}"
                    ) from error
    finally:
        for value in namespace.values():  # watches an example left open end with the test
            if type(value).__name__ == "Watch" and hasattr(value, "close"):
                value.close()
        namespace.clear()
        gc.collect()
        torch.random.set_rng_state(state)
