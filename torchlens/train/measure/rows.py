"""Exact statistics of many tensors from a few reductions over rows of equal length.

The values of a phase's tensors are laid out as rows of ``BLOCK`` values (``layout.py``): a
large tensor's own memory viewed as rows, the smaller ones packed end to end into a buffer,
each padded with NaN to a whole row. ``row_stats`` reduces every row of a 2-D block at once
(the same handful of kernels whatever its number of rows); ``merge_rows`` combines the rows
of each tensor into its ``EXACT_FIELDS`` (Chan's parallel formula for the spread, so each
row's own mean is the pivot of its deviations).

Precision: values are summed in float64 (reductions with a float64 accumulator, no float64
copy of the data); deviations from a row's mean are taken in the data's own precision (float32
for float32 and half data, whose values are widened first) and their squares summed in
float64, so ``m2`` of float32 data is within a few float32 ulps of the float64 two-pass value
(float64 data stays float64 throughout). On a GPU the rows are read by the Triton kernels of
``kernels.py`` (all sources of a dtype in one launch, deviations in float64); where those are
off, ``row_stats`` runs as one kernel compiled by ``torch.compile`` per source (two passes over
the values), and else as the eager torch code; all give the same fields.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

import torch

# the columns of ``row_stats``: the additive ones first (merged by one index_add)
ROW_COLUMNS = ("finite", "sum", "nan", "posinf", "zeros", "m2", "min", "max")
_ADDITIVE = 5


def row_stats_eager(x: torch.Tensor) -> torch.Tensor:
    """(rows, 8) float64: ``ROW_COLUMNS`` of each row of the 2-D float ``x``; ``m2`` about the
    row's own mean, ``min``/``max`` over its finite values (meaningless where none is finite).

    Example:
        >>> row = row_stats_eager(torch.tensor([[1.0, 3.0, float("nan"), 0.0]]))[0].tolist()
        >>> dict(zip(ROW_COLUMNS, row))
        {'finite': 3.0, 'sum': 4.0, 'nan': 1.0, 'posinf': 0.0, 'zeros': 1.0, 'm2': 4.666666666666667, 'min': 0.0, 'max': 3.0}
    """
    wide = torch.float64
    finite = torch.isfinite(x)
    count = finite.sum(1, dtype=wide)
    total = torch.where(finite, x, 0).sum(1, dtype=wide)
    mean = total / count.clamp_min(1)
    pivot = mean.to(x.dtype)[:, None]  # the mean in the data's precision: deviations stay there
    # non-finite values replaced by the row's mean: it lies between the finite minimum and
    # maximum (rounding is monotonic) and deviates from itself by exactly zero
    filled = torch.where(finite, x, pivot)
    lo, hi = torch.aminmax(filled, dim=1)
    squares = torch.linalg.vector_norm(filled - pivot, 2, dim=1, dtype=wide).square()
    # about the float64 mean rather than its rounding: sum (x - p)^2 = m2 + n (mean - p)^2
    m2 = squares - count * (mean - pivot[:, 0].to(wide)).square()
    columns = [
        count,
        total,
        torch.isnan(x).sum(1, dtype=wide),
        (x == float("inf")).sum(1, dtype=wide),
        (x == 0).sum(1, dtype=wide),
        m2.clamp_min(0),
        lo.to(wide),
        hi.to(wide),
    ]
    return torch.stack(columns, dim=1)


class _Compiled:
    """``row_stats_eager`` compiled once (dynamic in the number of rows), used on CUDA where
    Triton is present; any failure to compile or run it turns it off for the process (the eager
    code gives the same fields). ``TORCHLENS_MEASURE_COMPILE=0`` turns it off."""

    def __init__(self) -> None:
        self.fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
        self.error: Optional[str] = None  # why the compiled kernel is not used
        self._lock = threading.Lock()
        if os.environ.get("TORCHLENS_MEASURE_COMPILE", "1") == "0":
            self.error = "turned off by TORCHLENS_MEASURE_COMPILE=0"

    def get(self) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
        if self.fn is not None or self.error is not None:
            return self.fn
        with self._lock:
            if self.fn is None and self.error is None:
                try:
                    import triton  # noqa: F401  (inductor's GPU kernels are Triton's)

                    self.fn = torch.compile(row_stats_eager, dynamic=True, fullgraph=True)
                except Exception as error:  # no Triton, or no compiler for this platform
                    self.error = f"{type(error).__name__}: {error}"
        return self.fn

    def disable(self, error: BaseException) -> None:
        self.fn, self.error = None, f"{type(error).__name__}: {error}"


COMPILED = _Compiled()


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """``row_stats_eager(x)``, by the compiled kernel on CUDA where it is available."""
    if x.is_cuda:
        fn: Any = COMPILED.get()
        if fn is not None:
            try:
                return fn(x)
            except Exception as error:  # a compiler failure: the eager code from now on
                COMPILED.disable(error)
    return row_stats_eager(x)


def merge_rows(stats: torch.Tensor, owner: torch.Tensor, numel: torch.Tensor, pads: torch.Tensor) -> torch.Tensor:
    """(N, len(EXACT_FIELDS)) float64: the exact summary of each of N tensors from the
    ``row_stats`` of its rows (``owner[r]``: the tensor of row ``r``), given each tensor's number
    of values ``numel`` and of NaN pads ``pads`` (float64 tensors of length N). The line is NaN.

    Example:
        >>> x = torch.tensor([[1.0, 2.0], [3.0, float("nan")], [5.0, 7.0]])
        >>> table = merge_rows(row_stats_eager(x), torch.tensor([0, 0, 1]), torch.tensor([3.0, 2.0]),
        ...                    torch.tensor([1.0, 0.0]))
        >>> [round(v, 9) for v in table[0, :5].tolist()], [round(v, 9) for v in table[1, :5].tolist()]
        ([3.0, 2.0, 2.0, 1.0, 3.0], [2.0, 6.0, 2.0, 5.0, 7.0])
    """
    n_tensors = numel.numel()
    wide = stats.dtype
    added = torch.zeros(n_tensors, _ADDITIVE, dtype=wide, device=stats.device).index_add_(
        0, owner, stats[:, :_ADDITIVE]
    )
    count, total = added[:, 0], added[:, 1]
    mean = total / count.clamp_min(1)
    row_count = stats[:, 0]
    apart = stats[:, 1] / row_count.clamp_min(1) - mean[owner]
    m2 = torch.zeros(n_tensors, dtype=wide, device=stats.device).index_add_(
        0, owner, stats[:, 5] + row_count * apart * apart
    )
    inf = float("inf")
    has = (row_count > 0)[:, None]
    # both extremes by one "amin": the maxima negated
    extremes = torch.where(has, torch.stack([stats[:, 6], -stats[:, 7]], dim=1), inf)
    lowest = torch.full((n_tensors, 2), inf, dtype=wide, device=stats.device).scatter_reduce_(
        0, owner[:, None].expand(-1, 2), extremes, "amin"
    )
    none = count == 0
    nan = torch.full_like(count, float("nan"))
    nans = added[:, 2] - pads
    columns = [
        count,
        torch.where(none, nan, mean),
        m2,
        torch.where(none, nan, lowest[:, 0]),
        torch.where(none, nan, -lowest[:, 1]),
        nans,
        added[:, 3],
        numel - count - nans - added[:, 3],
        added[:, 4],
        nan,
    ]
    return torch.stack(columns, dim=1)


__all__ = ["ROW_COLUMNS", "row_stats", "row_stats_eager", "merge_rows", "COMPILED"]
