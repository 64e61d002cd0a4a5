"""Samples of the values of tensors for the explorer's histograms, drawn with the sampler's own
generators (never from the user's random streams)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

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
        rows = g.reshape(1, 1) if g.dim() == 0 else g if g.dim() == 2 else g.reshape(g.shape[0], -1)
        return _float32(torch.linalg.vector_norm(rows, dim=1))


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


__all__ = ["Sampler"]
