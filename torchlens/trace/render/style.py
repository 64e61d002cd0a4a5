"""How the drawing looks: colours, fonts and the text inside nodes, edges and module boxes.

Everything here is plain data or small pure functions, so a look can be changed in one place.

Example:
    >>> import torch
    >>> from torchlens.trace.render.style import shape_text, positions_text
    >>> shape_text(torch.Size([1, 384, 13, 13]))
    '1x384x13x13'
    >>> positions_text([1, 'mask', (0, 2)])
    'arg 1, mask, arg 0[2]'
"""

from __future__ import annotations

import html
from typing import Any, Iterable, List, Optional, Sequence

import torch

from ..records.format import human_bytes

FONT = "Helvetica"

# (fill, border) per node kind: soft, calm colours that stay readable in print.
COLORS = {
    "op": ("#ffffff", "#9a9fa6"),
    "params": ("#e3eaf4", "#7d93b2"),
    "input": ("#dcefd8", "#6f9f66"),
    "output": ("#f8dcd5", "#c4806f"),
    "buffer": ("#fbf3cc", "#c2ab4c"),
    "bool": ("#e9e1f4", "#8f7bb4"),
    "untraced": ("#fbe3e0", "#c0392b"),  # made by a call torchlens does not trace
    "module": ("#eef0f3", "#7d858f"),
}
INTERVENED_BORDER = "#d35400"  # border of layers whose value an intervention replaced
EDGE_COLOR = "#6f747b"
EDGE_LABEL_COLOR = "#4f555c"
IF_EDGE_COLOR = "#8f7bb4"
CLUSTER_BORDER = "#b9c0c9"
CLUSTER_LABEL_COLOR = "#59616b"
DETAIL_COLOR = "#3f444a"

DIRECTIONS = {"bottomup": "BT", "topdown": "TB", "leftright": "LR"}

# Operations whose arguments can be swapped: their edges need no argument position.
COMMUTATIVE_TYPES = frozenset({"add", "mul", "iadd", "imul", "maximum", "minimum", "eq", "ne"})

GRAPH_DEFAULTS = {
    "fontname": FONT,
    "fontsize": "12",
    "fontcolor": "#2f3338",
    "bgcolor": "white",
    "labelloc": "t",
    "labeljust": "c",
    "nodesep": "0.25",
    "ranksep": "0.32",
    "pad": "0.25",
    "newrank": "true",
}
NODE_DEFAULTS = {
    "shape": "box",
    "style": "filled,rounded",
    "fillcolor": COLORS["op"][0],
    "color": COLORS["op"][1],
    "fontname": FONT,
    "fontsize": "10",
    "fontcolor": "#1f2328",
    "margin": "0.10,0.05",
    "height": "0.3",
    "penwidth": "1.0",
}
EDGE_DEFAULTS = {
    "color": EDGE_COLOR,
    "arrowsize": "0.6",
    "penwidth": "0.9",
    "fontname": FONT,
    "fontsize": "8",
    "fontcolor": EDGE_LABEL_COLOR,
}
CLUSTER_DEFAULTS = {
    "style": "rounded",
    "color": CLUSTER_BORDER,
    "penwidth": "1.0",
    "fontname": FONT,
    "fontsize": "9",
    "fontcolor": CLUSTER_LABEL_COLOR,
    "labeljust": "l",
    "margin": "10",
}
MAX_LABEL_CHARS = 200
# where the edges of a wide fan-in or fan-out meet (fans.py): a dot on the edges' line
JUNCTION = {
    "shape": "point",
    "width": "0.04",
    "height": "0.04",
    "color": EDGE_COLOR,
    "fillcolor": EDGE_COLOR,
    "label": "",
}
IF_EDGE = {"style": "dashed", "color": IF_EDGE_COLOR, "fontcolor": IF_EDGE_COLOR, "label": "if"}


# ----- text -------------------------------------------------------------------------------------
def shape_text(shape: Optional[Sequence[int]]) -> str:
    """``torch.Size([1, 384, 13, 13])`` -> ``'1x384x13x13'``; a 0-d shape -> ``'scalar'``."""
    if shape is None:
        return "?"
    # a nested tensor's ragged dimensions are None: '2x*x16'
    return "x".join("*" if d is None else str(int(d)) for d in shape) if len(shape) else "scalar"


def passes_text(passes: Iterable[int], limit: int = 4) -> str:
    """``{2, 3, 4}`` -> ``'passes 2-4'``; ``{1}`` -> ``'pass 1'``; ``{1, 3, 4}`` -> ``'passes 1, 3-4'``;
    past ``limit`` runs the middle is elided: ``'passes 1, 3, 5, ..., 99 (50 in all)'``."""
    nums = sorted(set(passes))
    runs: List[str] = []
    start = prev = nums[0]
    for n in nums[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    if len(runs) > limit:
        runs = runs[: limit - 1] + ["...", runs[-1] + f" ({len(nums)} in all)"]
    return ("pass " if len(nums) == 1 else "passes ") + ", ".join(runs)


def position_text(position: Any) -> str:
    """One argument position: ``0`` -> ``'arg 0'``, ``'mask'`` -> ``'mask'``, ``(0, 2)`` -> ``'arg 0[2]'``."""
    if isinstance(position, tuple) and position:
        head = position_text(position[0])
        return head + "".join(f"[{p}]" for p in position[1:])
    if isinstance(position, int):
        return f"arg {position}"
    return str(position)


def positions_text(positions: Iterable[Any], limit: int = 4) -> str:
    """Several positions of one parent, in order, without repeats; past ``limit`` the middle is
    elided (a stack of 1,500 steps is one edge: ``'arg 0[0], arg 0[1], arg 0[2], ..., arg 0[1499]
    (1500 in all)'``)."""
    texts = list(dict.fromkeys(position_text(p) for p in positions))
    if len(texts) > limit:
        texts = texts[: limit - 1] + ["...", f"{texts[-1]} ({len(texts)} in all)"]
    return ", ".join(texts)


def clip(text: str, limit: int = MAX_LABEL_CHARS) -> str:
    """A label cut to ``limit`` characters (``dot`` rejects quoted strings over 16,384)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def params_text(count: int) -> str:
    """``663936`` -> ``'663,936 params'``."""
    return f"{count:,} param" + ("" if count == 1 else "s")


def html_label(title: str, lines: Sequence[str] = (), italic_lines: Sequence[str] = ()) -> str:
    """An HTML-like graphviz label: a bold title and smaller detail lines (text is escaped).

    One table row per line, so lines of different sizes never overlap.
    """
    rows = [f"<TR><TD><B>{html.escape(title)}</B></TD></TR>"]
    for text in italic_lines:
        rows.append(f'<TR><TD><FONT POINT-SIZE="8" COLOR="{DETAIL_COLOR}"><I>{html.escape(text)}</I></FONT></TD></TR>')
    for text in lines:
        rows.append(f'<TR><TD><FONT POINT-SIZE="9" COLOR="{DETAIL_COLOR}">{html.escape(text)}</FONT></TD></TR>')
    return '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">' + "".join(rows) + "</TABLE>>"


def tensor_text(shape: Optional[Sequence[int]], dtype: Optional[torch.dtype], nbytes: Optional[int]) -> str:
    """``'1x384x13x13 (253.5 KB)'``; the dtype is named when it is not float32 (``'3x4 bool (12 B)'``)."""
    text = shape_text(shape)
    if dtype is not None and dtype != torch.float32:
        text += " " + str(dtype).replace("torch.", "")
    return f"{text} ({human_bytes(nbytes or 0)})"


# The backward path (``save_gradients``): blue, drawn against the data flow.
BACKWARD_EDGE = {
    "color": "#3b6fb6",
    "fontcolor": "#3b6fb6",
    "style": "dashed",
    "constraint": "false",
    "arrowhead": "vee",
    "penwidth": "1.2",
}
