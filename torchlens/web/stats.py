"""The one rule for statistics and histograms of tensor values, shared by both pages, and the
one packed form of histograms (``pack``/``unpack``: a row of floats per series).

``NUM_BINS`` equal bins between the smallest and the largest finite value. The explorer's
logged steps collect many 1-D samples (one per series) and ``histograms`` bins them all with
a fixed number of operations, moving the result to the host in one transfer; the graph page's
details panel describes one saved activation with ``tensor_stats``, which bins the same way.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .exact import EXACT_FIELDS, exact_summary

NUM_BINS = 32


class Piece(NamedTuple):
    """Values ``start`` to ``start + size`` of the 1-D tensor ``buffer``: a sample handed over
    without a view of its own (a logged step's samples lie end to end in a few buffers, and a
    view per sample would cost an operation each).

    Example:
        >>> as_tensor(Piece(torch.arange(5.0), 1, 3)).tolist()
        [1.0, 2.0, 3.0]
    """

    buffer: torch.Tensor
    start: int
    size: int


class Row(NamedTuple):
    """Row ``at`` of the 2-D tensor ``table``: an exact summary handed over without a view.

    Example:
        >>> as_tensor(Row(torch.eye(3), 1)).tolist()
        [0.0, 1.0, 0.0]
    """

    table: torch.Tensor
    at: int


Sample = Union[torch.Tensor, Piece]  # a 1-D float sample, or where it lies
Summary = Union[None, torch.Tensor, Row]  # an ``exact_summary``, or where it lies, or none


def as_tensor(value: Any) -> Any:
    """A ``Piece`` or ``Row`` as the tensor it stands for (one view); anything else as it is."""
    if type(value) is Piece:
        return value.buffer[value.start : value.start + value.size]
    if type(value) is Row:
        return value.table[value.at]
    return value


def device_of(sample: Sample) -> torch.device:
    """The device a sample (or the buffer its ``Piece`` lies in) is on."""
    return sample.buffer.device if type(sample) is Piece else sample.device  # type: ignore[union-attr]


def size_of(sample: Optional[Sample]) -> int:
    """How many values a sample has (0 for None), without a view of a ``Piece``."""
    return 0 if sample is None else sample.size if type(sample) is Piece else sample.numel()  # type: ignore[union-attr]


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
    samples: Sequence[Sample],
    reject_proportion: float,
    bins: int = NUM_BINS,
    summaries: Optional[Sequence[Summary]] = None,
) -> Histograms:
    """Histograms of 1-D float samples over [min, max] of each, in ``bins`` equal bins.

    ``summaries`` (one ``exact_summary`` per sample, or None) come back to the host in the same
    transfer, as ``Histograms.exact``. Samples may be ``Piece``s of a few buffers and summaries
    ``Row``s of a few tables: the operations run are then as many however many samples there are.

    Example:
        >>> h = histograms([torch.tensor([0., 1., 2., 3.])], reject_proportion=0.0, bins=3)
        >>> h.counts.tolist(), float(h.lo[0]), float(h.hi[0])
        ([[1.0, 1.0, 2.0]], 0.0, 3.0)
        >>> buffer = torch.arange(6.0)
        >>> h = histograms([Piece(buffer, 3, 3), Piece(buffer, 0, 3)], 0.0, bins=3)
        >>> h.lo.tolist(), h.counts.tolist()
        ([3.0, 0.0], [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    """
    if not samples:
        empty = np.zeros(0)
        return Histograms(np.zeros((0, bins), np.float32), empty, empty, np.zeros(0, np.int64))
    joined = join(samples)
    devices = {part.device for part in joined.parts}
    if len(devices) > 1:  # rare: a model split over devices; one pass per device
        return _per_device(samples, reject_proportion, bins, summaries)
    device = joined.parts[0].device
    counts, lo, hi, nonfinite, sums, squares = _bin(samples, reject_proportion, bins, joined)
    on_device, on_host = _summary_groups(summaries, device)
    exact = torch.full((len(samples), len(EXACT_FIELDS)), float("nan"), dtype=sums.dtype, device=device)
    for series, rows in on_device:
        exact.index_copy_(0, _on(series, device), rows.to(exact.dtype))
    moments = torch.cat([sums[:, None], squares[:, None], exact], dim=1)
    packed = pack(counts, lo, hi, nonfinite, moments=moments)
    packed_host = _to_host(packed).double().numpy()  # the one host transfer
    for series, host_rows in on_host:  # summaries already on the host (a GPU step's, moved once per phase)
        packed_host[series, bins + 5 :] = host_rows
    return unpack(packed_host, bins)


def _summary_groups(
    summaries: Optional[Sequence[Summary]], device: torch.device
) -> Tuple[List[Tuple[np.ndarray, torch.Tensor]], List[Tuple[np.ndarray, np.ndarray]]]:
    """The summaries as blocks of rows, a fixed number of operations for any number of them:
    (series, rows) on ``device`` and (series, rows) on the host. The ``Row``s of one table are
    one block (the host's read as an array, the device's by one ``index_select``); loose rows are
    stacked into one block per place."""
    on_device: List[Tuple[np.ndarray, torch.Tensor]] = []
    on_host: List[Tuple[np.ndarray, np.ndarray]] = []
    if summaries is None:
        return on_device, on_host
    tables: Dict[int, Tuple[torch.Tensor, List[int], List[int]]] = {}
    loose: Dict[bool, Tuple[List[int], List[torch.Tensor]]] = {}
    for i, v in enumerate(summaries):
        if v is None:
            continue
        if type(v) is Row:
            block = tables.get(id(v.table))
            if block is None:
                block = tables[id(v.table)] = (v.table, [], [])
            block[1].append(i)
            block[2].append(v.at)
        else:
            host = v.is_cpu and device.type != "cpu"  # type: ignore[union-attr]
            series, rows = loose.setdefault(host, ([], []))
            series.append(i)
            rows.append(v if host or v.device == device else v.to(device))  # type: ignore[union-attr, arg-type]
    for table, series, indices in tables.values():
        if table.is_cpu:
            on_host.append((np.asarray(series), _host_array(table)[indices]))
        else:
            on_device.append((np.asarray(series), table.to(device).index_select(0, _on(np.asarray(indices), device))))
    for host, (series, rows) in loose.items():
        if host:
            on_host.append((np.asarray(series), _host_array(torch.stack(rows))))
        else:
            on_device.append((np.asarray(series), torch.stack(rows)))
    return on_device, on_host


def _host_array(table: torch.Tensor) -> np.ndarray:
    """A host tensor's values as an array of float64 (shared where it is float64 already)."""
    return table.detach().numpy().astype(np.float64, copy=False)


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
    samples: Sequence[Sample],
    reject_proportion: float,
    bins: int,
    summaries: Optional[Sequence[Summary]],
) -> Histograms:
    """``histograms`` of samples on several devices: one pass per device."""
    parts: Dict[torch.device, List[int]] = {}
    for i, s in enumerate(samples):
        parts.setdefault(device_of(s), []).append(i)
    n = len(samples)
    result = Histograms(np.zeros((n, bins), np.float32), np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
    for indices in parts.values():
        chosen = [summaries[i] for i in indices] if summaries is not None else None
        part = histograms([samples[i] for i in indices], reject_proportion, bins, summaries=chosen)
        result.counts[indices], result.lo[indices] = part.counts, part.lo
        result.hi[indices], result.nonfinite[indices] = part.hi, part.nonfinite
        result.sums[indices], result.sums_of_squares[indices] = part.sums, part.sums_of_squares
        result.exact[indices] = part.exact
    return result


def _bin(
    samples: Sequence[Sample], reject_proportion: float, bins: int, joined: Optional[Joined] = None
) -> Tuple[torch.Tensor, ...]:
    """On the samples' device: the counts (S, bins), lo, hi, non-finite counts (before outlier
    rejection), and the sums and sums of squares of the binned values (S,) of each sample."""
    joined = join(samples) if joined is None else joined
    device = joined.parts[0].device
    n = len(samples)
    # No operation below needs a value on the host (no boolean masks, no bincount, whose output
    # size depends on the data): on a GPU the whole step stays asynchronous until the one copy.
    nonfinite = torch.zeros(n, device=device)
    values, segments = end_to_end(samples, device, joined)
    nonfinite.scatter_add_(0, segments, (~torch.isfinite(values)).float())

    values, segments = _kept_values(values, segments, sizes=joined.sizes, proportion=reject_proportion, device=device)
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
    flat: torch.Tensor, segments: torch.Tensor, sizes: List[int], proportion: float, device: torch.device
) -> tuple:
    """``reject_outliers`` of every sample, end to end, with the index of the sample each value
    came from; a rejected value is NaN (binning leaves non-finite values out). ``flat`` and
    ``segments``: the samples end to end and each value's sample (``end_to_end``), ``sizes``
    their lengths. The samples are handled in groups by the power of two their length rounds
    up to, each one matrix padded with NaN to the group's longest (a median and a top-k per
    group, not per length: a step's samples have many lengths, and the padding at most doubles
    what is read). The values kept are those of ``reject_outliers`` but for ties at the far end.

    Example:
        >>> samples = [torch.tensor([1.0, 2.0, 3.0, 99.0]), torch.ones(2)]
        >>> flat, segments = end_to_end(samples, torch.device("cpu"))
        >>> values, segments = _kept_values(flat, segments, sizes=[4, 2], proportion=0.25, device=torch.device("cpu"))
        >>> sorted(v for v in values.tolist() if v == v), segments.tolist()
        ([1.0, 1.0, 1.0, 2.0, 3.0], [0, 0, 0, 0, 0, 1, 1, 1])
    """
    lengths_all = np.asarray(sizes, np.int64)
    groups = _length_groups(lengths_all) if proportion > 0 else []
    if not groups:
        return flat, segments
    in_flat = np.cumsum(lengths_all) - lengths_all  # where each sample starts in ``flat``
    rows_kept: List[torch.Tensor] = []
    rows_of: List[np.ndarray] = []
    for members, lengths in groups:
        width = int(lengths.max())
        keep = lengths - (proportion * lengths).astype(np.int64)
        keep = np.where((keep < 1) | (keep >= lengths), lengths, keep)  # too short to reject from
        # the group's values, taken from ``flat`` in one gather
        inside = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        taken = flat.index_select(0, _on(np.repeat(in_flat[members], lengths) + inside, device))
        # one row per sample and one spare column, always NaN: where a sample drops fewer
        # values than the group's most, its remaining top-k places point there
        batch = torch.full((len(members), width + 1), float("nan"), dtype=taken.dtype, device=device)
        starts = np.arange(len(members)) * (width + 1) - (np.cumsum(lengths) - lengths)
        at = np.repeat(starts, lengths) + np.arange(lengths.sum())  # each value's place in its row
        batch.view(-1).index_copy_(0, _on(at, device), taken)
        body = batch[:, :width]
        median = body.nanmedian(dim=1, keepdim=True).values
        distance = (body - median).abs().nan_to_num(nan=float("inf"))  # pads and NaN: the farthest
        far = width - keep  # each row's values to drop, its pads included
        k = int(far.max())
        if k:
            farthest = distance.topk(k, dim=1, sorted=True).indices
            beyond = np.arange(k)[None, :] >= far[:, None]
            batch.scatter_(1, farthest.masked_fill_(_on(beyond, device), width), float("nan"))
        rows_kept.append(batch.view(-1))
        rows_of.append(np.repeat(members, width + 1))
    return torch.cat(rows_kept), _on(np.concatenate(rows_of), device)


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


class Joined(NamedTuple):
    """Where samples lie once joined: ``parts`` (the buffers their ``Piece``s lie in, and the
    loose samples) end to end, each sample ``sizes[i]`` values from ``starts[i]`` on."""

    parts: List[torch.Tensor]
    starts: List[int]
    sizes: List[int]
    total: int  # the values of all parts


def join(samples: Sequence[Sample]) -> Joined:
    """Where ``samples`` lie once the buffers of their pieces and the loose ones are joined
    (``end_to_end`` takes their values from there)."""
    offsets: Dict[int, int] = {}  # id(buffer) -> where it starts among the parts
    parts: List[torch.Tensor] = []
    starts: List[int] = []
    sizes: List[int] = []
    total = 0
    for s in samples:  # one plain loop: a step has hundreds of samples
        if type(s) is Piece:
            buffer, start, size = s
            at = offsets.get(id(buffer))
            if at is None:
                at = offsets[id(buffer)] = total
                parts.append(buffer)
                total += buffer.numel()
            starts.append(at + start)
            sizes.append(size)
        else:
            size = s.numel()  # type: ignore[union-attr]
            parts.append(s)  # type: ignore[arg-type]
            starts.append(total)
            sizes.append(size)
            total += size
    return Joined(parts, starts, sizes, total)


def end_to_end(samples: Sequence[Sample], device: torch.device, joined: Optional[Joined] = None) -> tuple:
    """All samples end to end, and the index of the sample each value came from, in a fixed
    number of operations: the buffers the ``Piece``s lie in and the loose samples joined (one
    ``cat``, none for a single buffer), then the samples' values taken in order (one gather,
    none where they lie in order already). ``joined``: ``join(samples)``, where the caller has it.

    Example:
        >>> buffer = torch.arange(4.0)
        >>> values, segments = end_to_end([Piece(buffer, 2, 2), torch.tensor([9.0]), Piece(buffer, 0, 1)],
        ...                               torch.device("cpu"))
        >>> values.tolist(), segments.tolist()
        ([2.0, 3.0, 9.0, 0.0], [0, 0, 1, 2])
    """
    parts, starts, sizes, total = join(samples) if joined is None else joined
    joined_values = parts[0] if len(parts) == 1 else torch.cat(parts)
    lengths = np.asarray(sizes, np.int64)
    begins = np.asarray(starts, np.int64)
    ends = np.cumsum(lengths)
    if total == int(ends[-1]) and np.array_equal(begins, ends - lengths):
        values = joined_values  # in order, nothing left out
    else:
        inside = np.arange(int(ends[-1])) - np.repeat(ends - lengths, lengths)
        values = joined_values.index_select(0, _on(np.repeat(begins, lengths) + inside, device))
    segments = torch.repeat_interleave(torch.arange(len(sizes)), torch.from_numpy(lengths))
    return values, segments.to(device, non_blocking=True)


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
    "Piece",
    "Row",
    "Sample",
    "Summary",
    "as_tensor",
    "device_of",
    "size_of",
    "Joined",
    "join",
    "end_to_end",
    "histograms",
    "pack",
    "unpack",
    "reject_outliers",
    "bin_edges",
    "NUM_BINS",
    "Histograms",
    "tensor_stats",
]
