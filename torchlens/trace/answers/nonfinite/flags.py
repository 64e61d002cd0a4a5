"""What ``find_nonfinite`` keeps during its passes: one finiteness flag per tensor instead of a copy.

``FlagPlan`` is a ``SavePlan`` whose "saved activation" of each tensor is its (min, max), two 0-d
tensors on the tensor's device (``finite_flag``), so a pass keeps a few bytes per operation and the device
is never synchronised per operation; with ``gradients=True`` each operation's output is hooked so
the gradient reaching it in backward leaves a flag too (in the order backward reaches them).
``FocusPlan`` keeps detached copies of a few chosen tensors (and their gradients): the producer's
neighbourhood, for the report. ``read_flags`` turns many flags into codes (0 finite, 1 Inf, 2 NaN)
with one host transfer per device.
"""

from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from ...capture import SavePlan
from ...records.tensor_log import TensorLogEntry

# kinds of records whose tensor is made during the pass (hooks on these vanish with the graph)
_MADE_IN_PASS = ("op", "untraced")
Flag = Tuple[torch.Tensor, torch.Tensor]  # (min, max) of a tensor, not yet read


def finite_flag(tensor: Any) -> Optional[Flag]:
    """The tensor's (min, max) as two 0-d tensors on its device (``torch.aminmax``: one pass,
    no allocation; NaN propagates into both, an Inf shows as one of them), which ``read_flags``
    turns into a code. None for tensors that cannot hold NaN/Inf (integers, bools) or hold no
    values (empty, meta, sparse). ``isfinite(t).all()`` would allocate a mask and cost ~40x more
    on a CPU.

    Example:
        >>> read_flags([finite_flag(torch.tensor([1.0, float("nan")])), finite_flag(torch.tensor([1, 2]))])
        [2, None]
    """
    if not isinstance(tensor, torch.Tensor) or not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    if tensor.layout != torch.strided or tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    t = tensor.detach()  # no graph (cheaper than entering no_grad on every call)
    try:
        low, high = torch.aminmax(torch.view_as_real(t) if t.is_complex() else t)
        return low, high
    except RuntimeError:  # a dtype without aminmax (float8, complex32): the slow way
        try:
            low = torch.isfinite(t).all().to(torch.float32).log()  # 0 or -inf
            return low, torch.where(torch.isnan(t).any(), float("nan"), 0.0).to(torch.float32)
        except RuntimeError:
            return None


def read_flags(flags: Sequence[Optional[Flag]]) -> List[Optional[int]]:
    """The flags as codes, 0: all finite, 1: some +-Inf (no NaN), 2: some NaN; None stays None.
    One host transfer per device (the values go there as float64, which holds every float).

    Example:
        >>> read_flags([(torch.tensor(0.0), torch.tensor(1.0)), None, (torch.tensor(float("-inf")), torch.tensor(0.0))])
        [0, None, 1]
    """
    out: List[Optional[int]] = [None] * len(flags)
    groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
    for i, flag in enumerate(flags):
        if flag is not None:
            groups.setdefault((flag[0].device, flag[0].dtype), []).append(i)
    by_device: Dict[torch.device, List[Tuple[List[int], torch.Tensor]]] = {}
    for (device, _), positions in groups.items():
        values = torch.stack([v for i in positions for v in flags[i]]).to(torch.float64)
        by_device.setdefault(device, []).append((positions, values))
    for parts in by_device.values():
        host = torch.cat([v for _, v in parts]).tolist()
        positions = [i for p, _ in parts for i in p]
        for k, i in enumerate(positions):
            low, high = host[2 * k], host[2 * k + 1]
            out[i] = (
                2 if math.isnan(low) or math.isnan(high) else 0 if math.isfinite(low) and math.isfinite(high) else 1
            )
    return out


def as_finite(codes: Dict[str, Optional[int]]) -> Dict[str, Optional[bool]]:
    """Flag codes -> finite (True), not (False), unknown (None)."""
    return {k: None if c is None else c == 0 for k, c in codes.items()}


def as_nan_free(codes: Dict[str, Optional[int]]) -> Dict[str, Optional[bool]]:
    """Flag codes -> holds no NaN (True), holds NaN (False), unknown (None)."""
    return {k: None if c is None else c != 2 for k, c in codes.items()}


class FlagPlan(SavePlan):
    """Every tensor of the pass leaves its finiteness flag as its ``activation``; with
    ``gradients=True`` every operation's output also gets a hook that appends
    ``(raw_index, flag of its incoming gradient)`` to ``grad_flags`` when backward reaches it."""

    def __init__(self, gradients: bool) -> None:
        super().__init__(save_all=True)
        self.copy_at_once = True  # never keep the tensor itself (no sharing, no copy either)
        self.gradients = gradients
        self.grad_flags: List[Tuple[int, Optional[Flag]]] = []
        self.handles: List[Any] = []

    def copy(self, tensor: torch.Tensor, entry: Optional[TensorLogEntry] = None) -> Any:
        if entry is not None and entry.kind == "output" and entry.parent_refs:
            parent = entry.parent_refs[0][0]  # the output is its parent's tensor: same values, same flag
            if isinstance(parent.activation, tuple):
                return parent.activation
        if self.gradients and entry is not None and entry.kind in _MADE_IN_PASS:
            _hook(self, tensor, entry.raw_index)
        return finite_flag(tensor)

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _hook(plan: FlagPlan, tensor: torch.Tensor, raw_index: int) -> None:
    # only tensors made by the pass (with a grad_fn): a hook on a leaf would outlive the call
    if not tensor.requires_grad or tensor.grad_fn is None:
        return

    def record(grad: torch.Tensor) -> None:
        plan.grad_flags.append((raw_index, finite_flag(grad)))

    plan.handles.append(tensor.register_hook(record))


class FocusPlan(SavePlan):
    """Saves detached copies of the tensors at ``raw_indices`` only, and with ``gradients=True``
    the gradients that reach them (``grads``: raw_index -> gradient)."""

    def __init__(self, raw_indices: FrozenSet[int], gradients: bool) -> None:
        super().__init__(raw_indices=raw_indices, detach=True)
        self.copy_at_once = True
        self.gradients = gradients
        self.grads: Dict[int, torch.Tensor] = {}
        self.handles: List[Any] = []

    def copy(self, tensor: torch.Tensor, entry: Optional[TensorLogEntry] = None) -> Any:
        if self.gradients and entry is not None and entry.kind in _MADE_IN_PASS:
            if tensor.requires_grad and tensor.grad_fn is not None:
                index = entry.raw_index

                def keep(grad: torch.Tensor) -> None:
                    self.grads[index] = grad.detach().clone()

                self.handles.append(tensor.register_hook(keep))
        return tensor.detach().clone()

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


__all__ = ["FlagPlan", "FocusPlan", "finite_flag", "read_flags", "as_finite", "as_nan_free"]
