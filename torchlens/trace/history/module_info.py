"""What a history knows of the model's modules (``ModuleInfo``) and of the whole pass
(``PassStats``): plain values the history, its summary, loading and post-processing share.

Example:
    >>> info = ModuleInfo(addresses=["fc"], types={"fc": "Linear"}, children={"": ["fc"]}, passes={"fc": 1})
    >>> info.types["fc"]
    'Linear'
"""

from __future__ import annotations

import operator
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
        """Each fact in one sweep that runs in C (``map`` over an attribute getter; ``filter``
        drops the unset ones): this runs after every pass, and a Python loop over the entries
        cost a tenth of post-processing."""
        return cls(
            num_tensors=len(entries),
            tensor_bytes=sum(filter(None, map(_NBYTES, entries))),
            num_param_operations=sum(map(bool, map(_PARAMS, entries))),
            max_passes=max(1, max(filter(None, map(_PASSES, entries)), default=1)),
            is_branching=max(map(len, filter(None, map(_CHILDREN, entries))), default=0) > 1,
            has_conditional_branching=any(map(_BOOL_USED, entries)),
        )


_NBYTES = operator.attrgetter("nbytes")
_PARAMS = operator.attrgetter("param_addresses")
_PASSES = operator.attrgetter("num_passes")
_CHILDREN = operator.attrgetter("child_layers")
_BOOL_USED = operator.attrgetter("bool_used")


__all__ = ["ModuleInfo", "PassStats"]
