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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

TOLERANCE = 0.1  # a KS distance above this: the distributions differ


@dataclass
class SeriesComparison:
    """One series of two runs: ``first_step`` is the first step whose distance exceeds the
    tolerance (None: never, or the series is in one run only: ``only_in`` is then 'a' or 'b');
    ``distance`` is the distance there (else the largest seen); ``steps_compared`` counts the
    columns both runs have."""

    call_id: str
    kind: str
    name: str
    first_step: Optional[int]
    distance: float
    steps_compared: int
    only_in: Optional[str] = None


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
            if d > tolerance + noise:
                first, worst = span[0], d
                break
            worst = max(worst, d)
        out.append(SeriesComparison(key[0], key[1], key[2], first_step=first, distance=worst, steps_compared=compared))
    seen = set(names_a)
    for key in names_b:
        if key not in seen:
            out.append(
                SeriesComparison(
                    key[0], key[1], key[2], first_step=None, distance=float("nan"), steps_compared=0, only_in="b"
                )
            )
    return out


__all__ = ["compare_runs", "column_distance", "SeriesComparison", "TOLERANCE"]
