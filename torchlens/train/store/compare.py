"""Two runs side by side: ``run_a.compare(run_b)`` finds, per series, the first logged step where
the two runs' distributions differ by more than a tolerance.

The distance of two columns is the Kolmogorov-Smirnov statistic of their histograms: the
largest gap between the two cumulative distributions (values spread evenly inside each bin),
from 0 (the same) to 1 (no overlap). A column with NaN/inf values in one run and none in the
other differs (distance 1). A column differs when its distance exceeds ``tolerance`` plus the
distance that sampling alone gives at the 1% level (``1.63 * sqrt((n + m) / (n m))`` for
histograms of n and m sampled values: about 0.23 for two samples of 100, nothing for all values
of large tensors), so two runs that train identically do not differ by their samples. Columns are matched by their steps (the same first and last step),
so runs logged at different frequencies or compacted differently are compared where they
meet. Series are matched by (call id, kind, name).

The histograms are drawn from samples; the exact statistics (over all values) decide first: a
column differs when the two runs' value counts (``count``, ``nan``, ``posinf``, ``neginf``)
differ, or when ``true_min``, ``true_max``, ``mean`` or ``std`` differ by more than float
rounding (``EXACT_RTOL``, 1e-5, of the larger magnitude of the two columns' values). A 1000x
learning rate moves a weight by far more than that at the first step after the change, while
its histogram (one bias value, a sample of 100) may stay within the sampling noise; two runs
that train identically have the same statistics to the last bit. ``SeriesComparison.detail``
says which statistic differed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

TOLERANCE = 0.1  # a KS distance above this: the distributions differ
EXACT_RTOL = 1e-5  # exact statistics further apart than this (of the values' magnitude) differ
_COUNTS = ("count", "nan", "posinf", "neginf")
_VALUES = ("true_min", "true_max", "mean", "std")


@dataclass
class SeriesComparison:
    """One series of two runs: ``first_step`` is the first step whose distance exceeds the
    tolerance or whose exact statistics differ (None: never, or the series is in one run only:
    ``only_in`` is then 'a' or 'b'); ``distance`` is the histograms' distance there (else the
    largest seen); ``steps_compared`` counts the columns both runs have; ``detail`` says what
    differed first (e.g. ``'mean 0.0123 vs 0.0456'``)."""

    call_id: str
    kind: str
    name: str
    first_step: Optional[int]
    distance: float
    steps_compared: int
    only_in: Optional[str] = None
    detail: Optional[str] = None


def _cdf(lo: float, hi: float, counts: np.ndarray, grid: np.ndarray) -> np.ndarray:
    total = float(counts.sum())
    if total <= 0 or not np.isfinite(lo):
        return np.zeros_like(grid)
    if hi <= lo:  # every value at one point
        return (grid >= lo).astype(np.float64)
    edges = np.linspace(lo, hi, len(counts) + 1)
    cumulative = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)]) / total
    return np.interp(grid, edges, cumulative, left=0.0, right=1.0)


def column_distance(a: tuple, b: tuple) -> float:
    """KS distance of two histograms given as ``(lo, hi, counts, nonfinite)``.

    Example:
        >>> same = (0.0, 1.0, np.array([1.0, 1.0]), 0)
        >>> column_distance(same, same), column_distance(same, (2.0, 3.0, np.array([1.0, 1.0]), 0))
        (0.0, 1.0)
    """
    if (a[3] > 0) != (b[3] > 0):
        return 1.0
    lows = [v for v in (a[0], b[0]) if np.isfinite(v)]
    if not lows:
        return 0.0
    highs = [v for v in (a[1], b[1]) if np.isfinite(v)]
    edges = [np.linspace(x[0], x[1], len(x[2]) + 1) for x in (a, b) if np.isfinite(x[0])]
    grid = np.unique(np.concatenate(edges + [np.array([min(lows), max(highs)])]))
    return float(np.max(np.abs(_cdf(a[0], a[1], a[2], grid) - _cdf(b[0], b[1], b[2], grid))))


def exact_difference(sa: Any, i: int, sb: Any, j: int) -> Optional[str]:
    """What differs between column ``i`` of series ``sa`` and column ``j`` of ``sb`` in their
    exact statistics (None: nothing beyond float rounding, or not recorded).

    Example:
        >>> from types import SimpleNamespace as S
        >>> col = lambda mean: S(count=[4.0], nan=[0.0], posinf=[0.0], neginf=[0.0], true_min=[-1.0],
        ...                      true_max=[1.0], mean=[mean], std=[0.5])
        >>> exact_difference(col(0.1), 0, col(0.1 + 1e-9), 0), exact_difference(col(0.1), 0, col(0.2), 0)
        (None, 'mean 0.1 vs 0.2')
    """

    def at(s: Any, name: str, k: int) -> float:
        values = getattr(s, name)
        return float(values[k]) if k < len(values) else float("nan")

    for name in _COUNTS:
        a, b = at(sa, name, i), at(sb, name, j)
        if np.isfinite(a) and np.isfinite(b) and a != b:
            return f"{name} {a:.0f} vs {b:.0f}"
    pairs = [(name, at(sa, name, i), at(sb, name, j)) for name in _VALUES]
    pairs = [(name, a, b) for name, a, b in pairs if np.isfinite(a) and np.isfinite(b)]
    scale = max([abs(v) for _, a, b in pairs for v in (a, b)] + [0.0])  # the values' magnitude
    for name, a, b in pairs:
        if abs(a - b) > EXACT_RTOL * scale:
            return f"{name} {a:.3g} vs {b:.3g}"
    return None


def compare_runs(run_a: Any, run_b: Any, tolerance: float = TOLERANCE) -> List[SeriesComparison]:
    """Per series of either run (``Run`` objects: the reader imports this module, not the
    other way round), where the two runs first differ (see the module's text)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"compare: tolerance is a KS distance in [0, 1), not {tolerance!r}.")
    names_a, names_b = run_a.series_names(), run_b.series_names()
    in_b = set(names_b)
    out: List[SeriesComparison] = []
    for key in names_a:
        if key not in in_b:
            out.append(
                SeriesComparison(
                    key[0], key[1], key[2], first_step=None, distance=float("nan"), steps_compared=0, only_in="a"
                )
            )
            continue
        sa, sb = run_a.series(*key), run_b.series(*key)
        where_b = {(int(s), int(e)): i for i, (s, e) in enumerate(zip(sb.steps, sb.last_steps))}
        first, worst, compared = None, 0.0, 0
        for i, span in enumerate(zip(sa.steps.tolist(), sa.last_steps.tolist())):
            j = where_b.get(span)
            if j is None:
                continue
            compared += 1
            d = column_distance(
                (sa.min[i], sa.max[i], sa.counts[i], sa.nonfinite[i]),
                (sb.min[j], sb.max[j], sb.counts[j], sb.nonfinite[j]),
            )
            n, m = float(sa.counts[i].sum()), float(sb.counts[j].sum())
            noise = 1.63 * np.sqrt((n + m) / (n * m)) if n > 0 and m > 0 else 0.0
            detail = exact_difference(sa, i, sb, j)
            if detail is None and d > tolerance + noise:
                detail = f"histogram distance {d:.3g} > {tolerance:g} + {noise:.3g} (sampling noise)"
            if detail is not None:
                first, worst = span[0], d
                break
            worst = max(worst, d)
        out.append(
            SeriesComparison(
                key[0], key[1], key[2], first_step=first, distance=worst, steps_compared=compared, detail=detail
            )
        )
    seen = set(names_a)
    for key in names_b:
        if key not in seen:
            out.append(
                SeriesComparison(
                    key[0], key[1], key[2], first_step=None, distance=float("nan"), steps_compared=0, only_in="b"
                )
            )
    return out


__all__ = ["compare_runs", "column_distance", "exact_difference", "SeriesComparison", "TOLERANCE", "EXACT_RTOL"]
