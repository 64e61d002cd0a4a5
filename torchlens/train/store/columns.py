"""Merging rows of the run's ``columns`` table, many pairs at once, in a fixed number of numpy
operations whatever their number.

A long run keeps each series to a bounded number of columns (``database.py``): a column then
holds several logged steps, so a new step is merged into the column of the steps before it,
and when the stride doubles every pair of neighbouring columns is merged into one. A logged
ResNet-18 step has some 430 series, and a compaction some 220,000 rows: merged one pair at a
time in Python they cost about 35 ms a step and a 14 s pause; here, one array per field.

A row is ``(series_id, slot, step, last_step, num_steps, lo, hi, nonfinite, counts,
*EXACT_COLUMNS)`` (None where a value is not finite; ``counts`` the histogram's float32 bytes).
The merged row keeps the first row's place (series and slot), spans both rows' steps and
holds:

* the histogram over the union of the two ranges, each old bin's count spread evenly over its
  width (the counts of a histogram whose range is one point go to the bin holding that point);
  a histogram with no range (no finite values) adds nothing but its place;
* counts that add up (values, NaN, infinities, zeros), the min and max of both, mean and
  standard deviation pooled over the finite values, and the line (the chart's value: a std, a
  norm, an update ratio) as the mean of the two rows' lines weighted by their steps.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ...web.stats import bin_edges

# the statistics over all values stored with each column (x_ in the table)
EXACT_COLUMNS = ("count", "true_min", "true_max", "mean", "std", "nan", "posinf", "neginf", "zeros", "line")
_HEAD = 9  # fields before the exact ones: ids, steps, range, non-finite count, histogram
_ADDED = [EXACT_COLUMNS.index(k) for k in ("count", "nan", "posinf", "neginf", "zeros")]


def combine_columns(first: Sequence[tuple], second: Sequence[tuple], bins: int) -> List[tuple]:
    """Row ``i`` of ``first`` merged with row ``i`` of ``second`` (rows of the columns table,
    histograms of ``bins`` bins), for every ``i``.

    Example:
        >>> counts = np.array([1, 0, 0, 1], np.float32).tobytes()
        >>> exact = (2.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5)
        >>> a = (7, 0, 10, 10, 1, 0.0, 1.0, 0, counts, *exact)
        >>> b = (7, 1, 11, 11, 1, 0.0, 1.0, 0, counts, *exact)
        >>> row = combine_columns([a], [b], bins=4)[0]
        >>> row[:8], np.frombuffer(row[8], np.float32).tolist(), row[9:12]
        ((7, 0, 10, 11, 2, 0.0, 1.0, 0), [2.0, 0.0, 0.0, 2.0], (4.0, 0.0, 1.0))
    """
    if not first:
        return []
    return _rows(_merged(_fields(first), _fields(second), bins))


def compact_columns(rows: Sequence[tuple], bins: int) -> List[tuple]:
    """Rows (in any order) at a doubled stride: slots ``2k`` and ``2k + 1`` of a series merged
    into slot ``k`` (a slot alone keeps its row, moved there), ordered by (series, slot).

    Example:
        >>> counts = np.array([1, 0], np.float32).tobytes()
        >>> row = lambda sid, slot: (sid, slot, slot, slot, 1, 0.0, 1.0, 0, counts, *[1.0] * 10)
        >>> [r[:5] for r in compact_columns([row(1, 0), row(1, 1), row(1, 2), row(2, 1)], bins=2)]
        [(1, 0, 0, 1, 2), (1, 1, 2, 2, 1), (2, 0, 1, 1, 1)]
    """
    if not rows:
        return []
    fields = _fields(rows)
    fields = _take(fields, np.lexsort((fields["slot"], fields["series"])))
    fields["slot"] //= 2
    key = fields["series"] * (int(fields["slot"].max()) + 1) + fields["slot"]
    first = np.flatnonzero(key[1:] == key[:-1])  # a slot holds at most two rows: pairs never overlap
    paired = np.zeros(len(rows), bool)
    paired[first] = paired[first + 1] = True
    merged = _merged(_take(fields, first), _take(fields, first + 1), bins)
    alone = _take(fields, np.flatnonzero(~paired))
    both = {name: np.concatenate([merged[name], alone[name]]) for name in merged}
    order = np.lexsort((both["slot"], both["series"]))
    return _rows(_take(both, order))


def _fields(rows: Sequence[tuple]) -> Dict[str, np.ndarray]:
    """The rows' fields as arrays (None: NaN); ``counts`` as one (rows, bins) float64 array."""
    columns = list(zip(*rows))
    found: Dict[str, np.ndarray] = {
        name: np.array(columns[i], dtype=np.int64) for i, name in enumerate(("series", "slot"))
    }
    found.update(
        (name, np.array(columns[i], dtype=np.float64))
        for i, name in enumerate(("step", "last_step", "num_steps", "lo", "hi", "nonfinite"), start=2)
    )
    found["counts"] = np.frombuffer(b"".join(columns[8]), np.float32).reshape(len(rows), -1).astype(np.float64)
    found["exact"] = np.array(columns[_HEAD:], dtype=np.float64).T.reshape(len(rows), len(EXACT_COLUMNS))
    return found


def _take(fields: Dict[str, np.ndarray], index: np.ndarray) -> Dict[str, np.ndarray]:
    return {name: values[index] for name, values in fields.items()}


def _merged(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray], bins: int) -> Dict[str, np.ndarray]:
    """The fields of each pair ``a[i]``, ``b[i]`` merged (``a``'s place kept)."""
    lo, hi, counts = _merged_histograms(a, b, bins)
    return {
        "series": a["series"],
        "slot": a["slot"],
        "step": np.minimum(a["step"], b["step"]),
        "last_step": np.maximum(a["last_step"], b["last_step"]),
        "num_steps": a["num_steps"] + b["num_steps"],
        "lo": lo,
        "hi": hi,
        "nonfinite": a["nonfinite"] + b["nonfinite"],
        "counts": counts,
        "exact": _merged_exact(a, b),
    }


def _rows(fields: Dict[str, np.ndarray]) -> List[tuple]:
    """Rows of the columns table from their fields."""
    ints = [fields[name].astype(np.int64).tolist() for name in ("series", "slot", "step", "last_step", "num_steps")]
    head = zip(*ints, nullable(fields["lo"]), nullable(fields["hi"]), fields["nonfinite"].astype(np.int64).tolist())
    blobs = np.ascontiguousarray(fields["counts"], np.float32)
    return [(*h, blob.tobytes(), *x) for h, blob, x in zip(head, blobs, nullable(fields["exact"]))]


def _merged_histograms(
    a: Dict[str, np.ndarray], b: Dict[str, np.ndarray], bins: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, counts) of each merged pair: the union of the ranges, each histogram spread
    over it (see the module); where neither has a range, NaN and the counts added."""
    has_a, has_b = np.isfinite(a["lo"]), np.isfinite(b["lo"])
    with np.errstate(invalid="ignore"):
        lo = np.fmin(np.where(has_a, a["lo"], np.nan), np.where(has_b, b["lo"], np.nan))
        hi = np.fmax(np.where(has_a, a["hi"], np.nan), np.where(has_b, b["hi"], np.nan))
    total = np.where((~has_a & ~has_b)[:, None], a["counts"] + b["counts"], 0.0)
    span = hi - lo
    edges = bin_edges(lo, hi, bins)  # the page's edges of the merged range
    for part, has in ((a, has_a), (b, has_b)):
        total += _spread(part, has, lo=lo, span=span, edges=edges)
    return lo, hi, total


def _spread(
    part: Dict[str, np.ndarray], has: np.ndarray, *, lo: np.ndarray, span: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Each row's histogram of ``part`` in the new bins (``edges``): its cumulative count,
    linear within each old bin, read at the new edges; a histogram of one point (or a new
    range of one point) in the bin holding the point; zero where ``has`` is False."""
    bins = edges.shape[1] - 1
    p_lo, p_hi, counts = part["lo"], part["hi"], part["counts"]
    cumulative = np.zeros((len(p_lo), bins + 1))
    np.cumsum(counts, axis=1, out=cumulative[:, 1:])
    with np.errstate(invalid="ignore", divide="ignore"):
        at = (edges - p_lo[:, None]) * (bins / (p_hi - p_lo))[:, None]  # in old bins
        point = (p_hi <= p_lo) | (span <= 0) | ~has
        index = np.where(span > 0, np.minimum(np.nan_to_num((p_lo - lo) / span * bins), bins - 1), 0).astype(np.int64)
    at[point] = 0.0
    np.clip(at, 0, bins, out=at)
    j = np.minimum(at.astype(np.int64), bins - 1)  # at >= 0: truncation is the floor
    below = np.take_along_axis(cumulative, j, axis=1)
    at -= j
    at *= np.take_along_axis(cumulative, j + 1, axis=1) - below
    below += at
    spread = np.diff(below, axis=1)
    rows = np.flatnonzero(point & has)
    spread[point] = 0.0
    spread[rows, index[rows]] = counts[rows].sum(axis=1)
    return spread


def _merged_exact(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> np.ndarray:
    """``EXACT_COLUMNS`` of each merged pair (see the module); a row whose statistics were not
    recorded (count not finite) takes the other's."""
    x, y = a["exact"], b["exact"]
    col = EXACT_COLUMNS.index
    out = x.copy()
    out[:, _ADDED] = x[:, _ADDED] + y[:, _ADDED]
    n_x = x[:, col("count")] - x[:, col("nan")] - x[:, col("posinf")] - x[:, col("neginf")]
    n_y = y[:, col("count")] - y[:, col("nan")] - y[:, col("posinf")] - y[:, col("neginf")]
    n = n_x + n_y
    some = n > 0
    out[:, col("true_min")] = np.where(some, np.fmin(x[:, col("true_min")], y[:, col("true_min")]), np.nan)
    out[:, col("true_max")] = np.where(some, np.fmax(x[:, col("true_max")], y[:, col("true_max")]), np.nan)
    mean_x, mean_y = np.nan_to_num(x[:, col("mean")]), np.nan_to_num(y[:, col("mean")])
    std_x, std_y = np.nan_to_num(x[:, col("std")]), np.nan_to_num(y[:, col("std")])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (mean_x * n_x + mean_y * n_y) / n
        spread = n_x * (std_x**2 + (mean_x - mean) ** 2) + n_y * (std_y**2 + (mean_y - mean) ** 2)
        std = np.sqrt(spread / n)
    out[:, col("mean")] = np.where(some, mean, np.nan)
    out[:, col("std")] = np.where(some, std, np.nan)
    line_x, line_y = x[:, col("line")], y[:, col("line")]
    w_x = np.where(np.isfinite(line_x), a["num_steps"], 0.0)
    w_y = np.where(np.isfinite(line_y), b["num_steps"], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        line = (np.nan_to_num(line_x) * w_x + np.nan_to_num(line_y) * w_y) / (w_x + w_y)
    out[:, col("line")] = np.where(w_x + w_y > 0, line, np.nan)
    recorded_x, recorded_y = np.isfinite(x[:, col("count")]), np.isfinite(y[:, col("count")])
    out[~recorded_x] = y[~recorded_x]
    out[recorded_x & ~recorded_y] = x[recorded_x & ~recorded_y]
    return out


def nullable(table: np.ndarray) -> list:
    """``table``'s values (or rows) as Python floats, None where a value is not finite (as
    the table stores them).

    Example:
        >>> nullable(np.array([[1.0, np.nan], [np.inf, 2.0]]))
        [[1.0, None], [None, 2.0]]
    """
    out = table.astype(object)
    out[~np.isfinite(table)] = None
    return out.tolist()


__all__ = ["EXACT_COLUMNS", "combine_columns", "compact_columns", "nullable"]
