"""Text from a history shown where control characters would act: a terminal, a DOT file.

A loaded history's labels and names come from a file; an escape sequence in one would clear or
rewrite the user's terminal when printed, and ``dot`` rejects some control characters. Each
control character (C0 but newline and tab, DEL, C1) is shown as a visible stand-in instead:
its Unicode control picture (``\\x1b`` -> ``␛``), or ``\\x9b`` as ``‹9b›`` for the C1 range.

Example:
    >>> visible("relu\\x1b[2J_1_2")
    'relu␛[2J_1_2'
    >>> visible("two\\nlines\\tkept")
    'two\\nlines\\tkept'
"""

from __future__ import annotations

from typing import Dict

_PICTURES: Dict[int, str] = {c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\n\t"}
_PICTURES[0x7F] = "\u2421"
_PICTURES.update({c: f"\u2039{c:02x}\u203a" for c in range(0x80, 0xA0)})  # ‹9b›: no markup characters


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab replaced by a visible stand-in."""
    return text.translate(_PICTURES)


def visible_line(text: str) -> str:
    """``visible`` for text that must stay on one line: newline and tab are shown too."""
    return visible(text).replace("\n", "\u2424").replace("\t", "\u2409")


__all__ = ["visible", "visible_line"]
