"""Triton kernels that read the rows and the samples of all sources of one dtype (every
tensor read in place and the packed buffer) in one launch each, through a small table of the
sources' addresses, and merge the rows of every tensor in one more: the number of launches of a
phase does not grow with its tensors.

``row_kernel``: program ``r`` reduces row ``r`` (the ``row_n[r]`` values at ``row_at[r]`` in
source ``row_src[r]``: ``BLOCK`` of them but in the last row of a tensor read at its own
address, whose missing values count as NaN pads) into the columns of ``rows.ROW_COLUMNS``, all in float64 (the values widened
first: the sum, the row's mean and the squared deviations from it are float64). ``gather_kernel``:
value ``g`` of the draws (at ``at[g]`` in source ``draw_src[g]``) is written, as float32, to
``out[slot[g]]``. ``merge_kernel``: program ``j`` merges the rows of tensor ``j`` into its
``EXACT_FIELDS`` as ``rows.merge_rows`` does (Chan's formula, float64). Where Triton is missing, or fails to compile, torch's eager code does the same
(``rows.row_stats_eager``, ``take``); ``TORCHLENS_MEASURE_TRITON=0`` turns the kernels off.
Tests run them on the CPU with Triton's interpreter (``Kernels(interpret=True)``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Optional, Tuple

import torch

from .layout import ADDRESSED_DTYPES, BLOCK


def _define() -> tuple:
    """The kernels (``triton.jit`` functions); ImportError without Triton."""
    import triton
    import triton.language as tl

    return _row_kernel(triton, tl), _gather_kernel(triton, tl), _merge_kernel(triton, tl)


def _row_kernel(triton: Any, tl: Any) -> Any:
    """Program ``r``: the 8 row statistics of row ``r`` (``ROW_COLUMNS`` of rows.py)."""

    @triton.jit
    def row_kernel(ptrs, row_src, row_at, row_n, out, DTYPE: tl.constexpr, WIDTH: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        src = tl.load(row_src + r)
        base = tl.load(ptrs + src).to(tl.pointer_type(DTYPE))
        lanes = tl.arange(0, WIDTH)
        # past a tensor's end (its last row, read at its address): NaN, taken off as a pad is
        inside = lanes < tl.load(row_n + r)
        x = tl.load(base + tl.load(row_at + r) + lanes, mask=inside, other=float("nan")).to(tl.float64)
        inf = float("inf")
        finite = (x == x) & (x != inf) & (x != -inf)
        count = tl.sum(finite.to(tl.float64), axis=0)
        total = tl.sum(tl.where(finite, x, 0.0), axis=0)
        mean = total / tl.maximum(count, 1.0)
        deviation = tl.where(finite, x - mean, 0.0)
        row = out + r * 8
        tl.store(row, count)
        tl.store(row + 1, total)
        tl.store(row + 2, tl.sum((x != x).to(tl.float64), axis=0))
        tl.store(row + 3, tl.sum((x == inf).to(tl.float64), axis=0))
        tl.store(row + 4, tl.sum((x == 0.0).to(tl.float64), axis=0))
        tl.store(row + 5, tl.sum(deviation * deviation, axis=0))
        tl.store(row + 6, tl.min(tl.where(finite, x, inf), axis=0))
        tl.store(row + 7, tl.max(tl.where(finite, x, -inf), axis=0))

    return row_kernel


def _gather_kernel(triton: Any, tl: Any) -> Any:
    """The samples: value ``g`` of the draw read from its source and stored at its slot."""

    @triton.jit
    def gather_kernel(ptrs, draw_src, at, slot, out, n, DTYPE: tl.constexpr, SPAN: tl.constexpr):
        g = tl.program_id(0).to(tl.int64) * SPAN + tl.arange(0, SPAN)
        inside = g < n
        src = tl.load(draw_src + g, mask=inside, other=0)
        base = tl.load(ptrs + src, mask=inside, other=0).to(tl.pointer_type(DTYPE))
        value = tl.load(base + tl.load(at + g, mask=inside, other=0), mask=inside, other=0.0)
        tl.store(out + tl.load(slot + g, mask=inside, other=0), value.to(tl.float32), mask=inside)

    return gather_kernel


def _merge_kernel(triton: Any, tl: Any) -> Any:
    """Program ``j``: the ``EXACT_FIELDS`` of tensor ``j`` from its rows."""

    @triton.jit
    def merge_kernel(stats, runs, numel, pads, out, CH: tl.constexpr):
        # program j: the rows of tensor j (at most two runs: its body in place, its packed tail)
        j = tl.program_id(0).to(tl.int64)
        inf = float("inf")
        lanes = tl.arange(0, CH)
        count = tl.zeros([CH], dtype=tl.float64)
        total = tl.zeros([CH], dtype=tl.float64)
        nan = tl.zeros([CH], dtype=tl.float64)
        posinf = tl.zeros([CH], dtype=tl.float64)
        zeros = tl.zeros([CH], dtype=tl.float64)
        lo = tl.full([CH], inf, dtype=tl.float64)
        hi = tl.full([CH], -inf, dtype=tl.float64)
        for k in tl.static_range(2):
            first = tl.load(runs + j * 4 + 2 * k)
            n = tl.load(runs + j * 4 + 2 * k + 1)
            for start in range(0, n, CH):
                inside = start + lanes < n
                row = stats + (first + start + lanes) * 8
                c = tl.load(row, mask=inside, other=0.0)
                count += c
                total += tl.load(row + 1, mask=inside, other=0.0)
                nan += tl.load(row + 2, mask=inside, other=0.0)
                posinf += tl.load(row + 3, mask=inside, other=0.0)
                zeros += tl.load(row + 4, mask=inside, other=0.0)
                lo = tl.minimum(lo, tl.where(c > 0, tl.load(row + 6, mask=inside, other=inf), inf))
                hi = tl.maximum(hi, tl.where(c > 0, tl.load(row + 7, mask=inside, other=-inf), -inf))
        n_finite = tl.sum(count, axis=0)
        mean = tl.sum(total, axis=0) / tl.maximum(n_finite, 1.0)
        m2 = tl.zeros([CH], dtype=tl.float64)
        for k in tl.static_range(2):  # Chan: each row's spread about its own mean, moved to the mean
            first = tl.load(runs + j * 4 + 2 * k)
            n = tl.load(runs + j * 4 + 2 * k + 1)
            for start in range(0, n, CH):
                inside = start + lanes < n
                row = stats + (first + start + lanes) * 8
                c = tl.load(row, mask=inside, other=0.0)
                apart = tl.load(row + 1, mask=inside, other=0.0) / tl.maximum(c, 1.0) - mean
                m2 += tl.load(row + 5, mask=inside, other=0.0) + c * apart * apart
        none = n_finite == 0
        nans = tl.sum(nan, axis=0) - tl.load(pads + j)
        n_posinf = tl.sum(posinf, axis=0)
        missing = float("nan")
        o = out + j * 10
        tl.store(o, n_finite)
        tl.store(o + 1, tl.where(none, missing, mean))
        tl.store(o + 2, tl.sum(m2, axis=0))
        tl.store(o + 3, tl.where(none, missing, tl.min(lo, axis=0)))
        tl.store(o + 4, tl.where(none, missing, tl.max(hi, axis=0)))
        tl.store(o + 5, nans)
        tl.store(o + 6, n_posinf)
        tl.store(o + 7, tl.load(numel + j) - n_finite - nans - n_posinf)
        tl.store(o + 8, tl.sum(zeros, axis=0))
        tl.store(o + 9, missing)

    return merge_kernel


class Kernels:
    """The kernels, defined at first use (``get``); any failure to define or run them turns them
    off for the process (``disable``; torch's eager code gives the same fields).
    ``interpret``: run by Triton's interpreter, on CPU tensors (for tests; ``TRITON_INTERPRET=1``
    must be set before Triton is imported).

    Example:
        >>> Kernels().applies(torch.device("cpu")), Kernels().applies(torch.device("cuda"))
        (False, True)
    """

    def __init__(self, interpret: bool = False) -> None:
        self.interpret = interpret
        self.fns: Optional[tuple] = None
        self.error: Optional[str] = None  # why the kernels are not used
        self._lock = threading.Lock()
        if os.environ.get("TORCHLENS_MEASURE_TRITON", "1") == "0":
            self.error = "turned off by TORCHLENS_MEASURE_TRITON=0"

    def get(self) -> Optional[tuple]:
        if self.fns is not None or self.error is not None:
            return self.fns
        with self._lock:
            if self.fns is None and self.error is None:
                try:
                    from triton import knobs

                    if bool(knobs.runtime.interpret) != self.interpret:
                        # interpreted kernels read host memory: never a GPU's addresses
                        raise RuntimeError("Triton's interpreter is " + ("off" if self.interpret else "on"))
                    self.fns = _define()
                except Exception as error:  # no Triton, or it cannot build for this platform
                    self.error = f"{type(error).__name__}: {error}"
        return self.fns

    def disable(self, error: BaseException) -> None:
        self.fns, self.error = None, f"{type(error).__name__}: {error}"

    def applies(self, device: torch.device) -> bool:
        """Whether the kernels read tensors of ``device`` (CUDA; the CPU when interpreted)."""
        return (device.type == "cpu") == self.interpret and (self.interpret or device.type == "cuda")

    def rows(self, ptrs: torch.Tensor, rows: Tuple[torch.Tensor, ...], dtype: torch.dtype) -> Any:
        """(rows, 8) float64: ``ROW_COLUMNS`` of each row (see the module), the rows being given
        by ``rows`` = (row_src, row_at, row_n); None where the kernels are off."""
        fns = self.get()
        if fns is None:
            return None
        n = rows[0].numel()
        out = torch.empty(n, 8, dtype=torch.float64, device=rows[0].device)
        try:
            with _on(out.device):  # Triton launches on the current device: the tensors' one
                fns[0][(n,)](ptrs, *rows, out, DTYPE=_TL[dtype](), WIDTH=BLOCK, num_warps=4)
        except Exception as error:  # a compiler failure: the eager code from now on
            self.disable(error)
            return None
        return out

    def merge(self, stats: torch.Tensor, runs: torch.Tensor, numel: torch.Tensor, pads: torch.Tensor) -> Any:
        """(N, 10) float64: ``merge_rows`` of the rows ``stats`` of N tensors, tensor ``j``'s
        rows being the (first, count) runs ``runs[4j : 4j + 4]``; None where the kernels are off."""
        fns = self.get()
        if fns is None:
            return None
        out = torch.empty(numel.numel(), 10, dtype=torch.float64, device=stats.device)
        try:
            with _on(out.device):
                fns[2][(numel.numel(),)](stats, runs, numel, pads=pads, out=out, CH=256, num_warps=4)
        except Exception as error:
            self.disable(error)
            return None
        return out

    def gather(self, ptrs: torch.Tensor, index: tuple, out: torch.Tensor, dtype: torch.dtype) -> bool:
        """Write the draws ``index`` = (draw_src, at, slot) into ``out`` (float32); False where
        the kernels are off."""
        fns = self.get()
        n = index[0].numel()
        if fns is None:
            return False
        if n == 0:
            return True
        span = 1024
        grid = ((n + span - 1) // span,)
        try:
            with _on(out.device):
                fns[1][grid](ptrs, *index, out, n, DTYPE=_TL[dtype](), SPAN=span, num_warps=4)
        except Exception as error:
            self.disable(error)
            return False
        return True


def _on(device: torch.device) -> Any:
    """A context in which ``device`` is CUDA's current device (none for the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _tl_dtype(name: str) -> Callable[[], Any]:
    """Triton's dtype of that name, looked up when asked (Triton is imported only then)."""

    def get() -> Any:
        import triton.language as tl

        return getattr(tl, name)

    return get


# the dtypes the kernels read: those of the packed buffers and ADDRESSED_DTYPES (layout.py)
_TL = {dtype: _tl_dtype(str(dtype).rpartition(".")[2]) for dtype in ADDRESSED_DTYPES}

TRITON = Kernels()

__all__ = ["Kernels", "TRITON"]
