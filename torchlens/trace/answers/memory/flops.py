"""Floating-point operations of each traced op, counted by torch's own rules.

``OpFlops`` is a dispatch mode entered during a traced pass: every aten operator that reaches it
is run, and if ``torch.utils.flop_counter`` has a formula for it (matmuls, convolutions,
attention: the same table ``FlopCounterMode`` uses) its FLOPs are added to the op the tracer is
running. An operator without a formula is decomposed first, as ``FlopCounterMode`` does, so a
composite one is counted through its parts. Shapes are all the formulas read, so it works on
meta tensors. Element-wise ops count 0, as in torch. One addition: torch's CPU flash-attention
operator, which its table lacks, is counted by the formula of the GPU one.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...capture import PassRecords


class OpFlops(TorchDispatchMode):
    """Adds each aten operator's FLOPs to ``counts[where()]`` (``where``: the current op).

    Example:
        >>> import torch
        >>> counts = {}
        >>> with OpFlops(counts, lambda: "mm"):
        ...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
        >>> counts
        {'mm': 48}
    """

    def __init__(self, counts: Dict[Any, int], where: Callable[[], Any], records: Optional[PassRecords] = None) -> None:
        super().__init__()
        self.records = records  # the pass, paused while an operator runs here: its parts are no ops of the model
        from torch.utils.flop_counter import flop_registry  # loaded on first use only

        aten = torch.ops.aten
        self.registry = dict(flop_registry)
        # torch's table lacks the CPU flash operator (what the CPU, and memory_report on meta, run):
        # it takes the GPU flash operator's formula (same leading q, k, v), so attention counts the same
        self.registry.setdefault(
            aten._scaled_dot_product_flash_attention_for_cpu, flop_registry[aten._scaled_dot_product_flash_attention]
        )
        self.counts = counts
        self.where = where

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        records = self.records
        if records is None or records.is_paused:
            return self._run(func, args, kwargs or {})
        with records.paused():
            return self._run(func, args, kwargs or {})

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        rule = self.registry.get(func._overloadpacket)
        if rule is None:
            try:
                with self:  # its parts come back here, and are counted
                    out = func.decompose(*args, **kwargs)
            except Exception:  # no decomposition that runs here: run the operator itself
                out = NotImplemented
            if out is not NotImplemented:
                return out
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        flops = int(rule(*args, **kwargs, out_val=out))
        if flops:
            key = self.where()
            self.counts[key] = self.counts.get(key, 0) + flops
        return out


__all__ = ["OpFlops"]
