"""The exact statistics and the samples of a batch of tensors, in a number of kernels that does
not grow with the number of tensors (per device: one packing copy per computing dtype, one
``row_stats`` per tensor read in place and per buffer, one merge, one random draw, one gather
per source and one reordering of the samples). Where the Triton kernels of ``kernels.py`` run
(a GPU), two launches per dtype and one merge read every dense tensor at its own address: nothing is
packed, viewed or copied per tensor, only those with gaps or of integer and boolean dtypes are
packed first. A batch's samples stay one tensor per device, each tensor's a ``Piece`` of it
(no view until one is read).

The fields are ``EXACT_FIELDS`` (``torchlens.web.exact``) with their meaning there: counts of
every value, mean, spread, min and max of the finite ones; ``exact_summary`` of each tensor
gives the same within float rounding (see ``rows.py`` for the precision). Nothing here reads a
value on the host: on a GPU the whole batch is queued without waiting for it. The layout (what
is read where, and the index tensors on the device) is built once per signature of the batch
when a ``LayoutCache`` is given (``layout.py``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from ...web.stats import Piece, as_tensor
from .kernels import TRITON
from .layout import BLOCK, Group, LayoutCache, _flat, measurable, plan, signature
from .rows import COMPILED, merge_rows, row_stats


@dataclass
class Batch:
    """What ``measure_batch`` found: ``rows[i]`` (row ``where[i][1]`` of ``tables[where[i][0]]``,
    or None where ``tensors[i]`` is not ``measurable``) and ``samples[i]`` (float32, on the
    tensor's device). ``pieces[i]`` says where ``samples[i]`` lies among its group's samples: a
    logged step hands that on, so that no thread makes a view per tensor."""

    tables: Dict[torch.device, torch.Tensor]
    pieces: List[Optional[Piece]]
    where: List[Optional[Tuple[torch.device, int]]]

    @property
    def rows(self) -> List[Optional[torch.Tensor]]:
        """Each tensor's row of its device's table (made when asked: a logged step reads the
        rows of the tables' host copies instead, on the writer thread)."""
        return [None if w is None else self.tables[w[0]][w[1]] for w in self.where]

    @property
    def samples(self) -> List[Optional[torch.Tensor]]:
        """Each tensor's sample (made when asked, one view each)."""
        return [as_tensor(p) for p in self.pieces]


def measure_batch(
    tensors: Sequence[torch.Tensor],
    sample_n: Optional[int],
    generator: Callable[[torch.device], Optional[torch.Generator]],
    cache: Optional[LayoutCache] = None,
    keys: Optional[Tuple[Optional[tuple], ...]] = None,
) -> Batch:
    """``EXACT_FIELDS`` of every value of each tensor (one (N, 10) float64 table per device),
    and a float32 sample of ``sample_n`` of its values drawn uniformly with replacement (all
    of them, in order, when it has fewer; every value when ``sample_n`` is None; stratified over
    the sources a tensor is read from, see ``layout.py``). ``generator(device)``: the generator
    of the draw on that device. ``cache``: where the layout of the batch's signature is kept
    between calls (None: built for this call); ``keys``: ``signature(tensors)``, where the
    caller has it already.

    Example:
        >>> b = measure_batch([torch.tensor([1.0, float("inf")]), torch.arange(5)], 3, lambda d: None)
        >>> b.rows[0][[0, 1, 6]].tolist(), b.rows[1][[1, 4, 8]].tolist(), b.samples[1].shape
        ([1.0, 1.0, 1.0], [2.0, 4.0, 1.0], torch.Size([3]))
    """
    if keys is None:
        keys = signature(tensors)
    compiled = _compiled(keys)
    addressed = _addressed(keys)
    layout = (
        cache.get(keys, sample_n, compiled, addressed)
        if cache is not None
        else plan(keys, sample_n, compiled, addressed)
    )
    n = len(tensors)
    pieces: List[Optional[Piece]] = [None] * n
    where: List[Optional[Tuple[torch.device, int]]] = [None] * n
    tables: Dict[torch.device, torch.Tensor] = {}
    with torch.no_grad():
        for group in layout.groups:
            device = group.device
            measured = _measure_group(group, tensors, sample_n, generator(device))
            if measured is None:  # the kernels failed (and are off now): packed, as torch reads them
                return measure_batch(tensors, sample_n, generator, cache=cache, keys=keys)
            table, samples = measured
            tables[device] = table
            sizes = group.sizes
            starts = itertools.accumulate(sizes, initial=0)  # each member's place among the samples
            for j, (i, start) in enumerate(zip(group.members, starts)):
                pieces[i], where[i] = Piece(samples, start, sizes[j]), (device, j)
    return Batch(tables, pieces, where)


def _compiled(keys: Sequence[Optional[tuple]]) -> bool:
    """Whether a CUDA tensor's rows are read by the compiled kernel (one call per source, however
    large: it makes no temporaries). Triton is looked for at the first batch on a GPU."""
    if COMPILED.fn is not None:
        return True
    if COMPILED.error is not None:
        return False
    return any(k is not None and k[1].type == "cuda" for k in keys) and COMPILED.get() is not None


def _addressed(keys: Sequence[Optional[tuple]]) -> FrozenSet[torch.device]:
    """The devices whose tensors the Triton kernels read at their own addresses."""
    devices = {k[1] for k in keys if k is not None and TRITON.applies(k[1])}
    return frozenset(devices) if devices and TRITON.get() is not None else frozenset()


def _measure_group(
    group: Group, tensors: Sequence[torch.Tensor], sample_n: Optional[int], generator: Optional[torch.Generator]
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The table of ``group``'s members and their samples end to end; None where the group was laid out
    for the Triton kernels (``group.addressed``) and they failed."""
    device = group.device
    index = group.on_device()
    members = group.members
    sources: List[torch.Tensor] = []
    for source in group.sources:
        if not source.parts:
            member = tensors[members[source.member]]
            if group.addressed:  # the kernels read the tensor itself: its address is all they need
                sources.append(member)
            else:  # a tensor's body, read in place
                flat = _flat(member, group.modes[source.member])
                sources.append(flat[: source.rows * BLOCK].view(source.rows, BLOCK))
            continue
        pieces: List[torch.Tensor] = []
        for j, start, stop, whole, pad in source.parts:
            flat = _flat(tensors[members[j]], group.modes[j])
            pieces.append(flat if whole else flat[start:stop])
            if pad is not None:
                pieces.append(pad)
        values = torch.empty(source.rows * BLOCK, dtype=source.dtype, device=device)
        torch.cat(pieces, out=values)
        sources.append(values.view(source.rows, BLOCK))
    # the kernels of kernels.py read every source of a dtype at once, through their addresses
    ptrs = _addresses(sources, device) if TRITON.applies(device) and TRITON.get() is not None else None
    if group.addressed and ptrs is None:
        return None
    stats = _row_stats(group, sources, index, ptrs)
    if stats is None:
        return None
    table = TRITON.merge(stats, index["runs"], index["numel"], index["pads"]) if ptrs is not None else None
    if table is None:
        if group.addressed:
            return None
        table = merge_rows(stats, index["owner"], index["numel"], index["pads"])

    if sample_n is None:  # every value: a float32 copy of each tensor
        every = [_flat(tensors[i], mode).to(torch.float32) for i, mode in zip(members, group.modes)]
        return table, torch.cat(every)
    u = torch.rand(index["base"].numel(), generator=generator, device=device, dtype=torch.float64)
    at = torch.minimum((u * index["span"]).long(), index["last"]).add_(index["base"])
    sample = None
    if ptrs is not None:
        sample = torch.empty(at.numel(), dtype=torch.float32, device=device)
        for dtype, s0, s1, _, _, d0, d1 in group.by_dtype:
            draws = (index["draw_src"][d0:d1], at[d0:d1], index["slot"][d0:d1])
            if not TRITON.gather(ptrs[s0:s1], draws, sample, dtype):
                sample = None
                break
    if sample is None and group.addressed:
        return None
    if sample is None:  # torch's own: one gather per source
        drawn = [(sources[s], c) for s, c in enumerate(group.draws) if c]
        parts = at.split([c for _, c in drawn]) if len(drawn) > 1 else (at,)
        picked = [source.take(p) for (source, _), p in zip(drawn, parts)]
        values = torch.cat(picked) if len(picked) > 1 else picked[0]
        sample = values.to(torch.float32).index_select(0, index["order"])
    return table, sample


def _row_stats(
    group: Group, sources: List[torch.Tensor], index: Dict[str, torch.Tensor], ptrs: Optional[torch.Tensor]
) -> Optional[torch.Tensor]:
    """``ROW_COLUMNS`` of every row of the group's sources, in the order of ``index["owner"]``:
    one kernel per dtype, or ``row_stats`` per segment (None: the kernels failed on a group
    only they can read)."""
    found: List[torch.Tensor] = []
    for dtype, s0, s1, r0, r1, _, _ in group.by_dtype:
        if ptrs is not None:
            rows = (index["row_src"][r0:r1], index["row_at"][r0:r1], index["row_n"][r0:r1])
            got = TRITON.rows(ptrs[s0:s1], rows, dtype)
            if got is not None:
                found.append(got)
                continue
            if group.addressed:
                return None
        for s, a, b, whole in group.segments:
            if s0 <= s < s1:
                found.append(row_stats(sources[s] if whole else sources[s][a:b]))
    return torch.cat(found) if len(found) > 1 else found[0]


def _addresses(sources: List[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sources' addresses on ``device`` (from pinned memory, without waiting)."""
    host = torch.tensor([s.data_ptr() for s in sources], dtype=torch.int64)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


__all__ = ["Batch", "measure_batch", "measurable"]
