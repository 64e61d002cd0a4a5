"""Samples of the values of tensors for the explorer's histograms, drawn with the sampler's own
generators (never from the user's random streams)."""

from __future__ import annotations

from typing import Dict, Optional

import torch


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
        t = tensor.detach()
        if t.is_complex() or t.layout != torch.strided or t.is_meta:
            return None
        n = t.numel()
        if n == 0:
            return None
        flat = t.reshape(-1)
        other = None if minus is None else minus.detach().reshape(-1)
        if self.sample_n is None or n <= self.sample_n:
            return flat.to(torch.float32, copy=True) if other is None else (flat - other).to(torch.float32)
        g = self._generators.get(flat.device) or self._generator(flat.device)
        index = torch.randint(n, (self.sample_n,), generator=g, device=flat.device)
        picked = flat.index_select(0, index)
        return (picked if other is None else picked - other.index_select(0, index)).to(torch.float32)

    def norms(self, grad: torch.Tensor) -> Optional[torch.Tensor]:
        """All per-sample L2 norms of a gradient: all but the first dimension flattened, one
        norm per row (a 0-d gradient is its absolute value)."""
        g = grad.detach()
        if g.layout != torch.strided or g.numel() == 0:
            return None
        rows = g.reshape(1, 1) if g.dim() == 0 else g.reshape(g.shape[0], -1)
        return torch.linalg.vector_norm(rows, dim=1).float()


__all__ = ["Sampler"]
