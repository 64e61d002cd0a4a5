"""Samples of the values of tensors for the explorer's histograms, drawn with the sampler's own
generators (never from the user's random streams)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...web.stats import Piece, Sample, as_tensor, size_of
from ..measure import SMALL


class Sampler:
    """Draws value samples with its own generators, never from the user's random streams."""

    def __init__(self, sample_n: Optional[int], seed: int = 0) -> None:
        if sample_n is not None and (not isinstance(sample_n, int) or sample_n < 1):
            raise ValueError(f"sample_n must be a positive int or None (all values), not {sample_n!r}.")
        self.sample_n = sample_n
        self.seed = seed
        self._generators: Dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        g = self._generators.get(device)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            self._generators[device] = g
        return g

    def values(self, tensor: torch.Tensor, minus: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """A float32 copy of ``sample_n`` values of ``tensor`` (all of them when fewer or None);
        ``minus``: of ``tensor - minus`` (same shape), subtracting at the drawn positions only.

        The copy is taken now, so a later in-place change of the tensor does not reach it.
        None for tensors without real values (complex, sparse, meta).
        """
        if not _has_values(tensor):
            return None
        n = tensor.numel()
        flat = _flat(tensor)  # each operation skipped here is one less per watched tensor
        other = None if minus is None else _flat(minus)
        if self.sample_n is None or n <= self.sample_n:
            return flat.to(torch.float32, copy=True) if other is None else _float32(flat - other)
        g = self._generators.get(flat.device) or self._generator(flat.device)
        index = torch.randint(n, (self.sample_n,), generator=g, device=flat.device)
        picked = flat.index_select(0, index)
        return _float32(picked if other is None else picked - other.index_select(0, index))

    def positions(self, n: int, device: torch.device) -> Optional[torch.Tensor]:
        """The positions a sample of ``n`` values takes, drawn now (None: all of them), for
        ``take`` to gather later, on any thread.

        Example:
            >>> s = Sampler(sample_n=3)
            >>> s.take(torch.arange(10.0), s.positions(10, torch.device("cpu"))).numel()
            3
        """
        if self.sample_n is None or n <= self.sample_n:
            return None
        g = self._generators.get(device) or self._generator(device)
        return torch.randint(n, (self.sample_n,), generator=g, device=device)

    def take(self, tensor: torch.Tensor, index: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A float32 copy of the values of ``tensor`` at ``index`` (``positions``; None: all)."""
        if not _has_values(tensor):
            return None
        flat = _flat(tensor)
        return flat.to(torch.float32, copy=True) if index is None else _float32(flat.index_select(0, index))

    def values_of(self, tensors: Sequence[torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """``values`` of each of ``tensors``, drawn together: one draw and one gather per group of
        equal length (up to ``SMALL`` values), dtype and device, not one each (what a logged
        step launches then does not grow with the number of tensors it measures).

        Example:
            >>> rows = Sampler(sample_n=3).values_of([torch.arange(8.0), torch.arange(8.0) + 10])
            >>> [r.numel() for r in rows], bool((rows[1] - rows[0] >= 2).all())
            ([3, 3], True)
        """
        out: List[Optional[torch.Tensor]] = [None] * len(tensors)
        groups: Dict[Tuple[int, torch.dtype, torch.device], List[int]] = {}
        for i, t in enumerate(tensors):
            if _has_values(t):
                groups.setdefault((t.numel(), t.dtype, t.device), []).append(i)
        for (n, _, device), indices in groups.items():
            if len(indices) == 1 or n > SMALL:  # a large one's copy would cost more than its draw
                for i in indices:
                    out[i] = self.values(tensors[i])
                continue
            rows = torch.stack([_flat(tensors[i]) for i in indices])  # a copy: later changes miss it
            if self.sample_n is not None and n > self.sample_n:
                g = self._generators.get(device) or self._generator(device)
                index = torch.randint(n, (len(indices), self.sample_n), generator=g, device=device)
                rows = rows.gather(1, index)
            for i, row in zip(indices, _float32(rows).unbind(0)):
                out[i] = row
        return out

    def norms(self, grad: torch.Tensor) -> Optional[torch.Tensor]:
        """All per-sample L2 norms of a gradient: all but the first dimension flattened, one
        norm per row (a 0-d gradient is its absolute value)."""
        g = grad.detach() if grad.requires_grad else grad
        if g.layout != torch.strided or g.numel() == 0:
            return None
        if g.dim() > 2:  # over the dimensions after the first: no view of it (one dispatch fewer each)
            return _float32(torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))))
        return _float32(torch.linalg.vector_norm(_rows(g), dim=1))

    def norms_of(self, grads: Sequence[torch.Tensor]) -> List[Optional[Sample]]:
        """``norms`` of each of ``grads`` (strided, not empty), computed together: one stack and
        one norm per group of equal shape, dtype and device, not one each; those of a group are
        ``Piece``s of its norms (no view each).

        Example:
            >>> [as_tensor(n).tolist() for n in Sampler(4).norms_of([torch.ones(2, 4), torch.zeros(2, 4)])]
            [[2.0, 2.0], [0.0, 0.0]]
        """
        out: List[Optional[Sample]] = [None] * len(grads)
        groups: Dict[Tuple[torch.Size, torch.dtype, torch.device], List[int]] = {}
        for i, g in enumerate(grads):
            groups.setdefault((g.shape, g.dtype, g.device), []).append(i)
        for indices in groups.values():
            if len(indices) == 1:
                out[indices[0]] = self.norms(grads[indices[0]])  # type: ignore[assignment]
                continue
            rows = torch.stack([_rows(grads[i]) for i in indices])  # (tensors, samples, values)
            norms = _float32(torch.linalg.vector_norm(rows, dim=2)).view(-1)
            per = rows.shape[1]
            for k, i in enumerate(indices):
                out[i] = Piece(norms, k * per, per)
        return out


class NormsLater:
    """The per-sample norms of a small gradient, computed at the end of its backward pass with
    the others (``resolve``): one stack and one norm per shape, not one norm per gradient. The
    gradient is held, with its version: one changed meanwhile gets no values (``norms`` None,
    an empty ``sample``). ``sample``: what the histogram draws on (all the norms, or a sample)."""

    __slots__ = ("grad", "version", "_norms", "_sample")

    def __init__(self, grad: torch.Tensor) -> None:
        self.grad: Optional[torch.Tensor] = grad.detach() if grad.requires_grad else grad
        self.version = grad._version
        # where they lie: a ``Piece`` of the norms of the gradients of its shape, until read
        self._norms: Optional[Sample] = None
        self._sample: Optional[Sample] = None

    @property
    def norms(self) -> Optional[torch.Tensor]:
        """All the per-sample norms (None: not measured)."""
        return as_tensor(self._norms)  # type: ignore[no-any-return]

    @property
    def sample(self) -> Optional[torch.Tensor]:
        """What the histogram draws on."""
        return as_tensor(self._sample)  # type: ignore[no-any-return]

    def norms_ref(self) -> Optional[Sample]:
        """``norms`` as they lie (a ``Piece``: no view)."""
        return self._norms

    def sample_ref(self) -> Optional[Sample]:
        """``sample`` as it lies (a ``Piece``: no view)."""
        return self._sample

    @staticmethod
    def resolve(pending: Sequence["NormsLater"], sampler: Sampler) -> None:
        """Compute the norms (and samples) of all ``pending``, together.

        Example:
            >>> later = NormsLater(torch.full((2, 4), 0.5))
            >>> NormsLater.resolve([later], Sampler(None)); later.norms.tolist(), later.sample.tolist()
            ([1.0, 1.0], [1.0, 1.0])
        """
        kept, grads = [], []
        for p in pending:
            grad, p.grad = p.grad, None
            if grad is None:
                continue
            if grad._version != p.version:  # written over since it arrived: not its values now
                p._sample = grad.new_empty(0, dtype=torch.float32)
            else:
                kept.append(p)
                grads.append(grad)
        for p, norms in zip(kept, sampler.norms_of(grads)):
            p._norms = norms
        n = sampler.sample_n
        drawn = [p for p in kept if n is not None and size_of(p._norms) > n]
        for p in kept:
            p._sample = p._norms  # values of their own: a sample holding all of them needs no copy
        for p, sample in zip(drawn, sampler.values_of([p.norms for p in drawn])):  # type: ignore[misc]
            p._sample = sample


def _rows(g: torch.Tensor) -> torch.Tensor:
    """A gradient as (samples, values): all but its first dimension flattened."""
    return g.reshape(1, 1) if g.dim() == 0 else g if g.dim() == 2 else g.reshape(g.shape[0], -1)


def _has_values(t: torch.Tensor) -> bool:
    """Real values to sample: not complex, sparse, meta or empty."""
    return not (t.is_complex() or t.layout != torch.strided or t.is_meta) and t.numel() > 0


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached and 1-D, with no operation where it already is."""
    if t.requires_grad:
        t = t.detach()
    return t if t.dim() == 1 else t.reshape(-1)


def _float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a tensor of its own) as float32."""
    return t if t.dtype == torch.float32 else t.float()


__all__ = ["Sampler", "NormsLater"]
