"""Which inputs and outputs both drawings show as one node: the tensors of one container a
model takes or returns when there are many of them (a HuggingFace cache: GPT-2's 24 past
keys and values; a long tuple of outputs). Laid out one per node, they fill a row wider than
the rest of the graph and shrink everything else to nothing.

A container is an argument or output at the first level (``output.past_key_values``), or the
whole output when it is a plain list/tuple/dict of tensors (``output``). Its tensors form a
``TensorGroup`` when there are more than ``MAX_LOOSE`` of them, or when at least two sit two or
more levels inside it (a cache object: ``output.cache.layers.0.keys``); an LSTM's
``(h_n, c_n)`` pair stays two nodes.

Example:
    >>> import torch, torchlens as tl
    >>> class Many(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x + 1, [x * i for i in range(10)]
    >>> h = tl.log_forward_pass(Many(), torch.ones(2))
    >>> groups = tensor_groups(h.layer_list)  # layer label -> its group
    >>> len(groups), groups['output_2_4'].title, groups['output_2_4'] is groups['output_11_13']
    (10, 'output.1 (10 tensors)', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

MAX_LOOSE = 8  # more tensors than this in one container are drawn as one node


@dataclass
class TensorGroup:
    """The input or output tensors of one container, drawn as one node."""

    address: str  # 'output.past_key_values', 'input.past_key_values', 'output'
    kind: str  # 'input' or 'output'
    labels: List[str] = field(default_factory=list)  # layer labels, in execution order
    shapes: List[Any] = field(default_factory=list)
    nbytes: int = 0

    @property
    def title(self) -> str:
        """``'output.past_key_values (24 tensors)'``."""
        return f"{self.address} ({len(self.labels)} tensors)"

    @property
    def label(self) -> str:
        return self.title


def _container(address: str) -> Optional[Tuple[str, int]]:
    """(container address, levels of the tensor below it) of an input/output address."""
    parts = address.split(".")
    if parts[0] not in ("input", "output") or len(parts) < 2:
        return None
    if len(parts) == 2:
        return parts[0], 1  # a tensor of the whole output (or of the inputs)
    return ".".join(parts[:2]), len(parts) - 2


def tensor_groups(entries: Iterable[Any]) -> Dict[str, TensorGroup]:
    """Layer label -> its ``TensorGroup``, for the inputs and outputs drawn grouped."""
    found: Dict[str, TensorGroup] = {}
    deep: Dict[str, int] = {}
    for e in entries:
        if e.kind not in ("input", "output") or not isinstance(e.address, str):
            continue
        where = _container(e.address)
        if where is None or where[0] == "input":  # separate arguments of forward stay apart
            continue
        address, levels = where
        group = found.setdefault(address, TensorGroup(address, e.kind))
        group.labels.append(e.label)
        group.shapes.append(e.shape)
        group.nbytes += e.nbytes or 0
        deep[address] = deep.get(address, 0) + (levels >= 2)
    out: Dict[str, TensorGroup] = {}
    for address, group in found.items():
        if len(group.labels) > MAX_LOOSE or deep[address] >= 2:
            out.update((label, group) for label in group.labels)
    return out


__all__ = ["MAX_LOOSE", "TensorGroup", "tensor_groups"]
