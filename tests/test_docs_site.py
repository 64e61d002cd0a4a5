"""The documentation site: every public name has a reference entry with a runnable example, every
``TorchlensError`` subclass its page saying cause and fix, and ``mkdocs build --strict`` passes
(and fails on a broken link)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys

import pytest
from docs_blocks import DOCS, ROOT, parse

import torchlens
from torchlens.errors import TorchlensError

REFERENCE = DOCS / "reference"
ERRORS = REFERENCE / "errors"


def _public_names():
    return [name for name in torchlens.__all__ if name != "__version__"]


def _reference_pages():
    return {path: path.read_text() for path in REFERENCE.rglob("*.md")}


def _documented(name, pages):
    """The reference page holding ``::: torchlens.NAME`` (or the full path of its object)."""
    obj = getattr(torchlens, name)
    paths = {f"torchlens.{name}", f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', name)}"}
    for path, text in pages.items():
        if any(re.search(rf"^::: {re.escape(p)}\s*$", text, re.M) for p in paths):
            return path
    return None


def test_every_public_name_has_a_reference_entry_with_a_runnable_example():
    pages = _reference_pages()
    missing, no_example = [], []
    for name in _public_names():
        page = _documented(name, pages)
        if page is None:
            missing.append(name)
            continue
        if ">>>" in (inspect.getdoc(getattr(torchlens, name)) or ""):
            continue  # its docstring example runs as a doctest
        code = "\n".join(b.code for b in parse(page).blocks if b.language == "python" and not b.directive)
        if not re.search(rf"\b{re.escape(name)}\b", code):
            no_example.append(f"{name} ({page.relative_to(ROOT)})")
    assert not missing, f"public names without a `::: torchlens.NAME` entry under docs/reference/: {missing}"
    assert not no_example, (
        "public names whose docstring has no example and whose reference page runs none "
        f"(add a python block using the name, or a >>> example to the docstring): {no_example}"
    )


def _error_classes():
    for info in pkgutil.walk_packages(torchlens.__path__, "torchlens."):
        if info.name == "torchlens.__main__":
            continue
        importlib.import_module(info.name)
    found, todo = {}, [TorchlensError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("torchlens.") and sub.__name__ not in found:
                found[sub.__name__] = sub
                todo.append(sub)
    return found


def test_every_torchlens_error_has_a_page_with_cause_and_fix():
    problems = []
    for name, cls in sorted(_error_classes().items()):
        page = ERRORS / f"{name}.md"
        if not page.exists():
            problems.append(
                f"{name}: add docs/reference/errors/{name}.md (a '# {name}' title, "
                f"'::: {cls.__module__}.{cls.__qualname__}', '## Cause', '## Fix') and a row in errors/index.md"
            )
            continue
        text = page.read_text()
        for part in (f"# {name}", f"::: {cls.__module__}.{cls.__qualname__}", "## Cause", "## Fix"):
            if part not in text:
                problems.append(f"{name}: its page lacks {part!r}")
        if f"]({name}.md)" not in (ERRORS / "index.md").read_text():
            problems.append(f"{name}: not listed in docs/reference/errors/index.md")
    assert not problems, "\n".join(problems)


def _mkdocs(site_root, *args):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_root / "site"), *args],
        cwd=site_root,
        capture_output=True,
        text=True,
        timeout=600,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(site_root)},
    )


def _copy_project(tmp_path):
    """The site's sources in a temp folder: mkdocs.yml, docs/ (the images resolved) and the package."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs", symlinks=False)
    shutil.copytree(ROOT / "torchlens", tmp_path / "torchlens", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return tmp_path


needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="the docs build needs mkdocs, mkdocs-material and mkdocstrings[python] (pip install -e '.[docs]')",
)


@pytest.mark.slow
@needs_mkdocs
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    result = _mkdocs(_copy_project(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    built = tmp_path / "site"
    assert (built / "index.html").exists() and (built / "reference" / "answers" / "index.html").exists()
    # the reference is generated: a docstring's own words are on its page
    assert "Trace a float64 copy" in (built / "reference" / "answers" / "index.html").read_text()


@pytest.mark.slow
@needs_mkdocs
def test_a_broken_link_fails_the_build(tmp_path):
    root = _copy_project(tmp_path)
    page = root / "docs" / "how-to" / "gradients.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    result = _mkdocs(root)
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr
