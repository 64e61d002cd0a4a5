"""The one rule for statistics and histograms of tensor values, shared by both pages, and the
one packed form of histograms (``pack``/``unpack``: a row of floats per series).

``NUM_BINS`` equal bins between the smallest and the largest finite value. The explorer's
logged steps collect many 1-D samples (one per series) and ``histograms`` bins them all with
a fixed number of operations, moving the result to the host in one transfer; the graph page's
details panel describes one saved activation with ``tensor_stats``, which bins the same way.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .exact import EXACT_FIELDS, exact_summary

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


# The packed form of histograms: one row of floats per series, its columns the ``bins`` counts,
# lo, hi, the non-finite count, the sum and the sum of squares of the binned values, then the
# ``EXACT_FIELDS``. It is what crosses to the host in one transfer (``histograms``) and between
# the ranks of a distributed run in one collective (train/measure/distributed.py).


def pack(
    counts: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, nonfinite: torch.Tensor, moments: torch.Tensor
) -> torch.Tensor:
    """Histograms as one (S, bins + 5 + len(EXACT_FIELDS)) tensor: ``counts`` (S, bins), ``lo``,
    ``hi`` and ``nonfinite`` (S,), and ``moments`` (S, 2 + len(EXACT_FIELDS)): the sums and sums of
    squares of the binned values, then the exact statistics; all in ``moments``' dtype.

    Example:
        >>> packed = pack(torch.ones(1, 2), torch.zeros(1), torch.ones(1), torch.zeros(1),
        ...               moments=torch.zeros(1, 2 + len(EXACT_FIELDS)))
        >>> h = unpack(packed.numpy(), bins=2)
        >>> h.counts.tolist(), h.lo.tolist(), h.hi.tolist(), h.nonfinite.tolist()
        ([[1.0, 1.0]], [0.0], [1.0], [0])
    """
    dtype = moments.dtype
    parts = [counts.to(dtype), lo.to(dtype)[:, None], hi.to(dtype)[:, None], nonfinite.to(dtype)[:, None], moments]
    return torch.cat(parts, dim=1)


def unpack(packed: np.ndarray, bins: int) -> Histograms:
    """The ``Histograms`` of a packed (S, columns) array (``pack``); a series without a finite
    value gets nan as its ``lo`` and ``hi``."""
    lo, hi = packed[:, bins].copy(), packed[:, bins + 1].copy()
    empty = ~np.isfinite(lo)
    lo[empty], hi[empty] = np.nan, np.nan
    return Histograms(
        packed[:, :bins].astype(np.float32),
        lo,
        hi,
        packed[:, bins + 2].astype(np.int64),
        sums=packed[:, bins + 3],
        sums_of_squares=packed[:, bins + 4],
        exact=packed[:, bins + 5 :],
    )


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
        return _per_device(samples, reject_proportion, bins, summaries)
    device = samples[0].device
    given = list(summaries) if summaries is not None else [None] * len(samples)
    # summaries already on the host (a GPU step's, moved once per phase) stay there
    on_host = {} if device.type == "cpu" else {i: v for i, v in enumerate(given) if v is not None and v.is_cpu}
    counts, lo, hi, nonfinite, sums, squares = _bin(samples, reject_proportion, bins)
    exact = sums.dtype
    missing = torch.full((len(EXACT_FIELDS),), float("nan"), dtype=exact, device=device)
    summary_rows = torch.stack(
        [
            missing
            if v is None or i in on_host
            else v
            if v.dtype == exact and v.device == device
            else v.to(device, exact)
            for i, v in enumerate(given)
        ]
    )
    moments = torch.cat([sums[:, None], squares[:, None], summary_rows], dim=1)
    packed = pack(counts, lo, hi, nonfinite, moments=moments)
    packed_host = _to_host(packed).double().numpy()  # the one host transfer
    for i, v in on_host.items():
        packed_host[i, bins + 5 :] = v.double().numpy()
    return unpack(packed_host, bins)


def stack_rows(n: int, parts: Sequence[Tuple[Sequence[int], Histograms, Sequence[int]]]) -> Histograms:
    """``n`` rows of histograms gathered from others: each part ``(rows, h, taken)`` puts the
    rows ``taken`` of ``h`` at ``rows``.

    Example:
        >>> a = histograms([torch.tensor([0.0, 1.0])], 0.0, bins=2)
        >>> b = histograms([torch.tensor([5.0, 7.0])], 0.0, bins=2)
        >>> stack_rows(2, [([1], a, [0]), ([0], b, [0])]).lo.tolist()
        [5.0, 0.0]
    """
    bins = next((h.counts.shape[1] for _, h, _ in parts), NUM_BINS)
    out = Histograms(np.zeros((n, bins), np.float32), np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
    for rows, h, taken in parts:
        if len(rows):
            for field in ("counts", "lo", "hi", "nonfinite", "sums", "sums_of_squares", "exact"):
                getattr(out, field)[list(rows)] = getattr(h, field)[list(taken)]
    return out


def _per_device(
    samples: Sequence[torch.Tensor],
    reject_proportion: float,
    bins: int,
    summaries: Optional[Sequence[Optional[torch.Tensor]]],
) -> Histograms:
    """``histograms`` of samples on several devices: one pass per device."""
    parts: Dict[torch.device, List[int]] = {}
    for i, s in enumerate(samples):
        parts.setdefault(s.device, []).append(i)
    n = len(samples)
    result = Histograms(np.zeros((n, bins), np.float32), np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
    for indices in parts.values():
        chosen = [summaries[i] for i in indices] if summaries is not None else None
        part = histograms([samples[i] for i in indices], reject_proportion, bins, summaries=chosen)
        result.counts[indices], result.lo[indices] = part.counts, part.lo
        result.hi[indices], result.nonfinite[indices] = part.hi, part.nonfinite
        result.exact[indices] = part.exact
    return result


def _bin(samples: Sequence[torch.Tensor], reject_proportion: float, bins: int) -> Tuple[torch.Tensor, ...]:
    """On the samples' device: the counts (S, bins), lo, hi, non-finite counts (before outlier
    rejection), and the sums and sums of squares of the binned values (S,) of each sample."""
    device = samples[0].device
    n = len(samples)
    # No operation below needs a value on the host (no boolean masks, no bincount, whose output
    # size depends on the data): on a GPU the whole step stays asynchronous until the one copy.
    nonfinite = torch.zeros(n, device=device)
    numels = [s.numel() for s in samples]  # once, for both below (a step has hundreds of samples)
    values, segments = _flatten(samples, device, numels)
    nonfinite.scatter_add_(0, segments, (~torch.isfinite(values)).float())

    values, segments = _kept_values(samples, reject_proportion, device, numels)
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
    return counts, lo, hi, nonfinite, sums, squares


def _to_host(values: torch.Tensor) -> torch.Tensor:
    """``values`` on the host. From a GPU: copied into pinned memory, and waited for by an
    event of the copy alone (not a synchronisation of the device: a thread doing this does not
    stall the others' work, and ``torch.cuda.set_sync_debug_mode`` does not count it)."""
    if values.device.type != "cuda":
        return values.cpu()
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(values.device))
    event.synchronize()
    return host


def _kept_values(
    samples: Sequence[torch.Tensor], proportion: float, device: torch.device, numels: Optional[List[int]] = None
) -> tuple:
    """``reject_outliers`` of every sample, end to end, with the index of the sample each value
    came from; a rejected value is NaN (binning leaves non-finite values out). The samples are
    handled in groups by the power of two their length rounds up to, each one matrix padded with
    NaN to the group's longest (a median and a top-k per group, not per length: a step's samples
    have many lengths, and the padding at most doubles what is read). The values kept are those
    of ``reject_outliers`` but for ties at the far end.

    Example:
        >>> values, segments = _kept_values([torch.tensor([1.0, 2.0, 3.0, 99.0]), torch.ones(2)], 0.25,
        ...                                 torch.device("cpu"))
        >>> sorted(v for v in values.tolist() if v == v), segments.tolist()
        ([1.0, 1.0, 1.0, 2.0, 3.0], [0, 0, 0, 0, 0, 1, 1, 1])
    """
    numels = [s.numel() for s in samples] if numels is None else numels
    if proportion <= 0:
        return _flatten(samples, device, numels)
    groups = _length_groups(np.asarray(numels, np.int64))
    if not groups:
        return _flatten(samples, device, numels)
    values, segments = [], []
    for members, lengths in groups:
        width = int(lengths.max())
        keep = lengths - (proportion * lengths).astype(np.int64)
        keep = np.where((keep < 1) | (keep >= lengths), lengths, keep)  # too short to reject from
        # one row per sample and one spare column, always NaN: where a sample drops fewer
        # values than the group's most, its remaining top-k places point there
        flat = torch.cat([samples[i] for i in members.tolist()])
        batch = torch.full((len(members), width + 1), float("nan"), dtype=flat.dtype, device=device)
        starts = np.arange(len(members)) * (width + 1) - (np.cumsum(lengths) - lengths)
        at = np.repeat(starts, lengths) + np.arange(lengths.sum())  # each value's place in its row
        batch.view(-1).index_copy_(0, _on(at, device), flat)
        body = batch[:, :width]
        median = body.nanmedian(dim=1, keepdim=True).values
        distance = (body - median).abs().nan_to_num(nan=float("inf"))  # pads and NaN: the farthest
        far = width - keep  # each row's values to drop, its pads included
        k = int(far.max())
        if k:
            farthest = distance.topk(k, dim=1, sorted=True).indices
            beyond = np.arange(k)[None, :] >= far[:, None]
            batch.scatter_(1, farthest.masked_fill_(_on(beyond, device), width), float("nan"))
        values.append(batch.view(-1))
        segments.append(np.repeat(members, width + 1))
    return torch.cat(values), _on(np.concatenate(segments), device)


def _length_groups(lengths: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The samples of each length class (the power of two a length rounds up to: 1, 2, 4, ...),
    in the order the classes first appear: (their indices, ascending; their lengths). Empty
    samples belong to none. Worked out in numpy: a step has hundreds of samples.

    Example:
        >>> [(m.tolist(), n.tolist()) for m, n in _length_groups(np.array([3, 0, 4, 1, 5]))]
        [([0, 2], [3, 4]), ([3], [1]), ([4], [5])]
    """
    present = np.flatnonzero(lengths)
    if not present.size:
        return []
    # 2 ** bit_length(n - 1), exactly: frexp's exponent of an integer below 2 ** 53 is its bit length
    classes = np.left_shift(1, np.frexp(lengths[present] - 1)[1].astype(np.int64))
    found, first = np.unique(classes, return_index=True)
    groups = []
    for length_class in found[np.argsort(first)]:
        members = present[classes == length_class]
        groups.append((members, lengths[members]))
    return groups


def _on(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on a GPU copied from pinned memory, without waiting."""
    host = torch.from_numpy(array)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def _flatten(samples: Sequence[torch.Tensor], device: torch.device, numels: Optional[List[int]] = None) -> tuple:
    """All samples end to end, and the index of the sample each value came from (``numels``:
    their lengths, where the caller has them)."""
    lengths = torch.tensor([s.numel() for s in samples] if numels is None else numels, dtype=torch.int64)
    segments = torch.repeat_interleave(torch.arange(len(samples)), lengths).to(device, non_blocking=True)
    return torch.cat(list(samples)), segments


def bin_edges(lo: np.ndarray, hi: np.ndarray, bins: int) -> np.ndarray:
    """(S, bins + 1) edges spanning [lo, hi] of each row."""
    steps = np.linspace(0.0, 1.0, bins + 1)
    return lo[:, None] + (hi - lo)[:, None] * steps[None, :]


def tensor_stats(tensor: Any, bins: int = NUM_BINS) -> Optional[Dict[str, Any]]:
    """min, max, mean, std, fraction of zeros, count of non-finite values and a histogram of
    ``bins`` equal bins between min and max; None for anything that is not a dense tensor of
    numbers.

    A few passes over the values: ``exact.exact_summary`` (a few fast reductions on the CPU:
    moments, min, max, zeros, non-finite counts), then ``torch.histc`` between min and max (the
    explorer's bins: a value at ``lo + (hi - lo) * k / bins`` opens bin ``k``, the maximum is in
    the last).

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
            x = t.reshape(-1)
            if not x.is_cpu:
                x = x.cpu()
            if x.dtype not in (torch.float32, torch.float64):  # integers, bool, half precision
                x = x.to(torch.float64 if x.numel() <= 1 << 16 else torch.float32)
            n = int(x.numel())
            if n == 0:
                return {"n": 0, "nonfinite": 0}
            summary = exact_summary(x)
            if summary is None:
                return None
            fields = dict(zip(EXACT_FIELDS, summary.tolist()))
            finite = int(fields["finite"])
            if finite == 0:
                return {"n": n, "nonfinite": n}
            lo, hi = float(fields["min"]), float(fields["max"])
            mean = float(fields["mean"])
            std = math.sqrt(max(float(fields["m2"]), 0.0) / finite) if finite > 1 else 0.0
            zeros = float(fields["zeros"]) / n
            if hi > lo:  # the same bins as the explorer's histograms
                values = x if finite == n else x[torch.isfinite(x)]
                counts = [int(c) for c in torch.histc(values, bins, min=lo, max=hi).tolist()]
            else:
                counts = [finite]
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # exotic tensors: no statistics
        return None
    return {
        "n": n,
        "min": lo,
        "max": hi,
        "mean": mean,
        "std": std,
        "zeros": zeros,
        "nonfinite": n - finite,
        "hist": counts,
    }


__all__ = [
    "histograms",
    "pack",
    "unpack",
    "reject_outliers",
    "bin_edges",
    "NUM_BINS",
    "Histograms",
    "tensor_stats",
]
