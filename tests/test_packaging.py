"""The package as users install it: ``pip wheel .`` gives a pure Python wheel that holds the
licence, the page assets and the ``torchlens`` command, and works installed outside this checkout."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a clean copy of what the package is made of, as from a fresh clone: a build/
    # folder left in this checkout can hold files of modules since moved or removed
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "torchlens", source / "torchlens", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    # no build isolation: the build uses this environment's setuptools (no network needed)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("torchlens-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_the_licence_metadata_and_page_assets(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    for asset in ("index.html", "graph.html", "explorer.js", "graph.js", "common.js"):
        assert f"torchlens/web/assets/{asset}" in names, f"{asset} is missing from the wheel"
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    # a pure Python wheel: no compiled code of its own, one wheel for every platform
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib", ".c", ".pyi"))]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata
    assert (
        "torchlens = torchlens.cli:main"
        in zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    )


@pytest.mark.slow
def test_the_wheel_leaves_the_examples_out(wheel):
    """The demo and the scripts that draw the README's pictures (they launch Chromium) stay in the
    repository's examples/ folder: nothing of them is installed."""
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("torchlens/examples/", "examples/"))]
    assert (ROOT / "examples" / "demo.py").is_file() and not (ROOT / "torchlens" / "examples").exists()


@pytest.mark.slow
def test_the_wheel_ships_its_type_hints(wheel):
    """PEP 561: ``py.typed`` in the package tells type checkers to read torchlens's own hints."""
    names = zipfile.ZipFile(wheel).namelist()
    assert "torchlens/py.typed" in names, "py.typed is missing from the wheel"
    assert (ROOT / "torchlens" / "py.typed").is_file()


@pytest.mark.slow
def test_the_installed_command_draws_a_self_contained_graph_page(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    (tmp_path / "net.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import torchlens; print(torchlens.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(str(site)), f"the installed copy was not the one imported: {where}"
    page = tmp_path / "net.html"
    subprocess.run(
        [str(site / "bin" / "torchlens"), f"{tmp_path / 'net.py'}:Net", "--input", "2,4", "-o", str(page)],
        check=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    text = page.read_text()
    assert "linear_1_1" in text and "relu_1_2" in text
    assert 'src="/assets/' not in text and "<script>" in text  # assets inlined from the installed package
