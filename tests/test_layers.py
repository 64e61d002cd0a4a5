"""The package's layers point one way: every import inside torchlens goes down.

Two rules, checked on the syntax trees of every module (imports inside functions included):

1. Between parts (the table ``ALLOWED``): the two wings, ``trace`` and ``train``, stand on
   ``web`` and ``errors``; ``train`` sees the trace wing only through ``trace.observe`` (the
   pass observer) and ``trace.history`` (``ModelHistory``). Inside ``trace`` each part may
   import only the parts its row names.
2. Between files, inside parts too: no circle. A file graph without circles is one whose files
   can be put on floors with every import pointing down; any circle has an edge pointing up.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import torchlens

PACKAGE = pathlib.Path(torchlens.__file__).parent

# part -> the parts it may import (besides itself). A part is a file or folder of torchlens,
# or of torchlens/trace; "face" is torchlens/__init__.py.
ALLOWED: Dict[str, Set[str]] = {
    "version": set(),
    "errors": set(),
    "machine": set(),
    "web": {"errors"},
    "trace": set(),  # trace/__init__.py
    "trace.records": {"errors"},
    "trace.capture": {"trace.records", "errors", "machine"},
    "trace.history": {"trace.records", "errors"},
    # one traced pass, model and inputs to a history: what every driver runs
    "trace.traced_pass": {"trace.capture", "trace.records", "trace.history", "trace.postprocess", "trace.input_copy"},
    "trace.observe": {"trace.capture", "trace.records", "trace.traced_pass"},
    "trace.postprocess": {"trace.records", "trace.capture", "trace.history"},
    "trace.input_copy": {"trace.capture"},
    "trace.layer_request": {"trace.records", "trace.history", "errors"},
    # what a replayed operation may do (replay_guard.py): stands on errors alone
    "trace.replay_guard": {"errors"},
    "trace.replay": {"trace.records", "trace.capture", "trace.replay_guard"},
    # DrawOptions: how to draw, known to the tracer's entry point without loading the drawing
    "trace.draw_options": {"errors"},
    "trace.render": {"trace.records", "trace.history", "trace.draw_options", "web", "errors"},
    # comparisons of replayed results, read from a GPU once (verdicts.py): torch alone
    "trace.verdicts": set(),
    "trace.validate": {
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.input_copy",
        "trace.replay",
        "trace.verdicts",
    },
    "trace.storage": {
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.postprocess",
        "trace.replay_guard",
        "version",
        "errors",
    },
    # history.export(...) formats: loaded by name on first use (history/extensions.py)
    "trace.export": {"trace.records", "trace.history", "version", "errors"},
    "trace.intervene": {"trace.records", "trace.history", "trace.capture", "trace.layer_request", "errors"},
    "trace.rerun": {
        "trace.records",
        "trace.history",
        "trace.postprocess",
        "trace.layer_request",
        "trace.storage",
        "trace.replay",
        "errors",
    },
    "trace.api": {
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.postprocess",
        "trace.input_copy",
        "trace.layer_request",
        "trace.render",
        "trace.draw_options",
        "trace.validate",
        "trace.verdicts",
        "trace.storage",
        "trace.intervene",
        "trace.traced_pass",
        "errors",
    },
    "trace.answers": {
        "trace.api",
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.postprocess",
        "trace.input_copy",
        "trace.traced_pass",
        "errors",
    },
    "trace.generate": {
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.postprocess",
        "trace.input_copy",
        "trace.layer_request",
        "trace.render",
        "trace.storage",
        "trace.traced_pass",
        "web",
        "errors",
    },
    "trace.patching": {
        "trace.api",
        "trace.answers",
        "trace.records",
        "trace.history",
        "trace.capture",
        "trace.input_copy",
        "trace.layer_request",
        "trace.replay",
        "trace.rerun",
        "errors",
    },
    "trace.show": {"trace.api", "trace.render", "trace.draw_options"},
    # trace.answers: the NaN sentinel shares find_nonfinite's engine (loaded only when it is on)
    "train": {"trace.observe", "trace.history", "trace.answers", "web", "errors", "version"},
    "cli": {"machine", "face", "trace.api", "trace.render", "train", "errors"},
    "__main__": {"cli"},
    "face": set(),  # filled below: the face may import everything
}
# the argument checks (arguments.py) stand on errors, a floor every part above them may use;
# writing a file whole (files.py) stands on nothing
ALLOWED["arguments"] = {"errors"}
ALLOWED["files"] = set()
ALLOWED["collector"] = set()  # pausing the garbage collector: both wings, standing on nothing
for _part_name, _row in ALLOWED.items():
    if _part_name not in ("version", "errors", "machine", "arguments", "files", "collector"):
        _row.update(("arguments", "files", "collector"))
ALLOWED["face"] = set(ALLOWED) - {"face", "cli", "__main__"}


def _part(module: str) -> str:
    """``torchlens.trace.capture.tracer`` -> ``trace.capture``; ``torchlens.train.serve.x`` -> ``train``."""
    parts = module.split(".")[1:]
    if not parts or parts[0] == "__init__":
        return "face"
    if parts[0] == "trace" and len(parts) > 1:
        return f"trace.{parts[1]}"
    return parts[0]


def _module_name(path: pathlib.Path, root: pathlib.Path) -> Tuple[str, str]:
    """(dotted name of the module, dotted name of its package); ``root`` holds the package."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: pathlib.Path, root: pathlib.Path = PACKAGE.parent) -> Iterator[Tuple[int, str]]:
    """(line, imported torchlens module) for every import in the file, relative ones resolved.
    ``from .pkg import name`` yields ``pkg.name`` when that is a module of its own."""
    _, package = _module_name(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "torchlens":
                continue
            folder = root.joinpath(*target.split("."))
            for alias in node.names:
                if (folder / f"{alias.name}.py").exists() or (folder / alias.name / "__init__.py").exists():
                    yield node.lineno, f"{target}.{alias.name}"
                else:
                    yield node.lineno, target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torchlens":
                    yield node.lineno, alias.name


def _files(package: pathlib.Path) -> List[pathlib.Path]:
    return sorted(package.rglob("*.py"))


def _violations(package: pathlib.Path = PACKAGE) -> Iterator[str]:
    root = package.parent
    for path in _files(package):
        name, _ = _module_name(path, root)
        here = _part(name)
        if here not in ALLOWED:
            yield f"{path.relative_to(root)}: part {here!r} is not in ALLOWED"
            continue
        for line, target in _imports(path, root):
            there = _part(target)
            if there != here and there not in ALLOWED[here]:
                yield f"{path.relative_to(root)}:{line} imports {target} ({there!r}), which part {here!r} may not import"


def _circles(package: pathlib.Path = PACKAGE) -> List[List[str]]:
    """Every circle of imports between files (one per strongly connected group of files)."""
    root = package.parent
    graph: Dict[str, Set[str]] = {}
    for path in _files(package):
        name, _ = _module_name(path, root)
        graph.setdefault(name, set())
        for _, target in _imports(path, root):
            while target not in graph and not (
                root.joinpath(*target.split(".")).with_suffix(".py").exists()
                or root.joinpath(*target.split("."), "__init__.py").exists()
            ):
                target = target.rsplit(".", 1)[0]  # a name imported from a module: the module
            if target != name:
                graph[name].add(target)
    # Tarjan's strongly connected components, iteratively
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    groups: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def _faces(package: pathlib.Path = PACKAGE) -> Dict[str, Set[str]]:
    """Folders with a face (an ``__init__.py`` that lists ``__all__``): dotted name -> its names."""
    root = package.parent
    faces = {}
    for init in sorted(package.rglob("__init__.py")):
        for node in ast.parse(init.read_text(), str(init)).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                faces[_module_name(init, root)[0]] = set(ast.literal_eval(node.value))
    return faces


def _imported_modules(path: pathlib.Path, root: pathlib.Path) -> Iterator[Tuple[int, str]]:
    """(line, module) for every import; ``from face import name`` names the face itself when
    the face lists ``name`` (a function called like one of its modules is the face's)."""
    faces = _faces(root / "torchlens")
    _, package = _module_name(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                listed = alias.name in faces.get(module, ())
                is_module = (
                    root.joinpath(*module.split("."), alias.name).exists()
                    or root.joinpath(*module.split("."), f"{alias.name}.py").exists()
                )
                yield node.lineno, f"{module}.{alias.name}" if is_module and not listed else module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _beneath_faces(package: pathlib.Path = PACKAGE) -> Iterator[str]:
    root = package.parent
    faces = [f for f in _faces(package) if f != package.name]
    for path in _files(package):
        name, _ = _module_name(path, root)
        for line, target in _imported_modules(path, root):
            for face in faces:
                inside = name == face or name.startswith(face + ".")
                if target.startswith(face + ".") and not inside:
                    yield f"{path.relative_to(root)}:{line} imports {target}, beneath the face of {face}"


def test_no_import_reaches_beneath_a_face():
    """A folder with a face (``__init__.py`` with ``__all__``) is used through it from outside;
    its other modules are private to it."""
    found = list(_beneath_faces())
    assert not found, "imports beneath a face (import from the folder's __init__ instead):\n" + "\n".join(found)


def test_the_face_check_sees_an_import_beneath_a_face(tmp_path):
    package = tmp_path / "torchlens"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("from .deep import deep, x\n__all__ = ['x', 'deep']\n")
    (package / "inner" / "deep.py").write_text("x = 1\ndef deep(): pass\n")
    (package / "inner" / "private.py").write_text("y = 1\n")
    (package / "user.py").write_text(
        "from .inner.deep import x\nfrom .inner import x as y, deep\nfrom .inner import private\n"
        "import torchlens.inner.private\n"
    )
    found = [v.split(" ", 1)[1] for v in _beneath_faces(package)]
    assert found == [
        "imports torchlens.inner.deep, beneath the face of torchlens.inner",
        "imports torchlens.inner.private, beneath the face of torchlens.inner",
        "imports torchlens.inner.private, beneath the face of torchlens.inner",
    ]


def test_every_import_points_down():
    found = list(_violations())
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_no_circle_of_imports_between_files():
    circles = _circles()
    assert not circles, "files that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_checks_see_imports_inside_functions_and_circles(tmp_path):
    probe = tmp_path / "torchlens"
    (probe / "trace" / "history").mkdir(parents=True)
    (probe / "__init__.py").write_text("")
    (probe / "trace" / "__init__.py").write_text("")
    (probe / "trace" / "history" / "__init__.py").write_text("")
    (probe / "trace" / "history" / "model_history.py").write_text(
        "import torch\n\n\ndef f():\n    from ..render import build_dot\n    from . import rolled\n"
    )
    (probe / "trace" / "history" / "rolled.py").write_text("from .model_history import f\n")
    found = list(_violations(probe))
    assert found == [
        "torchlens/trace/history/model_history.py:5 imports torchlens.trace.render ('trace.render'), "
        "which part 'trace.history' may not import"
    ]
    assert _circles(probe) == [["torchlens.trace.history.model_history", "torchlens.trace.history.rolled"]]


def test_the_table_names_every_part():
    names = [_module_name(p, PACKAGE.parent)[0] for p in _files(PACKAGE)]
    parts = {_part(n) for n in names}
    assert parts <= set(ALLOWED), f"parts missing from ALLOWED: {sorted(parts - set(ALLOWED))}"
