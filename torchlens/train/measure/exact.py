"""The exact statistics (``EXACT_FIELDS``, the one rule of ``torchlens/web/exact.py``) of a
training step's tensors: over ALL values of each (never a sample), so that no spike is hidden
beside the sampled histogram (true min/max, mean, std, NaN/inf/zero counts).

A logged training step measures hundreds of tensors, from a 2M-value convolution weight to a
64-value norm bias. Each must be seen before anything changes it, but need not be measured then:
small ones are copied when seen and measured together later, stacked by length (their cost is
per call, not per value); large CPU ones are copied into reused buffers of the watch
(``CopyPool``: one pass that writes, against the four or five that read to measure them) and
measured later on the writer thread; the others (on a GPU, or
past the pool's limit) are read at once by a few fast reductions each.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...web.exact import exact_dtype, exact_summary
from ...web.stats import Piece, Row, Sample, Summary, as_tensor, device_of, end_to_end, join


def row_summaries(rows: Sequence[Sample], median_line: bool = False) -> List[torch.Tensor]:
    """The ``exact_summary`` of each 1-D tensor (or ``Piece``) of ``rows``, in a fixed number of
    operations per device (one call per small tensor would cost far more than its values): all
    rows in one buffer, reduced by segment. ``median_line``: each row's median (NaN left out) as
    its line, as per-sample gradient norms have (one median per distinct length); else the line
    is NaN.

    Example:
        >>> from torchlens.web.exact import EXACT_FIELDS
        >>> row = row_summaries([torch.tensor([3.0, 1.0, 2.0])], median_line=True)[0]
        >>> dict(zip(EXACT_FIELDS, row.tolist()))["mean"], row[3].item(), row[-1].item()
        (2.0, 1.0, 2.0)
        >>> a, b = row_summaries([torch.tensor([1.0, float("inf")]), torch.tensor([0.0, 2.0, 4.0])])
        >>> a[[0, 1, 6]].tolist(), b[[0, 1, 2, 8]].tolist()
        ([1.0, 1.0, 1.0], [3.0, 2.0, 8.0, 1.0])
    """
    return [as_tensor(r) for r in table_rows(rows, median_line)]


def table_rows(rows: Sequence[Sample], median_line: bool = False) -> List[Row]:
    """``row_summaries``, each a ``Row`` of its device's table: no view per row (a logged step
    measures hundreds).

    Example:
        >>> values = torch.tensor([1.0, 2.0, 4.0, 8.0])
        >>> first, second = table_rows([Piece(values, 0, 2), Piece(values, 2, 2)])
        >>> first.table is second.table, second.at, second.table[1, 1].item()
        (True, 1, 6.0)
    """
    by_device: Dict[torch.device, List[int]] = {}
    for i, v in enumerate(rows):
        by_device.setdefault(device_of(v), []).append(i)
    placed: Dict[int, Row] = {}
    for device, indices in by_device.items():
        group = [r if type(r) is Piece or r.dim() == 1 else r.reshape(-1) for r in (rows[i] for i in indices)]  # type: ignore[union-attr]
        joined = join(group)
        sizes = joined.sizes
        # a row's fields depend on its own values only (the forward's rows are measured apart
        # from the gradients' or with them: the same step must give the same run)
        values, segment = end_to_end(group, device, joined)
        table = _segment_summaries(values, segment, len(group), exact_dtype(device))
        if median_line:
            _median_lines(table, values, sizes)
        placed.update((i, Row(table, j)) for j, i in enumerate(indices))
    return [placed[i] for i in range(len(rows))]


def _median_lines(table: torch.Tensor, values: torch.Tensor, sizes: List[int]) -> None:
    """Each row's median (NaN left out) written as its line: one median per distinct length
    (``values``: the rows end to end, ``sizes`` their lengths)."""
    by_length: Dict[int, List[int]] = {}
    for j, n in enumerate(sizes):
        by_length.setdefault(n, []).append(j)
    starts = np.cumsum(sizes) - np.asarray(sizes)
    for n, at in by_length.items():
        if n == 0:
            continue
        positions = (starts[at][:, None] + np.arange(n)[None, :]).reshape(-1)
        stacked = values.index_select(0, torch.from_numpy(positions).to(values.device)).view(len(at), n)
        table[at, -1] = stacked.to(table.dtype).nanmedian(dim=1).values


def _segment_summaries(x: torch.Tensor, segment: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``EXACT_FIELDS`` of each of ``n`` rows whose values lie end to end in ``x`` (``segment``:
    the row of each value): each field summed (or its min and max taken) per segment."""
    inf = float("inf")
    x = x.to(dtype)
    device = x.device

    def per_row(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=device).index_add_(0, segment, values.to(dtype))

    finite = torch.isfinite(x)
    count = per_row(finite)
    z = torch.where(finite, x, 0.0)
    mean = per_row(z) / count.clamp_min(1)
    deviation = torch.where(finite, z - mean[segment], 0.0)
    lo = torch.full((n,), inf, dtype=dtype, device=device).scatter_reduce_(
        0, segment, torch.where(finite, x, inf), "amin"
    )
    hi = torch.full((n,), -inf, dtype=dtype, device=device).scatter_reduce_(
        0, segment, torch.where(finite, x, -inf), "amax"
    )
    none = count == 0
    nan = torch.full_like(mean, float("nan"))
    return torch.stack(
        [
            count,
            torch.where(none, nan, mean),
            per_row(deviation * deviation),
            torch.where(none, nan, lo),
            torch.where(none, nan, hi),
            per_row(torch.isnan(x)),
            per_row(x == inf),
            per_row(x == -inf),
            per_row(x == 0),
            nan,
        ],
        dim=1,
    )


# Tensors up to this many values are measured in batches (``LazySummary``); larger ones at once.
SMALL = 16384


class LazySummary:
    """The exact summary of a tensor, measured later (``resolve``, on the watch's writer thread)
    from values nothing changes meanwhile: a copy taken when the tensor was seen, or a buffer of
    the watch's own. ``then``: applied to the summary once measured; ``release``: given the
    values once measured (a ``CopyPool`` takes its buffer back); ``draw``: draws ``sample`` (for
    the histogram) from the values before they are let go."""

    __slots__ = ("values", "_summary", "then", "release", "draw", "_sample")

    def __init__(
        self,
        values: torch.Tensor,
        then: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        release: Optional[Callable[[torch.Tensor], None]] = None,
    ) -> None:
        self.values: Optional[torch.Tensor] = values
        self._summary: Summary = None  # a ``Row`` of the table its batch was measured in, until read
        self.then = then
        self.release = release
        # draws the samples of several values at once (``Sampler.values_of``)
        self.draw: Optional[Callable[[Sequence[torch.Tensor]], List[Optional[torch.Tensor]]]] = None
        self._sample: Optional[Sample] = None  # a ``Piece`` of its batch's samples, until read

    @property
    def measured(self) -> bool:
        """Whether it has been measured (its values are let go then)."""
        return self.values is None

    @property
    def summary(self) -> Optional[torch.Tensor]:
        """The exact summary (None: none); its row of the batch's table is viewed when read."""
        found = self._summary
        if type(found) is Row:
            found = self._summary = as_tensor(found)
        return found  # type: ignore[return-value]

    @summary.setter
    def summary(self, row: Summary) -> None:
        self._summary = row

    def summary_ref(self) -> Summary:
        """The summary as it lies: a ``Row`` of a table, not viewed (the writer thread places a
        step's rows together), or a tensor."""
        return self._summary

    @property
    def sample(self) -> Optional[torch.Tensor]:
        """The sample for the histogram (None: none); its piece of the batch's samples is viewed
        when read."""
        found = self._sample
        if type(found) is Piece:
            found = self._sample = as_tensor(found)
        return found  # type: ignore[return-value]

    @sample.setter
    def sample(self, sample: Optional[Sample]) -> None:
        self._sample = sample

    def sample_ref(self) -> Optional[Sample]:
        """The sample as it lies: a ``Piece`` of a buffer, not viewed, or a tensor."""
        return self._sample

    @staticmethod
    @torch.no_grad()
    def resolve(pending: Sequence["LazySummary"]) -> None:
        """Measure all that are not measured yet: the small ones in one batch."""
        todo = list({id(s): s for s in pending if s.values is not None}.values())
        small = [s for s in todo if s.values.numel() <= SMALL]  # type: ignore[union-attr]
        found = dict(zip(map(id, small), table_rows([s.values for s in small])))  # type: ignore[misc]
        by_draw: Dict[Callable, List[LazySummary]] = {}
        for s in todo:
            if s.draw is not None:
                by_draw.setdefault(s.draw, []).append(s)
        for draw, drawn in by_draw.items():  # before any ``release`` gives a copy back
            for s, sample in zip(drawn, draw([s.values for s in drawn])):  # type: ignore[misc]
                s.sample = sample
        for s in todo:
            values = s.values
            if values is None:  # measured meanwhile, by a ``then`` that needed it
                continue
            row: Summary = found[id(s)] if id(s) in found else exact_summary(values)
            s.summary = s.then(as_tensor(row)) if s.then is not None and row is not None else row
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
    t = tensor.detach() if tensor.requires_grad else tensor  # each operation counts per tensor
    if t.is_complex() or t.layout != torch.strided or t.is_meta or t.numel() == 0:
        return None
    if copy is not None and copy.dtype == t.dtype and copy.numel() == t.numel():
        return LazySummary(copy)
    if t.numel() <= SMALL:
        flat = t if t.dim() == 1 else t.reshape(-1)
        return LazySummary(flat.to(kept_dtype(t.dtype, t.device), copy=True))
    kept = pool.copy_of(t) if pool is not None and t.is_cpu else None
    return exact_summary(t) if kept is None else LazySummary(kept, release=pool.give)  # type: ignore[union-attr]


def kept_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype of a copy measured later, stacked beside other rows: its own for float16 and
    wider; float8, integers and bool widened to ``exact_dtype`` (torch cannot promote float8
    beside other dtypes, and a row of integers is measured in floats anyway).

    Example:
        >>> kept_dtype(torch.bfloat16, torch.device("cpu")), kept_dtype(torch.int32, torch.device("cpu"))
        (torch.bfloat16, torch.float64)
    """
    return dtype if dtype.is_floating_point and dtype.itemsize > 1 else exact_dtype(device)


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


__all__ = [
    "SMALL",
    "row_summaries",
    "table_rows",
    "LazySummary",
    "CopyPool",
    "measure",
    "kept_dtype",
    "summary_norm",
    "combine_summaries",
]
