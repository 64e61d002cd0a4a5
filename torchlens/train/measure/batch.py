"""The exact statistics and the samples of a batch of tensors, in a number of kernels that does
not grow with the number of tensors (per device: one copy of the host's layout to the device,
one packing copy per buffer, ``row_stats`` per block of rows, one merge, one random draw, and
one gather per block for the samples).

The fields are ``EXACT_FIELDS`` (``torchlens.web.exact``) with their meaning there: counts of
every value, mean, spread, min and max of the finite ones; ``exact_summary`` of each tensor
gives the same within float rounding (see ``rows.py`` for the precision). Nothing here reads a
value on the host: on a GPU the whole batch is queued without waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from .layout import BLOCK, Block, compute_dtype, flat_view, plan
from .rows import COMPILED, merge_rows, row_stats


def measurable(t: torch.Tensor) -> bool:
    """Whether ``measure_batch`` measures ``t``: a plain dense tensor (or parameter) with values,
    of a dtype it reads (float, integer, bool; not complex, float8 or quantized)."""
    return (
        type(t) in (torch.Tensor, nn.Parameter)
        and t.layout == torch.strided
        and not t.is_meta
        and t.numel() > 0
        and compute_dtype(t.dtype) is not None
    )


@dataclass
class Batch:
    """What ``measure_batch`` found: ``rows[i]`` (row ``where[i][1]`` of ``tables[where[i][0]]``,
    or None where ``tensors[i]`` is not ``measurable``) and ``samples[i]`` (float32, on the
    tensor's device)."""

    tables: Dict[torch.device, torch.Tensor]
    rows: List[Optional[torch.Tensor]]
    samples: List[Optional[torch.Tensor]]
    where: List[Optional[Tuple[torch.device, int]]]


def measure_batch(
    tensors: Sequence[torch.Tensor],
    sample_n: Optional[int],
    generator: Callable[[torch.device], Optional[torch.Generator]],
    rng: np.random.Generator,
) -> Batch:
    """``EXACT_FIELDS`` of every value of each tensor (one (N, 10) float64 table per device),
    and a float32 sample of ``sample_n`` of its values drawn uniformly with replacement (all
    of them, in order, when it has fewer; every value when ``sample_n`` is None).
    ``generator(device)``: the generator of the draw on that device; ``rng``: the host's, which
    splits the sample of a tensor read in several blocks.

    Example:
        >>> b = measure_batch([torch.tensor([1.0, float("inf")]), torch.arange(5)], 3,
        ...                   lambda d: None, np.random.default_rng(0))
        >>> b.rows[0][[0, 1, 6]].tolist(), b.rows[1][[1, 4, 8]].tolist(), b.samples[1].shape
        ([1.0, 1.0, 1.0], [2.0, 4.0, 1.0], torch.Size([3]))
    """
    rows: List[Optional[torch.Tensor]] = [None] * len(tensors)
    samples: List[Optional[torch.Tensor]] = [None] * len(tensors)
    tables: Dict[torch.device, torch.Tensor] = {}
    where: List[Optional[Tuple[torch.device, int]]] = [None] * len(tensors)
    by_device: Dict[torch.device, List[int]] = {}
    for i, t in enumerate(tensors):
        if measurable(t):
            by_device.setdefault(t.device, []).append(i)
    with torch.no_grad():
        for device, indices in by_device.items():
            found = _measure_device([tensors[i].detach() for i in indices], sample_n, generator(device), rng)
            tables[device] = found[0]
            for j, i in enumerate(indices):
                rows[i], samples[i], where[i] = found[0][j], found[1][j], (device, j)
    return Batch(tables, rows, samples, where)


def _measure_device(
    tensors: List[torch.Tensor], sample_n: Optional[int], generator: Optional[torch.Generator], rng: np.random.Generator
) -> tuple:
    device = tensors[0].device
    flats = [flat_view(t) for t in tensors]
    dtypes = [compute_dtype(t.dtype) for t in tensors]
    whole = device.type == "cuda" and COMPILED.get() is not None
    layout = plan(flats, dtypes, sample_n or 0, rng, whole_views=whole)  # type: ignore[arg-type]
    blocks = layout.blocks
    pairs = np.array([pair for b in blocks for pair in b.owner], np.int64).reshape(-1, 2)
    owner = np.repeat(pairs[:, 0], pairs[:, 1])
    numel = np.array([f.numel() for f in flats], np.int64)
    drawn = [b for b in blocks if b.slot] if sample_n is not None else []
    slots = [np.concatenate(b.slot) for b in drawn]
    bases = [np.concatenate(b.base) for b in drawn]
    spans = [np.concatenate(b.span) for b in drawn]
    # everything the kernels need from the host, in one copy
    parts = [owner, numel, layout.pads, *slots, *bases, *spans, *[np.maximum(s - 1, 0) for s in spans]]
    host = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    meta = _to_device(host, device)
    cuts = np.cumsum([len(p) for p in parts])[:-1].tolist()
    pieces = list(torch.tensor_split(meta, cuts)) if cuts else [meta]
    owner_d, numel_d, pads_d = pieces[0], pieces[1], pieces[2]
    k = len(drawn)
    slot_d, base_d, span_d, last_d = (pieces[3 + j * k : 3 + (j + 1) * k] for j in range(4))

    values = {id(b): _block_values(b, device) for b in blocks}
    stats = torch.cat([row_stats(v) for v in values.values()]) if len(values) > 1 else row_stats(values[id(blocks[0])])
    table = merge_rows(stats, owner_d, numel_d.to(stats.dtype), pads_d.to(stats.dtype))

    if sample_n is None:  # every value: a float32 copy of each tensor
        return table, [f.to(torch.float32, copy=True) for f in flats]
    sample = torch.empty(layout.samples, dtype=torch.float32, device=device)
    if drawn:
        total = sum(len(s) for s in slots)
        u = torch.rand(total, generator=generator, device=device, dtype=torch.float64)
        at = 0
        for j, block in enumerate(drawn):
            n = len(slots[j])
            local = torch.minimum((u[at : at + n] * span_d[j]).long(), last_d[j])
            picked = values[id(block)].reshape(-1).take(base_d[j] + local)
            sample.index_copy_(0, slot_d[j], picked.to(torch.float32))
            at += n
    return table, [sample[a:b] for a, b in layout.spans]


def _block_values(block: Block, device: torch.device) -> torch.Tensor:
    """The 2-D values of a block: its view, or its buffer filled by one concatenation."""
    if block.view is not None:
        return block.view
    buffer = torch.empty(block.rows * BLOCK, dtype=block.dtype, device=device)
    torch.cat(block.pieces, out=buffer)
    return buffer.view(block.rows, BLOCK)


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device`` without waiting: copied from pinned memory, asynchronously."""
    host = torch.from_numpy(np.ascontiguousarray(array, np.int64))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


__all__ = ["Batch", "measure_batch", "measurable"]
