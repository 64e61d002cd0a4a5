"""The exact statistics of one tensor: ``EXACT_FIELDS`` over ALL of its values (never a sample),
as one small vector on the tensor's device (true min/max, mean, spread, NaN/inf/zero counts).
The one rule both pages use: the explorer stores it beside each sampled histogram so that no
spike is hidden, and the graph page's details panel describes a saved activation with it
(``stats.tensor_stats``). The training watch measures many tensors at once, batched and later,
in ``torchlens/train/measure/exact.py``, with the same fields.
"""

from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple

import numpy as np
import torch

# Statistics over ALL values of a tensor (never a sample), as one small vector on the tensor's
# device. "finite" counts the finite values; mean, m2 (sum of squared deviations from the mean),
# min and max are over the finite values only (nan where there is none); nan/posinf/neginf/zeros
# count values; "line" is the series' summary scalar when it cannot be derived from the others.
EXACT_FIELDS = ("finite", "mean", "m2", "min", "max", "nan", "posinf", "neginf", "zeros", "line")


def exact_dtype(device: torch.device) -> torch.dtype:
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
        x = x.to(exact_dtype(x.device))
    elif x.element_size() < 4:  # half precision: centre the values in float32
        x = x.float()
    if x.is_cpu:  # reading a value costs no sync there: a tensor without NaN/inf is cheap
        total = float(x.sum())
        found = _finite_summary(x, total, line) if math.isfinite(total) else None
        if found is not None:
            return found
    exact = exact_dtype(x.device)
    nan = torch.full((), float("nan"), dtype=exact, device=x.device)
    return _summary_with_nonfinite(x, nan, nan if line is None else line.detach().to(exact).reshape(()))


_F64_EPS = torch.finfo(torch.float64).eps


def _finite_summary(x: torch.Tensor, total: float, line: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """On the CPU, where reading a value is free: three fast reductions in the tensor's own
    dtype (torch accumulates them in double there) and a zero count, read as Python floats (a
    few 0-d tensor operations would cost more than the reductions). Values far from zero
    relative to their spread are centred first. None where the norm overflows the dtype (finite
    values whose squares do not fit): the careful path measures those in float64."""
    n = x.numel()
    mean = total / n
    lo, hi = (v.item() for v in torch.aminmax(x))
    norm = float(torch.linalg.vector_norm(x))  # squared by multiplying: ``**`` raises on overflow
    m2 = norm * norm - n * mean * mean
    # cancellation: centre first where the error of the difference (a few units of the float64
    # accumulation, or of the dtype's rounding) could exceed ~1e-7 of the spread
    if m2 <= max(1e4 * torch.finfo(x.dtype).eps, 1e8 * _F64_EPS) * n * mean * mean:
        centred = x - mean  # in x's dtype, about a rounded mean: its residual sum corrects that
        norm = float(torch.linalg.vector_norm(centred))
        residual = float(centred.sum())
        m2 = norm * norm - residual * residual / n
    if not math.isfinite(m2):
        return None
    zeros = _count_zeros(x) if lo <= 0.0 <= hi else 0
    return _row(n, (mean, max(m2, 0.0), lo, hi, zeros), line)


def _row(n: int, moments: Tuple[float, float, float, float, int], line: Optional[torch.Tensor]) -> torch.Tensor:
    """``EXACT_FIELDS`` of ``n`` finite values from plain floats: their (mean, m2, min, max, zeros)."""
    mean, m2, lo, hi, zeros = moments
    last = float("nan") if line is None else float(line)
    return torch.from_numpy(np.array([n, mean, m2, lo, hi, 0, 0, 0, zeros, last], np.float64))


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


__all__ = ["EXACT_FIELDS", "exact_summary", "exact_dtype"]
