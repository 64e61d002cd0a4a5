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
        return cls(
            num_tensors=len(entries),
            tensor_bytes=sum(e.nbytes or 0 for e in entries),
            num_param_operations=sum(1 for e in entries if e.param_addresses),
            max_passes=max((e.num_passes or 1 for e in entries), default=1),
            is_branching=any(len(e.child_layers or ()) > 1 for e in entries),
            has_conditional_branching=any(e.bool_used for e in entries),
        )


__all__ = ["ModuleInfo", "PassStats"]
