"""The rolled view: one object per layer, aggregating its passes."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch

from ..records.tensor_log import TensorLogEntry


class RolledLayer:
    """A layer with all its passes: what the rolled drawing shows as one node.

    Example:
        >>> import torch, torchlens as tl
        >>> class Loop(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(2, 2)
        ...     def forward(self, x):
        ...         for _ in range(3):
        ...             x = self.fc(x)
        ...         return x
        >>> h = tl.log_forward_pass(Loop(), torch.ones(1, 2))
        >>> layer = h.rolled_layers['linear_1_1']
        >>> layer.num_passes, layer.parent_layers, layer.child_layers
        (3, ['input_1_0', 'linear_1_1'], ['linear_1_1', 'output_1_2'])
    """

    def __init__(self, passes: List[TensorLogEntry], layer_of: Dict[str, str]) -> None:
        self.passes = passes
        first = passes[0]
        self.label = first.layer_label
        self.layer_type = first.layer_type
        self.kind = first.kind
        self.param_addresses = first.param_addresses
        self.param_shapes = first.param_shapes
        self.num_params = first.num_params
        self._layer_of = layer_of

    @property
    def num_passes(self) -> int:
        return len(self.passes)

    @property
    def activations(self) -> List[Optional[torch.Tensor]]:
        return [e.activation for e in self.passes]

    @property
    def parents_per_pass(self) -> Dict[int, List[str]]:
        """Pass number -> parent layers (rolled labels) of that pass."""
        return {e.pass_num: _unique(self._layer_of.get(p, p) for p in e.parent_layers) for e in self.passes}

    @property
    def children_per_pass(self) -> Dict[int, List[str]]:
        return {e.pass_num: _unique(self._layer_of.get(c, c) for c in e.child_layers) for e in self.passes}

    @property
    def parent_layers(self) -> List[str]:
        return _unique(p for parents in self.parents_per_pass.values() for p in parents)

    @property
    def child_layers(self) -> List[str]:
        return _unique(c for children in self.children_per_pass.values() for c in children)

    @property
    def modules_output_of(self) -> List[str]:
        return _unique(a for e in self.passes for a, _ in e.output_of_modules)

    def __repr__(self) -> str:
        return f"RolledLayer({self.label!r}, passes={self.num_passes})"


def _unique(items: Iterable[str]) -> List[str]:
    return list(dict.fromkeys(items))


def roll(entries: List[TensorLogEntry]) -> Dict[str, RolledLayer]:
    """Layer label -> ``RolledLayer``, in order of each layer's first pass."""
    grouped: Dict[str, List[TensorLogEntry]] = {}
    for e in entries:
        grouped.setdefault(e.layer_label, []).append(e)
    layer_of = {e.label: e.layer_label for e in entries}
    return {label: RolledLayer(passes, layer_of) for label, passes in grouped.items()}
