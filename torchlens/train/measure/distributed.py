"""``tl.watch`` under ``torch.distributed`` (DDP, any process group): a series is the
distribution over the GLOBAL batch.

Every rank records its own samples; when a logged step is written, the ranks agree in three
collectives, whatever the number of series:

1. ``all_reduce(MIN)`` of a few numbers (and their negatives): the number of series, the step,
   a checksum of the series' names and one of the model's module structure. Ranks that disagree
   (a branch taken on one rank only, a different model) all learn it here and all raise
   ``RankMismatchError``: nobody is left waiting in a later collective.
2. ``all_reduce(MIN)`` of every series' smallest and (negated) largest finite sampled value:
   the common bin edges, so the global histogram bins exactly as one process would on the
   concatenated batch (chosen over fixed mergeable edges, which would need edges known in
   advance or coarser bins: this costs one small collective of 2 numbers per series).
3. ``all_gather`` of each rank's counts, non-finite counts and exact statistics; rank 0 sums
   the counts of ``io`` and ``io_grad`` (each rank saw its part of the batch), combines their
   statistics, and writes. ``params``, ``params_grad`` and ``updates`` are replicated under DDP
   (the same on every rank, gradients averaged): rank 0's copy is the series, not the sum.

Steps that are not logged run no collective, except with the NaN sentinel (``on_nonfinite=``):
its ``first_nonfinite`` runs one ``all_reduce`` of one number on every step. A rank that stops calling the model (or calls it
more often) while the others go on is found at the next logged step (different step numbers);
a rank that never reaches it leaves the others waiting until the process group's timeout.
The outlier rejection (``reject_outlier_proportion``) runs per rank before the edges are agreed;
the exact "line" of gradient series (the median per-sample norm) is the median of the ranks'
medians, the other exact statistics are exact over all ranks.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ...errors import TorchlensError
from ...web.stats import NUM_BINS, Histograms, as_tensor, histograms, pack, reject_outliers, unpack
from ..model import named_modules

REPLICATED = ("params", "params_grad", "updates")  # the same on every rank under DDP


class RankMismatchError(TorchlensError, RuntimeError):
    """The ranks of a distributed run recorded different things at the same logged step."""


def active_group(model: nn.Module) -> Optional[Any]:
    """The default process group when ``torch.distributed`` runs with more than one rank (None
    otherwise). A ``DistributedDataParallel`` model without an initialised group is an error."""
    dist = torch.distributed
    ready = dist.is_available() and dist.is_initialized()
    if not ready:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            raise RankMismatchError(
                "tl.watch: the model is wrapped in DistributedDataParallel but no process group is "
                "initialised (it was destroyed?). Call torch.distributed.init_process_group first."
            )
        return None
    return dist.group.WORLD if dist.get_world_size() > 1 else None


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s local shard (a plain tensor); any other tensor as it is."""
    if type(t).__name__ == "DTensor" and hasattr(t, "to_local"):
        return t.to_local()
    return t


def sharded_parameters(model: nn.Module) -> set:
    """``(module address, name)`` of the parameters that are ``DTensor``s (FSDP2, tensor
    parallel): their gradients are split over the ranks, so the ranks' counts are summed."""
    return {
        (address, name)
        for address, module in named_modules(model)
        for name, p in module._parameters.items()
        if p is not None and type(p).__name__ == "DTensor"
    }


def _checksum(texts: Sequence[str]) -> float:
    """A 32-bit checksum of some names, exact in float64."""
    return float(zlib.crc32("\n".join(texts).encode()))


def structure_checksum(model: nn.Module) -> float:
    """Checksum of a model's module addresses, classes and parameter shapes."""
    rows = []
    for address, module in named_modules(model):
        shapes = ",".join(f"{n}{tuple(p.shape)}" for n, p in module._parameters.items() if p is not None)
        rows.append(f"{address}:{type(module).__name__}:{shapes}")
    return _checksum(rows)


class RankGroup:
    """The collectives of one watch on a process group (see the module's docstring)."""

    def __init__(self, model: nn.Module, group: Any) -> None:
        dist = torch.distributed
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        cuda = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.structure = structure_checksum(model)
        self.sharded = sharded_parameters(model)
        self.collectives = 0  # run so far (the benchmark and tests read it)
        self.broken: Optional[str] = None  # the mismatch found: every rank knows it, none reduces again

    def _min(self, values: torch.Tensor) -> torch.Tensor:
        values = values.to(self.device)
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MIN, group=self.group)
        self.collectives += 1
        return values.cpu()

    def _split(self, key: tuple) -> bool:
        """A gradient (or update) of a sharded parameter: each rank holds its shard."""
        return key[1] != "params" and (key[0].rpartition(":")[0] if ":" in key[0] else "", key[2]) in self.sharded

    def agree(self, keys: Sequence[tuple], step: int) -> None:
        """Collective 1: the same series, step and model on every rank, or an error on all."""
        if self.broken is not None:  # every rank learnt it at the same collective: none runs another
            raise RankMismatchError(self.broken)
        head = torch.tensor(
            [len(keys), step, _checksum(["\x1f".join(k) for k in keys]), self.structure], dtype=torch.float64
        )
        both = self._min(torch.cat([head, -head]))
        low, high = both[:4], -both[4:]
        differ = [name for name, a, b in zip(("series", "step", "series", "structure"), low, high) if a != b]
        if differ:
            what = {
                "structure": "module structure (addresses, classes, parameter shapes)",
                "step": "step number (a rank called the model more or fewer times)",
                "series": "set of series (a module or branch ran on some ranks only)",
            }
            self.broken = (
                f"tl.watch: at logged step {step} the ranks of the process group differ in their "
                f"{'; '.join(dict.fromkeys(what[d] for d in differ))}. Every rank must run the same "
                "modules on logged steps; rank "
                f"{self.rank} stops here, and so do the others."
            )
            raise RankMismatchError(self.broken)

    def first_nonfinite(self, own: Optional[torch.Tensor], grads: Optional[torch.Tensor]) -> Optional[int]:
        """The NaN sentinel's step-end decision, the same on every rank (None: the step is finite).

        ``own``: this rank's flag of its outputs and the gradients reaching them (they differ
        per rank); ``grads``: of the parameters' gradients (under DDP averaged, so the same
        everywhere). One ``all_reduce(MIN)`` of one number, on every checked step: the lowest
        rank whose own values went non-finite, else the lowest whose parameters' gradients did.
        Its one read is the sentinel's host read of the step."""
        world = self.world
        code = torch.tensor(2 * world, dtype=torch.int64, device=self.device)  # 2 * world: all finite
        if grads is not None:
            code = torch.where(grads.to(self.device), code, world + self.rank)
        if own is not None:
            code = torch.where(own.to(self.device), code, self.rank)
        torch.distributed.all_reduce(code, op=torch.distributed.ReduceOp.MIN, group=self.group)
        self.collectives += 1
        value = int(code)
        return None if value == 2 * world else value % world

    def share(self, value: Any, source: int) -> Any:
        """``value`` of rank ``source``, on every rank (a rare collective: a non-finite step's event)."""
        box = [value]
        torch.distributed.broadcast_object_list(box, src=source, group=self.group, device=self.device)
        self.collectives += 1
        return box[0]

    def histograms(
        self,
        samples: Sequence[torch.Tensor],
        reject: float,
        summaries: Optional[list],
        step: int,
        keys: Sequence[tuple],
    ) -> Histograms:
        """The global histograms of the step's series (meaningful on rank 0)."""
        self.agree(keys, step)
        n = len(samples)
        if n == 0:
            return histograms([], 0.0)
        nonfinite = np.array([int((~torch.isfinite(s)).sum()) for s in samples], np.float64)
        kept = reject_outliers(samples, reject)
        inf = float("inf")
        lo = torch.stack(
            [torch.where(torch.isfinite(s), s, inf).amin() if s.numel() else torch.tensor(inf) for s in kept]
        )
        hi = torch.stack(
            [torch.where(torch.isfinite(s), s, -inf).amax() if s.numel() else torch.tensor(-inf) for s in kept]
        )
        edges = self._min(torch.cat([lo.double().cpu(), -hi.double().cpu()]))  # collective 2
        glo, ghi = edges[:n], -edges[n:]
        # The one binning rule (web/stats.py) on the common edges: each sample gets the global
        # smallest and largest value appended, so its own [min, max] IS the common range; the
        # two added values land in the first and last bin and are taken off again.
        padded = []
        for s, a, b in zip(kept, glo.tolist(), ghi.tolist()):
            padded.append(torch.cat([s, torch.tensor([a, b], dtype=s.dtype, device=s.device)]) if a != inf else s)
        h = histograms(padded, 0.0, summaries=summaries)
        counts = h.counts.astype(np.float64)
        sums, squares = h.sums.copy(), h.sums_of_squares.copy()
        for i, (a, b) in enumerate(zip(glo.tolist(), ghi.tolist())):
            if a != inf:
                counts[i, 0] -= 1
                counts[i, -1 if b > a else 0] -= 1
                sums[i] -= a + b
                squares[i] -= a * a + b * b
        bins = counts.shape[1]
        moments = np.concatenate([sums[:, None], squares[:, None], h.exact], 1)
        mine = pack(*(torch.from_numpy(np.asarray(x, np.float64)) for x in (counts, glo, ghi, nonfinite, moments)))
        parts = [torch.empty_like(mine, device=self.device) for _ in range(self.world)]
        torch.distributed.all_gather(parts, mine.to(self.device), group=self.group)  # collective 3
        self.collectives += 1
        every = torch.stack(parts).cpu().numpy()  # (ranks, series, columns): the packed form of each rank
        # a parameter (its gradient, its update) is replicated under DDP: one copy, rank 0's, is
        # its distribution; activations and their gradients are split over the ranks: summed.
        # The edges are common to all ranks: rank 0's.
        copy = np.array([k[1] in REPLICATED and not self._split(k) for k in keys])[:, None]
        summed = np.where(copy, every[0], every.sum(0))
        summed[:, bins : bins + 2] = every[0, :, bins : bins + 2]
        summed[:, bins + 5 :] = np.where(copy, every[0, :, bins + 5 :], combine_exact(every[:, :, bins + 5 :]))
        return unpack(summed, bins)


def rank_group(model: nn.Module) -> Optional[RankGroup]:
    """The collectives of a watch of ``model`` when ``torch.distributed`` runs with several ranks."""
    group = active_group(model)
    return RankGroup(model, group) if group is not None else None


def step_histograms(ranks: Optional[RankGroup], data: Any, reject: float, step: int) -> Histograms:
    """A logged step's histograms (``data``: the recorder's ``StepData``): of this process, or
    of the global batch under ``torch.distributed``."""
    data.summarize()
    if ranks is None:
        return histograms(data.samples, reject, summaries=data.summaries)
    samples = [as_tensor(s) for s in data.samples]  # each binned on the global edges: one view each
    return ranks.histograms(samples, reject, data.summaries, step=step, keys=data.keys)


def combine_exact(rows: np.ndarray) -> np.ndarray:
    """``EXACT_FIELDS`` of the ranks' values together: ``rows`` is (ranks, series, fields).

    Example:
        >>> a = [2, 1.0, 2.0, 0.0, 2.0, 0, 0, 0, 1, np.nan]  # values 0 and 2
        >>> b = [1, 4.0, 0.0, 4.0, 4.0, 1, 0, 0, 0, np.nan]  # value 4 and a nan
        >>> combine_exact(np.array([[a], [b]]))[0, :6].tolist()
        [3.0, 2.0, 8.0, 0.0, 4.0, 1.0]
    """
    count = np.nan_to_num(rows[:, :, 0])
    total = count.sum(0)
    means = np.where(count > 0, np.nan_to_num(rows[:, :, 1]), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(total > 0, (means * count).sum(0) / np.maximum(total, 1), np.nan)
        spread = np.where(count > 0, np.nan_to_num(rows[:, :, 2]) + count * (means - np.nan_to_num(mean)) ** 2, 0).sum(
            0
        )
    out = np.full(rows.shape[1:], np.nan)
    out[:, 0], out[:, 1], out[:, 2] = total, mean, spread
    missing = np.isnan(rows[:, :, 0]).all(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan columns: nan, as meant
        out[:, 3] = np.where(total > 0, np.nanmin(rows[:, :, 3], axis=0), np.nan)
        out[:, 4] = np.where(total > 0, np.nanmax(rows[:, :, 4], axis=0), np.nan)
        out[:, 9] = np.nanmedian(rows[:, :, 9], axis=0)
    out[:, 5:9] = np.nan_to_num(rows[:, :, 5:9]).sum(0)
    out[missing] = np.nan
    return out


__all__ = [
    "RankGroup",
    "RankMismatchError",
    "active_group",
    "rank_group",
    "step_histograms",
    "combine_exact",
    "structure_checksum",
    "NUM_BINS",
]
