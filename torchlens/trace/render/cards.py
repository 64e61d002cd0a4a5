"""The card a notebook shows for one ``TensorLogEntry`` (``history['conv2d_3_7']`` as the last
expression of a cell): label, shape, dtype, size, statistics and a small SVG histogram of the
saved values (``torchlens.web.stats.tensor_stats``, the same bins as both pages), parents and
children, the module and the source line. Plain HTML with inline styles only, so it cannot
restyle the notebook around it, and no script: it shows the same everywhere, GitHub included.

Example:
    >>> import torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3), random_seed=0)
    >>> card = entry_card_html(h['linear_1_1'])
    >>> 'data-label="linear_1_1"' in card and 'data-role="histogram"' in card
    True
"""

from __future__ import annotations

import html
import os
from typing import Any, Dict, List, Optional

import torch

from ...web.stats import tensor_stats
from ..records.tensor_log import provide_card

HIST_WIDTH, HIST_HEIGHT = 240, 56
_CELL = "padding: 1px 10px 1px 0; vertical-align: top; text-align: left;"
_KEY = _CELL + " color: #777; white-space: nowrap;"


def _number(x: float) -> str:
    return f"{x:.4g}"


def histogram_svg(counts: List[int], lo: float, hi: float) -> str:
    """A small bar chart of ``counts`` (equal bins from ``lo`` to ``hi``), as SVG text.

    Example:
        >>> svg = histogram_svg([1, 3, 0, 2], 0.0, 1.0)
        >>> svg.count("<rect") == 4 and ">0<" in svg and ">1<" in svg
        True
    """
    top = max(counts) or 1
    width = HIST_WIDTH / len(counts)
    bars = []
    for i, count in enumerate(counts):
        h = 0 if count == 0 else max(1.0, HIST_HEIGHT * count / top)  # a non-empty bin stays visible
        bars.append(
            f'<rect x="{i * width:.2f}" y="{HIST_HEIGHT - h:.2f}" width="{max(width - 0.5, 0.5):.2f}" '
            f'height="{h:.2f}" fill="#4a7fc1"><title>{count}</title></rect>'
        )
    label_y = HIST_HEIGHT + 12
    return (
        f'<svg data-role="histogram" xmlns="http://www.w3.org/2000/svg" style="display: block; margin: 0;" width="{HIST_WIDTH}" '
        f'height="{label_y + 2}" viewBox="0 0 {HIST_WIDTH} {label_y + 2}" font-size="10" font-family="sans-serif">'
        + "".join(bars)
        + f'<line x1="0" x2="{HIST_WIDTH}" y1="{HIST_HEIGHT}" y2="{HIST_HEIGHT}" stroke="#999" stroke-width="0.5"/>'
        + f'<text x="0" y="{label_y}" fill="#777">{html.escape(_number(lo))}</text>'
        + f'<text x="{HIST_WIDTH}" y="{label_y}" fill="#777" text-anchor="end">{html.escape(_number(hi))}</text>'
        + "</svg>"
    )


def _stats_rows(stats: Optional[Dict[str, Any]], entry: Any) -> List[tuple]:
    if entry.activation is None:
        return [("values", "not saved (layers_to_save)")]
    if stats is None:
        return [("values", "no statistics for this kind of tensor")]
    if "min" not in stats:
        return [("values", "empty" if stats["n"] == 0 else f"all {stats['nonfinite']} non-finite")]
    rows = [(name, _number(stats[name])) for name in ("min", "max", "mean", "std")]
    if stats["zeros"]:
        rows.append(("zeros", f"{stats['zeros']:.1%}"))
    if stats["nonfinite"]:
        rows.append(("non-finite", f"{stats['nonfinite']} (left out of the statistics)"))
    return rows


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _source(entry: Any) -> Optional[str]:
    """The innermost line of the call stack in the model's code: a conv2d's own innermost frame
    is torch's Conv2d.forward, the line a user wants is the one calling the module."""
    stack = entry.func_call_stack
    if not stack:
        return None
    outside_torch = [f for f in stack if not os.path.abspath(f.file).startswith(_TORCH_DIR)]
    where = (outside_torch or stack)[-1]
    return f"{os.path.basename(where.file)}:{where.line_number} in {where.function}: {where.code_line}"


def entry_card_html(entry: Any) -> str:
    """The card of ``entry`` as an HTML fragment (see the module doc)."""
    shape = tuple(entry.shape) if entry.shape is not None else None
    stats = tensor_stats(entry.activation) if entry.activation is not None else None
    rows: List[tuple] = [
        ("shape", str(shape)),
        ("dtype", str(entry.dtype).replace("torch.", "")),
        ("size", entry.tensor_size_text),
    ]
    rows += _stats_rows(stats, entry)
    rows.append(("parents", ", ".join(entry.parent_layers) or "none"))
    rows.append(("children", ", ".join(entry.child_layers) or "none"))
    module = entry._module_text(*entry.module_stack[-1]) if entry.module_stack else "none (outside every module)"
    rows.append(("module", module))
    source = _source(entry)
    if source is not None:
        rows.append(("source", source))
    source_role = ' data-role="source"'
    table = "".join(
        f'<tr><th style="{_KEY} font-weight: normal;">{html.escape(k)}</th>'
        f'<td style="{_CELL}"{source_role if k == "source" else ""}>'
        f"{html.escape(v)}</td></tr>"
        for k, v in rows
    )
    hist = ""
    if stats is not None and "min" in stats:
        hist = f'<div style="margin-top: 6px;">{histogram_svg(stats["hist"], stats["min"], stats["max"])}</div>'
    title = f"{entry.label} · {entry.func_name if entry.func is not None else entry.kind}"
    return (
        f'<div class="torchlens-card" data-label="{html.escape(entry.label, quote=True)}" style="font: 12px/1.4 '
        'sans-serif; border: 1px solid #ddd; border-radius: 4px; padding: 8px 10px; width: fit-content; max-width: 100%;">'
        f'<div style="font-weight: bold; margin-bottom: 4px;">{html.escape(title)}</div>'
        f'<table style="border-collapse: collapse; font-size: 12px;">{table}</table>{hist}</div>'
    )


provide_card(entry_card_html)

__all__ = ["entry_card_html", "histogram_svg"]
