"""The code blocks of README.md and docs/*.md, and the directives that say how a test runs them.

A directive is an HTML comment (invisible on GitHub and on the site) on the line right before a
fenced block, or anywhere for the page-level ones:

    <!-- docs-test: skip: REASON -->        the next block is not run; REASON says why (needs a GPU)
    <!-- docs-test: output -->              the next block is what the python blocks since the
                                            last checked output printed (doctest's rules: `...`
                                            matches anything, whitespace runs are one space)
    <!-- docs-test: output; varies: A, B --> the same, leaving out the lines that contain A or B
                                            (times, random seeds) on both sides
    <!-- docs-test: file NAME -->           the next block is written to NAME and run as a script
                                            there (its source lines then name NAME)
    <!-- docs-test: page slow -->           the page's examples are a slow test
    <!-- docs-test: page requires MODULE -->  skip the page where MODULE is not installed
    <!-- docs-test: setup                   hidden code run at that point of the page (a model
    CODE                                    and inputs for fragments that assume them)
    -->

Every python block without a directive runs; every block in another language needs one.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import textwrap
from typing import Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*(?P<end>-->)?\s*$")


@dataclasses.dataclass
class Block:
    """One fenced block (or hidden setup code) of a page, in page order."""

    page: pathlib.Path
    line: int  # 1-based line of the opening fence (or of the setup comment)
    language: str
    code: str
    directive: Optional[str] = None  # the directive before it: 'skip: ...', 'output', 'file x.py', 'setup'

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclasses.dataclass
class Page:
    path: pathlib.Path
    blocks: List[Block]
    options: Dict[str, List[str]]  # page-level directives: 'slow' -> [], 'requires' -> [modules]


def pages() -> List[pathlib.Path]:
    """README.md and every page of docs/, in a stable order."""
    return [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))


def parse(path: pathlib.Path) -> Page:
    """The blocks and page-level directives of one Markdown file."""
    lines = path.read_text().splitlines()
    blocks: List[Block] = []
    options: Dict[str, List[str]] = {}
    pending: Optional[str] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        if directive:
            body = directive.group("body")
            if body.startswith("page "):
                word, *rest = body[len("page ") :].split()
                options.setdefault(word, []).extend(rest)
            elif body == "setup" and not directive.group("end"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->")
                code = "\n".join(lines[i + 1 : end])
                blocks.append(Block(path, i + 1, "python", code, "setup"))
                i = end
            else:
                pending = body
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            indent, marker = fence.group("indent"), fence.group("fence")
            language = fence.group("info").strip().split()[0] if fence.group("info").strip() else ""
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(marker):
                end += 1
            body = [text[len(indent) :] if text.startswith(indent) else text.lstrip() for text in lines[i + 1 : end]]
            blocks.append(Block(path, i + 1, language, textwrap.dedent("\n".join(body)), pending))
            pending = None
            i = end + 1
            continue
        if line.strip():
            pending = None  # a directive applies to the block right after it only
        i += 1
    return Page(path, blocks, options)
