"""A heat map as plain SVG (no plotting library needed): one cell per value, a diverging
blue-white-red scale centred on 0, row and column labels and a small legend.

Example:
    >>> svg = heatmap_svg([[0.0, 1.0]], ["h.0"], ["0", "1"], title="t")
    >>> svg.startswith("<svg") and svg.count("<rect") >= 2
    True
"""

from __future__ import annotations

import html
import math
from typing import Any, List, Sequence

import numpy as np

_STOPS = ((33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43))
CELL, FONT = 22, 11


def _color(t: float) -> str:
    """``t`` in [-1, 1] -> blue (-1), white (0), red (1)."""
    if math.isnan(t):
        return "#999999"
    at = (min(1.0, max(-1.0, t)) + 1) / 2 * (len(_STOPS) - 1)
    i = min(int(at), len(_STOPS) - 2)
    f = at - i
    rgb = [round(a * (1 - f) + b * f) for a, b in zip(_STOPS[i], _STOPS[i + 1])]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heatmap_svg(values: Any, rows: Sequence[str], columns: Sequence[str], title: str = "") -> str:
    """SVG text of ``values`` (rows x columns)."""
    grid = np.asarray(values, dtype=float)
    finite = grid[np.isfinite(grid)]
    reach = float(np.abs(finite).max()) if finite.size else 1.0
    reach = reach or 1.0
    left = 8 + FONT * 0.62 * max((len(r) for r in rows), default=1)
    top = 28 + (FONT + 4 if title else 0)
    width = left + CELL * len(columns) + 90
    height = top + CELL * len(rows) + 34
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'font-family="sans-serif" font-size="{FONT}">',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{left:.0f}" y="{FONT + 4}" font-weight="bold">{html.escape(title)}</text>')
    for j, col in enumerate(columns):
        x = left + CELL * j + CELL / 2
        out.append(f'<text x="{x:.0f}" y="{top - 6}" text-anchor="middle">{html.escape(col)}</text>')
    for i, row in enumerate(rows):
        y = top + CELL * i
        out.append(f'<text x="{left - 6:.0f}" y="{y + CELL / 2 + 4:.0f}" text-anchor="end">{html.escape(row)}</text>')
        for j in range(len(columns)):
            v = grid[i, j]
            out.append(
                f'<rect x="{left + CELL * j:.0f}" y="{y}" width="{CELL}" height="{CELL}" fill="{_color(v / reach)}" '
                f'stroke="white"><title>{html.escape(row)} @ {html.escape(columns[j])}: {v:.4g}</title></rect>'
            )
    out.append(
        f'<text x="{left + CELL * len(columns) / 2:.0f}" y="{top + CELL * len(rows) + 16}" '
        'text-anchor="middle">position</text>'
    )
    lx = left + CELL * len(columns) + 16
    for k, t in enumerate((1.0, 0.5, 0.0, -0.5, -1.0)):
        y = top + k * 16
        out.append(f'<rect x="{lx:.0f}" y="{y}" width="14" height="14" fill="{_color(t)}" stroke="#ccc"/>')
        out.append(f'<text x="{lx + 20:.0f}" y="{y + 11}">{t * reach:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)


__all__ = ["heatmap_svg"]
