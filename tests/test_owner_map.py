"""The map of where things happen (docs/developing.md) stays true: each file it names exists and
defines the name given for it, so a reader who follows it lands on the owner."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (?P<behaviour>[^|]+?) \| `(?P<path>torchlens/[^`]+)` \| `(?P<name>[^`]+)` \|$")


def _rows():
    text = (ROOT / "docs" / "developing.md").read_text()
    section = text.split("## Where things happen", 1)[1].split("\n## ", 1)[0]
    return [m.groupdict() for m in map(ROW.match, section.splitlines()) if m]


def _defines(path: Path, dotted: str) -> bool:
    body = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = [
            node
            for node in body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part
        ]
        if not found:
            return False
        body = found[0].body
    return True


def test_the_map_has_its_rows():
    assert len(_rows()) >= 10


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row["name"])
def test_each_owner_defines_its_name(row):
    path = ROOT / row["path"]
    assert path.is_file(), f"{row['behaviour']}: {row['path']} is gone; update docs/developing.md"
    assert _defines(path, row["name"]), f"{row['behaviour']}: {row['path']} no longer defines {row['name']}"


def test_a_wrong_row_is_caught():
    assert not _defines(ROOT / "torchlens/trace/capture/rng.py", "StepMachine")
    assert not _defines(ROOT / "torchlens/trace/intervene.py", "Interventions.no_such_method")
