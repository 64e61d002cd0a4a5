"""Statistics over ALL values of a tensor (never a sample), as one small vector of
``EXACT_FIELDS`` on the tensor's device: what the explorer stores beside each sampled histogram
so that no spike is hidden (true min/max, mean, std, NaN/inf/zero counts).

A logged training step measures hundreds of tensors, from a 2M-value convolution weight to a
64-value norm bias. Each must be seen before anything changes it, but need not be measured then:
small ones are copied when seen and measured together later, stacked by length (their cost is
per call, not per value); large CPU ones are copied into reused buffers of the watch
(``CopyPool``: one pass that writes, against the four or five that read to measure them) and
measured later on the writer thread; the others (on a GPU, or
past the pool's limit) are read at once by a few fast reductions each.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

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
        found = _finite_summary(x, total, line) if math.isfinite(total) else None
        if found is not None:
            return found
    exact = _exact_dtype(x.device)
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
    from values nothing changes meanwhile: a copy taken when the tensor was seen, or a buffer of
    the watch's own. ``then``: applied to the summary once measured; ``release``: given the
    values once measured (a ``CopyPool`` takes its buffer back); ``draw``: draws ``sample`` (for
    the histogram) from the values before they are let go."""

    __slots__ = ("values", "summary", "then", "release", "draw", "sample")

    def __init__(
        self,
        values: torch.Tensor,
        then: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        release: Optional[Callable[[torch.Tensor], None]] = None,
    ) -> None:
        self.values: Optional[torch.Tensor] = values
        self.summary: Optional[torch.Tensor] = None
        self.then = then
        self.release = release
        self.draw: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None
        self.sample: Optional[torch.Tensor] = None

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
            values = s.values
            if values is None:  # measured meanwhile, by a ``then`` that needed it
                continue
            row = found[id(s)] if id(s) in found else exact_summary(values)
            s.summary = s.then(row) if s.then is not None and row is not None else row
            if s.draw is not None:
                s.sample = s.draw(values)
            s.values = None  # after the summary: another thread reads ``measured``, then ``summary``
            if s.release is not None:
                s.release(values)


def _default_limit() -> int:
    """Bytes of host memory a watch may hold in copies awaiting measurement: 1 GiB, or an eighth
    of the machine's memory when that is less."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return min(1 << 30, total // 8)


class CopyPool:
    """Host buffers holding copies of large CPU tensors until the writer thread measures them.

    Copying a tensor costs about a third of measuring it (one pass that writes against four
    that read), so a logged step on the CPU copies and leaves the measuring to the writer
    thread. Buffers are reused from step to step (a fresh one costs its page faults), and all of
    them together, busy or free, never exceed ``limit`` bytes: past that, free buffers of other
    sizes are dropped, and if that is not enough the caller measures on its own thread.

    Example:
        >>> pool = CopyPool(limit=1 << 20)
        >>> kept = pool.copy_of(torch.arange(20000.0))
        >>> kept[-1].item(), pool.owned
        (19999.0, 80000)
        >>> pool.give(kept); pool.copy_of(torch.ones(300000)) is None  # over the limit
        True
    """

    def __init__(self, limit: Optional[int] = None) -> None:
        self.limit = _default_limit() if limit is None else limit
        self.owned = 0  # bytes of the buffers alive, busy or free
        self._free: Dict[Tuple[int, torch.dtype], List[torch.Tensor]] = {}
        self._lock = threading.RLock()  # a buffer's finalizer may run while the lock is held

    def copy_of(self, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        """A 1-D copy of ``tensor`` (on the CPU) in a buffer of the pool; None over the limit."""
        key = (tensor.numel(), tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
            if buffer is None:
                self._make_room(nbytes)
                if self.owned + nbytes > self.limit:
                    return None
                buffer = torch.empty(tensor.numel(), dtype=tensor.dtype)
                self.owned += nbytes
                weakref.finalize(buffer, self._forget, nbytes)
        buffer.view(tensor.shape).copy_(tensor)
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        """Take a buffer back once its values are measured."""
        with self._lock:
            self._free.setdefault((buffer.numel(), buffer.dtype), []).append(buffer)

    def clear(self) -> None:
        """Let go of the free buffers (busy ones go when their summaries are measured)."""
        with self._lock:
            self._free = {}

    def _make_room(self, nbytes: int) -> None:
        for key in list(self._free):
            if self.owned + nbytes <= self.limit:
                return
            del self._free[key]  # their finalizers lower ``owned``

    def _forget(self, nbytes: int) -> None:
        with self._lock:
            self.owned -= nbytes


def measure(
    tensor: torch.Tensor, copy: Optional[torch.Tensor] = None, pool: Optional[CopyPool] = None
) -> Optional[Union[torch.Tensor, LazySummary]]:
    """``exact_summary(tensor)``, now or later: a ``LazySummary`` of a copy of it for a small
    tensor, or for a large CPU tensor that ``pool`` has room to copy. ``copy``: a 1-D copy of all
    its values already taken (e.g. a sample that holds them all), measured later at no cost.

    Example:
        >>> lazy = measure(torch.tensor([1.0, -1.0]))
        >>> LazySummary.resolve([lazy]); lazy.summary[1].item()
        0.0
    """
    t = tensor.detach()
    if t.is_complex() or t.layout != torch.strided or t.is_meta or t.numel() == 0:
        return None
    if copy is not None and copy.dtype == t.dtype and copy.numel() == t.numel():
        return LazySummary(copy)
    if t.numel() <= SMALL:
        copy = t.reshape(-1).clone() if t.is_floating_point() else t.reshape(-1).to(_exact_dtype(t.device))
        return LazySummary(copy)
    kept = pool.copy_of(t) if pool is not None and t.is_cpu else None
    return exact_summary(t) if kept is None else LazySummary(kept, release=pool.give)  # type: ignore[union-attr]


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
