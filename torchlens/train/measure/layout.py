"""Where each value of a batch of tensors is read from, decided on the host before any kernel:
rows of ``BLOCK`` values (``rows.py`` reduces them), and the positions of each tensor's sample.

A tensor of at least ``BIG`` values whose memory is one dense float block of the computing
dtype is read in place, viewed as rows (no copy; its last ``numel % BLOCK`` values are packed);
the others are packed end to end into buffers of at most ``CHUNK`` values, each padded with
NaN to a whole row (the pads are then taken off the NaN count). Every block of rows, view or
buffer, costs the same few kernels whatever the number of tensors in it, and the temporaries
of one block are bounded by ``CHUNK`` values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

BLOCK = 1024  # values per row
CHUNK = 1 << 24  # values per block of rows at most (bounds the memory a flush borrows)
BIG = 1 << 22  # a tensor this large is read in place where it can be


def compute_dtype(dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype a tensor's values are measured in: float32 for float32 and half precision,
    float64 for float64, integers and booleans (as ``exact_summary`` does); None for the others
    (complex, float8, quantized: measured one at a time, or not at all)."""
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    if dtype in _OTHER or dtype.is_complex:
        return None
    if dtype == torch.float64 or not dtype.is_floating_point:
        return torch.float64
    return None


_OTHER = {
    getattr(torch, name) for name in ("quint8", "qint8", "qint32", "quint4x2", "quint2x4") if hasattr(torch, name)
}
_OTHER |= {
    getattr(torch, f"uint{b}") for b in (16, 32, 64) if hasattr(torch, f"uint{b}")
}  # no cat/comparison kernels everywhere


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` as a 1-D tensor in memory order: a view where they are one dense
    block (contiguous, channels-last, any permutation), else a copy. Statistics and uniform
    samples do not depend on the order.

    Example:
        >>> x = torch.arange(6.0).reshape(2, 3).t()
        >>> flat_view(x).tolist(), flat_view(x).data_ptr() == x.data_ptr()
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], True)
    """
    if t.is_contiguous():
        return t.view(-1)
    expected = 1
    pairs = sorted(((st, s) for s, st in zip(t.shape, t.stride()) if s != 1))
    for stride, size in pairs:
        if stride != expected:
            return t.reshape(-1)
        expected *= size
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


@dataclass(eq=False)
class Block:
    """One 2-D block of rows: a view of a tensor's memory (``view``), or a buffer to fill by
    concatenating ``pieces`` (1-D values and NaN pads) into ``rows`` x ``BLOCK`` values."""

    dtype: torch.dtype
    rows: int = 0
    view: Optional[torch.Tensor] = None
    pieces: List[torch.Tensor] = field(default_factory=list)
    owner: List[Tuple[int, int]] = field(default_factory=list)  # (tensor, its rows here), in row order
    # sample positions within the block's flattened values: (slot in the batch's sample, base,
    # span): the value read is at base + floor(u * span), u uniform in [0, 1) (span 0: base)
    slot: List[np.ndarray] = field(default_factory=list)
    base: List[np.ndarray] = field(default_factory=list)
    span: List[np.ndarray] = field(default_factory=list)


@dataclass
class Plan:
    """The blocks of a batch of tensors of one device, each tensor's pads, and where each
    tensor's sample lies in the batch's sample vector (``spans[i]``: start, stop)."""

    blocks: List[Block]
    pads: np.ndarray
    spans: List[Tuple[int, int]]
    samples: int


def plan(
    flats: Sequence[torch.Tensor],
    dtypes: Sequence[torch.dtype],
    sample_n: int,
    rng: np.random.Generator,
    whole_views: bool = False,
) -> Plan:
    """Lay out the 1-D ``flats`` (measured in ``dtypes``, see ``compute_dtype``) as blocks of
    rows, with ``sample_n`` sample positions per tensor (all its values when it has fewer);
    ``rng`` splits a sample between the blocks a tensor spans (in proportion to their values).
    ``whole_views``: a tensor read in place is one block however large (the compiled kernel
    needs no temporaries to bound).

    Example:
        >>> p = plan([torch.zeros(3), torch.zeros(2000)], [torch.float32] * 2, 5, np.random.default_rng(0))
        >>> [b.rows for b in p.blocks], p.pads.tolist(), p.spans
        ([3], [1021, 48], [(0, 3), (3, 8)])
    """
    blocks: List[Block] = []
    pads = np.zeros(len(flats), np.int64)
    spans: List[Tuple[int, int]] = []
    packing: Optional[Block] = None
    cursor = 0
    order = sorted(range(len(flats)), key=lambda i: str(dtypes[i]))  # one packed buffer per dtype at a time
    placed: List[List[Tuple[Block, int, int]]] = [[] for _ in flats]  # (block, offset, length) of each piece
    for i in order:
        f, dtype = flats[i], dtypes[i]
        n = f.numel()
        start = 0
        if n >= BIG and f.dtype == dtype:
            whole = n // BLOCK
            step = whole if whole_views else CHUNK // BLOCK
            for r0 in range(0, whole, step):
                r1 = min(whole, r0 + step)
                block = Block(dtype, rows=r1 - r0, view=f[r0 * BLOCK : r1 * BLOCK].view(r1 - r0, BLOCK))
                block.owner = [(i, r1 - r0)]
                blocks.append(block)
                placed[i].append((block, 0, (r1 - r0) * BLOCK))
            start = whole * BLOCK
        while start < n:
            if packing is None or packing.dtype != dtype or packing.rows * BLOCK >= CHUNK:
                packing = Block(dtype)
                blocks.append(packing)
            take = min(n - start, CHUNK - packing.rows * BLOCK)
            rows = -(-take // BLOCK)
            pad = rows * BLOCK - take
            packing.pieces.append(f[start : start + take])
            if pad:
                packing.pieces.append(_nan_pad(f.device, dtype)[:pad])
            placed[i].append((packing, packing.rows * BLOCK, take))
            packing.owner.append((i, rows))
            packing.rows += rows
            pads[i] += pad
            start += take
    for i in range(len(flats)):
        n = flats[i].numel()
        k = min(n, sample_n)
        spans.append((cursor, cursor + k))
        pieces = placed[i]
        if n <= sample_n:  # every value, in order
            offset = cursor
            for block, at, length in pieces:
                block.slot.append(np.arange(offset, offset + length))
                block.base.append(np.arange(at, at + length))
                block.span.append(np.zeros(length, np.int64))
                offset += length
        else:
            counts = [k] if len(pieces) == 1 else rng.multinomial(k, [p[2] / n for p in pieces]).tolist()
            offset = cursor
            for (block, at, length), c in zip(pieces, counts):
                block.slot.append(np.arange(offset, offset + c))
                block.base.append(np.full(c, at, np.int64))
                block.span.append(np.full(c, length, np.int64))
                offset += c
        cursor += k
    return Plan(blocks, pads, spans, cursor)


_PADS: dict = {}


def _nan_pad(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``BLOCK`` NaNs on ``device`` (kept: every flush pads with slices of it)."""
    key = (device, dtype)
    pad = _PADS.get(key)
    if pad is None:
        pad = _PADS[key] = torch.full((BLOCK,), float("nan"), dtype=dtype, device=device)
    return pad


__all__ = ["BLOCK", "CHUNK", "BIG", "Block", "Plan", "plan", "flat_view", "compute_dtype"]
