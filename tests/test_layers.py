"""The package's layers point one way: every import inside torchlens goes down this table.

    records <- capture <- postprocess -> history <- (render | validate | storage ...) <- api <- face

An import found by walking the syntax trees of every module (also imports inside functions)
that this table does not allow fails the test, naming the file, the line and the rule.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, Set, Tuple

import torchlens

PACKAGE = pathlib.Path(torchlens.__file__).parent

# The explorer's engine (watch: recording, the run store and reader) and its page (explorer:
# the server and the exported file) are one layer: tl.watch serves the page of what it records.
ONE_LAYER = {"explorer": "watch"}

# layer -> the layers it may import (besides itself). A layer is a subpackage or a top-level
# module of torchlens; "face" is torchlens/__init__.py.
ALLOWED: Dict[str, Set[str]] = {
    "version": set(),
    "records": set(),
    "assets": set(),
    "history": {"records"},
    "capture": {"records"},
    "postprocess": {"records", "capture", "history"},
    "input_copy": {"capture"},
    "layer_request": {"records", "history"},
    "render": {"records", "history", "assets"},
    "validate": {"records", "history", "capture", "input_copy"},
    "storage": {"records", "history", "capture", "postprocess", "version"},
    "intervene": {"records", "history", "capture", "layer_request"},
    "rerun": {"records", "history", "postprocess", "layer_request", "storage", "validate"},
    "api": {
        "records",
        "history",
        "capture",
        "postprocess",
        "input_copy",
        "layer_request",
        "render",
        "validate",
        "storage",
        "intervene",
    },
    "show": {"api", "render"},
    "watch": {"capture", "records", "assets"},
    "integrations": {"watch"},
    "cli": {"face", "api", "render", "watch"},
    "__main__": {"cli"},
    "examples": {"face", "render", "watch"},
    "face": set(),  # filled below: the face may import everything
}
ALLOWED["face"] = set(ALLOWED) - {"face", "cli", "examples", "__main__"}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__init__":
        return "face"
    return ONE_LAYER.get(parts[1], parts[1])


def _module_name(path: pathlib.Path, root: pathlib.Path) -> Tuple[str, str]:
    """(dotted name of the module, dotted name of its package); ``root`` holds the package."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: pathlib.Path, root: pathlib.Path = PACKAGE.parent) -> Iterator[Tuple[int, str]]:
    """(line, imported torchlens module) for every import in the file, relative ones resolved."""
    _, package = _module_name(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.module:  # from . import x: each name may be a submodule
                    for alias in node.names:
                        yield node.lineno, f"{target}.{alias.name}"
                    continue
            else:
                target = node.module or ""
            if target.split(".")[0] == "torchlens":
                yield node.lineno, target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torchlens":
                    yield node.lineno, alias.name


def _violations(package: pathlib.Path = PACKAGE) -> Iterator[str]:
    root = package.parent
    for path in sorted(package.rglob("*.py")):
        name, _ = _module_name(path, root)
        here = _layer(name)
        for line, target in _imports(path, root):
            there = _layer(target)
            if there == here:
                continue
            if here not in ALLOWED:
                yield f"{path.relative_to(root)}: layer {here!r} is not in ALLOWED"
                break
            if there not in ALLOWED[here]:
                yield (
                    f"{path.relative_to(root)}:{line} imports {target} ({there!r}), which layer {here!r} may not import"
                )


def test_every_import_points_down():
    found = list(_violations())
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_the_check_sees_imports_inside_functions(tmp_path):
    # the walk must catch the lazy imports that once closed cycles (history -> render)
    source = PACKAGE / "history" / "model_history.py"
    assert all(_layer(t) in {"history", "records"} for _, t in _imports(source))
    probe = tmp_path / "torchlens" / "history"
    probe.mkdir(parents=True)
    (probe / "model_history.py").write_text("import torch\n\n\ndef f():\n    from ..render import build_dot\n")
    found = list(_violations(tmp_path / "torchlens"))
    assert found == [
        "torchlens/history/model_history.py:5 imports torchlens.render ('render'), which layer 'history' may not import"
    ]


def test_the_table_names_every_layer():
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    layers |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    layers = {ONE_LAYER.get(name, name) for name in layers}
    assert layers <= set(ALLOWED), f"layers missing from ALLOWED: {sorted(layers - set(ALLOWED))}"
