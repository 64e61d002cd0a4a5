"""How far apart two saved values of one op are: ``Difference`` of a pair of tensors.

Floating values are compared in float64 (whatever their dtypes), with ``torch.allclose``'s rule:
within tolerance when every element has ``|a - b| <= atol + rtol * |b|``; NaN against NaN and
equal infinities count as equal, NaN or Inf against a number as beyond. Integer and boolean
values are compared exactly; complex values by the magnitude of the difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch


@dataclass
class Difference:
    """The numbers one row of a comparison holds (None where they do not apply)."""

    same_shape: bool
    within: bool
    exact: bool = False  # compared exactly (integer or boolean values)
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None  # max |a-b| / |b| over elements with |b| > atol
    mean_rel: Optional[float] = None  # mean of |a-b| / |b| (each at most 1) over elements with |b| > atol
    rel_error: Optional[float] = None  # ||a - b|| / ||b|| (2-norms)
    cosine: Optional[float] = None
    note: Optional[str] = None


def difference(a: Any, b: Any, rtol: float, atol: float, saturation: Optional[float] = None) -> Difference:
    """Compare the value ``a`` against ``b`` (``b`` is the reference of relative errors).
    With ``saturation``, elements beyond it in magnitude on both sides, with the same sign,
    count as equal (a lower dtype's ``finfo.min`` against float64's, in a mask).

    Example:
        >>> d = difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), rtol=1e-3, atol=1e-5)
        >>> d.within, d.max_abs, round(d.max_rel, 6)
        (False, 0.5, 0.2)
        >>> difference(torch.tensor([1, 2]), torch.tensor([1, 2]), rtol=0.0, atol=0.0).exact
        True
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        same = _same_value(a, b)
        return Difference(same_shape=True, within=same, exact=True, note=None if same else "values are not tensors")
    if a.shape != b.shape:
        return Difference(same_shape=False, within=False, note=f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    a, b = a.detach(), b.detach()
    if a.device != b.device:
        b = b.to(a.device)
    if a.is_complex() or b.is_complex():
        return _complex(a.to(torch.complex128), b.to(torch.complex128), rtol, atol)
    if not a.is_floating_point() and not b.is_floating_point():
        return _exact(a, b)
    # float64 when either side is (a reference), else float32: half the memory traffic
    work = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    x, y = a.to(work), b.to(work)
    if saturation is not None:
        y = torch.where((x.abs() >= saturation) & (y.abs() >= saturation) & ((x > 0) == (y > 0)), x, y)
    if x.numel() == 0 or torch.equal(x, y):
        return Difference(
            same_shape=True, within=True, max_abs=0.0, max_rel=0.0, mean_rel=0.0, rel_error=0.0, cosine=1.0
        )
    diff = (x - y).abs_()
    max_abs = float(diff.max())
    if not math.isfinite(max_abs):  # NaN against NaN and equal infinities agree; NaN against a number: inf
        agree = (x == y) | (torch.isnan(x) & torch.isnan(y))
        x, y = torch.where(agree, 0.0, x), torch.where(agree, 0.0, y)  # the rest is measured on what differs
        diff = torch.where(agree, 0.0, diff.nan_to_num(nan=math.inf))
        max_abs = float(diff.max())
    return _numbers(diff, (x, y), max_abs, tolerance=(rtol, atol))


def _numbers(
    diff: torch.Tensor, values: Tuple[torch.Tensor, torch.Tensor], max_abs: float, *, tolerance: Tuple[float, float]
) -> Difference:
    """The statistics of ``diff`` = |a - b| (``max_abs`` its largest) against the reference ``b``."""
    (x, y), (rtol, atol) = values, tolerance
    ref = y.abs()
    # allclose's rule, |a - b| <= atol + rtol |b|, as one subtraction and one max (NaN: beyond)
    within = float(torch.sub(diff, ref, alpha=rtol).max()) <= atol
    big = ref > atol
    counted = int(big.sum())
    rel = diff / torch.where(big, ref, math.inf)
    if not math.isfinite(max_abs):
        rel = torch.where(big, rel, 0.0)  # inf / inf where the reference is small
    max_rel = float(rel.max()) if counted else 0.0
    mean_rel = float(rel.clamp_(max=1.0).sum()) / counted if counted else 0.0
    ref_norm, diff_norm = float(torch.linalg.vector_norm(y)), float(torch.linalg.vector_norm(diff))
    return Difference(
        same_shape=True,
        within=within,
        max_abs=max_abs,
        max_rel=max_rel,
        mean_rel=mean_rel,
        rel_error=_ratio(diff_norm, ref_norm),
        cosine=_cosine(x, y, ref_norm),
    )


def _ratio(num: float, den: float) -> float:
    if den > 0 and math.isfinite(den):
        return num / den
    return 0.0 if num == 0 else math.inf


def _cosine(x: torch.Tensor, y: torch.Tensor, y_norm: float) -> Optional[float]:
    """Cosine similarity of the flattened values (complex: the real part of <x, y>); 1 for two
    zero tensors, None when either holds NaN or Inf."""
    x_norm = float(torch.linalg.vector_norm(x))
    if not (math.isfinite(x_norm) and math.isfinite(y_norm)):
        return None
    if x_norm == 0 or y_norm == 0:
        return 1.0 if x_norm == y_norm else 0.0
    dot = torch.vdot(y.reshape(-1), x.reshape(-1))
    cosine = float(dot.real if dot.is_complex() else dot) / (x_norm * y_norm)
    return max(-1.0, min(1.0, cosine))  # rounding in the norms can take it past 1 (1.000001)


def _complex(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float) -> Difference:
    diff = (x - y).abs()
    max_abs = float(diff.max())
    if not math.isfinite(max_abs):
        diff = torch.where(x == y, torch.zeros_like(diff), diff.nan_to_num(nan=math.inf))
        max_abs = float(diff.max())
    return _numbers(diff, (x, y), max_abs, tolerance=(rtol, atol))


def _exact(a: torch.Tensor, b: torch.Tensor) -> Difference:
    if a.dtype != b.dtype:
        a, b = a.to(torch.int64), b.to(torch.int64)
    if torch.equal(a, b):
        return Difference(
            same_shape=True, within=True, exact=True, max_abs=0.0, max_rel=0.0, mean_rel=0.0, rel_error=0.0
        )
    if a.dtype == torch.bool:
        a, b = a.to(torch.int64), b.to(torch.int64)
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs()
    count = int((a != b).sum())
    return Difference(
        same_shape=True,
        within=False,
        exact=True,
        max_abs=float(diff.max()),
        mean_rel=count / a.numel(),
        rel_error=_ratio(float(torch.linalg.vector_norm(diff)), float(torch.linalg.vector_norm(b.to(torch.float64)))),
        note=f"{count} of {a.numel()} elements differ",
    )


def _same_value(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a comparison that does not give one bool (arrays, odd objects)
        return False


__all__ = ["Difference", "difference"]
