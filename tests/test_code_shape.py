"""Rules of the code's shape that a reader relies on, checked on the syntax trees."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import torchlens
from torchlens.errors import TorchlensError

PACKAGE = pathlib.Path(torchlens.__file__).parent


def _trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_no_call_passes_more_than_four_arguments_by_position():
    found = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                positional = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(positional) > 4:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node.func)}")
    assert not found, "calls passing more than four arguments by position (name them):\n" + "\n".join(found)


def test_every_exception_torchlens_defines_is_a_torchlens_error():
    for info in pkgutil.walk_packages([str(PACKAGE)], "torchlens."):
        if info.name == "torchlens.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and value.__module__ == module.__name__
                and issubclass(value, BaseException)
                and not issubclass(value, Warning)
            ):
                assert issubclass(value, TorchlensError), f"{info.name}.{name} is not a TorchlensError"


def test_the_check_sees_a_call_with_five_positional_arguments(tmp_path):
    tree = ast.parse("f(1, 2, 3, 4, 5)\ng(1, 2, 3, 4, e=5)\n")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [len(c.args) > 4 for c in calls] == [True, False]


def test_import_torchlens_loads_only_the_trace_wing():
    """Drawing, rerunning and the training explorer load on first use (import time)."""
    import subprocess
    import sys

    probe = (
        "import sys, torchlens as tl\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('torchlens.train', 'torchlens.trace.render', "
        "'torchlens.trace.rerun', 'graphviz')))\n"
        "print(loaded)\n"
        "tl.watch, tl.render_graph\n"
        "print('torchlens.train' in sys.modules, 'torchlens.trace.render' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.splitlines() == ["[]", "True True"]
