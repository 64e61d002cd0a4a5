"""``Comparison``: the answer of ``tl.compare`` and ``tl.compare_precision``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ....errors import TorchlensError
from ...records.func_call import FuncCallLocation
from ..display import answer_html


class CompareError(TorchlensError, ValueError):
    """``compare`` cannot compare these two passes (the message says why and what to do)."""


class NothingInCommonError(CompareError):
    """The two passes share (almost) no operations: a comparison would be an empty table."""


@dataclass(repr=False)
class ComparedOp:
    """One matched op: its labels on both sides and how far apart its values are."""

    label_a: str
    label_b: str
    layer_type: str
    module: Optional[str]  # innermost module address in a
    shape_a: Optional[Tuple[int, ...]]
    shape_b: Optional[Tuple[int, ...]]
    within: bool  # every element within tolerance (always False when shapes differ)
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    mean_rel: Optional[float] = None  # mean |a-b| / |b| (each at most 1) over elements with |b| > atol
    rel_error: Optional[float] = None  # ||a - b|| / ||b||
    cosine: Optional[float] = None
    exact: bool = False  # compared exactly (integer or boolean values)
    parents: List[str] = field(default_factory=list)  # labels in a of the matched parents
    is_origin: bool = False  # beyond tolerance while every matched parent is within it
    added: Optional[float] = None  # mean_rel beyond the worst of the parents' (never below 0)
    matched_by: str = "label"
    note: Optional[str] = None
    source: Optional[FuncCallLocation] = None

    @property
    def label(self) -> str:
        """The label in ``a`` (``label_b`` is the other side's)."""
        return self.label_a

    @property
    def same_shape(self) -> bool:
        return self.shape_a == self.shape_b

    def describe(self) -> str:
        """``'linear_2_3 (b: linear_2_3) in module fc2: max abs 0.31, max rel 0.02, cosine 0.9998'``."""
        where = f" in module {self.module}" if self.module else ""
        other = f" (b: {self.label_b})" if self.label_b != self.label_a else ""
        return f"{self.label_a}{other}{where}: {self.numbers()}"

    def __repr__(self) -> str:
        added = f", adds {self.added:.3g}" if self.added else ""
        return f"<ComparedOp {self.describe()}{added}>"

    def numbers(self) -> str:
        if not self.same_shape:
            return f"shapes differ, {_shape(self.shape_a)} vs {_shape(self.shape_b)}"
        if self.exact:
            return "equal" if self.within else f"not equal ({self.note or f'max abs {_num(self.max_abs)}'})"
        parts = [f"max abs {_num(self.max_abs)}", f"max rel {_num(self.max_rel)}"]
        if self.cosine is not None:
            parts.append(f"cosine {self.cosine:.6f}")
        return ", ".join(parts)

    def to_row(self) -> Dict[str, Any]:
        return {
            "label_a": self.label_a,
            "label_b": self.label_b,
            "layer_type": self.layer_type,
            "module": self.module,
            "shape_a": self.shape_a,
            "shape_b": self.shape_b,
            "within": self.within,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "mean_rel": self.mean_rel,
            "rel_error": self.rel_error,
            "cosine": self.cosine,
            "added": self.added,
            "is_origin": self.is_origin,
            "exact": self.exact,
            "matched_by": self.matched_by,
            "note": self.note,
        }


def _num(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _shape(shape: Optional[Tuple[int, ...]]) -> str:
    return "-" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


@dataclass
class Comparison:
    """Where two passes part. ``print(cmp)`` names the origin(s) of divergence, then a table.

    ``first_divergence`` is the first op (in ``a``'s execution order) beyond tolerance while
    every matched parent is within it (None when every matched op is within tolerance);
    ``origins`` all such ops; ``rows`` one ``ComparedOp`` per matched op; ``unmatched_a`` /
    ``unmatched_b`` the labels only one side has.
    """

    rows: List[ComparedOp]
    unmatched_a: List[str]
    unmatched_b: List[str]
    rtol: float
    atol: float
    name_a: str = "a"
    name_b: str = "b"
    matched_by_label: bool = False
    notes: List[str] = field(default_factory=list)
    history_a: Any = None
    history_b: Any = None
    dtypes_differ: Optional[str] = None  # ``compare``: the passes compute in different dtypes (said first)

    def __post_init__(self) -> None:
        self._by_label = {r.label_a: r for r in self.rows}
        self._by_label_b = {r.label_b: r for r in self.rows}

    @property
    def origins(self) -> List[ComparedOp]:
        return [r for r in self.rows if r.is_origin]

    @property
    def first_divergence(self) -> Optional[ComparedOp]:
        origins = self.origins
        return origins[0] if origins else None

    @property
    def diverged(self) -> List[ComparedOp]:
        """Every matched op beyond tolerance (origins and what they reached)."""
        return [r for r in self.rows if not r.within]

    @property
    def equal(self) -> bool:
        """Every matched op within tolerance."""
        return all(r.within for r in self.rows)

    def row(self, label: str, side: str = "a") -> ComparedOp:
        """The row of the op with this label in ``a`` (or in ``b`` with ``side='b'``)."""
        found = (self._by_label if side == "a" else self._by_label_b).get(label)
        if found is None:
            raise KeyError(f"{label!r} is not a matched op of {side} (unmatched or not a label of that pass).")
        return found

    def values(self, name: str = "rel_error", side: str = "a") -> Dict[str, Optional[float]]:
        """``{label: value}`` of one column (``'max_abs'``, ``'max_rel'``, ``'mean_rel'``,
        ``'rel_error'``, ``'cosine'``, ``'added'``) by the labels of side ``'a'`` or ``'b'``: what an overlay
        on the graph page of that side colours its nodes by."""
        return {(r.label_a if side == "a" else r.label_b): getattr(r, name) for r in self.rows}

    def overlay(self, side: str = "b") -> Dict[str, Any]:
        """The graph page's overlay for the pass of ``side``: each matched op's relative error
        (``||a - b|| / ||b||``; for ``compare_precision``, the error it adds), on a log scale
        from the tolerance up; ops compared exactly are 0 when equal, 1 when not.

        Example:
            >>> import torch, torchlens as tl
            >>> m = torch.nn.Linear(2, 2)
            >>> cmp = tl.compare((m, torch.ones(1, 2)), (m, torch.ones(1, 2)))
            >>> cmp.overlay()["name"], cmp.overlay()["values"]["linear_1_1"]
            ('relative error', 0.0)
        """
        if side not in ("a", "b"):
            raise CompareError(f"side must be 'a' or 'b', not {side!r}.")
        added = getattr(self, "dtype", None) is not None  # compare_precision's result
        values: Dict[str, Optional[float]] = {}
        for r in self.rows:
            value = r.added if added else r.rel_error
            if value is None and r.exact:
                value = 0.0 if r.within else 1.0
            values[r.label_a if side == "a" else r.label_b] = value
        positive = [v for v in values.values() if v is not None and v > 0 and v == v and v != float("inf")]
        if added:
            high = max(positive, default=1.0)
            domain = (high * 1e-3, high)
        else:
            domain = (self.rtol, max(positive + [self.rtol * 10]))
        first = self.first_divergence
        if first is None:
            caption = "every matched op is within tolerance"
        else:
            where = f" in module {first.module}" if first.module else ""
            caption = f"first divergence: {first.label_a if side == 'a' else first.label_b}{where}"
        return {
            "values": values,
            "name": "error added" if added else "relative error",
            "scale": "sequential",
            "log": True,
            "domain": domain,
            "caption": caption,
        }

    def to_html(self, path: Optional[str] = None, side: str = "b") -> str:
        """The graph page of pass ``side`` (``'a'`` or ``'b'``) with each matched op coloured
        by its relative error (``compare_precision``: the error it adds) and a legend, opened
        on ``first_divergence``. Returns the HTML; writes it to ``path`` when given.

        Example:
            >>> import torch, torchlens as tl
            >>> m = torch.nn.Linear(2, 2)
            >>> cmp = tl.compare((m, torch.ones(1, 2)), (m, torch.ones(1, 2) * 2))
            >>> "relative error" in cmp.to_html(side="a")
            True
        """
        history = self.history_a if side == "a" else self.history_b
        if history is None:
            raise CompareError(f"this comparison holds no history of {side!r} to draw.")
        return history.to_html(path, overlay=self.overlay(side), focus=self._focus(side))

    def _focus(self, side: str) -> Optional[str]:
        """The label the page of ``side`` opens on: the first divergence."""
        first = self.first_divergence
        return None if first is None else (first.label_a if side == "a" else first.label_b)

    def _repr_html_(self) -> str:
        """In a notebook: the origin(s) of divergence, then the graph page of ``b`` opened there."""
        story = "\n".join([self.header()] + self.story())
        if self.history_b is None:
            return answer_html(story, None)
        return answer_html(story, self.history_b, self.overlay("b"), self._focus("b"))

    def to_pandas(self):
        """One row per matched op (columns as in ``ComparedOp.to_row``)."""
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from error
        return pd.DataFrame([r.to_row() for r in self.rows])

    # ----- printing ---------------------------------------------------------------------------
    def header(self) -> str:
        how = "by label (same structure)" if self.matched_by_label else "by module, layer type and edges"
        return (
            f"Comparison of {self.name_a} (a) and {self.name_b} (b): {len(self.rows)} ops matched {how}, "
            f"{len(self.unmatched_a)} only in a, {len(self.unmatched_b)} only in b; "
            f"rtol={self.rtol:g}, atol={self.atol:g}."
        )

    def story(self) -> List[str]:
        origins = self.origins
        said = [self.dtypes_differ] if self.dtypes_differ else []
        if not origins:
            return said + ["Every matched op is within tolerance."]
        first = origins[0]
        lines = said + [f"First divergence: {first.describe()}"]
        if first.source is not None:
            lines.append(f"  at {_where(first.source)}")
        if first.parents:
            lines.append(f"  its matched parents are within tolerance: {', '.join(first.parents[:6])}")
        if first.note and first.same_shape and not first.exact:
            lines.append(f"  {first.note}")
        reached = len(self.diverged) - len(origins)
        if reached:
            lines.append(f"  {reached} ops downstream of the origin(s) are beyond tolerance too.")
        if len(origins) > 1:
            shown = ", ".join(r.label_a for r in origins[1:8]) + (", ..." if len(origins) > 8 else "")
            lines.append(f"Other origins ({len(origins) - 1}): {shown}")
        return lines

    def table(self, limit: int = 30) -> List[str]:
        """The per-op table: every row if few, else the origins and the rows beyond tolerance first."""
        rows = self.rows if len(self.rows) <= limit else (self.origins + [r for r in self.diverged if not r.is_origin])
        rows = rows[:limit] if rows else self.rows[:limit]
        header = ("", "op (a)", "op (b)", "shape", "max abs", "max rel", "cosine")
        cells = [header] + [_cells(r) for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
        left = len(self.rows) - len(rows)
        if left:
            lines.append(f"... {left} more rows (within tolerance or not shown): cmp.to_pandas() has every one.")
        return lines

    def __str__(self) -> str:
        lines = [self.header()] + self.story() + [""] + self.table()
        if self.unmatched_a or self.unmatched_b:
            lines.append("")
            lines += [_unmatched(side, labels) for side, labels in (("a", self.unmatched_a), ("b", self.unmatched_b))]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.__str__()


def _cells(r: ComparedOp) -> Tuple[str, ...]:
    mark = "!" if r.is_origin else ("x" if not r.within else "")
    shape = _shape(r.shape_a) if r.same_shape else f"{_shape(r.shape_a)} vs {_shape(r.shape_b)}"
    if r.exact:
        numbers = ("equal" if r.within else "differs", "", "")
    else:
        numbers = (_num(r.max_abs), _num(r.max_rel), "-" if r.cosine is None else f"{r.cosine:.6f}")
    return (mark, r.label_a, r.label_b if r.label_b != r.label_a else "=", shape) + numbers


def _unmatched(side: str, labels: List[str]) -> str:
    shown = ", ".join(labels[:10]) + (f", ... ({len(labels)} in all)" if len(labels) > 10 else "")
    return f"Only in {side}: {shown or 'none'}"


def _where(source: FuncCallLocation) -> str:
    line = (source.code_line or "").split("  #")[0].strip()  # without a trailing comment
    place = f"{os.path.basename(source.file)}:{source.line_number}"
    return f"`{line}` ({place})" if line else place


__all__ = ["Comparison", "ComparedOp", "CompareError", "NothingInCommonError"]
