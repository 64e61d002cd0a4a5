"""``NonfiniteReport``: the answer of ``find_nonfinite`` (and ``ModelHistory.first_nonfinite``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from ....errors import TorchlensError
from ...records.func_call import FuncCallLocation
from ..display import answer_html

PHASES = ("input", "parameter", "forward", "loss", "backward")
# the graph page's colours (worst first: a closed module shows the worst inside)
CATEGORY_COLORS = (("producer", "#d7301f"), ("first NaN", "#7a0177"), ("propagated", "#fdae6b"), ("finite", "#d9f0d3"))


class NonfiniteReportError(TorchlensError, ValueError):
    """``first_nonfinite`` / ``find_nonfinite`` cannot answer (the message says why and what to do)."""


@dataclass
class ParentStats:
    """What one parent of the producer held: the clue to why the producer made NaN/Inf
    (a ``sqrt`` parent with negatives, a division by a parent with zeros)."""

    label: str
    min: Optional[float] = None
    max: Optional[float] = None
    has_zeros: Optional[bool] = None
    has_negatives: Optional[bool] = None
    finite: Optional[bool] = None  # None: unknown (not saved)
    gradient_kind: Optional[str] = None  # backward: 'nan'/'inf'/'-inf' of the gradient it got, if not finite

    def describe(self) -> str:
        if self.min is None:
            return f"{self.label} (not saved)"
        facts = [f"min {self.min:.4g}", f"max {self.max:.4g}"]
        facts += [what for what, on in (("has zeros", self.has_zeros), ("has negatives", self.has_negatives)) if on]
        if self.finite is False:
            facts.append("NOT finite")
        if self.gradient_kind:
            facts.append(f"its gradient {self.gradient_kind}")
        return f"{self.label} ({', '.join(facts)})"


def nonfinite_kind(tensor: torch.Tensor) -> Optional[str]:
    """'nan', 'inf' or '-inf': the kind of the first non-finite value in ``tensor`` (flat order);
    None when all are finite (or it cannot hold them).

    Example:
        >>> nonfinite_kind(torch.tensor([1.0, -float("inf"), float("nan")]))
        '-inf'
    """
    if not isinstance(tensor, torch.Tensor) or not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    flat = tensor.detach().reshape(-1)
    bad = (~torch.isfinite(flat)).nonzero()
    if len(bad) == 0:
        return None
    value = flat[int(bad[0])]
    if value.is_complex():
        return "nan" if bool(torch.isnan(value)) else "inf"
    if bool(torch.isnan(value)):
        return "nan"
    return "inf" if float(value) > 0 else "-inf"


def parent_stats(label: str, value: Any) -> ParentStats:
    """min, max, zeros and negatives of a saved activation (complex: of its magnitude)."""
    if not isinstance(value, torch.Tensor) or value.numel() == 0:
        return ParentStats(label)
    t = value.detach()
    if t.is_complex():
        t = t.abs()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    finite = bool(torch.isfinite(t).all()) if t.is_floating_point() else True
    return ParentStats(
        label,
        min=float(t.min()),
        max=float(t.max()),
        has_zeros=bool((t == 0).any()),
        has_negatives=bool((t < 0).any()),
        finite=finite,
    )


@dataclass
class NonfiniteReport:
    """Where a non-finite value (NaN, Inf) first appeared, and what it came from.

    ``found``: False when everything stayed finite. ``phase``: ``'input'`` or ``'parameter'``
    (already non-finite before any operation: ``label`` is the input layer, or the parameter or
    buffer address), ``'forward'`` (``label`` is the first operation whose output is non-finite
    while every tensor it read was finite), ``'loss'`` (the outputs were finite, ``loss_fn`` of
    them was not, or its gradient was not) or ``'backward'`` (``label`` is the forward operation
    whose backward made a non-finite gradient for its parents from a finite one). ``kind``:
    'nan', 'inf' or '-inf'. ``source``: the line that called the operation; ``module``: the
    innermost module it ran in. ``parents``: ``ParentStats`` of what it read. ``propagated``: the
    layers downstream that turned non-finite because of it (forward), or whose gradients did
    (backward). ``finite`` and ``gradient_finite``: every layer's flag by label (None: not a
    floating tensor, or no gradient reached it), e.g. to colour a graph. ``history``: the
    ``ModelHistory`` (with the activations of the producer and its parents when something was found).

    Example:
        >>> import torch, torchlens as tl
        >>> class Root(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.sqrt(x - 1)
        >>> report = tl.find_nonfinite(Root(), torch.tensor([0.0, 4.0]))
        >>> report.found, report.phase, report.label, report.kind
        (True, 'forward', 'sqrt_1_2', 'nan')
        >>> report.parents[0]
        ParentStats(label='sub_1_1', min=-1.0, max=3.0, has_zeros=False, has_negatives=True, finite=True, gradient_kind=None)
    """

    found: bool
    phase: Optional[str] = None
    label: Optional[str] = None
    kind: Optional[str] = None
    source: Optional[FuncCallLocation] = None
    module: Optional[str] = None
    parents: List[ParentStats] = field(default_factory=list)
    propagated: List[str] = field(default_factory=list)
    history: Any = None
    finite: Dict[str, Optional[bool]] = field(default_factory=dict)
    gradient_finite: Dict[str, Optional[bool]] = field(default_factory=dict)
    address: Optional[str] = None  # the input, parameter or buffer address, when there is one
    checked_backward: bool = False
    first_nan: Optional["NonfiniteReport"] = None  # when the first value was an Inf: where NaN began
    notes: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        return _story(self)

    def __repr__(self) -> str:
        return f"<NonfiniteReport found={self.found} phase={self.phase!r} label={self.label!r} kind={self.kind!r}>"

    def _repr_html_(self) -> str:
        """In a notebook: the story, then the graph page opened on the producer."""
        if self.history is None:  # nothing to draw: the story alone
            return answer_html(_story(self), None)
        overlay, focus = self._page_view()
        return answer_html(_story(self), self.history, overlay, focus)

    def overlay(self) -> Dict[str, Any]:
        """The graph page's overlay: each layer 'producer', 'propagated' or 'finite' (backward:
        by its gradient); layers that hold no floating values have none.

        Example:
            >>> import torch, torchlens as tl
            >>> report = tl.find_nonfinite(torch.nn.Linear(2, 2), torch.ones(1, 2), backward=False)
            >>> sorted(set(report.overlay()["values"].values()))
            ['finite']
        """
        backward = self.phase == "backward"
        flags = self.gradient_finite if backward else self.finite
        producers = {self.label} if self.label else set()
        if self.phase == "parameter" and self.history is not None:  # the ops that read it
            producers = {e.label for e in self.history.layer_list if self.label in (e.param_addresses or ())}
        values: Dict[str, str] = {}
        for label, finite in flags.items():
            if label in producers:
                values[label] = "producer"
            elif finite is not None:
                values[label] = "finite" if finite else "propagated"
        if self.first_nan is not None and self.first_nan.label in values:
            values[self.first_nan.label] = "first NaN"
        caption = _story(self).split("\n")[0]
        return {
            "values": values,
            "name": "non-finite gradient (backward)" if backward else "non-finite values",
            "scale": "categorical",
            "colors": dict(CATEGORY_COLORS),
            "caption": caption if len(caption) <= 200 else caption[:197] + "...",
        }

    def to_html(self, path: Optional[str] = None) -> str:
        """The graph page of ``history`` with each node coloured producer / propagated /
        finite and a legend, opened on the producer (its modules open, its parents and source
        line in the details panel). Returns the HTML; writes it to ``path`` when given.

        Example:
            >>> import torch, torchlens as tl
            >>> report = tl.find_nonfinite(torch.nn.Linear(2, 2), torch.ones(1, 2))
            >>> "non-finite values" in report.to_html()
            True
        """
        if self.history is None:
            raise NonfiniteReportError(
                "this report has no history to draw; it comes from find_nonfinite or first_nonfinite."
            )
        overlay, focus = self._page_view()
        return self.history.to_html(path, overlay=overlay, focus=focus)

    def _page_view(self) -> Tuple[Dict[str, Any], Optional[str]]:
        """The overlay of the graph page and the label it opens on (the producer)."""
        labels = {e.label for e in self.history.layer_list}
        overlay = self.overlay()
        focus = (
            self.label
            if self.label in labels
            else next((k for k, v in overlay["values"].items() if v == "producer"), None)
        )
        return overlay, focus

    def to_pandas(self) -> Any:
        """One row per layer: label, forward flag, gradient flag, and its role in the answer
        ('producer', 'parent', 'propagated' or '').

        Example:
            >>> import torch, torchlens as tl
            >>> report = tl.find_nonfinite(torch.nn.Linear(2, 2), torch.ones(1, 2))
            >>> list(report.to_pandas().columns)
            ['label', 'finite', 'gradient_finite', 'role']
        """
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from error
        parents = {p.label for p in self.parents}
        propagated = set(self.propagated)
        rows = []
        for label, finite in self.finite.items():
            role = (
                "producer"
                if label == self.label
                else "parent"
                if label in parents
                else "propagated"
                if label in propagated
                else ""
            )
            rows.append(
                {"label": label, "finite": finite, "gradient_finite": self.gradient_finite.get(label), "role": role}
            )
        return pd.DataFrame(rows, columns=["label", "finite", "gradient_finite", "role"])


def _where(report: NonfiniteReport) -> str:
    """``(`y = torch.sqrt(x)`, model.py:12) inside module 'block.1'``."""
    parts = []
    if report.source is not None:
        code = report.source.code_line.split("  #")[0].strip()  # without a trailing comment
        where = f"{os.path.basename(report.source.file)}:{report.source.line_number}"
        parts.append(f"(`{code}`, {where})" if code else f"({where})")
    parts.append(f"inside module '{report.module}'" if report.module else "in the model's own forward")
    return " ".join(parts)


def _listed(labels: List[str], limit: int = 6) -> str:
    shown = ", ".join(labels[:limit])
    return shown + (f", ... ({len(labels) - limit} more)" if len(labels) > limit else "")


def _story(r: NonfiniteReport) -> str:
    if not r.found:
        checked = "forward and backward" if r.checked_backward else "forward"
        text = f"No NaN or Inf: every value stayed finite ({len(r.finite)} layers, {checked})."
    elif r.phase == "parameter":
        text = f"{r.kind} is already in {r.label} before any operation runs (a parameter or buffer of the model)."
    elif r.phase == "input":
        text = f"{r.kind} is already in the input {r.label}" + (f" ({r.address})" if r.address else "") + "."
    elif r.phase == "loss":
        text = f"The forward pass stayed finite, but {r.kind} appeared in the loss: " + (r.notes[0] if r.notes else "")
    elif r.phase == "backward":
        text = (
            f"The forward pass stayed finite. In backward, {r.label} {_where(r)} got a finite gradient "
            f"and its backward made {r.kind} in the gradient of what it read: "
            + ", ".join(p.describe() for p in r.parents)
            + "."
        )
    else:
        text = f"{r.kind} first appeared in {r.label} {_where(r)}"
        text += ", from parents: " + ", ".join(p.describe() for p in r.parents) + "." if r.parents else "."
    if r.found and r.propagated:
        if r.phase == "backward":
            text += f" It then spread back to the gradients of {len(r.propagated)} more: {_listed(r.propagated)}."
        else:
            text += f" It then reached {len(r.propagated)} layers downstream: {_listed(r.propagated)}."
    if r.first_nan is not None:
        n = r.first_nan
        text += f"\nThe first NaN came later, in {n.label} {_where(n)}"
        text += ", from parents: " + ", ".join(p.describe() for p in n.parents) + "." if n.parents else "."
    extra = r.notes[1:] if r.phase == "loss" else r.notes
    return "\n".join([text] + [f"Note: {note}" for note in extra])


__all__ = ["NonfiniteReport", "ParentStats", "NonfiniteReportError", "nonfinite_kind", "parent_stats", "PHASES"]
