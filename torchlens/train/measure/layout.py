"""Where each value of a batch of tensors is read from, decided on the host before any kernel,
once per set of tensors: rows of ``BLOCK`` values (``rows.py`` reduces them), and the positions
of each tensor's sample.

A tensor of at least ``BIG`` values whose memory is one dense float block of the computing
dtype is read in place, viewed as rows (no copy; its last ``numel % BLOCK`` values are packed);
the others are packed end to end into one buffer per device and computing dtype, each padded
with NaN to a whole row (the pads are then taken off the NaN count). Where the Triton kernels
read a device's tensors (a GPU), every dense float tensor is read at its own address instead,
whatever its size, its last row masked where it ends (``plan(addressed=...)``): a step then
makes no view, slice or packing copy per tensor. ``row_stats`` reads every
source (a view or a buffer) in one call, or in slices of at most ``CHUNK`` values where torch's
eager kernels make temporaries as large as what they read.

The layout depends only on the tensors' signature (``signature``: type, dtype, device, shape
and strides of each), which a phase repeats step after step: ``LayoutCache`` keeps it, with its
index tensors already on the device, while the signature stays the same. Each step then only
views the tensors' memory, and the Python it runs per tensor is a few attribute reads.

Samples are stratified: a tensor read from several sources (its body in place, its tail in a
buffer) gets from each a share of its ``sample_n`` draws in proportion to the values there
(largest remainders; the same shares every step), and within a source the positions are
uniform, drawn afresh every step by one random draw on the device.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Hashable, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch
from torch import nn

BLOCK = 1024  # values per row
CHUNK = 1 << 24  # values per eager row_stats call at most (bounds the temporaries it makes)
BIG = 1 << 22  # a tensor this large is read in place where it can be

_PLAIN = (torch.Tensor, nn.Parameter)
# dtypes the kernels of kernels.py read at a tensor's own address (``plan(addressed=...)``)
ADDRESSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# how a tensor's values are viewed as one dimension (``flat``): a view, a view of a dense
# permutation, or a copy of a tensor with gaps
_VIEW, _DENSE, _COPY = 0, 1, 2


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


def tensor_key(t: torch.Tensor) -> Optional[Tuple[Any, ...]]:
    """What the layout of ``t`` depends on (dtype, device, shape, strides), or None where
    ``measure_batch`` does not measure it (not a plain dense tensor, or no values, or a dtype it
    does not read: see ``compute_dtype``).

    Example:
        >>> tensor_key(torch.zeros(2, 3))
        (torch.float32, device(type='cpu'), torch.Size([2, 3]), (3, 1))
        >>> tensor_key(torch.zeros(0)), tensor_key(torch.zeros(2, dtype=torch.complex64))
        (None, None)
    """
    if type(t) not in _PLAIN or t.layout is not _STRIDED or t.is_meta or t.numel() == 0:
        return None
    dtype = t.dtype
    read = _READ.get(dtype)
    if read is None:
        read = _readable(dtype)
    return (dtype, t.device, t.shape, t.stride()) if read else None


_STRIDED = torch.strided
_READ: Dict[torch.dtype, bool] = {}  # whether the values of a dtype are read (see ``compute_dtype``)


def _readable(dtype: torch.dtype) -> bool:
    read = _READ[dtype] = compute_dtype(dtype) is not None
    return read


def measurable(t: torch.Tensor) -> bool:
    """Whether ``measure_batch`` measures ``t``: a plain dense tensor (or parameter) with values,
    of a dtype it reads (float, integer, bool; not complex, float8 or quantized).

    Example:
        >>> measurable(torch.ones(2)), measurable(torch.ones(2, dtype=torch.complex64))
        (True, False)
    """
    return tensor_key(t) is not None


def signature(tensors: Sequence[torch.Tensor]) -> Tuple[Optional[Tuple[Any, ...]], ...]:
    """The keys (``tensor_key``) of ``tensors``: a batch with the same signature has the same
    layout."""
    return tuple(map(tensor_key, tensors))


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` as a 1-D tensor in memory order: a view where they are one dense
    block (contiguous, channels-last, any permutation), else a copy. Statistics and uniform
    samples do not depend on the order.

    Example:
        >>> x = torch.arange(6.0).reshape(2, 3).t()
        >>> flat_view(x).tolist(), flat_view(x).data_ptr() == x.data_ptr()
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], True)
    """
    return _flat(t, _mode(t.shape, t.stride()))


def _mode(shape: Sequence[int], strides: Sequence[int]) -> int:
    """How a tensor of ``shape`` and ``strides`` is seen as one dimension (see ``_flat``)."""
    expected, contiguous = 1, True
    for size, stride in reversed(list(zip(shape, strides))):
        if size != 1 and stride != expected:
            contiguous = False
            break
        expected *= size
    if contiguous:
        return _VIEW
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(shape, strides) if s != 1):
        if stride != expected:
            return _COPY
        expected *= size
    return _DENSE


def _flat(t: torch.Tensor, mode: int) -> torch.Tensor:
    if mode == _VIEW:  # a contiguous 1-D tensor is its own flat view (a bias: no operation for it)
        return t if t.dim() == 1 else t.view(-1)
    if mode == _DENSE:
        return t.as_strided((t.numel(),), (1,), t.storage_offset())
    return t.reshape(-1)


@dataclass(eq=False)
class Source:
    """A 2-D block of ``rows`` x ``BLOCK`` values of ``dtype`` that ``row_stats`` reads: the
    body of member ``member`` read in place (``parts`` empty), or a buffer filled by one
    concatenation of ``parts``: (member, start, stop, all of it, the NaN pad after it or None)."""

    dtype: torch.dtype
    rows: int = 0
    member: int = -1
    parts: List[Tuple[int, int, int, bool, Optional[torch.Tensor]]] = field(default_factory=list)


@dataclass(eq=False)
class Group:
    """The layout of a batch's tensors on one device. ``members``: their positions in the batch
    (row ``j`` of the device's table is ``members[j]``'s); ``sources``: what is read, grouped by
    dtype (``by_dtype``: (dtype, first and end source, first and end row, first and end draw));
    ``segments``: (source, first row, end row, all of it) of each eager ``row_stats`` call, in
    the order of the rows ``owner`` maps to members. The samples: ``draws[s]`` positions drawn
    in source ``s`` (at ``base + floor(u * span)``, at most ``last``), the drawn values put in
    the sample's order by ``order`` (or each written at ``slot``); member ``j``'s sample is
    ``sizes[j]`` values long. ``row_src``/``row_at``/``row_n`` and ``draw_src``: each row's and draw's
    source (within its dtype), the row's offset there and its number of values, for the kernels
    of ``kernels.py``."""

    device: torch.device
    addressed: bool  # sources without parts are whole tensors read at their address (``plan``)
    members: List[int]
    modes: List[int]
    sources: List[Source]
    by_dtype: List[Tuple[torch.dtype, int, int, int, int, int, int]]
    segments: List[Tuple[int, int, int, bool]]
    sizes: List[int]
    draws: List[int]
    host: Dict[str, np.ndarray]  # the index arrays (int64), copied to the device once
    index: Dict[str, torch.Tensor] = field(default_factory=dict)  # the same, on the device

    def on_device(self) -> Dict[str, torch.Tensor]:
        """The index tensors on the device (copied there once, in one transfer)."""
        if not self.index:
            names = list(self.host)
            parts = [self.host[n] for n in names]
            whole = _to_device(np.concatenate(parts), self.device)
            cuts = np.cumsum([len(p) for p in parts])[:-1].tolist()
            self.index = dict(zip(names, torch.tensor_split(whole, cuts)))
            # numel and pads count values: float64 where the merge uses them
            self.index["numel"] = self.index["numel"].double()
            self.index["pads"] = self.index["pads"].double()
        return self.index


@dataclass(eq=False)
class Layout:
    """The layout of a batch of tensors: one ``Group`` per device; ``skipped``: positions of the
    tensors not measured."""

    groups: List[Group]
    skipped: List[int]


def plan(
    keys: Sequence[Optional[Tuple[Any, ...]]],
    sample_n: Optional[int],
    whole_views: bool = False,
    addressed: FrozenSet[torch.device] = frozenset(),
) -> Layout:
    """The layout of a batch of tensors of ``signature`` ``keys``, with ``sample_n`` sample
    positions per tensor (all its values when it has fewer or ``sample_n`` is None).
    ``whole_views``: every source is read by one ``row_stats`` call however large (a compiled
    kernel makes no temporaries to bound). On the devices in ``addressed`` the kernels of
    ``kernels.py`` read every dense tensor of a dtype they read (``ADDRESSED_DTYPES``) at its own
    address, its last row masked where it ends: no view and no copy of it is made; only the
    others (with gaps, or of other dtypes) are packed.

    Example:
        >>> p = plan(signature([torch.zeros(3), torch.zeros(2000)]), 5)
        >>> g = p.groups[0]
        >>> g.sources[0].rows, g.host["pads"].tolist(), g.sizes
        (3, [1021, 48], [3, 5])
    """
    by_device: Dict[torch.device, List[int]] = {}
    skipped: List[int] = []
    for i, key in enumerate(keys):
        if key is None:
            skipped.append(i)
        else:
            by_device.setdefault(key[1], []).append(i)
    groups = [
        _group(
            device,
            [keys[i] for i in members],
            sample_n=sample_n,
            whole_views=whole_views,
            members=members,
            addressed=device in addressed,
        )
        for device, members in by_device.items()
    ]
    return Layout(groups, skipped)


class _Sources:
    """The sources of a group as they are laid out, dtype after dtype: each member's pieces
    (source, offset, length), its NaN pad, and the spans of sources and rows of each dtype."""

    def __init__(self, n_of: List[int]) -> None:
        self.n_of = n_of
        self.sources: List[Source] = []
        self.pads = np.zeros(len(n_of), np.int64)
        self.pieces: List[List[Tuple[int, int, int]]] = [[] for _ in n_of]
        self.spans: List[Tuple[torch.dtype, int, int, int, int]] = []  # dtype, its sources, its rows
        self.rows = 0

    def span(self, dtype: torch.dtype, first: int) -> None:
        """The sources from ``first`` on are ``dtype``'s."""
        first_row = self.rows
        self.rows += sum(s.rows for s in self.sources[first:])
        self.spans.append((dtype, first, len(self.sources), first_row, self.rows))

    def own(self, dtype: torch.dtype, members: List[int]) -> None:
        """Each of ``members`` its own source, read whole at its address (its last row masked)."""
        first = len(self.sources)
        for j in members:
            n = self.n_of[j]
            rows = -(-n // BLOCK)
            self.pads[j] = rows * BLOCK - n
            self.pieces[j].append((len(self.sources), 0, n))
            self.sources.append(Source(dtype, rows=rows, member=j))
        self.span(dtype, first)

    def packed(self, device: torch.device, wide: torch.dtype, mine: List[int], body: Set[int]) -> None:
        """The whole rows of each of ``body`` read in place, the rest of ``mine`` packed."""
        n_of, pads, first = self.n_of, self.pads, len(self.sources)
        for j in mine:
            if j in body:
                self.pieces[j].append((len(self.sources), 0, n_of[j] // BLOCK * BLOCK))
                self.sources.append(Source(wide, rows=n_of[j] // BLOCK, member=j))
        buffer = Source(wide)
        for j in mine:
            start = n_of[j] // BLOCK * BLOCK if j in body else 0
            if start == n_of[j]:
                continue
            take = n_of[j] - start
            rows = -(-take // BLOCK)
            pads[j] = rows * BLOCK - take
            self.pieces[j].append((len(self.sources), buffer.rows * BLOCK, take))
            buffer.parts.append((j, start, n_of[j], start == 0, _nan_pad(device, wide)[: pads[j]] if pads[j] else None))
            buffer.rows += rows
        if buffer.parts:
            self.sources.append(buffer)
        self.span(wide, first)


def _group(
    device: torch.device,
    keys: List[Any],
    *,
    sample_n: Optional[int],
    whole_views: bool,
    members: List[int],
    addressed: bool,
) -> Group:
    n_of = [math.prod(key[2]) for key in keys]
    modes = [_mode(key[2], key[3]) for key in keys]
    wides = [compute_dtype(key[0]) for key in keys]
    laid = _Sources(n_of)
    for wide in sorted({w for w in wides if w is not None}, key=str):
        mine = [j for j, w in enumerate(wides) if w == wide]
        if addressed:  # each dense tensor its own source, read at its address (see ``plan``)
            own = {j for j in mine if keys[j][0] in ADDRESSED_DTYPES and modes[j] != _COPY}
            for dtype in sorted({keys[j][0] for j in own}, key=str):
                laid.own(dtype, [j for j in mine if j in own and keys[j][0] == dtype])
            mine = [j for j in mine if j not in own]
        if mine:
            body = {j for j in mine if n_of[j] >= BIG and keys[j][0] == wide and modes[j] != _COPY}
            laid.packed(device, wide, mine, body)
    sources, spans = laid.sources, laid.spans
    step = max(1, CHUNK // BLOCK)
    segments: List[Tuple[int, int, int, bool]] = []
    for s, source in enumerate(sources):
        step_s = source.rows if whole_views else step
        for r0 in range(0, source.rows, step_s):
            r1 = min(source.rows, r0 + step_s)
            segments.append((s, r0, r1, r1 - r0 == source.rows))
    first_of = {s: d[1] for d in spans for s in range(d[1], d[2])}
    host = _row_index(sources, first_of, n_of)
    host["pads"] = laid.pads
    host["runs"] = _runs(host["owner"], len(keys))
    sizes = [n if sample_n is None else min(n, sample_n) for n in n_of]
    draws = [0] * len(sources)
    if sample_n is not None:
        _draw_plan(host, laid.pieces, n_of=n_of, sample_n=sample_n, draws=draws)
        host["draw_src"] = np.repeat([s - first_of[s] for s in range(len(sources))], draws).astype(np.int64)
    by_dtype, draws_at = [], 0
    for wide, s0, s1, r0, r1 in spans:
        n_draws = sum(draws[s0:s1])
        by_dtype.append((wide, s0, s1, r0, r1, draws_at, draws_at + n_draws))
        draws_at += n_draws
    return Group(
        device=device,
        addressed=addressed,
        members=members,
        modes=modes,
        sources=sources,
        by_dtype=by_dtype,
        segments=segments,
        sizes=sizes,
        draws=draws,
        host=host,
    )


def _row_index(sources: List[Source], first_of: Dict[int, int], n_of: List[int]) -> Dict[str, np.ndarray]:
    """Per row of the sources: the member it belongs to (``owner``), its source within its
    dtype, its offset there and its number of values (fewer than ``BLOCK`` only in the last row
    of a tensor read whole at its address); and each member's ``numel``."""
    rows = [np.arange(src.rows, dtype=np.int64) for src in sources]
    owners = [
        np.full(s.rows, s.member, np.int64)
        if not s.parts
        else np.repeat([p[0] for p in s.parts], [-(-(p[2] - p[1]) // BLOCK) for p in s.parts])
        for s in sources
    ]
    return {
        "owner": np.concatenate(owners).astype(np.int64),
        "numel": np.asarray(n_of, np.int64),
        "row_src": np.concatenate([np.full(src.rows, s - first_of[s], np.int64) for s, src in enumerate(sources)]),
        "row_at": np.concatenate([r * BLOCK for r in rows]),
        "row_n": np.concatenate(
            [
                np.minimum(BLOCK, n_of[src.member] - r * BLOCK) if not src.parts else np.full(src.rows, BLOCK)
                for src, r in zip(sources, rows)
            ]
        ).astype(np.int64),
    }


def _runs(owner: np.ndarray, members: int) -> np.ndarray:
    """(first row, number of rows) of the two runs of rows of each member, flattened (a member's
    rows: its body read in place, then its tail in its dtype's buffer; a run of none is (0, 0)).

    Example:
        >>> _runs(np.array([1, 1, 0, 1]), 2).reshape(2, 4).tolist()
        [[2, 1, 0, 0], [0, 2, 3, 1]]
    """
    runs = np.zeros((members, 4), np.int64)
    cuts = np.flatnonzero(np.diff(owner)) + 1
    filled = np.zeros(members, np.int64)
    for start, stop in zip([0, *cuts.tolist()], [*cuts.tolist(), len(owner)]):
        j = owner[start]
        k = filled[j]
        assert k < 2, "a tensor's rows lie in at most two runs"
        runs[j, 2 * k : 2 * k + 2] = (start, stop - start)
        filled[j] += 1
    return runs.reshape(-1)


def _draw_plan(
    host: Dict[str, np.ndarray],
    pieces: List[List[Tuple[int, int, int]]],
    *,
    n_of: List[int],
    sample_n: int,
    draws: List[int],
) -> None:
    """Fill ``host`` with the draws' ``base``, ``span``, ``last`` (in source order), the
    ``order`` that puts them in the sample's order and each one's ``slot`` there, and ``draws``
    with their number per source."""
    # one item per piece that gets draws: its source, first slot in the sample, offset in the
    # source, number of draws, whether they are every value in order, its length
    items: List[Tuple[int, int, int, int, bool, int]] = []
    cursor = 0
    for j, placed in enumerate(pieces):
        every = n_of[j] <= sample_n  # every value, in order
        counts = [length for _, _, length in placed] if every else _shares(sample_n, [p[2] for p in placed])
        for (s, at, length), c in zip(placed, counts):
            if c:
                items.append((s, cursor, at, c, every, length))
                cursor += c
    empty = np.zeros(0, np.int64)
    if not items:
        host.update(base=empty, span=empty, last=empty, order=empty, slot=empty)
        return
    # the draws in source order (items of one source in the order of their members), as arrays
    table = np.array(items, dtype=np.int64)
    table = table[np.argsort(table[:, 0], kind="stable")]
    src, first, offset, count, whole, size = table.T
    within = np.arange(cursor) - np.repeat(np.cumsum(count) - count, count)  # each draw's place in its item
    in_order = np.repeat(whole, count).astype(bool)
    slot = np.repeat(first, count) + within
    base = np.repeat(offset, count) + np.where(in_order, within, 0)
    span = np.where(in_order, 0, np.repeat(size, count))
    draws[:] = np.bincount(src, weights=count, minlength=len(draws)).astype(np.int64).tolist()
    order = np.empty(cursor, np.int64)
    order[slot] = np.arange(cursor)  # the sample's value at ``slot[g]`` is drawn value ``g``
    host.update(base=base, span=span, last=np.maximum(span - 1, 0), order=order, slot=slot)


def _shares(k: int, lengths: List[int]) -> List[int]:
    """``k`` split in proportion to ``lengths`` (largest remainders).

    Example:
        >>> _shares(10, [5, 5, 1]), _shares(3, [1000000, 7])
        ([5, 4, 1], [3, 0])
    """
    if len(lengths) == 1:
        return [k]
    total = sum(lengths)
    exact = [k * length / total for length in lengths]
    counts = [int(e) for e in exact]
    for i in sorted(range(len(lengths)), key=lambda i: counts[i] - exact[i])[: k - sum(counts)]:
        counts[i] += 1
    return counts


class LayoutCache:
    """The layouts of the last ``size`` signatures seen (a phase repeats its own step after
    step; a watch has a few phases, the early measurements of copies a forward makes past its
    budget, and a last batch of another size). A layout holds its index tensors on the device:
    a few int64 per row of ``BLOCK`` values and per sample value.

    Example:
        >>> cache = LayoutCache()
        >>> keys = signature([torch.zeros(3)])
        >>> cache.get(keys, 2) is cache.get(keys, 2), cache.builds
        (True, 1)
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.builds = 0  # layouts built (a measure of how often the signature changed)
        self._layouts: "OrderedDict[Hashable, Layout]" = OrderedDict()

    def get(
        self,
        keys: Tuple[Optional[Tuple[Any, ...]], ...],
        sample_n: Optional[int],
        whole_views: bool = False,
        addressed: FrozenSet[torch.device] = frozenset(),
    ) -> Layout:
        """The layout of ``keys``: the one kept, or a new one (kept in place of the oldest)."""
        full = (keys, sample_n, whole_views, addressed, BIG, CHUNK)  # the sizes: tests change them
        found = self._layouts.get(full)
        if found is not None:
            self._layouts.move_to_end(full)
            return found
        found = self._layouts[full] = plan(keys, sample_n, whole_views, addressed)
        self.builds += 1
        while len(self._layouts) > self.size:
            self._layouts.popitem(last=False)
        return found

    def clear(self) -> None:
        self._layouts.clear()


_PADS: dict = {}


def _nan_pad(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``BLOCK`` NaNs on ``device`` (kept: every buffer pads with slices of it)."""
    key = (device, dtype)
    pad = _PADS.get(key)
    if pad is None:
        pad = _PADS[key] = torch.full((BLOCK,), float("nan"), dtype=dtype, device=device)
    return pad


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device`` without waiting: copied from pinned memory, asynchronously."""
    host = torch.from_numpy(np.ascontiguousarray(array, np.int64))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


__all__ = [
    "ADDRESSED_DTYPES",
    "BLOCK",
    "CHUNK",
    "BIG",
    "Group",
    "Layout",
    "LayoutCache",
    "Source",
    "plan",
    "flat_view",
    "compute_dtype",
    "measurable",
    "signature",
    "tensor_key",
]
