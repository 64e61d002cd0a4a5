"""Where in the Python source an operation was called from; source text is read lazily."""

from __future__ import annotations

import linecache
import textwrap
import types
from typing import Dict, List, Optional, Union


class DetachedCode:
    """What a history keeps of a code object once it leaves the process that ran it (saved to a
    folder or pickled): file, function, first line, and the source lines around its call sites,
    so ``func_call_stack`` reads the same text later, even when the file has changed or gone."""

    __slots__ = ("co_filename", "co_name", "co_qualname", "co_firstlineno", "source")

    def __init__(self, filename: str, name: str, qualname: str, firstlineno: int, source: Dict[int, str]) -> None:
        self.co_filename = filename
        self.co_name = name
        self.co_qualname = qualname
        self.co_firstlineno = firstlineno
        self.source = source

    def __repr__(self) -> str:
        return f"<code {self.co_qualname} at {self.co_filename}:{self.co_firstlineno}>"


# What a call frame's code is: the live code object, or its stand-in in a loaded or unpickled history.
CodeLike = Union[types.CodeType, DetachedCode]


class FuncCallLocation:
    """One frame of the call stack of an operation: file, line, function and nearby source.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))
        >>> loc = h['linear_1_1'].func_call_stack[-1]
        >>> loc.function
        'forward'
    """

    __slots__ = ("code", "line_number", "_context")

    def __init__(self, code: CodeLike, line_number: int, context: int = 2) -> None:
        self.code = code
        self.line_number = line_number
        self._context = context

    @property
    def file(self) -> str:
        return self.code.co_filename

    @property
    def function(self) -> str:
        return self.code.co_name

    @property
    def code_line(self) -> str:
        """The source line of the call, stripped."""
        return self._line(self.line_number).strip()

    def _line(self, number: int) -> str:
        """Source line ``number`` of the file (a loaded or unpickled history reads the text it stored)."""
        code = self.code
        if isinstance(code, DetachedCode):  # a stand-in for a code object keeps its source text
            return code.source.get(number, "")
        return linecache.getline(self.file, number)

    def source_lines(self, context: Optional[int] = None) -> List[str]:
        """Source lines around the call, the call marked with ``--->``."""
        context = self._context if context is None else context
        numbers = range(max(1, self.line_number - context), self.line_number + context + 1)
        texts = [(n, self._line(n).rstrip()) for n in numbers]
        while texts and not texts[-1][1].strip():  # no trailing blank lines
            texts.pop()
        body = textwrap.dedent("\n".join(t for _, t in texts)).split("\n") if texts else []
        return [("--->  " if n == self.line_number else "      ") + line for (n, _), line in zip(texts, body)]

    def __repr__(self) -> str:
        code = "\n".join("    " + line for line in self.source_lines())
        return (
            f"FuncCallLocation:\n  file: {self.file}\n  line: {self.line_number}\n"
            f"  function: {self.function}\n  code:\n{code}"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FuncCallLocation) and self.code is other.code and self.line_number == other.line_number

    def __hash__(self) -> int:
        return hash((id(self.code), self.line_number))
