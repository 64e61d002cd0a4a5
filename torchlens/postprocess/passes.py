"""Which records are passes of the same layer.

Rule: operations of the same type that use the same parameter objects (and sit at the same
position among their call's outputs) are one layer; its passes are numbered in execution order.
Every other record is a layer of its own.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..history.tensor_log import TensorLogEntry


def group_passes(entries: List[TensorLogEntry]) -> List[List[TensorLogEntry]]:
    """Layers in order of their first pass; each layer is its passes in execution order."""
    layers: List[List[TensorLogEntry]] = []
    by_params: Dict[Tuple, List[TensorLogEntry]] = {}
    for e in entries:
        if e.kind == "op" and e.param_addresses:
            key = (e.layer_type, e.param_addresses, e.output_index)
            layer = by_params.get(key)
            if layer is None:
                layer = by_params[key] = []
                layers.append(layer)
            layer.append(e)
        else:
            layers.append([e])
    return layers
