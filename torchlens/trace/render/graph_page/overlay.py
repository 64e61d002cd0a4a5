"""An overlay of the graph page: one value per operation (a number or a category) that colours
its node, with a legend. ``history.to_html(overlay=...)`` takes an ``Overlay``, a plain
``{label: value}`` mapping, or the same fields as a dict (``{"values": {...}, "name": ...,
"scale": ...}``: what the answers layer passes, as it does not import this one).

Scales: ``'sequential'`` (low to high, light to dark red; ``log=True`` for errors spanning
decades), ``'diverging'`` (blue below ``center``, red above) and ``'categorical'`` (one colour
per category, in the order given by ``colors`` or first seen). A label of a rolled view's layer
(several passes) takes the worst value of its passes; a closed module is outlined in the colour
of the worst value inside it.

Example:
    >>> ov = Overlay({"a_1_1": 0.0, "b_1_2": 2.0}, name="error")
    >>> spec = ov.page_spec({"a_1_1": "a_1_1", "b_1_2": "b_1_2"})
    >>> spec["scale"], spec["nodes"]["b_1_2"]["fill"], spec["nodes"]["a_1_1"]["text"]
    ('sequential', '#d7301f', '0')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ....errors import TorchlensError

SCALES = ("sequential", "diverging", "categorical")
# light to dark (sequential); blue, white, red (diverging); distinct colours (categorical)
SEQUENTIAL = ("#fff7ec", "#fdd49e", "#fc8d59", "#d7301f")
DIVERGING = ("#2166ac", "#92c5de", "#f7f7f7", "#f4a582", "#b2182b")
PALETTE = ("#d7301f", "#fdae6b", "#d9f0d3", "#6baed6", "#9e9ac8", "#fdd0a2", "#bdbdbd", "#74c476")
STEPS = 5  # swatches in the legend of a numeric scale


class OverlayError(TorchlensError, ValueError):
    """An overlay that cannot be drawn (the message says what to give instead)."""


Value = Union[float, int, str, bool, None]


@dataclass
class Overlay:
    """Colour each node of the graph page by ``values[label]`` (labels as in ``history``; a
    node without a value keeps its usual look). ``scale``: ``'sequential'``, ``'diverging'``
    or ``'categorical'`` (default: categorical when any value is a string, else sequential).
    ``domain``: ``(low, high)`` of a numeric scale (default: the values' range; diverging:
    symmetric around ``center``). ``colors``: ``{category: css colour}`` (its order is the
    legend's and the worst-first order). ``caption``: a line under the legend's title.

    Example:
        >>> Overlay({"x_1_1": "bad", "y_1_2": "ok"}, colors={"bad": "red", "ok": "green"}).resolved_scale()
        'categorical'
    """

    values: Mapping[str, Value]
    name: str = "value"
    scale: Optional[str] = None
    domain: Optional[Tuple[float, float]] = None
    log: bool = False
    center: float = 0.0
    colors: Optional[Mapping[str, str]] = None
    caption: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, overlay: Any) -> "Overlay":
        """An ``Overlay`` from what ``to_html(overlay=...)`` was given."""
        if isinstance(overlay, Overlay):
            return overlay
        if isinstance(overlay, Mapping):
            if isinstance(overlay.get("values"), Mapping):  # the fields as a dict
                known = {k: v for k, v in overlay.items() if k in cls.__dataclass_fields__}
                unknown = sorted(set(overlay) - set(known))
                if unknown:
                    raise OverlayError(
                        f"overlay fields {unknown} are unknown; give some of: {', '.join(cls.__dataclass_fields__)}."
                    )
                return cls(**known)
            return cls(dict(overlay))
        raise OverlayError(
            f"overlay must be a {{label: value}} dict or an Overlay, not {type(overlay).__name__}; "
            "e.g. history.to_html(overlay={'linear_1_1': 0.5})."
        )

    def resolved_scale(self) -> str:
        if self.scale is not None:
            if self.scale not in SCALES:
                raise OverlayError(f"overlay scale {self.scale!r} is unknown; use one of {', '.join(SCALES)}.")
            return self.scale
        if self.colors or any(isinstance(v, str) for v in self.values.values()):
            return "categorical"
        return "sequential"

    def page_spec(self, layer_of: Mapping[str, str]) -> Dict[str, Any]:
        """The JSON the page draws: per label (``layer_of``: op label -> layer label; layer
        labels get the worst of their passes) its fill, ink, text and severity, and the legend."""
        scale = self.resolved_scale()
        known = {label: v for label, v in self.values.items() if label in layer_of and v is not None}
        if self.values and not known:
            shown = ", ".join(list(map(str, self.values))[:3])
            raise OverlayError(
                f"none of the overlay's labels ({shown}, ...) is an operation of this history; "
                "use labels as in history.layer_labels (e.g. 'linear_1_1')."
            )
        if scale == "categorical":
            paint, legend = _categorical(self, known)
        else:
            paint, legend = _numeric(self, scale, known)
        nodes: Dict[str, Dict[str, Any]] = {}
        for label, value in known.items():
            nodes[label] = paint(value)
            layer = layer_of[label]
            if layer != label and (layer not in nodes or nodes[layer]["severity"] < nodes[label]["severity"]):
                nodes[layer] = nodes[label]
        return {"name": self.name, "scale": scale, "caption": self.caption, "legend": legend, "nodes": nodes}


def _ink(color: str) -> str:
    """Dark text on light fills, white on dark ones."""
    if not (color.startswith("#") and len(color) == 7):
        return "#1f2328"
    r, g, b = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#ffffff" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else "#1f2328"


def _mix(stops: Tuple[str, ...], t: float) -> str:
    """The colour at ``t`` in [0, 1] along ``stops`` (linear in RGB)."""
    t = min(1.0, max(0.0, t))
    at = t * (len(stops) - 1)
    i = min(int(at), len(stops) - 2)
    f = at - i
    a, b = stops[i], stops[i + 1]
    rgb = [round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return str(value) if not math.isfinite(value) else "0"
    return f"{value:.3g}"


def _categorical(ov: Overlay, known: Mapping[str, Value]) -> Tuple[Any, List[Dict[str, Any]]]:
    order: List[str] = list(ov.colors or {})
    for v in known.values():
        if str(v) not in order:
            order.append(str(v))
    colors = dict(ov.colors or {})
    for i, cat in enumerate(order):
        colors.setdefault(cat, PALETTE[i % len(PALETTE)])
    counts = {cat: 0 for cat in order}
    for v in known.values():
        counts[str(v)] += 1

    def paint(value: Value) -> Dict[str, Any]:
        cat = str(value)
        return {"fill": colors[cat], "ink": _ink(colors[cat]), "text": cat, "severity": len(order) - order.index(cat)}

    # categories no node has are left out of the legend (their colour is still reserved)
    legend = [{"color": colors[c], "text": f"{c} ({counts[c]})", "category": c} for c in order if counts[c]]
    return paint, legend


def _numeric(ov: Overlay, scale: str, known: Mapping[str, Value]) -> Tuple[Any, List[Dict[str, Any]]]:
    numbers = {k: float(v) for k, v in known.items()}  # type: ignore[arg-type]
    finite = [v for v in numbers.values() if math.isfinite(v)]
    if ov.domain is not None:
        lo, hi = map(float, ov.domain)
    elif scale == "diverging":
        reach = max((abs(v - ov.center) for v in finite), default=1.0) or 1.0
        lo, hi = ov.center - reach, ov.center + reach
    else:
        positive = [v for v in finite if v > 0] if ov.log else finite
        lo, hi = (min(positive), max(positive)) if positive else (0.0, 1.0)
    if ov.log and (lo <= 0 or scale == "diverging"):
        raise OverlayError("a log overlay needs a sequential scale and a domain above 0, e.g. domain=(1e-6, 1).")
    stops = DIVERGING if scale == "diverging" else SEQUENTIAL

    def where(v: float) -> float:
        if math.isnan(v):
            return 1.0  # NaN is the worst an error can be
        if ov.log:
            v = max(v, lo)
            return 0.5 if hi <= lo else (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        return 0.5 if hi <= lo else (v - lo) / (hi - lo)

    def paint(value: Value) -> Dict[str, Any]:
        v = float(value)  # type: ignore[arg-type]
        t = where(v)
        color = _mix(stops, t)
        severity = abs(t - 0.5) if scale == "diverging" else t
        return {"fill": color, "ink": _ink(color), "text": _fmt(v), "severity": severity}

    legend = []
    for i in range(STEPS):
        t = i / (STEPS - 1)
        v = 10 ** (math.log10(lo) + t * (math.log10(hi) - math.log10(lo))) if ov.log else lo + t * (hi - lo)
        text = _fmt(v)
        if i == 0 and (ov.log or ov.domain is not None) and scale == "sequential":
            text = "≤ " + text
        if i == STEPS - 1 and ov.domain is not None:
            text = "≥ " + text
        legend.append({"color": _mix(stops, t), "text": text})
    return paint, legend


__all__ = ["Overlay", "OverlayError", "SCALES"]
