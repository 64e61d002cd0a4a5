"""Statistics over ALL values of a tensor (never a sample), as one small vector of
``EXACT_FIELDS`` on the tensor's device: what the explorer stores beside each sampled histogram
so that no spike is hidden (true min/max, mean, std, NaN/inf/zero counts).

A logged training step measures hundreds of tensors, from a 2M-value convolution weight to a
64-value norm bias: large tensors are read by a few fast reductions each (the cost is the passes
over their memory), small ones are copied when seen and measured together later, stacked by
length (the cost there is per call, not per value).
"""

from __future__ import annotations

import ctypes
import math
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch

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
    x = t.reshape(-1)
    if not x.is_floating_point():
        x = x.to(_exact_dtype(x.device))
    elif x.element_size() < 4:  # half precision: centre the values in float32
        x = x.float()
    if x.is_cpu:  # reading a value costs no sync there: a tensor without NaN/inf is cheap
        total = float(x.sum())
        if math.isfinite(total):
            return _finite_summary(x, total, line)
    exact = _exact_dtype(x.device)
    nan = torch.full((), float("nan"), dtype=exact, device=x.device)
    return _summary_with_nonfinite(x, nan, nan if line is None else line.detach().to(exact).reshape(()))


def _finite_summary(x: torch.Tensor, total: float, line: Optional[torch.Tensor]) -> torch.Tensor:
    """On the CPU, where reading a value is free: three fast reductions in the tensor's own
    dtype (torch accumulates them in double there) and a zero count, read as Python floats (a
    few 0-d tensor operations would cost more than the reductions). Values far from zero
    relative to their spread are centred first."""
    n = x.numel()
    mean = total / n
    lo, hi = (v.item() for v in torch.aminmax(x))
    m2 = float(torch.linalg.vector_norm(x)) ** 2 - n * mean * mean
    if m2 <= 1e4 * n * mean * mean * torch.finfo(x.dtype).eps:  # cancellation: centre first
        m2 = float(torch.linalg.vector_norm(x - mean)) ** 2
    zeros = _count_zeros(x) if lo <= 0.0 <= hi else 0
    last = float("nan") if line is None else float(line)
    return torch.from_numpy(np.array([n, mean, max(m2, 0.0), lo, hi, 0, 0, 0, zeros, last], np.float64))


_WORDS = {2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}
_SMALLEST = {size: -(2 ** (8 * size - 1)) for size in _WORDS}  # the bits of -0.0, read as an integer


def _count_zeros(x: torch.Tensor) -> int:
    """How many values of a CPU float tensor are exactly zero (+0.0 or -0.0), about 3x faster
    than torch's ``(x == 0).sum()``. The values are read as integers of their width: +0.0 is the
    integer 0, and -0.0 is the smallest integer (sign bit alone), which no other value is, so
    one fast count of nonzero words and one minimum settle it, unless a -0.0 is present.
    numpy reads the memory through ctypes, not ``x.numpy()``: that would mark the storage as not
    resizable for good, and FSDP frees a parameter by resizing its storage to nothing.

    Example:
        >>> _count_zeros(torch.tensor([0.0, -0.0, 1e-45, -2.0, float("nan")]))
        2
    """
    x = x.contiguous()
    word = _WORDS[x.element_size()]
    words = np.ctypeslib.as_array((word * x.numel()).from_address(x.data_ptr()))
    zeros = x.numel() - int(np.count_nonzero(words))
    smallest = _SMALLEST[x.element_size()]
    if words.min() == smallest:  # some -0.0
        zeros += int(np.count_nonzero(words == smallest))
    return zeros


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


def row_summaries(rows: Sequence[torch.Tensor], median_line: bool = False) -> List[torch.Tensor]:
    """The ``exact_summary`` of each 1-D tensor of ``rows``, in a fixed number of operations per
    distinct (length, device): one call per small tensor would cost far more than its values.
    ``median_line``: each row's median (NaN left out) as its line, as per-sample gradient norms
    have; else the line is NaN.

    Example:
        >>> row = row_summaries([torch.tensor([3.0, 1.0, 2.0])], median_line=True)[0]
        >>> dict(zip(EXACT_FIELDS, row.tolist()))["mean"], row[3].item(), row[-1].item()
        (2.0, 1.0, 2.0)
    """
    groups: Dict[tuple, List[int]] = {}
    for i, v in enumerate(rows):
        groups.setdefault((v.numel(), v.device), []).append(i)
    placed: Dict[int, torch.Tensor] = {}
    inf = float("inf")
    for (_, device), indices in groups.items():
        x = torch.stack([rows[i].reshape(-1) for i in indices]).to(_exact_dtype(device))
        finite = torch.isfinite(x)
        count = finite.sum(1, dtype=x.dtype)
        z = torch.where(finite, x, 0.0)
        mean = z.sum(1) / count.clamp_min(1)
        deviation = torch.where(finite, z - mean[:, None], 0.0)
        none = count == 0
        nan = torch.full_like(mean, float("nan"))
        table = torch.stack(
            [
                count,
                torch.where(none, nan, mean),
                (deviation * deviation).sum(1),
                torch.where(none, nan, torch.where(finite, x, inf).amin(1)),
                torch.where(none, nan, torch.where(finite, x, -inf).amax(1)),
                torch.isnan(x).sum(1, dtype=x.dtype),
                (x == inf).sum(1, dtype=x.dtype),
                (x == -inf).sum(1, dtype=x.dtype),
                (x == 0).sum(1, dtype=x.dtype),
                x.nanmedian(dim=1).values if median_line else nan,
            ],
            dim=1,
        )
        placed.update(zip(indices, table))
    return [placed[i] for i in range(len(rows))]


# Tensors up to this many values are measured in batches (``LazySummary``); larger ones at once.
SMALL = 16384


class LazySummary:
    """The exact summary of a tensor, measured later (``resolve``, on the watch's writer thread)
    from values nothing changes meanwhile: a copy taken when the tensor was seen (small tensors),
    or a buffer of the watch's own. ``then``: applied to the summary once measured."""

    __slots__ = ("values", "summary", "then")

    def __init__(self, values: torch.Tensor, then: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        self.values: Optional[torch.Tensor] = values
        self.summary: Optional[torch.Tensor] = None
        self.then = then

    @property
    def measured(self) -> bool:
        """Whether it has been measured (its values are let go then)."""
        return self.values is None

    @staticmethod
    def resolve(pending: Sequence["LazySummary"]) -> None:
        """Measure all that are not measured yet: the small ones in one batch."""
        todo = list({id(s): s for s in pending if s.values is not None}.values())
        small = [s for s in todo if s.values.numel() <= SMALL]  # type: ignore[union-attr]
        found = dict(zip(map(id, small), row_summaries([s.values for s in small])))  # type: ignore[misc]
        for s in todo:
            row = found[id(s)] if id(s) in found else exact_summary(s.values)  # type: ignore[arg-type]
            s.summary = s.then(row) if s.then is not None and row is not None else row
            s.values = None


def measure(tensor: torch.Tensor, copy: Optional[torch.Tensor] = None) -> Optional[Union[torch.Tensor, LazySummary]]:
    """``exact_summary(tensor)`` now, or for a small tensor a ``LazySummary`` of a copy of it
    (``copy``: a 1-D copy of all its values already taken, e.g. a sample that holds them all).

    Example:
        >>> lazy = measure(torch.tensor([1.0, -1.0]))
        >>> LazySummary.resolve([lazy]); lazy.summary[1].item()
        0.0
    """
    t = tensor.detach()
    if t.numel() > SMALL or t.is_complex() or t.layout != torch.strided or t.is_meta or t.numel() == 0:
        return exact_summary(t)
    if copy is None or copy.dtype != t.dtype:
        copy = t.reshape(-1).clone() if t.is_floating_point() else t.reshape(-1).to(_exact_dtype(t.device))
    return LazySummary(copy)


def summary_norm(rows: torch.Tensor) -> torch.Tensor:
    """The L2 norm of all values from their ``EXACT_FIELDS`` (the last dimension of ``rows``):
    NaN when there was a NaN, inf when there was an infinity, as ``vector_norm`` of the values.

    Example:
        >>> summary_norm(exact_summary(torch.tensor([3.0, 4.0]))).item()
        5.0
    """
    if rows.dim() == 1 and rows.is_cpu:  # one row on the host: plain floats cost far less than tensor ops
        count, mean, m2, _, _, nan, posinf, neginf = rows[:8].tolist()
        value = math.sqrt(max(m2, 0.0) + (count * mean * mean if count > 0 else 0.0))
        value = float("nan") if nan > 0 else float("inf") if posinf + neginf > 0 else value
        return torch.tensor(value, dtype=rows.dtype)
    count, mean, m2 = rows[..., 0], rows[..., 1], rows[..., 2]
    norm = torch.sqrt(m2.clamp_min(0) + count * torch.where(count > 0, mean, 0) ** 2)
    norm = torch.where(rows[..., 6] + rows[..., 7] > 0, float("inf"), norm)
    return torch.where(rows[..., 5] > 0, float("nan"), norm)


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
