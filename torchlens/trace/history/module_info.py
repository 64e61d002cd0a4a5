"""What a history knows of the model's modules (``ModuleInfo``) and of the whole pass
(``PassStats``): plain values the history, its summary, loading and post-processing share.

Example:
    >>> info = ModuleInfo(addresses=["fc"], types={"fc": "Linear"}, children={"": ["fc"]}, passes={"fc": 1})
    >>> info.types["fc"]
    'Linear'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from ..records.tensor_log import TensorLogEntry


@dataclass
class ModuleInfo:
    """The model's modules: addresses (``'features.6'``), types, nesting and passes."""

    addresses: List[str]
    types: Dict[str, str]
    children: Dict[str, List[str]]  # '' is the model itself
    passes: Dict[str, int]  # how many times each module ran in this pass (absent: never)


@dataclass
class PassStats:
    """Facts about the whole forward pass, kept when a ``layers_to_save`` subset drops entries."""

    num_tensors: int
    tensor_bytes: int
    num_param_operations: int
    max_passes: int
    is_branching: bool
    has_conditional_branching: bool

    @classmethod
    def of(cls, entries: List[TensorLogEntry]) -> "PassStats":
        tensor_bytes = param_operations = 0
        max_passes, branching, conditional = 1, False, False
        for e in entries:  # one loop, not six generators: this runs after every pass
            tensor_bytes += e.nbytes or 0
            if e.param_addresses:
                param_operations += 1
            if e.num_passes is not None and e.num_passes > max_passes:
                max_passes = e.num_passes
            if e.child_layers is not None and len(e.child_layers) > 1:
                branching = True
            if e.bool_used:
                conditional = True
        return cls(
            num_tensors=len(entries),
            tensor_bytes=tensor_bytes,
            num_param_operations=param_operations,
            max_passes=max_passes,
            is_branching=branching,
            has_conditional_branching=conditional,
        )


__all__ = ["ModuleInfo", "PassStats"]
