"""Which part of an activation a patch replaces: positions, heads, or any slice along a dimension.

A ``Selection`` turns into a boolean mask over the target activation; the patched value is
``torch.where(mask, source, target)``, so every selected element is the source's element
bit for bit and every other one the target's. When the two runs have different lengths along
the position dimension, the source is first lined up with the target: target position ``p``
takes source position ``source_positions[i]`` (by default ``p`` itself).

Example:
    >>> import torch
    >>> sel = Selection(positions=[1], position_dim=1)
    >>> sel.apply(torch.zeros(1, 3, 2), torch.ones(1, 3, 2), n_heads=None).tolist()
    [[[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from ...errors import TorchlensError

Index = Union[int, slice, Sequence[int], None]


class PatchError(TorchlensError, ValueError):
    """A patch that cannot be made (the message says what went wrong and what to give instead)."""


@dataclass
class Selection:
    """What to replace: ``positions`` along ``position_dim``, ``heads`` (the last dimension
    split into ``n_heads`` equal parts), ``index`` ({dim: int | slice | list}) for any other
    dimension. None everywhere: the whole tensor."""

    positions: Index = None
    position_dim: int = 1
    heads: Index = None
    index: Dict[int, Index] = field(default_factory=dict)
    source_positions: Index = None

    @property
    def whole(self) -> bool:
        return self.positions is None and self.heads is None and not self.index

    def describe(self) -> str:
        parts = []
        if self.positions is not None:
            parts.append(f"positions {_text(self.positions)}")
        if self.heads is not None:
            parts.append(f"heads {_text(self.heads)}")
        parts += [f"dim {d} {_text(i)}" for d, i in self.index.items()]
        return ", ".join(parts) or "whole tensor"

    def apply(
        self, target: torch.Tensor, source: torch.Tensor, n_heads: Optional[int], label: str = ""
    ) -> torch.Tensor:
        """The target with the selected elements taken from the source."""
        source = self._aligned(target, source, label)
        if self.whole:
            return source.to(dtype=target.dtype).clone()
        mask = self.mask(target, n_heads, label)
        return torch.where(mask, source.to(dtype=target.dtype), target)

    def mask(self, target: torch.Tensor, n_heads: Optional[int], label: str = "") -> torch.Tensor:
        shape = tuple(target.shape)
        mask = torch.ones((), dtype=torch.bool, device=target.device)
        chosen = {_dim(d, len(shape), label, "index"): (which, f"index[{d}]") for d, which in self.index.items()}
        if self.positions is not None:
            chosen[_dim(self.position_dim, len(shape), label, "position_dim")] = (self.positions, "positions")
        for d, (which, what) in chosen.items():
            mask = mask & _along(shape, d, _flags(shape[d], which, label, what), target.device)
        if self.heads is not None:
            if n_heads is None or n_heads < 1 or not shape or shape[-1] % n_heads:
                raise PatchError(
                    f"patch: heads= needs the number of heads to split the last dimension of {label} "
                    f"(shape {shape}) into equal parts; found {n_heads}. Give n_heads=, or patch a tensor whose "
                    "last dimension is heads x head size (e.g. the input of the attention's output projection)."
                )
            flags = _flags(n_heads, self.heads, label, "heads").repeat_interleave(shape[-1] // n_heads)
            mask = mask & _along(shape, len(shape) - 1, flags, target.device)
        return mask

    def _aligned(self, target: torch.Tensor, source: torch.Tensor, label: str) -> torch.Tensor:
        """The source with the target's shape: as it is, or its positions picked to line up."""
        if source.shape == target.shape:
            if self.source_positions is None:
                return source
        if source.dim() != target.dim():
            raise _shape_error(label, target, source, "they have a different number of dimensions")
        d = _dim(self.position_dim, target.dim(), label, "position_dim")
        others_differ = [i for i in range(target.dim()) if i != d and target.shape[i] != source.shape[i]]
        if others_differ:
            raise _shape_error(label, target, source, f"dimension {others_differ[0]} differs")
        if self.positions is None:
            raise _shape_error(
                label,
                target,
                source,
                f"the runs have different lengths along dimension {d}; give positions= "
                "(and source_positions= where the source's positions are others)",
            )
        wanted = _listed(target.shape[d], self.positions, label, "positions")
        sources = (
            wanted
            if self.source_positions is None
            else _listed(source.shape[d], self.source_positions, f"{label} of the source run", "source_positions")
        )
        if len(sources) != len(wanted):
            raise PatchError(
                f"patch: {len(wanted)} positions but {len(sources)} source_positions for {label}; give as many of each."
            )
        beyond = [p for p in sources if p >= source.shape[d]]
        if beyond:
            raise PatchError(
                f"patch: position {beyond[0]} of {label} does not exist in the source run (its length along "
                f"dimension {d} is {source.shape[d]}); give source_positions= that exist there."
            )
        aligned = target.clone()
        index = torch.tensor(wanted, device=target.device)
        aligned.index_copy_(d, index, source.index_select(d, torch.tensor(sources, device=source.device)).to(target))
        return aligned


def _shape_error(label: str, target: torch.Tensor, source: torch.Tensor, why: str) -> PatchError:
    return PatchError(
        f"patch: {label} has shape {tuple(target.shape)} in the run patched but {tuple(source.shape)} in the source, "
        f"and {why}. Patch a layer whose shapes agree, or select positions that both runs have."
    )


def _dim(dim: int, ndim: int, label: str, name: str) -> int:
    if not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise PatchError(f"patch: {name} {dim!r} is not a dimension of {label}, which has {ndim} dimensions.")
    return dim % ndim


def _flags(size: int, which: Index, label: str, what: str) -> torch.Tensor:
    flags = torch.zeros(size, dtype=torch.bool)
    flags[_listed(size, which, label, what)] = True
    return flags


def _listed(size: int, which: Index, label: str, what: str) -> List[int]:
    """The indices ``which`` names in ``range(size)``; a clear error for one that does not exist."""
    if which is None:
        return list(range(size))
    if isinstance(which, slice):
        return list(range(size))[which]
    items = [which] if isinstance(which, int) else list(which)
    out = []
    for i in items:
        if not isinstance(i, int) or isinstance(i, bool) or not -size <= i < size:
            raise PatchError(
                f"patch: {what} {i!r} does not exist in {label} (it has {size}); give indices in 0..{size - 1}."
            )
        out.append(i % size)
    return out


def _along(shape: tuple, dim: int, flags: torch.Tensor, device: Any) -> torch.Tensor:
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return flags.to(device).reshape(view)


def _text(which: Index) -> str:
    if isinstance(which, slice):
        return f"{which.start or 0}:{'' if which.stop is None else which.stop}"
    return str(which if isinstance(which, int) else list(which))  # type: ignore[arg-type]


__all__ = ["Selection", "PatchError"]
