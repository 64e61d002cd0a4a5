"""The one rule for statistics and histograms of tensor values, shared by both pages.

``NUM_BINS`` equal bins between the smallest and the largest finite value. The explorer's
logged steps collect many 1-D samples (one per series) and ``histograms`` bins them all with
a fixed number of operations, moving the result to the host in one transfer; the graph page's
details panel describes one saved activation with ``tensor_stats``, which bins the same way.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

NUM_BINS = 32


def reject_outliers(samples: Sequence[torch.Tensor], proportion: float) -> List[torch.Tensor]:
    """Drop the ``proportion`` of each sample's values farthest from its median.

    Samples of equal length are handled as one batch (one median and one top-k per length).
    Non-finite values count as the farthest.
    """
    if proportion <= 0:
        return list(samples)
    kept: List[Optional[torch.Tensor]] = [None] * len(samples)
    by_length: Dict[tuple, List[int]] = {}
    for i, s in enumerate(samples):
        by_length.setdefault((s.numel(), s.device), []).append(i)
    for (length, _), indices in by_length.items():
        keep = length - int(proportion * length)
        if keep >= length or keep < 1:
            for i in indices:
                kept[i] = samples[i]
            continue
        batch = torch.stack([samples[i] for i in indices])
        median = batch.nanmedian(dim=1, keepdim=True).values
        distance = (batch - median).abs().nan_to_num(nan=float("inf"))
        chosen = distance.topk(keep, dim=1, largest=False, sorted=False).indices
        rows = batch.gather(1, chosen)
        for row, i in zip(rows, indices):
            kept[i] = row
    return kept  # type: ignore[return-value]


class Histograms:
    """Histograms of several series on the host: row ``i`` belongs to the ``i``-th sample."""

    def __init__(
        self,
        counts: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        nonfinite: np.ndarray,
        sums: Optional[np.ndarray] = None,
        sums_of_squares: Optional[np.ndarray] = None,
        exact: Optional[np.ndarray] = None,
    ) -> None:
        self.counts = counts  # (S, NUM_BINS) float32
        self.lo = lo  # (S,) float64: the smallest finite value (nan when there is none)
        self.hi = hi
        self.nonfinite = nonfinite  # (S,) int64: nan/inf values seen (before outlier rejection)
        self.sums = sums if sums is not None else np.zeros(len(lo))  # of the binned values
        self.sums_of_squares = sums_of_squares if sums_of_squares is not None else np.zeros(len(lo))
        # (S, len(EXACT_FIELDS)): statistics over all values of each tensor (nan: not computed)
        self.exact = exact if exact is not None else np.full((len(lo), len(EXACT_FIELDS)), np.nan)

    def edges(self, i: int) -> np.ndarray:
        """Bin edges of row ``i``."""
        return bin_edges(self.lo[i : i + 1], self.hi[i : i + 1], self.counts.shape[1])[0]


def histograms(
    samples: Sequence[torch.Tensor],
    reject_proportion: float,
    bins: int = NUM_BINS,
    summaries: Optional[Sequence[Optional[torch.Tensor]]] = None,
) -> Histograms:
    """Histograms of 1-D float samples over [min, max] of each, in ``bins`` equal bins.

    ``summaries`` (one ``exact_summary`` per sample, or None) come back to the host in the same
    transfer, as ``Histograms.exact``.

    Example:
        >>> h = histograms([torch.tensor([0., 1., 2., 3.])], reject_proportion=0.0, bins=3)
        >>> h.counts.tolist(), float(h.lo[0]), float(h.hi[0])
        ([[1.0, 1.0, 2.0]], 0.0, 3.0)
    """
    if not samples:
        empty = np.zeros(0)
        return Histograms(np.zeros((0, bins), np.float32), empty, empty, np.zeros(0, np.int64))
    devices = {s.device for s in samples}
    if len(devices) > 1:  # rare: a model split over devices; one pass per device
        parts = {d: [i for i, s in enumerate(samples) if s.device == d] for d in devices}
        result = Histograms(
            np.zeros((len(samples), bins), np.float32),
            np.zeros(len(samples)),
            np.zeros(len(samples)),
            np.zeros(len(samples), np.int64),
        )
        for indices in parts.values():
            chosen = [summaries[i] for i in indices] if summaries is not None else None
            part = histograms([samples[i] for i in indices], reject_proportion, bins, summaries=chosen)
            result.counts[indices], result.lo[indices] = part.counts, part.lo
            result.hi[indices], result.nonfinite[indices] = part.hi, part.nonfinite
            result.exact[indices] = part.exact
        return result
    device = samples[0].device
    n = len(samples)
    # No operation below needs a value on the host (no boolean masks, no bincount, whose output
    # size depends on the data): on a GPU the whole step stays asynchronous until the one copy.
    nonfinite = torch.zeros(n, device=device)
    values, segments = _flatten(samples, device)
    nonfinite.scatter_add_(0, segments, (~torch.isfinite(values)).float())

    values, segments = _flatten(reject_outliers(samples, reject_proportion), device)
    finite = torch.isfinite(values)
    lo = torch.full((n,), float("inf"), device=device).scatter_reduce(
        0, segments, torch.where(finite, values, float("inf")), "amin"
    )
    hi = torch.full((n,), -float("inf"), device=device).scatter_reduce(
        0, segments, torch.where(finite, values, -float("inf")), "amax"
    )
    width = (hi - lo)[segments]
    position = torch.where(width > 0, (values - lo[segments]) / width.clamp_min(1e-38), torch.zeros_like(values))
    bin_index = (position.nan_to_num(0.0) * bins).floor().clamp(0, bins - 1).long()
    flat_index = torch.where(finite, segments * bins + bin_index, n * bins)  # non-finite: one spare slot
    counts = torch.zeros(n * bins + 1, device=device).scatter_add_(0, flat_index, torch.ones_like(values))
    counts = counts[: n * bins].view(n, bins)
    exact = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    kept = torch.where(finite, values, 0.0).to(exact)
    sums = torch.zeros(n, dtype=exact, device=device).scatter_add_(0, segments, kept)
    squares = torch.zeros(n, dtype=exact, device=device).scatter_add_(0, segments, kept * kept)
    missing = torch.full((len(EXACT_FIELDS),), float("nan"), dtype=exact, device=device)
    given = list(summaries) if summaries is not None else [None] * n
    summary_rows = torch.stack([missing if v is None else v.to(device, exact) for v in given])
    packed = (
        torch.cat(
            [
                counts.to(exact),
                lo.to(exact)[:, None],
                hi.to(exact)[:, None],
                nonfinite.to(exact)[:, None],
                sums[:, None],
                squares[:, None],
                summary_rows,
            ],
            dim=1,
        )
        .cpu()
        .double()
        .numpy()
    )  # the one host transfer
    lo_host, hi_host = packed[:, bins], packed[:, bins + 1]
    empty = ~np.isfinite(lo_host)
    lo_host[empty], hi_host[empty] = np.nan, np.nan
    return Histograms(
        packed[:, :bins].astype(np.float32),
        lo_host,
        hi_host,
        packed[:, bins + 2].astype(np.int64),
        sums=packed[:, bins + 3],
        sums_of_squares=packed[:, bins + 4],
        exact=packed[:, bins + 5 :],
    )


# Statistics over ALL values of a tensor (never a sample), as one small vector on the tensor's
# device. "finite" counts the finite values; mean, m2 (sum of squared deviations from the mean),
# min and max are over the finite values only (nan where there is none); nan/posinf/neginf/zeros
# count values; "line" is the series' summary scalar when it cannot be derived from the others.
EXACT_FIELDS = ("finite", "mean", "m2", "min", "max", "nan", "posinf", "neginf", "zeros", "line")


def _exact_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def exact_summary(tensor: torch.Tensor, line: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``EXACT_FIELDS`` of every value of ``tensor``, computed on its device with no host sync
    (None for complex, sparse and meta tensors). ``line``: a 0-d tensor stored in the last field.

    Example:
        >>> v = exact_summary(torch.tensor([0.0, 2.0, float("nan"), float("-inf")]))
        >>> dict(zip(EXACT_FIELDS, v.tolist()))["finite"], v[3].item(), v[5].item(), v[7].item()
        (2.0, 0.0, 1.0, 1.0)
    """
    t = tensor.detach()
    if t.is_complex() or t.layout != torch.strided or t.is_meta or t.numel() == 0:
        return None
    exact = _exact_dtype(t.device)
    x = t.reshape(-1)
    if not x.is_floating_point():
        x = x.to(exact)
    elif x.element_size() < 4:  # half precision: centre the values in float32
        x = x.float()
    nan = torch.full((), float("nan"), dtype=exact, device=x.device)
    line = nan if line is None else line.detach().to(exact).reshape(())
    if x.device.type == "cpu":  # reading a value costs no sync there: a tensor without NaN/inf is cheap
        total = x.sum()
        if math.isfinite(float(total)):
            return _finite_summary(x, total, line)
    return _summary_with_nonfinite(x, nan, line)


def _finite_summary(x: torch.Tensor, total: torch.Tensor, line: torch.Tensor) -> torch.Tensor:
    """On the CPU, where reading a value is free: three fast reductions in the tensor's own
    dtype (torch accumulates them in double there) and a zero count, read as Python floats (a
    few 0-d tensor operations would cost more than the reductions). Values far from zero
    relative to their spread are centred first."""
    n = x.numel()
    mean = float(total) / n
    lo, hi = (v.item() for v in torch.aminmax(x))
    m2 = float(torch.linalg.vector_norm(x)) ** 2 - n * mean * mean
    if m2 <= 1e4 * n * mean * mean * torch.finfo(x.dtype).eps:  # cancellation: centre first
        m2 = float(torch.linalg.vector_norm(x - mean)) ** 2
    zeros = _count_zeros(x)
    fields = [n, mean, max(m2, 0.0), lo, hi, 0, 0, 0, zeros, float(line)]
    return torch.tensor(fields, dtype=line.dtype)


_BITS = {2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}


def _count_zeros(x: torch.Tensor) -> int:
    """How many values of a CPU float tensor are exactly zero (+0.0 or -0.0), about 2.5x faster
    than torch's ``(x == 0)`` and its sum: the values' bits shifted left by one (dropping the
    sign) are zero exactly for the zeros, and numpy counts nonzero words without building a mask.
    numpy reads the memory through ctypes, not ``x.numpy()``: that would mark the storage as not
    resizable for good, and FSDP frees a parameter by resizing its storage to nothing.

    Example:
        >>> _count_zeros(torch.tensor([0.0, -0.0, 1e-45, -2.0]))
        2
    """
    x = x.contiguous()
    words = (_BITS[x.element_size()] * x.numel()).from_address(x.data_ptr())
    return x.numel() - int(np.count_nonzero(np.left_shift(np.ctypeslib.as_array(words), 1)))


def _summary_with_nonfinite(x: torch.Tensor, nan: torch.Tensor, line: torch.Tensor) -> torch.Tensor:
    exact = nan.dtype
    finite = torch.isfinite(x)
    count = finite.sum(dtype=exact)
    z = torch.where(finite, x, 0).to(exact)
    mean = z.sum() / count.clamp_min(1)
    deviation = torch.where(finite, z - mean, 0)
    m2 = torch.dot(deviation, deviation)
    inf = float("inf")
    lo = torch.where(finite, x, inf).amin().to(exact)
    hi = torch.where(finite, x, -inf).amax().to(exact)
    none = count == 0
    fields = [
        count,
        torch.where(none, nan, mean),
        m2,
        torch.where(none, nan, lo),
        torch.where(none, nan, hi),
        torch.isnan(x).sum(dtype=exact),
        (x == inf).sum(dtype=exact),
        (x == -inf).sum(dtype=exact),
        (x == 0).sum(dtype=exact),
        line,
    ]
    return torch.stack(fields)


def combine_summaries(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One ``exact_summary`` of the values of several tensors together (on the device)."""
    if len(parts) == 1:
        return parts[0]
    rows = torch.stack(list(parts))
    count, means = rows[:, 0], rows[:, 1]
    total = count.sum()
    weights = torch.where(count > 0, count, 0)
    mean = (torch.where(count > 0, means, 0) * weights).sum() / total.clamp_min(1)
    spread = torch.where(count > 0, rows[:, 2] + weights * (means - mean) ** 2, 0).sum()
    out = [
        total,
        torch.where(total > 0, mean, float("nan")),
        spread,
        rows[:, 3].nan_to_num(float("inf")).amin(),
        rows[:, 4].nan_to_num(-float("inf")).amax(),
    ]
    out[3] = torch.where(total > 0, out[3], float("nan"))
    out[4] = torch.where(total > 0, out[4], float("nan"))
    return torch.cat([torch.stack(out), rows[:, 5:9].sum(dim=0), rows[-1:, 9]])


def host_summary(row: np.ndarray) -> Dict[str, float]:
    """The stored statistics from one host row of ``EXACT_FIELDS``: count, true_min, true_max,
    mean, std (population std of the finite values), nan, posinf, neginf, zeros, line."""
    finite, mean, m2, lo, hi, nan, posinf, neginf, zeros, line = (float(v) for v in row)
    std = math.sqrt(max(m2, 0.0) / finite) if finite > 0 else float("nan")
    return {
        "count": finite + nan + posinf + neginf,
        "true_min": lo,
        "true_max": hi,
        "mean": mean,
        "std": std,
        "nan": nan,
        "posinf": posinf,
        "neginf": neginf,
        "zeros": zeros,
        "line": line,
        "norm": math.sqrt(max(m2, 0.0) + finite * mean * mean) if finite > 0 else float("nan"),
    }


def _flatten(samples: Sequence[torch.Tensor], device: torch.device) -> tuple:
    """All samples end to end, and the index of the sample each value came from."""
    lengths = torch.tensor([s.numel() for s in samples])
    segments = torch.repeat_interleave(torch.arange(len(samples)), lengths).to(device, non_blocking=True)
    return torch.cat(list(samples)), segments


def bin_edges(lo: np.ndarray, hi: np.ndarray, bins: int) -> np.ndarray:
    """(S, bins + 1) edges spanning [lo, hi] of each row."""
    steps = np.linspace(0.0, 1.0, bins + 1)
    return lo[:, None] + (hi - lo)[:, None] * steps[None, :]


def merge(lo_a: float, hi_a: float, counts_a: np.ndarray, lo_b: float, hi_b: float, counts_b: np.ndarray) -> tuple:
    """One histogram holding two, over the union of their ranges (counts spread evenly within
    each old bin). Used to keep long runs to a bounded number of columns."""
    parts = [(lo, hi, c) for lo, hi, c in ((lo_a, hi_a, counts_a), (lo_b, hi_b, counts_b)) if np.isfinite(lo)]
    bins = len(counts_a)
    if not parts:
        return float("nan"), float("nan"), counts_a + counts_b
    lo = min(p[0] for p in parts)
    hi = max(p[1] for p in parts)
    new_edges = np.linspace(lo, hi, bins + 1)
    total = np.zeros(bins, np.float64)
    for p_lo, p_hi, c in parts:
        if p_hi <= p_lo or hi <= lo:  # all values at one point
            index = 0 if hi <= lo else min(int((p_lo - lo) / (hi - lo) * bins), bins - 1)
            total[index] += c.sum()
            continue
        old_edges = np.linspace(p_lo, p_hi, bins + 1)
        cumulative = np.concatenate([[0.0], np.cumsum(c, dtype=np.float64)])
        total += np.diff(np.interp(new_edges, old_edges, cumulative))
    return lo, hi, total.astype(np.float32)


def tensor_stats(tensor: Any, bins: int = NUM_BINS) -> Optional[Dict[str, Any]]:
    """min, max, mean, std, fraction of zeros, count of non-finite values and a histogram of
    ``bins`` equal bins between min and max; None for anything that is not a dense tensor of
    numbers.

    Example:
        >>> import torch
        >>> s = tensor_stats(torch.tensor([0.0, 0.0, 1.0, 3.0]), bins=3)
        >>> s["min"], s["max"], s["mean"], s["zeros"], s["hist"]
        (0.0, 3.0, 1.0, 0.5, [2, 1, 1])
    """
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.is_meta:
        return None
    try:
        with torch.no_grad():
            t = tensor.detach()
            if t.is_quantized:
                t = t.dequantize()
            if t.is_complex():
                t = t.abs()
            x = t.to("cpu", torch.float64).flatten() if t.numel() <= 1 << 16 else t.flatten().to("cpu", torch.float32)
            n = int(x.numel())
            if n == 0:
                return {"n": 0, "nonfinite": 0}
            finite = torch.isfinite(x)
            nonfinite = n - int(finite.sum())
            if nonfinite:
                x = x[finite]
            if x.numel() == 0:
                return {"n": n, "nonfinite": nonfinite}
            lo, hi = float(x.min()), float(x.max())
            mean = float(x.mean())
            std = float(x.std(correction=0)) if x.numel() > 1 else 0.0
            zeros = float((x == 0).sum()) / n
            if hi > lo:  # the same bins as the explorer's histograms
                counts = [int(c) for c in histograms([x.float()], reject_proportion=0.0, bins=bins).counts[0]]
            else:
                counts = [int(x.numel())]
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # exotic tensors: no statistics
        return None
    return {
        "n": n,
        "min": lo,
        "max": hi,
        "mean": mean,
        "std": std,
        "zeros": zeros,
        "nonfinite": nonfinite,
        "hist": counts,
    }


__all__ = [
    "exact_summary",
    "combine_summaries",
    "host_summary",
    "EXACT_FIELDS",
    "histograms",
    "reject_outliers",
    "bin_edges",
    "merge",
    "NUM_BINS",
    "Histograms",
    "tensor_stats",
]
