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


# the user's calls: their many keywords are the interface (each documented), not a design smell
PUBLIC_ENTRY_POINTS = frozenset({"log_forward_pass", "log_generate", "patch", "patch_sweep", "watch"})
MAX_FUNCTION_LINES = 80  # of code: the docstring is not counted
MAX_PARAMETERS = 10  # besides self / cls


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _code_lines(function) -> int:
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _parameters(function) -> int:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def _long_functions(trees):
    found = []
    for path, tree in trees:
        for function in _functions(tree):
            if function.name in PUBLIC_ENTRY_POINTS:
                continue
            where = f"{path}:{function.lineno} {function.name}"
            if _code_lines(function) > MAX_FUNCTION_LINES:
                found.append(f"{where}: {_code_lines(function)} lines")
            if _parameters(function) > MAX_PARAMETERS:
                found.append(f"{where}: {_parameters(function)} parameters")
    return found


def test_no_function_is_over_80_lines_or_10_parameters():
    """Public entry points aside (the user's keywords are their interface)."""
    found = _long_functions((path.relative_to(PACKAGE.parent), tree) for path, tree in _trees())
    assert not found, "functions to split, or whose parameters to gather into a value:\n" + "\n".join(found)


def test_the_check_sees_a_long_function_and_one_with_many_parameters():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f'def long():\n    """Doc."""\n{long_body}\n\ndef wide(self, a, b, c, d, e, f, g, h, i, j, k):\n    pass\n'
    source += "\ndef fine(self, a, b, c, d, e, f, g, h, i, j):\n    pass\n"
    found = _long_functions([("m.py", ast.parse(source))])
    assert found == ["m.py:1 long: 81 lines", "m.py:84 wide: 11 parameters"]


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
